//! Rebuilding a graph by moving its nodes into a new table, with new nodes
//! spliced in between.
//!
//! A pass that only adds nodes — recomputation's and re-gathering's
//! backward clones, a few percent of a tiled step's million nodes — would
//! otherwise copy every node through [`Graph::add_copy`]: a clone of each
//! op, name and type list, a look at each operand's type, and a drop of the
//! whole input after. Here each input node is moved once, its operands
//! renumbered by the pass, and the input's table is freed as one block.
//!
//! Types are not inferred again: a node keeps its outputs, and a node the
//! pass adds gives its own. The pass must keep every operand's type (a
//! clone reads what its original read, or clones of it), as
//! [`Graph::verify`] checks.

use crate::graph::{Graph, GraphError, Node, NodeIndex, Value};

/// A graph's named results ([`Graph::outputs`]).
pub type Outputs = Vec<(String, Value)>;

/// A graph's updates ([`Graph::updates`]).
pub type Updates = Vec<(NodeIndex, Value)>;

/// A graph being rebuilt from another's nodes, in order.
pub struct Splice {
    name: String,
    input: std::vec::IntoIter<Node>,
    nodes: Vec<Node>,
    operand_count: usize,
}

impl Splice {
    /// Takes `graph`'s nodes, with room for `added` more in the new graph.
    /// Its outputs and updates are the caller's to renumber
    /// ([`Splice::finish`]).
    pub fn new(graph: Graph, added: usize) -> (Splice, Outputs, Updates) {
        let (name, nodes, outputs, updates) = graph.into_parts();
        let splice =
            Splice { name, nodes: Vec::with_capacity(nodes.len() + added), input: nodes.into_iter(), operand_count: 0 };
        (splice, outputs, updates)
    }

    /// How many of the input's nodes are left to move.
    pub fn input_len(&self) -> usize {
        self.input.len()
    }

    /// The next node of the input, moved out of it; its operands still
    /// name the input's nodes.
    pub fn next_input(&mut self) -> Option<Node> {
        self.input.next()
    }

    /// A node already in the new graph.
    pub fn node(&self, n: NodeIndex) -> &Node {
        &self.nodes[n.index()]
    }

    /// Appends `node`, whose operands name nodes already in the new graph.
    pub fn push(&mut self, node: Node) -> Result<NodeIndex, GraphError> {
        let index = self.nodes.len();
        let fail = |message: String| GraphError { node: node.name.to_string(), op: node.op.name(), message };
        if u32::try_from(index).is_err() {
            return Err(fail("a graph holds fewer than 2^32 nodes".into()));
        }
        for v in node.operands() {
            let exists = self.nodes.get(v.node.index()).is_some_and(|p| (v.output as usize) < p.outputs.len());
            if !exists {
                return Err(fail(format!("operand {v:?} is not in the graph yet")));
            }
        }
        self.operand_count += node.operands().len();
        self.nodes.push(node);
        Ok(NodeIndex::new(index))
    }

    /// The new graph, with these outputs and updates (renumbered by the
    /// caller).
    pub fn finish(self, outputs: Outputs, updates: Updates) -> Graph {
        Graph::from_parts(self.name, self.nodes, self.operand_count, outputs, updates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Dim, Op, Phase, Place, Shape, TensorType};

    fn graph() -> Graph {
        let mut g = Graph::new("g");
        let ty = TensorType { dtype: DType::F32, shape: Shape::new([Dim::constant(4)]) };
        let x = g.input("x", ty).unwrap();
        let y = g.add("y", Op::Relu, &[x]).unwrap();
        g.set_output("y", y);
        g
    }

    #[test]
    fn a_node_spliced_in_shifts_the_rest_and_the_graph_checks() {
        let (mut splice, outputs, updates) = Splice::new(graph(), 1);
        let x = splice.next_input().unwrap();
        let x = splice.push(x).unwrap();
        let twin = Node::new(
            "x.twin",
            Op::Relu,
            splice.node(x).outputs.clone(),
            Phase::Forward,
            Place::Device,
            &[Value { node: x, output: 0 }],
        );
        let twin = splice.push(twin).unwrap();
        let mut y = splice.next_input().unwrap();
        y.set_operands(&[Value { node: twin, output: 0 }]);
        let y = splice.push(y).unwrap();
        let outputs = outputs.into_iter().map(|(name, _)| (name, Value { node: y, output: 0 })).collect();
        let g = splice.finish(outputs, updates);
        assert_eq!(g.node_count(), 3);
        assert_eq!(g.operand_count(), 2);
        assert_eq!(g.users(twin), [y]);
        assert_eq!(g.verify(), Ok(()));
    }

    #[test]
    fn a_node_reading_one_not_yet_added_is_refused() {
        let (mut splice, _, _) = Splice::new(graph(), 0);
        let _x = splice.next_input().unwrap();
        let y = splice.next_input().unwrap();
        let error = splice.push(y).unwrap_err();
        assert_eq!(error.node, "y");
        assert!(error.message.contains("not in the graph yet"), "{error}");
    }
}
