//! Inserting nodes into a graph in place: its node table grows by the new
//! nodes and the old ones move up to make room, each once.
//!
//! A pass that only adds nodes — recomputation's and re-gathering's
//! backward clones, a few percent of a tiled step's 600k nodes — would
//! otherwise copy every node into a new graph through [`Graph::add_copy`]:
//! a clone of each op, name and type list, a look at each operand's type, a
//! fresh table (whose first touch, page by page, cost more than the rest)
//! and a drop of the whole input after. Here the table is the input's,
//! grown at its end; the nodes move within it, last first, as a merge
//! does.
//!
//! Types are not inferred again: a node keeps its outputs, and an inserted
//! node comes with its own. The pass must keep every operand's type (a
//! clone reads what its original read, or clones of it), as
//! [`Graph::verify`] checks; the order is checked here.

use std::sync::Arc;

use crate::graph::{Graph, GraphError, Node, NodeIndex, Phase, Place};
use crate::op::Op;

impl Graph {
    /// The graph with the nodes of each `(at, nodes)` of `inserted`
    /// (ascending, one entry an index) put just before the node now at
    /// `at`, in their order. Its nodes' new indices are the caller's to
    /// work out (a node moves up by the count inserted at or before it),
    /// and so are the operands: every old node is handed to `renumber`, with
    /// its old index, to name its operands anew; the inserted nodes name
    /// theirs already. The outputs and updates are renumbered here.
    ///
    /// Refused where a node would read one that is not before it.
    pub fn insert_before(
        mut self,
        inserted: Vec<(NodeIndex, Vec<Node>)>,
        mut renumber: impl FnMut(NodeIndex, &mut Node),
    ) -> Result<Graph, GraphError> {
        let old = self.nodes.len();
        let added: usize = inserted.iter().map(|(_, nodes)| nodes.len()).sum();
        let fail = |node: &Node, message: &str| GraphError {
            node: node.name.to_string(),
            op: node.op.name(),
            message: message.to_string(),
        };
        if u32::try_from(old + added).is_err() {
            return Err(GraphError {
                node: self.name.clone(),
                op: "insert",
                message: "a graph holds fewer than 2^32 nodes".into(),
            });
        }
        // Each old node's new index, for the outputs and updates.
        let Some(moved_to) = moved_to(old, inserted.iter().map(|(at, nodes)| (*at, nodes.len()))) else {
            let message = "nodes inserted past the end, or not in ascending order";
            return Err(GraphError { node: self.name.clone(), op: "insert", message: message.into() });
        };
        // Room at the end, filled with one shared placeholder that the
        // moves below leave behind and overwrite.
        let placeholder = Node::new("", Op::Relu, Arc::from([]), Phase::Forward, Place::Device, &[]);
        self.nodes.resize(old + added, placeholder);
        let mut write = old + added;
        let mut inserted = inserted.into_iter().rev().peekable();
        let mut operand_count = 0;
        for at in (0..old).rev() {
            renumber(NodeIndex::new(at), &mut self.nodes[at]);
            write -= 1;
            self.nodes.swap(at, write);
            operand_count += self.nodes[write].operands().len();
            if let Some((_, nodes)) = inserted.next_if(|(n, _)| n.index() == at) {
                for node in nodes.into_iter().rev() {
                    write -= 1;
                    operand_count += node.operands().len();
                    self.nodes[write] = node;
                }
            }
        }
        for (at, node) in self.nodes.iter().enumerate() {
            if node.operands().iter().any(|v| v.node.index() >= at) {
                return Err(fail(node, "it reads a node that is not before it"));
            }
        }
        let renumbered = |v: crate::Value| crate::Value { node: moved_to[v.node.index()], output: v.output };
        let outputs = self.outputs.iter().map(|(name, v)| (name.clone(), renumbered(*v))).collect();
        let updates = self.updates.iter().map(|&(target, v)| (moved_to[target.index()], renumbered(v))).collect();
        Ok(Graph::from_parts(self.name, self.nodes, operand_count, outputs, updates))
    }
}

/// Each of `nodes` old nodes' index once `count` nodes are inserted before
/// each `(at, count)` of `inserted` (ascending): what
/// [`Graph::insert_before`] moves them to, and what a caller renumbers by.
/// `None` where an entry is out of order or past the end.
pub fn moved_to(nodes: usize, inserted: impl IntoIterator<Item = (NodeIndex, usize)>) -> Option<Vec<NodeIndex>> {
    let mut moved_to = Vec::with_capacity(nodes);
    let mut shift = 0;
    let mut next = inserted.into_iter().peekable();
    for at in 0..nodes {
        if let Some((_, count)) = next.next_if(|(n, _)| n.index() == at) {
            shift += count;
        }
        moved_to.push(NodeIndex::new(at + shift));
    }
    next.peek().is_none().then_some(moved_to)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{DType, Dim, Shape, TensorType, Value};

    /// `x → y = relu(x) → z = relu(y)`, `z` the output; the reassembly's
    /// tests start from it too.
    pub(crate) fn graph() -> Graph {
        let mut g = Graph::new("g");
        let ty = TensorType { dtype: DType::F32, shape: Shape::new([Dim::constant(4)]) };
        let x = g.input("x", ty).unwrap();
        let y = g.add("y", Op::Relu, &[x]).unwrap();
        let z = g.add("z", Op::Relu, &[y]).unwrap();
        g.set_output("z", z);
        g
    }

    /// The first output of node `n`.
    pub(crate) fn at(n: usize) -> Value {
        Value { node: NodeIndex::new(n), output: 0 }
    }

    #[test]
    fn nodes_inserted_shift_the_rest_and_the_graph_checks() {
        let g = graph();
        let outputs = g.node(NodeIndex::new(0)).outputs.clone();
        // A twin of `y` before `z` (then at 3), and `z` reading it.
        let twin = Node::new("y.twin", Op::Relu, outputs, Phase::Forward, Place::Device, &[at(0)]);
        let g = g
            .insert_before(vec![(NodeIndex::new(2), vec![twin])], |n, node| match n.index() {
                2 => node.set_operands(&[at(2)]),
                _ => {
                    let operands: Vec<Value> = node.operands().to_vec();
                    node.set_operands(&operands);
                }
            })
            .unwrap();
        let names: Vec<&str> = g.nodes().map(|n| &*n.name).collect();
        assert_eq!(names, ["x", "y", "y.twin", "z"]);
        assert_eq!(g.operands(NodeIndex::new(3)), [at(2)]);
        assert_eq!(g.outputs, [("z".to_string(), at(3))]);
        assert_eq!(g.operand_count(), 3);
        assert_eq!(g.users(NodeIndex::new(2)), [NodeIndex::new(3)]);
        assert_eq!(g.verify(), Ok(()));
    }

    #[test]
    fn a_node_reading_one_after_it_is_refused() {
        let g = graph();
        let outputs = g.node(NodeIndex::new(0)).outputs.clone();
        // Inserted before `y` but reading `z`'s new place.
        let twin = Node::new("z.twin", Op::Relu, outputs, Phase::Forward, Place::Device, &[at(3)]);
        let error = g.insert_before(vec![(NodeIndex::new(1), vec![twin])], |_, _| {}).unwrap_err();
        assert_eq!(error.node, "z.twin");
        assert!(error.message.contains("not before it"), "{error}");
    }
}
