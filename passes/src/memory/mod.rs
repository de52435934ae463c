//! Memory planning: liveness over a schedule, then one arena per rank with
//! every buffer at a fixed offset, so the peak is known before a run.
//!
//! The schedule today is the graph's deterministic topological order, which
//! follows build order: forward, backward in reverse, then the optimizer.
//! Byte accounting per tensor class: parameters and optimizer state
//! (moments, accumulators, step, loss scale) persist for the whole step;
//! inputs live until their last reader; every computed tensor — activations,
//! gradients, the 16-bit working copies — lives from the node that computes
//! it to its last reader. Updates are in place when the schedule allows
//! (see [`liveness`]). Not yet counted: GEMM workspace, collective staging
//! buffers and the runtime's own context; the planner issue adds them.

pub mod arena;
pub mod liveness;

use std::collections::BTreeMap;
use zeroplan_ir::{Bindings, Graph, NodeIndex};

pub use arena::Arena;
pub use liveness::{Category, Interval, LivenessError};

/// A memory plan of one graph under one binding of its symbols.
pub struct MemoryPlan {
    pub order: Vec<NodeIndex>,
    pub intervals: Vec<Interval>,
    pub arena: Arena,
    /// Bytes live at the peak position, by category (persistent ones whole).
    pub at_peak: BTreeMap<Category, u64>,
}

/// Plans `graph` for `bindings` (e.g. `batch = 32, seq = 128`).
pub fn plan(graph: &Graph, bindings: &Bindings) -> Result<MemoryPlan, LivenessError> {
    let order = graph.topo_order().ok_or(LivenessError::Cycle)?;
    let intervals = liveness::liveness(graph, &order, bindings)?;
    let arena = arena::place(&intervals);
    let at_peak = composition_at_peak(&intervals, &arena);
    Ok(MemoryPlan { order, intervals, arena, at_peak })
}

/// Live bytes by category at the schedule position where most are live.
fn composition_at_peak(intervals: &[Interval], arena: &Arena) -> BTreeMap<Category, u64> {
    let positions = intervals.iter().map(|i| i.end + 1).max().unwrap_or(0);
    let spans: Vec<(usize, usize, u64, Category)> =
        arena.placements.iter().map(|p| (p.start, p.end, p.bytes, intervals[p.interval].category)).collect();
    let mut delta = vec![0i128; positions + 1];
    for &(s, e, b, _) in &spans {
        delta[s] += b as i128;
        delta[e + 1] -= b as i128;
    }
    let (mut live, mut best, mut at) = (0i128, -1i128, 0usize);
    for (i, d) in delta.iter().enumerate() {
        live += d;
        if live > best {
            (best, at) = (live, i);
        }
    }
    let mut by = BTreeMap::new();
    for (s, e, b, c) in spans {
        if s <= at && at <= e {
            *by.entry(c).or_default() += b;
        }
    }
    by
}
