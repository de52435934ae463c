//! Communication volume: what every rank sends per training step.
//!
//! Ring algorithms (Patarasuk & Yuan, 2009; NCCL's default for large
//! messages): over `r` ranks a reduce-scatter or an all-gather of `n`
//! elements sends `(r−1)/r · n` elements from each rank in `r−1` steps, and
//! an all-reduce is the two in sequence, `2(r−1)/r · n` in `2(r−1)` steps.
//! `n` is the whole (unsharded) tensor's length.

use std::collections::BTreeMap;
use zeroplan_ir::{Bindings, Graph, Op, Phase, Value};

/// The fraction of the whole tensor each rank sends in a ring collective;
/// `None` for ops that do not communicate.
pub fn ring_share(op: &Op) -> Option<f64> {
    let (ranks, passes) = match *op {
        Op::AllReduce { ranks } | Op::TensorAllReduce { ranks } => (ranks, 2.0),
        // A sequence all-gather and reduce-scatter pair moves what the
        // tensor all-reduce it replaces did (Korthikanti et al., 2022).
        Op::ReduceScatter { ranks }
        | Op::AllGather { ranks }
        | Op::SequenceAllGather { ranks, .. }
        | Op::SequenceReduceScatter { ranks } => (ranks, 1.0),
        _ => return None,
    };
    Some(passes * (ranks - 1) as f64 / ranks as f64)
}

/// The unsharded length of a collective's tensor under `bindings`: the
/// all-gather's output, the reduce-scatter's or all-reduce's input (a
/// tensor all-reduce's is an activation, sized by `batch` and `seq`).
pub fn whole_elements(graph: &Graph, value: Value, bindings: &Bindings) -> Option<u64> {
    let node = graph.node(value.node);
    let whole = match node.op {
        Op::AllGather { .. } | Op::SequenceAllGather { .. } => value,
        _ => graph.operands(value.node)[0],
    };
    graph.value_type(whole).shape.numel_value(bindings)
}

/// Traffic of one collective kind over a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Traffic {
    /// Collectives launched per step.
    pub count: u64,
    /// Elements each rank sends per step.
    pub elements: f64,
    /// Bytes each rank sends per step.
    pub bytes: f64,
}

/// Per collective kind (`all_reduce`, …), what each rank sends in one step
/// of `micro_batches` micro-batches of the sizes `bindings` gives:
/// forward and backward collectives run once per micro-batch, optimizer
/// ones once. A collective whose size is unbound counts as empty.
pub fn traffic(graph: &Graph, micro_batches: u64, bindings: &Bindings) -> BTreeMap<&'static str, Traffic> {
    let mut by_kind: BTreeMap<&'static str, Traffic> = BTreeMap::new();
    for n in graph.node_indices() {
        let node = graph.node(n);
        let Some(share) = ring_share(&node.op) else { continue };
        let whole = whole_elements(graph, Value { node: n, output: 0 }, bindings).unwrap_or(0);
        let elements = share * whole as f64;
        let times = if node.phase == Phase::Optimizer { 1 } else { micro_batches };
        let t = by_kind.entry(node.op.name()).or_default();
        t.count += times;
        t.elements += times as f64 * elements;
        t.bytes += times as f64 * elements * node.outputs[0].dtype.size_bytes() as f64;
    }
    by_kind
}
