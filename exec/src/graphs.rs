//! The capture plan: which runs of a rank's schedule a device may record
//! once as a graph (CUDA graphs) and replay on every later step, and which
//! instructions break a run, with the reason.
//!
//! A plan's program is static — fixed arena offsets, fixed launch shapes —
//! so the same instructions run on the same buffers every step. A run of
//! consecutive steps whose instructions are all asynchronous device work
//! can be recorded once and replayed with one launch, removing each
//! kernel's launch overhead (PyTorch's `torch.cuda.graphs` does this for a
//! whole step). What breaks a run is anything the CPU must do or wait for
//! in the middle of it:
//!
//! - an instruction the device cannot record ([`Capture::Breaks`]): a host
//!   routine on a staging copy, a Cranelift kernel on the pinned arena, a
//!   feed from the host, a collective through a host communicator;
//! - the runner's own host work between two steps (`split_before`): the
//!   micro-batch's deferred updates, a value read back for a capture, an
//!   NVMe window opening or closing, a data-parallel collective handed to
//!   the communication thread;
//! - dropout's counter word: a graph reads it from device memory, set once
//!   before each replay, so one graph holds steps of one offset only. The
//!   last micro-batch runs the optimizer's steps at the step's offset and
//!   its own at the micro-batch's, which differ when there are several
//!   micro-batches: a run drawing masks at both is split in two.
//!
//! The plan is a pure function of plain data (tested here, without a
//! GPU); the runtime's runner builds its input from the schedule and the
//! device's verdicts, and the device records and replays
//! ([`crate::Device::run_segment`]).

use std::collections::HashMap;
use std::ops::Range;

/// Fewer instructions than this are launched eagerly: a graph launch costs
/// about one kernel launch, so recording one instruction saves nothing.
pub const MIN_LAUNCHES: usize = 2;

/// Whether to record and replay graphs (`train --cuda-graphs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GraphMode {
    /// Every instruction launched eagerly, every step.
    Off,
    /// Graphs where the device can record them; a refusal at run time
    /// falls back to eager launches and warns with the reason.
    On,
    /// As `On` where nothing asks for per-instruction host access
    /// (profiling, finite checks turn graphs off), a refusal logged at
    /// debug level.
    #[default]
    Auto,
}

impl std::str::FromStr for GraphMode {
    type Err = String;

    fn from_str(s: &str) -> Result<GraphMode, String> {
        match s {
            "off" => Ok(GraphMode::Off),
            "on" => Ok(GraphMode::On),
            "auto" => Ok(GraphMode::Auto),
            _ => Err(format!("`{s}` is not a CUDA graph mode: on, off or auto")),
        }
    }
}

/// A device's verdict on one instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Capture {
    /// Asynchronous work on the device's streams alone: recordable.
    /// `draws_masks`: it reads dropout's counter word (which changes every
    /// pass, so the graph reads it from device memory).
    Recordable {
        /// Whether it reads dropout's counter word.
        draws_masks: bool,
    },
    /// Not recordable: the CPU runs it or waits for it (why, in words).
    Breaks(String),
}

/// What the plan sees of one step of the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanStep {
    /// Runs once per optimizer step, in the last micro-batch only.
    pub optimizer: bool,
    /// The device's verdict on its instruction; `None` without one (a
    /// view, a param, work moved to another step), which records nothing
    /// and breaks nothing.
    pub capture: Option<Capture>,
    /// Host work the runner does between the previous step and this one,
    /// which ends any graph there (why, in words).
    pub split_before: Option<String>,
}

/// Which pass over the schedule: every micro-batch but the last skips the
/// optimizer's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// Micro-batches `0..k-1`: the optimizer's steps skipped.
    MicroBatch,
    /// The last micro-batch, with the optimizer's steps.
    Last,
}

/// Which dropout counter word a segment's mask-drawing steps read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Masks {
    /// None draws masks.
    None,
    /// The micro-batch's word.
    MicroBatch,
    /// The optimizer phase's (the step's first micro-batch's).
    Optimizer,
}

/// A run of steps recorded as one graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The device's key for its graph: equal for the same instructions
    /// (a segment without optimizer steps is one graph in both passes).
    pub key: usize,
    /// The schedule's steps it covers (in the micro-batch pass, the
    /// optimizer's among them are skipped).
    pub steps: Range<usize>,
    /// The instructions it records.
    pub launches: usize,
    /// The counter word its mask-drawing steps read.
    pub masks: Masks,
}

/// One pass's segments and the instructions launched eagerly, with why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassPlan {
    /// The graphs, in schedule order.
    pub segments: Vec<Segment>,
    /// `(step, why)` for every instruction of the pass outside a segment.
    pub eager: Vec<(usize, String)>,
}

impl PassPlan {
    /// The segment starting at `step`, if any.
    pub fn starting_at(&self, step: usize) -> Option<&Segment> {
        self.segments.iter().find(|s| s.steps.start == step)
    }
}

/// Both passes' plans.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CapturePlan {
    /// Micro-batches `0..k-1` (empty with one micro-batch).
    pub micro_batch: PassPlan,
    /// The last micro-batch.
    pub last: PassPlan,
}

impl CapturePlan {
    /// The plan of `pass`.
    pub fn pass(&self, pass: Pass) -> &PassPlan {
        match pass {
            Pass::MicroBatch => &self.micro_batch,
            Pass::Last => &self.last,
        }
    }

    /// Instructions recorded and launched eagerly per optimizer step of
    /// `micro_batches`: what the cost model's launch term counts.
    pub fn launches(&self, micro_batches: u64) -> (u64, u64) {
        let count = |p: &PassPlan| {
            let recorded: usize = p.segments.iter().map(|s| s.launches).sum();
            (recorded as u64, p.eager.len() as u64)
        };
        let (r_mb, e_mb) = count(&self.micro_batch);
        let (r_last, e_last) = count(&self.last);
        let others = micro_batches.saturating_sub(1);
        (r_mb * others + r_last, e_mb * others + e_last)
    }
}

/// The capture plan of `steps` with `micro_batches` per optimizer step.
pub fn plan(steps: &[PlanStep], micro_batches: u64) -> CapturePlan {
    let mut keys = HashMap::new();
    // With one micro-batch the two counter words are one.
    let several = micro_batches > 1;
    let micro_batch = if several { plan_pass(steps, Pass::MicroBatch, true, &mut keys) } else { PassPlan::default() };
    let last = plan_pass(steps, Pass::Last, several, &mut keys);
    CapturePlan { micro_batch, last }
}

/// A pass's segments; `two_words`: the optimizer's steps draw masks at
/// another counter word than the micro-batch's. `keys` gives equal
/// segments equal keys across passes.
fn plan_pass(
    steps: &[PlanStep],
    pass: Pass,
    two_words: bool,
    keys: &mut HashMap<(Range<usize>, bool), usize>,
) -> PassPlan {
    let mut out = PassPlan::default();
    let mut open: Option<Open> = None;
    let mut close = |open: &mut Option<Open>, out: &mut PassPlan, why: &str| {
        if let Some(o) = open.take() {
            o.close(steps, pass, why, out, keys);
        }
    };
    // A split before a step this pass skips still splits before the next.
    let mut split: Option<&str> = None;
    for (at, step) in steps.iter().enumerate() {
        split = step.split_before.as_deref().or(split);
        if step.optimizer && pass == Pass::MicroBatch {
            continue;
        }
        if let Some(why) = split.take() {
            close(&mut open, &mut out, why);
        }
        match &step.capture {
            None => {}
            Some(Capture::Breaks(why)) => {
                close(&mut open, &mut out, why);
                out.eager.push((at, why.clone()));
            }
            Some(Capture::Recordable { draws_masks }) => {
                let word = match (*draws_masks, step.optimizer) {
                    (false, _) => Masks::None,
                    (true, true) if two_words => Masks::Optimizer,
                    (true, _) => Masks::MicroBatch,
                };
                if let Some(o) = &open
                    && o.masks != Masks::None
                    && word != Masks::None
                    && o.masks != word
                {
                    close(&mut open, &mut out, "dropout masks drawn at another counter word (micro-batch, optimizer)");
                }
                let o = open.get_or_insert(Open { start: at, end: at, launches: Vec::new(), masks: Masks::None });
                o.end = at + 1;
                o.launches.push(at);
                if word != Masks::None {
                    o.masks = word;
                }
            }
        }
    }
    close(&mut open, &mut out, "");
    out
}

/// A segment being gathered.
struct Open {
    start: usize,
    end: usize,
    launches: Vec<usize>,
    masks: Masks,
}

impl Open {
    /// Ends the segment (`why`: what ended it), or, too short to gain
    /// anything, launches its instructions eagerly.
    fn close(
        self,
        steps: &[PlanStep],
        pass: Pass,
        why: &str,
        out: &mut PassPlan,
        keys: &mut HashMap<(Range<usize>, bool), usize>,
    ) {
        if self.launches.len() < MIN_LAUNCHES {
            let reason = if why.is_empty() {
                "alone in its run: a graph launch saves nothing".to_string()
            } else {
                format!("alone in its run (ended by: {why}): a graph launch saves nothing")
            };
            out.eager.extend(self.launches.iter().map(|&at| (at, reason.clone())));
            return;
        }
        let range = self.start..self.end;
        let with_optimizer = pass == Pass::Last && steps[range.clone()].iter().any(|s| s.optimizer);
        let next = keys.len();
        let key = *keys.entry((range.clone(), with_optimizer)).or_insert(next);
        out.segments.push(Segment { key, steps: range, launches: self.launches.len(), masks: self.masks });
    }
}

#[cfg(test)]
mod tests;
