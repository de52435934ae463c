//! Liveness: when each tensor of a scheduled step is born and when it dies.
//!
//! The schedule is a topological order of the nodes. A value is born at the
//! step that computes it and dies after its last reader. Parameters and
//! optimizer state persist across steps, so they live throughout. A graph
//! output lives to the end. An update may be done in place: when every
//! other reader of the updated tensor runs before the node that computes
//! the new value, the new value takes the old one's buffer (AdamW writes
//! the parameter and its moments in place, accumulators add in place).
//! An update of the forward or backward phase takes effect before the
//! optimizer runs, so the optimizer's readers of its target do not hold it
//! back. Other updates are copied into their target when their phase ends,
//! so their value lives until then; a constant update no node reads (an
//! accumulator's zeroing) is written into its target then and takes no
//! memory of its own.

use rayon::prelude::*;
use rustc_hash::FxHashSet;
use zeroplan_ir::{Bindings, Graph, NodeIndex, Op, Phase, Value};

use crate::value_table::ValueTable;

/// What a tensor is, for reports by category.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Trained parameters (f32 masters under mixed precision), their 16-bit
    /// working copies, and parameters gathered for use (ZeRO-3).
    Parameters,
    /// Optimizer moments, accumulators and other persistent state.
    OptimizerState,
    /// Batch inputs.
    Inputs,
    /// The gradients the optimizer applies, flat gradient buckets and their
    /// reductions (after the partition pass).
    Gradients,
    /// Everything else computed during the step.
    Activations,
}

/// One tensor's lifetime over the schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Interval {
    pub value: Value,
    pub bytes: u64,
    /// Schedule positions `[start, end]`, inclusive.
    pub start: usize,
    pub end: usize,
    pub category: Category,
    /// The value reuses the buffer of this earlier value (an in-place
    /// update, or a view).
    pub alias_of: Option<Value>,
    /// Device or host memory.
    pub place: zeroplan_ir::Place,
}

impl Interval {
    /// Each interval's index in `intervals`, by its value: for following
    /// `alias_of` to the interval it names. Sized by the largest node the
    /// intervals hold, which a place's own list may end well before.
    pub(crate) fn indices(intervals: &[Interval]) -> ValueTable<u32> {
        let nodes = intervals.iter().map(|i| i.value.node.index() + 1).max().unwrap_or(0);
        let mut index_of = ValueTable::with_nodes(nodes);
        for (i, interval) in intervals.iter().enumerate() {
            index_of.insert(interval.value, i as u32);
        }
        index_of
    }
}

/// Why liveness could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum LivenessError {
    #[error("the size of `{0}` is not known: bind every symbol (batch, seq)")]
    Unbound(String),
    #[error("`{value}`: {why}")]
    Indivisible { value: String, why: String },
}

/// Lifetimes of every value of `graph` under the schedule `order`.
pub fn liveness(graph: &Graph, order: &[NodeIndex], bindings: &Bindings) -> Result<Vec<Interval>, LivenessError> {
    // Schedule positions by node index (dense: every node and every
    // operand of a 300k-node step is looked up).
    let mut at = vec![usize::MAX; graph.node_count()];
    for (i, n) in order.iter().enumerate() {
        at[n.index()] = i;
    }
    let position = |n: NodeIndex| at[n.index()];
    let last = order.len().saturating_sub(1);
    let mut last_use: ValueTable<usize> = ValueTable::for_graph(graph);
    for (i, &n) in order.iter().enumerate() {
        for &v in graph.operands(n) {
            last_use.raise(v, i);
        }
    }
    for (_, v) in &graph.outputs {
        last_use.insert(*v, last);
    }
    // A sequence collective runs on the communication stream until its
    // result is first read (`collective-matmul` issues it ahead of the
    // GEMM it overlaps): its operand lives until then, so no instruction
    // between the two is given the bytes it is still reading.
    for &n in order {
        if matches!(graph.node(n).op, Op::SequenceAllGather { .. } | Op::SequenceReduceScatter { .. }) {
            let first_read = graph.users(n).iter().map(|&u| position(u)).min().unwrap_or(position(n));
            for &v in graph.operands(n) {
                last_use.raise(v, first_read);
            }
        }
    }
    // A view is read wherever its views are: the viewed buffer lives until
    // the last of them (reverse order reaches views of views first).
    let mut alias: ValueTable<Value> = ValueTable::for_graph(graph);
    for &n in order.iter().rev() {
        if graph.node(n).op.is_view() {
            let (view, viewed) = (Value { node: n, output: 0 }, graph.operands(n)[0]);
            if let Some(&l) = last_use.get(&view) {
                last_use.raise(viewed, l);
            }
            alias.insert(view, viewed);
        }
    }
    // In-place updates: the new value may take the target's buffer when no
    // reader of the target comes after the node computing the new value.
    // An update of the micro-batch phases (a gradient accumulator) takes
    // effect before the optimizer runs, so the optimizer's readers want the
    // new value: they do not hold the old buffer.
    // (target, optimizer phase?) of each update made in place: a target may be
    // updated in place once per phase group (an accumulator: added to in the
    // backward, zeroed by the optimizer).
    let mut updated_in_place: FxHashSet<(Value, bool)> = FxHashSet::default();
    let optimizer = |n: NodeIndex| graph.node(n).phase == Phase::Optimizer;
    // Where the micro-batch phases end: an update not made in place is
    // copied into its target there.
    let micro_batch_end = order.iter().rposition(|&n| !optimizer(n)).unwrap_or(last);
    for (target, v) in &graph.updates {
        let old = Value { node: *target, output: 0 };
        let last_reader = graph
            .users(*target)
            .iter()
            .copied()
            .filter(|&r| optimizer(v.node) || !optimizer(r))
            // A view is read wherever its readers are (conservatively, all phases).
            .map(|r| {
                let view = graph.node(r).op.is_view().then(|| last_use.get(&Value { node: r, output: 0 }));
                view.flatten().copied().unwrap_or(position(r))
            })
            .max();
        // A constant no node reads (an accumulator's zeroing) is written into
        // its target when its phase ends, wherever the schedule put its node.
        let constant = matches!(graph.node(v.node).op, Op::Fill { .. }) && graph.users(v.node).is_empty();
        let readers_done = constant || last_reader.is_none_or(|l| l <= position(v.node));
        let same_size = graph.value_type(old).size_bytes(bindings) == graph.value_type(*v).size_bytes(bindings);
        let same_place = graph.node(old.node).place == graph.node(v.node).place;
        if readers_done
            && same_size
            && same_place
            && !alias.contains_key(v)
            && !updated_in_place.contains(&(old, optimizer(v.node)))
        {
            alias.insert(*v, old);
            updated_in_place.insert((old, optimizer(v.node)));
        } else {
            // Copied into the target when its phase ends: it lives until then.
            let phase_end = if optimizer(v.node) { last } else { micro_batch_end };
            last_use.raise(*v, phase_end);
        }
    }
    let gradients = applied_gradients(graph);
    // Every value's bytes, in schedule order, found on all cores: each
    // reads its type's dimensions and the bindings, a cache miss or two
    // per value of a million-node step.
    let sizes: Vec<Option<u64>> =
        order.par_iter().flat_map_iter(|&n| graph.node(n).outputs.iter().map(|ty| ty.size_bytes(bindings))).collect();
    let mut sizes = sizes.into_iter();
    let mut intervals = Vec::with_capacity(sizes.len());
    for &n in order {
        let node = graph.node(n);
        let persistent = matches!(node.op, Op::Param { .. } | Op::State { .. });
        let reads_a_parameter = || graph.operands(n).iter().all(|v| matches!(graph.node(v.node).op, Op::Param { .. }));
        let category = match node.op {
            Op::Param { .. } => Category::Parameters,
            Op::State { .. } => Category::OptimizerState,
            Op::Input => Category::Inputs,
            // Working copies, and parameters gathered for the forward or backward.
            Op::Cast { .. } if reads_a_parameter() => Category::Parameters,
            Op::AllGather { .. } if node.phase != Phase::Optimizer => Category::Parameters,
            Op::Flatten { .. } | Op::ReduceScatter { .. } => Category::Gradients,
            Op::AllReduce { .. } if node.phase == Phase::Backward => Category::Gradients,
            _ if gradients.contains(&n) => Category::Gradients,
            _ => Category::Activations,
        };
        for output in 0..node.outputs.len() as u32 {
            let value = Value { node: n, output };
            let ty = &node.outputs[output as usize];
            let bytes = sizes.next().flatten().ok_or_else(|| {
                match ty.shape.dims().iter().find_map(|d| d.indivisible(bindings)) {
                    Some(why) => LivenessError::Indivisible { value: graph.value_ref(value), why },
                    None => LivenessError::Unbound(graph.value_ref(value)),
                }
            })?;
            let start = if persistent { 0 } else { position(n) };
            let end = if persistent { last } else { last_use.get(&value).copied().unwrap_or(position(n)) };
            let alias_of = alias.get(&value).copied();
            intervals.push(Interval { value, bytes, start, end, category, alias_of, place: node.place });
        }
    }
    Ok(intervals)
}

/// The nodes computing the gradients optimizers read, before the
/// reductions and copies of the optimizer phase.
fn applied_gradients(graph: &Graph) -> FxHashSet<NodeIndex> {
    graph
        .node_indices()
        .filter_map(|n| zeroplan_ir::kernel::adamw_operands(graph, n))
        .map(|ops| crate::accounting::held_gradient(graph, ops[1]).node)
        .filter(|n| !matches!(graph.node(*n).op, Op::State { .. }))
        .collect()
}
