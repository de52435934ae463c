//! The dataflow graph: typed ops on a petgraph [`StableGraph`].
//!
//! Nodes hold an op, a readable unique name (`layer3.attn.q`), the types of
//! their outputs and their operands in order (every pass reads them); an edge
//! from producer to consumer records the same operand, so petgraph's
//! algorithms (toposort, reachability) see exactly what the passes see, and
//! a node's users are its outgoing edges.
//! `StableGraph` keeps node indices valid when passes remove nodes.

use petgraph::Direction;
use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::{EdgeRef, NodeIndexable};
use smallvec::SmallVec;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::infer::infer;
use crate::op::{Init, Op};
use crate::shape::TensorType;

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
    /// The operands in operand order, as the edges into the node record
    /// them: read where the passes read them (every node, every pass), so
    /// that reading them walks no edge list and allocates nothing.
    operands: SmallVec<[Value; 3]>,
}

/// An edge: output `output` of the source feeds operand `operand` of the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    pub output: u32,
    pub operand: u32,
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
    pub(crate) graph: StableGraph<Node, Operand>,
    /// Seeded per map (foldhash), not Fx: names come from plan and graph
    /// files, which are untrusted, and names made to collide must not make
    /// loading one quadratic; a file written offline cannot know the seed.
    pub(crate) by_name: HashMap<Arc<str>, NodeIndex, foldhash::quality::RandomState>,
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

    /// An empty graph with room for `nodes` nodes and `edges` edges: a pass
    /// that rebuilds a 300k-node step into one of about the same size would
    /// otherwise rehash every name and move every node each time the
    /// tables double.
    pub fn with_capacity(name: impl Into<String>, nodes: usize, edges: usize) -> Graph {
        Graph {
            name: name.into(),
            graph: StableGraph::with_capacity(nodes, edges),
            by_name: HashMap::with_capacity_and_hasher(nodes, Default::default()),
            ..Graph::default()
        }
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
    /// empty `declared`. Names must be unique.
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
        self.insert(name, op, operands, outputs.into())
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
        let outputs = if unchanged { outputs.clone() } else { self.infer(&name, &op, operands, &[])?.into() };
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

    /// Adds the node and its operand edges under a name not yet taken;
    /// the operands are known to exist.
    fn insert(
        &mut self,
        name: Arc<str>,
        op: Op,
        operands: &[Value],
        outputs: Arc<[TensorType]>,
    ) -> Result<NodeIndex, GraphError> {
        let slot = match self.by_name.entry(name) {
            Entry::Occupied(taken) => {
                let message = "a node of this name already exists".into();
                return Err(GraphError { node: taken.key().to_string(), op: op.name(), message });
            }
            Entry::Vacant(slot) => slot,
        };
        let node = Node {
            name: slot.key().clone(),
            op,
            outputs,
            phase: self.phase,
            place: self.place,
            operands: operands.into(),
        };
        let index = self.graph.add_node(node);
        slot.insert(index);
        for (i, v) in operands.iter().enumerate() {
            self.graph.add_edge(v.node, index, Operand { output: v.output, operand: i as u32 });
        }
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
        Ok((0..self.graph[node].outputs.len() as u32).map(|output| Value { node, output }).collect())
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
        let node = &self.graph[target];
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
        for n in self.graph.node_indices() {
            *counts.entry(self.graph[n].phase).or_default() += 1;
        }
        counts
    }

    pub fn node(&self, index: NodeIndex) -> &Node {
        &self.graph[index]
    }

    pub fn node_by_name(&self, name: &str) -> Option<NodeIndex> {
        self.by_name.get(name).copied()
    }

    /// Gives node `n` the unused name `name`: for a pass that learns what a
    /// node is only after adding it (the last of a running sum).
    pub fn rename(&mut self, n: NodeIndex, name: impl Into<Arc<str>>) -> Result<(), GraphError> {
        let name: Arc<str> = name.into();
        if self.by_name.contains_key(&name) {
            let op = self.graph[n].op.name();
            return Err(GraphError { node: name.to_string(), op, message: "a node of that name exists".into() });
        }
        let old = std::mem::replace(&mut self.graph[n].name, name.clone());
        self.by_name.remove(&old);
        self.by_name.insert(name, n);
        Ok(())
    }

    pub fn node_count(&self) -> usize {
        self.graph.node_count()
    }

    /// The underlying petgraph, for passes that use its algorithms.
    pub fn petgraph(&self) -> &StableGraph<Node, Operand> {
        &self.graph
    }

    pub fn value_type(&self, v: Value) -> &TensorType {
        &self.graph[v.node].outputs[v.output as usize]
    }

    fn try_type(&self, v: Value) -> Option<&TensorType> {
        self.graph.node_weight(v.node)?.outputs.get(v.output as usize)
    }

    /// The operands of a node, in operand order.
    pub fn operands(&self, index: NodeIndex) -> &[Value] {
        &self.graph[index].operands
    }

    /// Nodes in a deterministic topological order: among ready nodes, the one
    /// added first goes first. `None` if the graph has a cycle.
    ///
    /// A node is added after its operands (`Graph::insert`) and none is
    /// removed, so the order of addition is that order: an edge from a node
    /// to one added before it — which a cycle needs — is checked for, not
    /// assumed away.
    pub fn topo_order(&self) -> Option<Vec<NodeIndex>> {
        let forward = self.graph.node_count() == self.graph.node_bound()
            && self
                .graph
                .node_indices()
                .all(|n| self.graph.edges_directed(n, Direction::Incoming).all(|e| e.source() < n));
        forward.then(|| self.graph.node_indices().collect())
    }

    /// Parameter nodes, in topological order.
    pub fn params(&self) -> Vec<NodeIndex> {
        let order = self.topo_order().unwrap_or_else(|| self.graph.node_indices().collect());
        order.into_iter().filter(|n| matches!(self.graph[*n].op, Op::Param { .. })).collect()
    }

    /// The number of trainable scalars: each parameter node counted once,
    /// however many ops use it (shared weights count once). A flat buffer
    /// counts its members, whether this rank holds all of it or a shard.
    pub fn parameter_count(&self) -> u64 {
        let count = |n: &NodeIndex| match &self.graph[*n].op {
            Op::Param { init: Init::Flat { members, .. } } => Some(members.iter().map(|m| m.len()).sum()),
            _ => self.graph[*n].outputs[0].shape.numel().as_constant(),
        };
        self.params().iter().filter_map(count).sum()
    }

    /// The model's trainable scalars when this graph is one tensor rank's:
    /// [`Graph::parameter_count`] with each tensor shard counted as the
    /// whole tensor it is `1/t` of (the vocabulary padded to a multiple of
    /// `t` included), so every tensor rank gives the same count.
    pub fn model_parameter_count(&self) -> u64 {
        let whole = |init: &Init, len: u64| len * init.tensor_shard_ranks().unwrap_or(1);
        let count = |n: &NodeIndex| match &self.graph[*n].op {
            Op::Param { init: Init::Flat { members, .. } } => {
                Some(members.iter().map(|m| whole(&m.init, m.len())).sum())
            }
            Op::Param { init } => self.graph[*n].outputs[0].shape.numel().as_constant().map(|len| whole(init, len)),
            _ => None,
        };
        self.params().iter().filter_map(count).sum()
    }

    /// The tensor-parallel ranks this graph is one rank of (1: none), from
    /// its tensor-parallel ops and sharded parameters.
    pub fn tensor_parallel(&self) -> u64 {
        self.graph
            .node_weights()
            .filter_map(|node| match &node.op {
                Op::Param { init } | Op::State { init } => init.tensor_shard_ranks(),
                op => op.tensor_ranks(),
            })
            .max()
            .unwrap_or(1)
    }

    /// The nodes that read any output of `n`, each once, in index order.
    pub fn users(&self, n: NodeIndex) -> Vec<NodeIndex> {
        let mut users: Vec<NodeIndex> = self.graph.edges_directed(n, Direction::Outgoing).map(|e| e.target()).collect();
        users.sort_unstable();
        users.dedup();
        users
    }

    /// How many nodes of each op, by op name.
    pub fn op_histogram(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for n in self.graph.node_indices() {
            *counts.entry(self.graph[n].op.name()).or_default() += 1;
        }
        counts
    }
}
