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
pub mod reserve;

use std::collections::BTreeMap;
use zeroplan_ir::{Bindings, Graph, NodeIndex, Phase, Place};

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
    /// Each phase's own peak (forward, backward, optimizer).
    pub phase_peaks: BTreeMap<Phase, PhasePeak>,
    /// Host memory (ZeRO-Offload), planned the same way.
    pub host_intervals: Vec<Interval>,
    pub host: Arena,
}

/// Plans `graph` for `bindings` (e.g. `batch = 32, seq = 128`).
pub fn plan(graph: &Graph, bindings: &Bindings) -> Result<MemoryPlan, LivenessError> {
    plan_in_order(graph, graph.topo_order(), bindings)
}

/// [`plan`] under the schedule `order`, the graph's topological order
/// already computed: the search plans each probe at several micro-batches.
pub fn plan_in_order(graph: &Graph, order: Vec<NodeIndex>, bindings: &Bindings) -> Result<MemoryPlan, LivenessError> {
    // The host's intervals are taken out of the one list, which keeps the
    // device's in order where they are: partitioning into two new lists
    // held a million-node step's intervals twice (50 MB) at the planner's
    // peak.
    let mut intervals = liveness::liveness(graph, &order, bindings)?;
    let mut host_intervals: Vec<Interval> = intervals.extract_if(.., |i| i.place != Place::Device).collect();
    own_buffers_across_places(&mut intervals);
    own_buffers_across_places(&mut host_intervals);
    // The two arenas are independent: a ZeRO-3 offload plan's host arena
    // holds a hundred thousand states.
    let (arena, host) = rayon::join(|| arena::place(&intervals), || arena::place(&host_intervals));
    let phase_at: Vec<Phase> = order.iter().map(|&n| graph.node(n).phase).collect();
    let (at_peak, phase_peaks) = peaks(&intervals, &arena, &phase_at);
    Ok(MemoryPlan { order, intervals, arena, at_peak, phase_peaks, host_intervals, host })
}

impl MemoryPlan {
    /// The device bytes live at each schedule position, one series per
    /// category: what the arena holds as the step runs (a buffer counts
    /// from its first writer to its last reader, in-place updates included),
    /// for memory-over-time charts. At the peak position the series add up
    /// to [`MemoryPlan::at_peak`].
    pub fn live_by_category(&self) -> BTreeMap<Category, Vec<u64>> {
        let positions = self.order.len().max(self.arena.placements.iter().map(|p| p.end + 1).max().unwrap_or(0));
        let mut delta: BTreeMap<Category, Vec<i128>> = BTreeMap::new();
        for p in &self.arena.placements {
            let d = delta.entry(self.intervals[p.interval].category).or_insert_with(|| vec![0; positions + 1]);
            d[p.start] += p.bytes as i128;
            d[p.end + 1] -= p.bytes as i128;
        }
        let running = |d: Vec<i128>| -> Vec<u64> {
            let mut live = 0i128;
            d[..positions]
                .iter()
                .map(|x| {
                    live += x;
                    live.max(0) as u64
                })
                .collect()
        };
        delta.into_iter().map(|(c, d)| (c, running(d))).collect()
    }
}

/// A view whose target lives in the other place's arena cannot share its
/// buffer: it gets its own (the bytes it reads must be there anyway).
fn own_buffers_across_places(intervals: &mut [Interval]) {
    let here = Interval::indices(intervals);
    for interval in intervals.iter_mut() {
        if interval.alias_of.is_some_and(|v| !here.contains_key(&v)) {
            interval.alias_of = None;
        }
    }
}

/// The most bytes live during one phase of the step, and what they are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhasePeak {
    pub live_bytes: u64,
    pub by_category: BTreeMap<Category, u64>,
}

/// Live bytes by category at the schedule position where most are live,
/// and the same for each phase's own busiest position. The phases' peaks
/// grow at different rates with depth and batch (activations in the
/// backward, states in the optimizer), so the depth extrapolation
/// (`planner::depth`) follows each on its own.
fn peaks(
    intervals: &[Interval],
    arena: &Arena,
    phase_at: &[Phase],
) -> (BTreeMap<Category, u64>, BTreeMap<Phase, PhasePeak>) {
    let positions = intervals.iter().map(|i| i.end + 1).max().unwrap_or(0).max(phase_at.len());
    let spans: Vec<(usize, usize, u64, Category)> =
        arena.placements.iter().map(|p| (p.start, p.end, p.bytes, intervals[p.interval].category)).collect();
    let mut delta = vec![0i128; positions + 1];
    for &(s, e, b, _) in &spans {
        delta[s] += b as i128;
        delta[e + 1] -= b as i128;
    }
    let mut live = 0i128;
    let mut best: Option<(i128, usize)> = None;
    let mut best_in: BTreeMap<Phase, (i128, usize)> = BTreeMap::new();
    for (i, d) in delta.iter().enumerate().take(positions) {
        live += d;
        if best.is_none_or(|(b, _)| live > b) {
            best = Some((live, i));
        }
        if let Some(&phase) = phase_at.get(i) {
            let entry = best_in.entry(phase).or_insert((live, i));
            if live > entry.0 {
                *entry = (live, i);
            }
        }
    }
    let at = |position: usize| {
        let mut by = BTreeMap::new();
        for &(s, e, b, c) in &spans {
            if s <= position && position <= e {
                *by.entry(c).or_default() += b;
            }
        }
        by
    };
    let overall = best.map(|(_, i)| at(i)).unwrap_or_default();
    let by_phase = best_in
        .into_iter()
        .map(|(phase, (live, i))| (phase, PhasePeak { live_bytes: live.max(0) as u64, by_category: at(i) }))
        .collect();
    (overall, by_phase)
}
