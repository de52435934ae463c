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
//! (see [`liveness`]); views share the buffer they view. After the
//! partition pass, flat gradient buckets and their reductions are
//! `gradients`, gathered parameters (ZeRO-3) are activations-like transients
//! and host-resident state (ZeRO-Offload) is planned in a second, host arena.

pub mod arena;
pub mod liveness;

use std::collections::BTreeMap;
use zeroplan_ir::{Bindings, Graph, NodeIndex, Place};

pub use arena::Arena;
pub use liveness::{Category, Interval, LivenessError};

/// A memory plan of one graph under one binding of its symbols.
pub struct MemoryPlan {
    pub order: Vec<NodeIndex>,
    /// Lifetimes of the device's tensors; the arena indexes into these.
    pub intervals: Vec<Interval>,
    pub arena: Arena,
    /// Bytes live at the peak position, by category (persistent ones whole).
    pub at_peak: BTreeMap<Category, u64>,
    /// Host memory (ZeRO-Offload), planned the same way.
    pub host_intervals: Vec<Interval>,
    pub host: Arena,
}

/// Plans `graph` for `bindings` (e.g. `batch = 32, seq = 128`).
pub fn plan(graph: &Graph, bindings: &Bindings) -> Result<MemoryPlan, LivenessError> {
    let order = graph.topo_order().ok_or(LivenessError::Cycle)?;
    let (intervals, host_intervals): (Vec<Interval>, Vec<Interval>) =
        liveness::liveness(graph, &order, bindings)?.into_iter().partition(|i| i.place == Place::Device);
    let arena = arena::place(&intervals);
    let host = arena::place(&host_intervals);
    let at_peak = composition_at_peak(&intervals, &arena);
    Ok(MemoryPlan { order, intervals, arena, at_peak, host_intervals, host })
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
