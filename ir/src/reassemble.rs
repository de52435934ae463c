//! Reassembling a graph from its own nodes and new ones, in a new order.
//!
//! A pass that replaces some nodes by others and keeps the rest — fusion
//! puts one kernel in place of each group of memory-bound nodes and keeps
//! the other 900k nodes of a tiled step as they are — would otherwise copy
//! every kept node into a new graph through [`Graph::add_copy`]: a clone of
//! each op, name and type list, a look at each operand's type, one node
//! after another, and a drop of the whole input after. Here a kept node is
//! moved to its new place in the input's own table, and every operand is
//! renumbered after, on all cores.
//!
//! Types are not inferred again: a kept node keeps its outputs, and a new
//! node comes with its own. The pass must keep every operand's type (a
//! value a new node stands for has the type it had), as [`Graph::verify`]
//! checks; the order is checked here.
//!
//! The nodes move within the input's table, each once: a kept node whose
//! new place is at or before its old one is moved when its turn comes
//! (nothing written so far has reached its slot); the few that go after
//! their old place — fusion holds back a node reading a kernel that ends
//! after it — are taken out first. A fresh table for a million nodes cost
//! more, page by page, than the moves.

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::graph::{Graph, GraphError, Node, NodeIndex, Value};

/// One node of a reassembled graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The input's node at this index, moved.
    Kept(NodeIndex),
    /// The new node at this index of those made. Its operands name the
    /// input's values, as a kept node's do, and are renumbered the same way.
    Made(usize),
}

// The table is reused as `Option<Node>`s only if they are the size of a
// `Node` (the name's pointer is never null).
const _: () = assert!(size_of::<Option<Node>>() == size_of::<Node>());

impl Graph {
    /// The graph of `parts`, in their order, over this graph's nodes and
    /// `made`. Every operand of every part, every output and every update
    /// names a value of this graph, which `renumber` maps to the value that
    /// stands for it in the new one (`None`: nothing does, which is
    /// refused). Nodes no part keeps are dropped; a node kept or made twice
    /// is refused, and so is a node that would read one not before it.
    pub fn reassembled(
        self,
        parts: &[Part],
        made: Vec<Node>,
        renumber: impl Fn(Value) -> Option<Value> + Sync,
    ) -> Result<Graph, GraphError> {
        let refused =
            |node: &str, op: &'static str, message: String| GraphError { node: node.to_string(), op, message };
        if u32::try_from(parts.len()).is_err() {
            return Err(refused(&self.name, "reassemble", "a graph holds fewer than 2^32 nodes".into()));
        }
        let Graph { name, nodes, outputs, updates, phase, place, .. } = self;
        let twice = |what: &str, at: usize| {
            refused(&name, "reassemble", format!("{what} {at} is placed twice, or does not exist"))
        };
        let mut table: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
        let mut made: Vec<Option<Node>> = made.into_iter().map(Some).collect();
        // Kept nodes that go after their old place, by their new one.
        let mut late: FxHashMap<usize, Node> = FxHashMap::default();
        for (at, part) in parts.iter().enumerate() {
            if let Part::Kept(n) = *part
                && n.index() < at
            {
                let node = table.get_mut(n.index()).and_then(Option::take).ok_or_else(|| twice("node", n.index()))?;
                late.insert(at, node);
            }
        }
        if table.len() < parts.len() {
            table.resize_with(parts.len(), || None);
        }
        for (at, part) in parts.iter().enumerate() {
            let node = match *part {
                Part::Kept(n) if n.index() < at => late.remove(&at),
                Part::Kept(n) => table.get_mut(n.index()).and_then(Option::take),
                Part::Made(m) => made.get_mut(m).and_then(Option::take),
            };
            // What the slot held, if anything, is a node no part keeps:
            // every kept one was taken out before or is taken now.
            table[at] = Some(node.ok_or_else(|| match *part {
                Part::Kept(n) => twice("node", n.index()),
                Part::Made(m) => twice("made node", m),
            })?);
        }
        table.truncate(parts.len());
        let mut nodes: Vec<Node> = table.into_iter().map(|n| n.expect("every slot is filled above")).collect();
        // The first node, in the new order, that reads what nothing stands
        // for or what comes after it: the same one however the work is split.
        let misread = nodes.par_iter_mut().enumerate().find_map_first(|(at, node)| {
            for i in 0..node.operands().len() {
                let v = node.operands()[i];
                let message = match renumber(v) {
                    Some(new) if new.node.index() < at => {
                        node.operands_mut()[i] = new;
                        continue;
                    }
                    Some(_) => "it reads a node that is not before it".to_string(),
                    None => format!("operand {v:?} is not kept"),
                };
                return Some(refused(&node.name, node.op.name(), message));
            }
            None
        });
        if let Some(error) = misread {
            return Err(error);
        }
        let renumbered = |v: Value, what: &str| {
            renumber(v).ok_or_else(|| refused(&name, "reassemble", format!("{what} {v:?} is not kept")))
        };
        let outputs = outputs
            .into_iter()
            .map(|(output, v)| Ok((output, renumbered(v, "the output")?)))
            .collect::<Result<_, GraphError>>()?;
        let updates = updates
            .into_iter()
            .map(|(target, v)| {
                let target = renumbered(Value { node: target, output: 0 }, "the updated tensor")?.node;
                Ok((target, renumbered(v, "the update")?))
            })
            .collect::<Result<_, GraphError>>()?;
        let operand_count = nodes.iter().map(|n| n.operands().len()).sum();
        let mut graph = Graph::from_parts(name, nodes, operand_count, outputs, updates);
        (graph.phase, graph.place) = (phase, place);
        Ok(graph)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::splice::tests::{at, graph};
    use crate::{Op, Phase, Place};

    #[test]
    fn a_node_replaced_and_the_rest_kept_renumber_and_check() {
        let g = graph();
        let outputs = g.node(NodeIndex::new(1)).outputs.clone();
        // `y` and `z` replaced by one node `yz` over `x`, standing for `z`;
        // `x` kept.
        let yz = Node::new("yz", Op::Relu, outputs, Phase::Forward, Place::Device, &[at(0)]);
        let parts = [Part::Kept(NodeIndex::new(0)), Part::Made(0)];
        let g = g
            .reassembled(&parts, vec![yz], |v| match v.node.index() {
                0 => Some(at(0)),
                2 => Some(at(1)),
                _ => None,
            })
            .unwrap();
        let names: Vec<&str> = g.nodes().map(|n| &*n.name).collect();
        assert_eq!(names, ["x", "yz"]);
        assert_eq!(g.operands(NodeIndex::new(1)), [at(0)]);
        assert_eq!(g.outputs, [("z".to_string(), at(1))]);
        assert_eq!(g.operand_count(), 1);
        assert_eq!(g.verify(), Ok(()));
    }

    #[test]
    fn nodes_moved_after_their_old_place_keep_their_operands() {
        let g = graph();
        let outputs = g.node(NodeIndex::new(1)).outputs.clone();
        // A new node `w` over `x` first: `y` and `z` each go one place on.
        let w = Node::new("w", Op::Relu, outputs, Phase::Forward, Place::Device, &[at(0)]);
        let parts = [
            Part::Kept(NodeIndex::new(0)),
            Part::Made(0),
            Part::Kept(NodeIndex::new(1)),
            Part::Kept(NodeIndex::new(2)),
        ];
        let g = g.reassembled(&parts, vec![w], |v| Some(at([0, 2, 3][v.node.index()]))).unwrap();
        let names: Vec<&str> = g.nodes().map(|n| &*n.name).collect();
        assert_eq!(names, ["x", "w", "y", "z"]);
        assert_eq!(g.operands(NodeIndex::new(3)), [at(2)]);
        assert_eq!(g.outputs, [("z".to_string(), at(3))]);
        assert_eq!(g.verify(), Ok(()));
    }

    #[test]
    fn reading_what_nothing_stands_for_or_what_comes_later_is_refused() {
        // `y` dropped, `z` still reading it.
        let parts = [Part::Kept(NodeIndex::new(0)), Part::Kept(NodeIndex::new(2))];
        let error = graph().reassembled(&parts, Vec::new(), |v| (v.node.index() != 1).then_some(v)).unwrap_err();
        assert_eq!(error.node, "z");
        assert!(error.message.contains("not kept"), "{error}");
        // `z` put before `y`, which it reads.
        let parts = [Part::Kept(NodeIndex::new(0)), Part::Kept(NodeIndex::new(2)), Part::Kept(NodeIndex::new(1))];
        let swap = |v: Value| Some(at([0, 2, 1][v.node.index()]));
        let error = graph().reassembled(&parts, Vec::new(), swap).unwrap_err();
        assert_eq!(error.node, "z");
        assert!(error.message.contains("not before it"), "{error}");
    }

    #[test]
    fn a_node_placed_twice_is_refused() {
        // Twice where the second goes after its old place, and twice where
        // both are at or before it.
        let parts = [Part::Kept(NodeIndex::new(0)), Part::Kept(NodeIndex::new(0))];
        let error = graph().reassembled(&parts, Vec::new(), Some).unwrap_err();
        assert!(error.message.contains("placed twice"), "{error}");
        let parts = [Part::Kept(NodeIndex::new(1)), Part::Kept(NodeIndex::new(1))];
        let error = graph().reassembled(&parts, Vec::new(), Some).unwrap_err();
        assert!(error.message.contains("placed twice"), "{error}");
    }
}
