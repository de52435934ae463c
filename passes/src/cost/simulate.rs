//! The step simulation: the schedule played on five in-order streams.
//!
//! Compute (GEMMs and kernels), the data-parallel and the tensor-parallel
//! group's communication (NCCL, a stream per communicator), copy (PCIe)
//! and host (CPU AdamW) each run their instructions in schedule order, one
//! at a time; an instruction starts when its stream is free and its operands
//! are ready. So a reduce-scatter issued mid-backward overlaps the rest of
//! the backward, a prefetched all-gather overlaps the layer before, and
//! what cannot overlap shows as exposed time. The step is the forward and
//! backward once per micro-batch (the first simulated, the others assumed
//! the same) followed by the optimizer phase.

use rayon::prelude::*;
use std::collections::BTreeMap;
use zeroplan_ir::plan::Predicted;
use zeroplan_ir::{Bindings, Graph, NodeIndex, Phase};

use super::time::Machine;
use super::work::{Stream, Work, work};

/// One instruction on the timeline of the first micro-batch and the
/// optimizer phase.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub node: NodeIndex,
    /// `None` for views and other instructions that run nowhere.
    pub stream: Option<Stream>,
    pub start: f64,
    pub end: f64,
    /// What it does: its engine, FLOPs and bytes.
    pub work: Work,
}

/// The schedule played once: each stream's busy seconds (forward and
/// backward, optimizer), the FLOPs; every instruction's times went to the
/// caller as they were found.
struct Playback {
    busy: BTreeMap<Stream, [f64; 2]>,
    micro_batch_end: f64,
    end: f64,
    model_flops: f64,
    hardware_flops: f64,
}

/// Plays `graph` in `order`, handing each instruction's event to
/// `on_event`: the planner's simulation keeps none (not keeping a tiled
/// 100T step's million events lowered its plan's peak by 50–90 MB), a
/// timeline keeps them all.
fn play(
    graph: &Graph,
    order: &[NodeIndex],
    bindings: &Bindings,
    machine: &Machine,
    mut on_event: impl FnMut(Event),
) -> Option<Playback> {
    // When each node's results are ready, by node index.
    let mut ready = vec![0.0f64; graph.node_count()];
    let mut free: BTreeMap<Stream, f64> = BTreeMap::new();
    let mut p =
        Playback { busy: BTreeMap::new(), micro_batch_end: 0.0, end: 0.0, model_flops: 0.0, hardware_flops: 0.0 };
    let tensor_parallel = graph.tensor_parallel();
    // What each instruction does, found on all cores before the streams
    // play in order: sizing every tensor of a million-node step was most
    // of the simulation. Collected in place by index: collecting into an
    // `Option<Vec>` gathers per-thread lists and copies them into one,
    // both held at once (100 MB at the planner's peak). The states each
    // instruction moves matter only on the NVMe tier: sizing them on the
    // CPU tier was a sixth of a tiled 100T step's simulation.
    let mut works: Vec<Option<Work>> = Vec::new();
    let (states, ()) = rayon::join(
        || machine.streams_states_from_nvme().then(|| super::offload::state_traffic(graph, bindings)),
        || order.par_iter().map(|&n| work(graph, n, bindings)).collect_into_vec(&mut works),
    );
    if works.iter().any(Option::is_none) {
        return None;
    }
    for (&n, w) in order.iter().zip(works.into_iter().flatten()) {
        let node = graph.node(n);
        let inputs_ready = graph.operands(n).iter().map(|v| ready[v.node.index()]).fold(0.0, f64::max);
        let stream = super::work::stream(&node.op, w.engine);
        let (start, finish) = match stream {
            None => (inputs_ready, inputs_ready),
            Some(stream) => {
                let mut seconds = machine.seconds(&node.op, &w, tensor_parallel);
                if let Some(&moved) = states.as_ref().and_then(|states| states.get(&n)) {
                    seconds = machine.tiered_seconds(seconds, moved);
                }
                let start = inputs_ready.max(free.get(&stream).copied().unwrap_or(0.0));
                free.insert(stream, start + seconds);
                p.busy.entry(stream).or_default()[usize::from(node.phase == Phase::Optimizer)] += seconds;
                (start, start + seconds)
            }
        };
        ready[n.index()] = finish;
        p.end = p.end.max(finish);
        if node.phase != Phase::Optimizer {
            p.micro_batch_end = p.micro_batch_end.max(finish);
            p.hardware_flops += w.flops;
            if !node.name.ends_with(".recompute") {
                p.model_flops += w.flops * (1.0 - super::work::recomputed_share(&node.op));
            }
        }
        on_event(Event { node: n, stream, start, end: finish, work: w });
    }
    Some(p)
}

/// The timeline of `graph` in `order`: one event per instruction.
pub fn timeline(graph: &Graph, order: &[NodeIndex], bindings: &Bindings, machine: &Machine) -> Option<Vec<Event>> {
    let mut events = Vec::with_capacity(order.len());
    play(graph, order, bindings, machine, |e| events.push(e))?;
    Some(events)
}

/// The timeline of a whole step of `micro_batches` micro-batches, as
/// [`simulate`] times it: micro-batch `i`'s forward and backward are the
/// first one's shifted by `i` times its length, and the optimizer's
/// instructions run with the last, where the schedule puts them. Each event
/// with its micro-batch; the last ends at the predicted step time.
pub fn step_timeline(
    graph: &Graph,
    order: &[NodeIndex],
    bindings: &Bindings,
    machine: &Machine,
    micro_batches: u64,
) -> Option<Vec<(u64, Event)>> {
    let mut events = Vec::with_capacity(order.len());
    let p = play(graph, order, bindings, machine, |e| events.push(e))?;
    let k = micro_batches.max(1);
    let mut out = Vec::with_capacity(events.len() * k as usize);
    for i in 0..k {
        let shift = i as f64 * p.micro_batch_end;
        let last = i + 1 == k;
        for e in events.iter().filter(|e| last || graph.node(e.node).phase != Phase::Optimizer) {
            out.push((i, Event { start: e.start + shift, end: e.end + shift, ..e.clone() }));
        }
    }
    Some(out)
}

/// Simulates `graph` (in `order`) under `bindings` on `machine`; one step
/// accumulates `micro_batches` micro-batches and trains on `tokens` tokens
/// over the whole cluster. `None` where a size is unbound.
pub fn simulate(
    graph: &Graph,
    order: &[NodeIndex],
    bindings: &Bindings,
    machine: &Machine,
    micro_batches: u64,
    tokens: u64,
) -> Option<Predicted> {
    let p = play(graph, order, bindings, machine, |_| {})?;
    let repeats = micro_batches.max(1) as f64;
    let step_seconds = p.end + (repeats - 1.0) * p.micro_batch_end;
    let compute = p.busy.get(&Stream::Compute).map_or(0.0, |[fb, opt]| repeats * fb + opt);
    let busy_seconds = p.busy.iter().map(|(s, [fb, opt])| (s.name().to_string(), repeats * fb + opt)).collect();
    let (model_flops, hardware_flops) = (repeats * p.model_flops, repeats * p.hardware_flops);
    Some(Predicted {
        step_seconds,
        tokens_per_second: tokens as f64 / step_seconds,
        mfu: model_flops / (step_seconds * machine.peak_flops()),
        model_flops,
        hardware_flops,
        stalled_seconds: (step_seconds - compute).max(0.0),
        busy_seconds,
        launches: machine.launches,
    })
}
