//! Where a step's time goes: wall time per instruction, summed by kind, and
//! each instruction's run on its track.
//!
//! Off by default (two clock reads per instruction are cheap, but a step
//! should not pay for what nobody reads). On a device that queues its work
//! (a CUDA stream) the runner waits for each compute instruction to finish
//! before reading the clock, so a span is the instruction's launch and run
//! and nothing overlaps it: a profiled step is slower than an unprofiled
//! one, and shows where the time goes. Collectives on the communication
//! track are timed to their return (on NCCL: their launch). [`super::Runner::set_profiling`]
//! turns it on; [`Profile::by_kind`] then gives the time of every
//! instruction kind (`matmul`, `transpose`, each generated kernel's family…)
//! over the steps run since, which is what a speed hunt starts from, and
//! [`Profile::spans`] every instruction's start and length, which is what a
//! timeline (`zeroplan train --profile`) draws against the plan's
//! prediction. Spans keep their start as an [`Instant`], so the ranks of one
//! process, each with its own runner, share one clock.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use zeroplan_ir::NodeIndex;

use zeroplan_exec::Instruction;

/// Accumulated time of one kind of instruction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Entry {
    pub calls: u64,
    pub seconds: f64,
    /// Floating-point operations done (GEMMs only; 0 elsewhere).
    pub flops: f64,
}

/// Where an instruction ran: in the rank's schedule, or on one of its
/// communication streams (the collectives' threads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Track {
    Compute,
    /// The data-parallel group's collectives (and, on a device that runs
    /// the groups on one thread, the tensor-parallel group's too).
    Comm,
    /// The tensor-parallel group's collectives.
    TensorComm,
}

/// One instruction's run.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// The program's node it ran for.
    pub node: NodeIndex,
    pub track: Track,
    pub start: Instant,
    pub seconds: f64,
}

/// Timings of the instructions run while profiling was on.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    kinds: BTreeMap<String, Entry>,
    spans: Vec<Span>,
}

impl Profile {
    pub(super) fn record(
        &mut self,
        instr: &impl Instruction,
        node: NodeIndex,
        track: Track,
        start: Instant,
        took: Duration,
    ) {
        let e = self.kinds.entry(instr.kind()).or_default();
        e.calls += 1;
        e.seconds += took.as_secs_f64();
        e.flops += instr.flops();
        self.spans.push(Span { node, track, start, seconds: took.as_secs_f64() });
    }

    /// Every kind with its time, the slowest first.
    pub fn by_kind(&self) -> Vec<(String, Entry)> {
        let mut v: Vec<(String, Entry)> = self.kinds.iter().map(|(k, e)| (k.clone(), e.clone())).collect();
        v.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
        v
    }

    /// The time of all recorded instructions.
    pub fn total_seconds(&self) -> f64 {
        self.kinds.values().map(|e| e.seconds).sum()
    }

    /// Every instruction run, in the order each finished on its track.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }
}
