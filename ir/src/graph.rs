//! The dataflow graph: typed ops in a table of nodes, each holding its
//! operands.
//!
//! Nodes hold an op, a readable unique name (`layer3.attn.q`), the types of
//! their outputs and their operands in order (every pass reads them). A
//! node is added after the nodes it reads and none is removed — a pass
//! that changes a graph builds a new one — so the order of addition is a
//! topological order and a node's index is its place in it. Who reads a
//! node is asked of far fewer nodes than what a node reads: that index is
//! built, once, on the first [`Graph::users`], rather than kept edge by
//! edge as the nodes are added (a tiled step adds a million). So is the
//! index of names, on the first lookup by name: most graphs a pass builds
//! are never asked for a node by name.

use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use crate::infer::infer;
use crate::name_index::NameIndex;
use crate::op::{Init, Op};
use crate::shape::TensorType;

/// A node's place in its graph: the order it was added in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeIndex(u32);

impl NodeIndex {
    /// The node added `index`-th (from 0).
    ///
    /// # Panics
    /// At 2^32 nodes or more, which [`Graph`] refuses to hold.
    pub fn new(index: usize) -> NodeIndex {
        NodeIndex(u32::try_from(index).expect("a graph holds fewer than 2^32 nodes"))
    }

    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One output of one node: what an operand refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    pub node: NodeIndex,
    pub output: u32,
}

/// Which part of a training step a node belongs to. With gradient
/// accumulation the forward and backward nodes run once per micro-batch and
/// the optimizer nodes once per step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    #[default]
    Forward,
    Backward,
    Optimizer,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }
}

/// Where a node runs and its outputs live. Everything is on the device
/// unless the partition pass offloads it (ZeRO-Offload's host AdamW and
/// host-resident optimizer states).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Place {
    #[default]
    Device,
    Host,
}

/// A node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Shared with the graph's name index, and with the copies passes
    /// make: a pass that rebuilds a 300k-node step copies no string.
    pub name: Arc<str>,
    pub op: Op,
    /// Shared with the copies passes make of the node, as the name is: a
    /// copy whose operands keep their types keeps these without a clone.
    pub outputs: Arc<[TensorType]>,
    pub phase: Phase,
    pub place: Place,
    /// The operands in operand order: every pass reads them, at every
    /// node, so they are inline and reading them allocates nothing.
    operands: SmallVec<[Value; 3]>,
}

impl Node {
    /// A node outside any graph, for [`Graph::insert_before`]:
    /// `outputs` must be what `op` infers over the operands' types.
    pub fn new(
        name: impl Into<Arc<str>>,
        op: Op,
        outputs: Arc<[TensorType]>,
        phase: Phase,
        place: Place,
        operands: &[Value],
    ) -> Node {
        Node { name: name.into(), op, outputs, phase, place, operands: operands.into() }
    }

    pub fn operands(&self) -> &[Value] {
        &self.operands
    }

    /// Reads `operands` instead, of the same types (a node moved by
    /// [`Graph::insert_before`] names its operands anew).
    pub fn set_operands(&mut self, operands: &[Value]) {
        self.operands.clear();
        self.operands.extend_from_slice(operands);
    }

    /// The operands, to be named anew ([`Graph::reassembled`]).
    pub(crate) fn operands_mut(&mut self) -> &mut [Value] {
        &mut self.operands
    }
}

/// An error raised while adding a node; it names the node.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("node `{node}` ({op}): {message}")]
pub struct GraphError {
    pub node: String,
    pub op: &'static str,
    pub message: String,
}

/// A dataflow graph with named outputs (the loss, logits…).
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    /// In the order they were added: a topological order.
    pub(crate) nodes: Vec<Node>,
    /// The operands of all nodes, counted as they are added.
    operand_count: usize,
    /// Who reads each node, built on the first [`Graph::users`] and
    /// dropped when a node is added.
    users: OnceLock<Users>,
    /// Each name's node, built on the first lookup by name and kept up to
    /// date from then on. Until then a node's name is not checked as it is
    /// added: [`Graph::verify`] finds two nodes of one name.
    by_name: OnceLock<NameIndex>,
    /// The graph's results, by name, in the order they were declared.
    pub outputs: Vec<(String, Value)>,
    /// Persistent tensors (parameters, states) and the values that replace
    /// them. An update takes effect when the phase of its value has run: a
    /// backward-phase update after every micro-batch (gradient accumulators),
    /// an optimizer-phase update once per step (weights, moments). A target
    /// has at most one update per phase.
    pub updates: Vec<(NodeIndex, Value)>,
    /// The phase given to nodes added from now on.
    pub phase: Phase,
    /// The place given to nodes added from now on.
    pub place: Place,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph { name: name.into(), ..Graph::default() }
    }

    /// An empty graph with room for `nodes` nodes: a pass that rebuilds a
    /// 300k-node step into one of about the same size would otherwise move
    /// every node each time the table doubles.
    pub fn with_capacity(name: impl Into<String>, nodes: usize) -> Graph {
        Graph { name: name.into(), nodes: Vec::with_capacity(nodes), ..Graph::default() }
    }

    /// Room for `nodes` more nodes: for a pass that grows its graph in
    /// place (the training step appends the backward and the optimizer to
    /// the forward), so that the node table is not moved, and its new
    /// pages touched, at each doubling.
    pub fn reserve(&mut self, nodes: usize) {
        self.nodes.reserve(nodes);
        if let Some(by_name) = self.by_name.get_mut() {
            by_name.reserve(&self.nodes, nodes);
        }
    }

    /// A graph of `nodes`, in topological order, reading `operand_count`
    /// operands in all ([`Graph::insert_before`]); names not yet indexed,
    /// cursor at the forward on the device.
    pub(crate) fn from_parts(
        name: String,
        nodes: Vec<Node>,
        operand_count: usize,
        outputs: Vec<(String, Value)>,
        updates: Vec<(NodeIndex, Value)>,
    ) -> Graph {
        Graph { name, nodes, operand_count, outputs, updates, ..Graph::default() }
    }

    /// Runs `add` with new nodes placed at `place`, then restores the cursor:
    /// the one way passes put nodes on the host.
    pub fn at_place<T>(&mut self, place: Place, add: impl FnOnce(&mut Graph) -> T) -> T {
        let saved = std::mem::replace(&mut self.place, place);
        let result = add(self);
        self.place = saved;
        result
    }

    /// Adds a node after inferring its output types from its operands.
    ///
    /// Source ops take their type from `declared`; other ops must pass an
    /// empty `declared`. Names must be unique: a graph whose names have
    /// been looked up refuses a taken one here, any graph in
    /// [`Graph::verify`].
    pub fn add_node(
        &mut self,
        name: impl Into<Arc<str>>,
        op: Op,
        operands: &[Value],
        declared: Vec<TensorType>,
    ) -> Result<NodeIndex, GraphError> {
        let name = name.into();
        if !op.is_source() && !declared.is_empty() {
            let message = "only sources declare their type".into();
            return Err(GraphError { node: name.to_string(), op: op.name(), message });
        }
        let outputs = self.infer(&name, &op, operands, &declared)?;
        let outputs = self.shared_outputs(operands, outputs);
        self.insert(name, op, operands, outputs)
    }

    /// `outputs` as an operand's producer holds them, where it has one
    /// output of the same type (an elementwise op, a copy, an all-reduce),
    /// or else in a table of their own: `partition` adds 930k nodes to a
    /// tiled 100T step, each ~310 bytes of fresh memory (its growth in
    /// RSS), of which a type of its own is ~110 (a 48-byte table and a
    /// 2-D shape's 64 bytes of dimensions).
    fn shared_outputs(&self, operands: &[Value], outputs: Vec<TensorType>) -> Arc<[TensorType]> {
        if let [only] = outputs.as_slice() {
            let same = |v: &Value| {
                let producer = &self.nodes.get(v.node.index())?.outputs;
                (producer.len() == 1 && producer[0] == *only).then(|| producer.clone())
            };
            if let Some(shared) = operands.iter().find_map(same) {
                return shared;
            }
        }
        outputs.into()
    }

    /// Adds a copy of a node of another graph: the same `op`, over
    /// `operands` whose types there were `was`, with outputs `outputs`.
    /// Inference is a function of the op and its operands' types, so where
    /// the operands here have the types `was` lists, the outputs are taken
    /// as they are rather than inferred again — a pass that rebuilds a
    /// 300k-node step copies most nodes unchanged. A source's type is its
    /// declared one, checked when the node was first added: a copy keeps
    /// it as it is. Otherwise it is [`Graph::add_node`].
    pub fn add_copy(
        &mut self,
        name: impl Into<Arc<str>>,
        op: Op,
        operands: &[Value],
        was: &[&TensorType],
        outputs: &Arc<[TensorType]>,
    ) -> Result<NodeIndex, GraphError> {
        let name = name.into();
        if op.is_source() {
            if !operands.is_empty() {
                return self.add_node(name, op, operands, outputs.to_vec());
            }
            return self.insert(name, op, operands, outputs.clone());
        }
        // An operand copied unchanged shares its producer's types, so the
        // address says so before the shapes are compared.
        let same = |v: &Value, was: &TensorType| self.try_type(*v).is_some_and(|t| std::ptr::eq(t, was) || t == was);
        let unchanged = operands.len() == was.len() && operands.iter().zip(was).all(|(v, &ty)| same(v, ty));
        let outputs = if unchanged {
            outputs.clone()
        } else {
            let inferred = self.infer(&name, &op, operands, &[])?;
            self.shared_outputs(operands, inferred)
        };
        self.insert(name, op, operands, outputs)
    }

    /// The output types of `op` over `operands`, or the error naming `name`.
    fn infer(
        &self,
        name: &str,
        op: &Op,
        operands: &[Value],
        declared: &[TensorType],
    ) -> Result<Vec<TensorType>, GraphError> {
        let fail = |message: String| GraphError { node: name.to_string(), op: op.name(), message };
        let types: Vec<&TensorType> = operands
            .iter()
            .map(|v| self.try_type(*v).ok_or_else(|| fail(format!("operand {v:?} does not exist"))))
            .collect::<Result<_, _>>()?;
        infer(op, &types, declared).map_err(fail)
    }

    /// Adds the node, under a name not yet taken where the names are
    /// indexed; the operands are known to exist.
    fn insert(
        &mut self,
        name: Arc<str>,
        op: Op,
        operands: &[Value],
        outputs: Arc<[TensorType]>,
    ) -> Result<NodeIndex, GraphError> {
        if u32::try_from(self.nodes.len()).is_err() {
            let message = "a graph holds fewer than 2^32 nodes".into();
            return Err(GraphError { node: name.to_string(), op: op.name(), message });
        }
        let index = NodeIndex::new(self.nodes.len());
        if let Some(by_name) = self.by_name.get_mut()
            && by_name.insert(&self.nodes, &name, index).is_err()
        {
            let message = "a node of this name already exists".into();
            return Err(GraphError { node: name.to_string(), op: op.name(), message });
        }
        let node = Node { name, op, outputs, phase: self.phase, place: self.place, operands: operands.into() };
        self.nodes.push(node);
        self.operand_count += operands.len();
        self.users.take();
        Ok(index)
    }

    /// Adds a single-output node and returns its value.
    pub fn add(&mut self, name: impl Into<Arc<str>>, op: Op, operands: &[Value]) -> Result<Value, GraphError> {
        let node = self.add_node(name, op, operands, Vec::new())?;
        Ok(Value { node, output: 0 })
    }

    /// Adds a multi-output node (`split`) and returns all its values.
    pub fn add_multi(
        &mut self,
        name: impl Into<Arc<str>>,
        op: Op,
        operands: &[Value],
    ) -> Result<Vec<Value>, GraphError> {
        let node = self.add_node(name, op, operands, Vec::new())?;
        Ok((0..self.nodes[node.index()].outputs.len() as u32).map(|output| Value { node, output }).collect())
    }

    pub fn input(&mut self, name: impl Into<Arc<str>>, ty: TensorType) -> Result<Value, GraphError> {
        self.source(name, Op::Input, ty)
    }

    pub fn param(&mut self, name: impl Into<Arc<str>>, ty: TensorType, init: Init) -> Result<Value, GraphError> {
        self.source(name, Op::Param { init }, ty)
    }

    pub fn source(&mut self, name: impl Into<Arc<str>>, op: Op, ty: TensorType) -> Result<Value, GraphError> {
        let node = self.add_node(name, op, &[], vec![ty])?;
        Ok(Value { node, output: 0 })
    }

    /// Declares a named result of the graph.
    pub fn set_output(&mut self, name: impl Into<String>, value: Value) {
        self.outputs.push((name.into(), value));
    }

    /// Declares that the persistent tensor `target` (a parameter or state)
    /// takes `value` once the phase of `value` has run. Two updates of one
    /// target in one phase are refused by [`Graph::verify`]: looking for
    /// them here would make building a step quadratic in its updates (a
    /// tiled 400-layer model has tens of thousands).
    pub fn set_update(&mut self, target: NodeIndex, value: Value) -> Result<(), GraphError> {
        let node = &self.nodes[target.index()];
        let fail = |message: String| GraphError { node: node.name.to_string(), op: node.op.name(), message };
        if !matches!(node.op, Op::Param { .. } | Op::State { .. }) {
            return Err(fail("only parameters and states are updated".into()));
        }
        if node.outputs[0] != *self.value_type(value) {
            return Err(fail(format!("its update has type {}", self.value_type(value))));
        }
        self.updates.push((target, value));
        Ok(())
    }

    /// The number of nodes in each phase.
    pub fn phase_counts(&self) -> BTreeMap<Phase, usize> {
        let mut counts = BTreeMap::new();
        for node in &self.nodes {
            *counts.entry(node.phase).or_default() += 1;
        }
        counts
    }

    pub fn node(&self, index: NodeIndex) -> &Node {
        &self.nodes[index.index()]
    }

    /// The nodes, in the order they were added (a topological order).
    pub fn nodes(&self) -> std::slice::Iter<'_, Node> {
        self.nodes.iter()
    }

    /// The nodes' indices, in the order they were added.
    pub fn node_indices(&self) -> impl DoubleEndedIterator<Item = NodeIndex> + ExactSizeIterator + use<> {
        (0..self.nodes.len()).map(NodeIndex::new)
    }

    pub fn node_by_name(&self, name: &str) -> Option<NodeIndex> {
        self.names().get(&self.nodes, name)
    }

    /// The first node, in order, whose name an earlier node has.
    pub fn duplicate_name(&self) -> Option<NodeIndex> {
        self.names().duplicate()
    }

    /// Builds the name index now, if no lookup has yet: for a caller with
    /// a core to spare before it verifies the graph or looks names up.
    pub fn index_names(&self) {
        self.names();
    }

    fn names(&self) -> &NameIndex {
        self.by_name.get_or_init(|| NameIndex::build(&self.nodes))
    }

    /// Gives node `n` the unused name `name`: for a pass that learns what a
    /// node is only after adding it (the last of a running sum). A taken
    /// name is refused as [`Graph::add_node`] refuses one.
    pub fn rename(&mut self, n: NodeIndex, name: impl Into<Arc<str>>) -> Result<(), GraphError> {
        let name: Arc<str> = name.into();
        let Some(by_name) = self.by_name.get_mut() else {
            self.nodes[n.index()].name = name;
            return Ok(());
        };
        if by_name.get(&self.nodes, &name).is_some() {
            let op = self.nodes[n.index()].op.name();
            return Err(GraphError { node: name.to_string(), op, message: "a node of that name exists".into() });
        }
        if by_name.duplicate().is_some() {
            // Which of two nodes of one name the index holds may change:
            // it is built again, from the names as they now are.
            self.nodes[n.index()].name = name;
            self.by_name = OnceLock::new();
            return Ok(());
        }
        by_name.remove(&self.nodes[n.index()].name, n);
        self.nodes[n.index()].name = name;
        by_name.insert(&self.nodes, &self.nodes[n.index()].name, n).expect("the name was free");
        Ok(())
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The operands of all nodes together: the edges of the dataflow.
    pub fn operand_count(&self) -> usize {
        self.operand_count
    }

    pub fn value_type(&self, v: Value) -> &TensorType {
        &self.node(v.node).outputs[v.output as usize]
    }

    fn try_type(&self, v: Value) -> Option<&TensorType> {
        self.nodes.get(v.node.index())?.outputs.get(v.output as usize)
    }

    /// The operands of a node, in operand order.
    pub fn operands(&self, index: NodeIndex) -> &[Value] {
        &self.node(index).operands
    }

    /// Nodes in topological order: the order they were added in, since a
    /// node is added after its operands ([`Graph::insert`]) and none is
    /// removed.
    pub fn topo_order(&self) -> Vec<NodeIndex> {
        self.node_indices().collect()
    }

    /// Parameter nodes, in topological order.
    pub fn params(&self) -> Vec<NodeIndex> {
        self.node_indices().filter(|n| matches!(self.node(*n).op, Op::Param { .. })).collect()
    }

    /// The number of trainable scalars: each parameter node counted once,
    /// however many ops use it (shared weights count once). A flat buffer
    /// counts its members, whether this rank holds all of it or a shard.
    pub fn parameter_count(&self) -> u64 {
        let count = |n: &NodeIndex| match &self.node(*n).op {
            Op::Param { init: Init::Flat { members, .. } } => Some(members.iter().map(|m| m.len()).sum()),
            _ => self.node(*n).outputs[0].shape.numel().as_constant(),
        };
        self.params().iter().filter_map(count).sum()
    }

    /// The model's trainable scalars when this graph is one tensor rank's:
    /// [`Graph::parameter_count`] with each tensor shard counted as the
    /// whole tensor it is `1/t` of (the vocabulary padded to a multiple of
    /// `t` included), so every tensor rank gives the same count.
    pub fn model_parameter_count(&self) -> u64 {
        let whole = |init: &Init, len: u64| len * init.tensor_shard_ranks().unwrap_or(1);
        let count = |n: &NodeIndex| match &self.node(*n).op {
            Op::Param { init: Init::Flat { members, .. } } => {
                Some(members.iter().map(|m| whole(&m.init, m.len())).sum())
            }
            Op::Param { init } => self.node(*n).outputs[0].shape.numel().as_constant().map(|len| whole(init, len)),
            _ => None,
        };
        self.params().iter().filter_map(count).sum()
    }

    /// The tensor-parallel ranks this graph is one rank of (1: none), from
    /// its tensor-parallel ops and sharded parameters.
    pub fn tensor_parallel(&self) -> u64 {
        self.nodes
            .iter()
            .filter_map(|node| match &node.op {
                Op::Param { init } | Op::State { init } => init.tensor_shard_ranks(),
                op => op.tensor_ranks(),
            })
            .max()
            .unwrap_or(1)
    }

    /// The nodes that read any output of `n`, each once, in index order.
    pub fn users(&self, n: NodeIndex) -> &[NodeIndex] {
        self.users.get_or_init(|| Users::of(&self.nodes)).of_node(n)
    }

    /// How many nodes of each op, by op name.
    pub fn op_histogram(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for node in &self.nodes {
            *counts.entry(node.op.name()).or_default() += 1;
        }
        counts
    }
}

impl std::ops::Index<NodeIndex> for Graph {
    type Output = Node;

    fn index(&self, index: NodeIndex) -> &Node {
        self.node(index)
    }
}

/// Who reads each node: for node `n`, `readers[start[n]..start[n + 1]]`,
/// each reader once, in index order (compressed sparse rows).
#[derive(Clone, Debug, Default)]
struct Users {
    start: Vec<u32>,
    readers: Vec<NodeIndex>,
}

impl Users {
    fn of(nodes: &[Node]) -> Users {
        // A node reading several outputs of one producer, or one twice, is
        // one reader of it: operands are few, so a look back suffices.
        fn distinct(node: &Node) -> impl Iterator<Item = NodeIndex> + '_ {
            let ops = &node.operands;
            (0..ops.len()).filter(move |&i| !ops[..i].iter().any(|v| v.node == ops[i].node)).map(move |i| ops[i].node)
        }
        let mut start = vec![0u32; nodes.len() + 1];
        for node in nodes {
            for p in distinct(node) {
                start[p.index() + 1] += 1;
            }
        }
        for i in 0..nodes.len() {
            start[i + 1] += start[i];
        }
        // Readers go in as they are met, in index order: each row sorted.
        let mut next: Vec<u32> = start[..nodes.len()].to_vec();
        let mut readers = vec![NodeIndex::default(); start[nodes.len()] as usize];
        for (i, node) in nodes.iter().enumerate() {
            for p in distinct(node) {
                readers[next[p.index()] as usize] = NodeIndex::new(i);
                next[p.index()] += 1;
            }
        }
        Users { start, readers }
    }

    fn of_node(&self, n: NodeIndex) -> &[NodeIndex] {
        &self.readers[self.start[n.index()] as usize..self.start[n.index() + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::shape::{Dim, Shape};

    fn vector(n: u64) -> TensorType {
        TensorType::new(Shape::new([Dim::constant(n)]), DType::F32)
    }

    #[test]
    fn users_are_each_reader_once_in_index_order_and_follow_added_nodes() {
        let mut g = Graph::new("g");
        let x = g.input("x", vector(4)).unwrap();
        let halves = g.add_multi("halves", Op::Split { axis: 0, sizes: vec![2, 2] }, &[x]).unwrap();
        // Reads both outputs of `halves`: one reader of it.
        let sum = g.add("sum", Op::Add, &[halves[0], halves[1]]).unwrap();
        // Reads `x` twice: one reader of it.
        let square = g.add("square", Op::Mul, &[x, x]).unwrap();
        assert_eq!(g.users(x.node), [halves[0].node, square.node]);
        assert_eq!(g.users(halves[0].node), [sum.node]);
        assert!(g.users(sum.node).is_empty());
        assert_eq!(g.operand_count(), 5);
        // A node added after the index was built is in the next answer.
        let again = g.add("again", Op::Add, &[sum, sum]).unwrap();
        assert_eq!(g.users(sum.node), [again.node]);
        assert_eq!(g.topo_order(), g.node_indices().collect::<Vec<_>>());
    }

    #[test]
    fn a_taken_name_is_refused_once_indexed_and_found_by_verify_before() {
        let mut g = Graph::new("g");
        let x = g.input("x", vector(4)).unwrap();
        // Not yet indexed: the second `y` is taken in, and verify names it.
        let y = g.add("y", Op::Add, &[x, x]).unwrap();
        let twin = g.add("y", Op::Mul, &[x, x]).unwrap();
        let error = g.verify().unwrap_err();
        assert_eq!((error.node.as_str(), error.message.as_str()), ("y", "two nodes have this name"));
        assert_eq!(g.duplicate_name(), Some(twin.node));
        // The index keeps the first; renaming the second mends the graph.
        assert_eq!(g.node_by_name("y"), Some(y.node));
        g.rename(twin.node, "z").unwrap();
        assert_eq!(g.duplicate_name(), None);
        assert_eq!((g.node_by_name("y"), g.node_by_name("z")), (Some(y.node), Some(twin.node)));
        g.verify().unwrap();
        // Indexed: a taken name is refused as it is added, or renamed to.
        let error = g.add("z", Op::Add, &[x, x]).unwrap_err();
        assert_eq!(error.message, "a node of this name already exists");
        assert!(g.rename(y.node, "x").is_err());
        assert_eq!(g.node_count(), 3);
    }

    #[test]
    fn node_checks_made_ahead_give_verify_its_answer() {
        let mut g = Graph::new("g");
        let x = g.input("x", vector(4)).unwrap();
        let y = g.add("y", Op::Add, &[x, x]).unwrap();
        g.add("z", Op::Mul, &[y, y]).unwrap();
        // Clean: checks made ahead, then the rest of the check, pass.
        let ahead = g.check_nodes_while(&|| true).expect("never told to stop");
        g.verify_checked(ahead.clone()).unwrap();
        // Told to stop before the first chunk: nothing to hand on.
        assert!(g.check_nodes_while(&|| false).is_none());
        // A node added after the checks were made is checked by verify_checked.
        let w = g.add("w", Op::Add, &[y, y]).unwrap();
        g.nodes[w.node.index()].outputs = vec![vector(5)].into();
        let late = g.verify_checked(ahead).unwrap_err();
        assert_eq!(late, g.verify().unwrap_err());
        assert_eq!(late.node, "w");
        // A stored type that is not the inferred one, found ahead, is verify's error.
        g.nodes[y.node.index()].outputs = vec![vector(5)].into();
        let found = g.check_nodes_while(&|| true).unwrap();
        let error = g.verify_checked(found).unwrap_err();
        assert_eq!(error, g.verify().unwrap_err());
        assert_eq!(error.node, "y");
        assert!(error.message.contains("differs from the inferred type"), "{}", error.message);
    }

    #[test]
    fn a_node_of_its_operands_type_shares_its_producers_outputs() {
        let mut g = Graph::new("g");
        let x = g.input("x", vector(4)).unwrap();
        let sum = g.add("sum", Op::Add, &[x, x]).unwrap();
        let halves = g.add_multi("halves", Op::Split { axis: 0, sizes: vec![2, 2] }, &[x]).unwrap();
        let half = g.add("half", Op::Scale { factor: 0.5 }, &[halves[0]]).unwrap();
        let wide = g.add("wide", Op::Concat { axis: 0 }, &[x, sum]).unwrap();
        let outputs = |v: Value| g.node(v.node).outputs.clone();
        assert!(Arc::ptr_eq(&outputs(sum), &outputs(x)));
        // A producer of several outputs holds them together: not shared.
        assert_eq!(outputs(half)[..], [vector(2)]);
        assert!(!Arc::ptr_eq(&outputs(half), &outputs(halves[0])));
        assert_eq!(outputs(wide)[..], [vector(8)]);
        assert!(!Arc::ptr_eq(&outputs(wide), &outputs(x)));
    }
}
