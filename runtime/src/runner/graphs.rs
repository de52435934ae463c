//! The runner's side of CUDA graphs: the capture plan of its schedule
//! (`zeroplan_exec::graphs::plan`) from the device's verdict on each
//! instruction and the runner's own host work between steps, and what the
//! step loop needs to launch a segment at its first step.
//!
//! The runner splits a graph wherever it does something on the host
//! between two steps: reading a captured value back, making the
//! micro-batch's deferred updates take effect (copies and fills the
//! runner issues, which must land between the steps that straddle them).
//! A collective runs on the communication thread, which waits on the
//! host, so it is never recorded. Profiling and finite checks
//! read after every instruction, and the NVMe tier moves slots between
//! steps: with any of them on, every instruction is launched eagerly.

use std::collections::{BTreeMap, HashMap, HashSet};

use zeroplan_exec::graphs::{self, Capture, CapturePlan, Pass, PlanStep, Segment};
use zeroplan_exec::{Device, Step};
use zeroplan_ir::Graph;

use super::on_stream;
use super::stream::Access;

/// A schedule's capture plan and what the step loop needs of it.
pub struct Graphs {
    pub plan: CapturePlan,
    /// Each segment's steps that have an instruction in its pass, by key.
    members: HashMap<usize, Vec<usize>>,
    /// Each segment's buffers (its steps' together), by key: a segment is
    /// launched at its first step, after the collectives any of it conflicts with.
    access: HashMap<usize, Access>,
    /// The keys launched so far. The next launch of another may record a
    /// graph, during which nothing else may queue work on the device.
    launched: HashSet<usize>,
}

/// What the runner does between steps that a graph cannot hold.
pub struct HostWork<'a> {
    /// Per step: a value is read back right after it (a capture).
    pub read_after: &'a [bool],
    /// The step after which the micro-batch's deferred updates take
    /// effect, if it has any.
    pub updates_after: Option<usize>,
}

/// The capture plan of `steps` on `device`, with `host`'s work between them.
pub fn plan<D: Device>(
    device: &D,
    g: &Graph,
    steps: &[Step<D::Instr>],
    access: &[Access],
    micro_batches: u64,
    host: &HostWork,
) -> Graphs {
    let plan_steps: Vec<PlanStep> = steps
        .iter()
        .enumerate()
        .map(|(at, s)| {
            let capture = s.instr.as_ref().map(|instr| {
                if on_stream(&g.node(s.node).op) {
                    Capture::Breaks("a collective: the communication thread runs it".into())
                } else {
                    device.capture(instr)
                }
            });
            let split_before = at.checked_sub(1).and_then(|before| {
                if host.read_after[before] {
                    Some("a captured value read back".to_string())
                } else if host.updates_after == Some(before) {
                    Some("the micro-batch's deferred updates".to_string())
                } else {
                    None
                }
            });
            PlanStep { optimizer: s.optimizer, capture, split_before }
        })
        .collect();
    let plan = graphs::plan(&plan_steps, micro_batches);
    let mut members = HashMap::new();
    let mut joined = HashMap::new();
    for (pass, p) in [(Pass::MicroBatch, &plan.micro_batch), (Pass::Last, &plan.last)] {
        for s in &p.segments {
            let list: Vec<usize> = s
                .steps
                .clone()
                .filter(|&at| steps[at].instr.is_some() && (pass == Pass::Last || !steps[at].optimizer))
                .collect();
            let mut union = Access::default();
            for &at in &list {
                union.reads.extend_from_slice(&access[at].reads);
                union.writes.extend_from_slice(&access[at].writes);
            }
            joined.insert(s.key, union);
            members.insert(s.key, list);
        }
    }
    log(&plan, micro_batches);
    Graphs { plan, members, access: joined, launched: HashSet::new() }
}

impl Graphs {
    /// The segment of `pass` starting at step `at`, its steps with an
    /// instruction, and its buffers.
    pub fn starting_at(&self, pass: Pass, at: usize) -> Option<(&Segment, &[usize], &Access)> {
        let s = self.plan.pass(pass).starting_at(at)?;
        Some((s, &self.members[&s.key], &self.access[&s.key]))
    }

    /// Whether `key` is launched for the first time (and notes it is).
    pub fn first_launch(&mut self, key: usize) -> bool {
        self.launched.insert(key)
    }
}

/// The plan in the debug log: how many instructions a step records, and
/// why the others are launched eagerly.
fn log(plan: &CapturePlan, micro_batches: u64) {
    let (recorded, eager) = plan.launches(micro_batches);
    let mut why: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, reason) in plan.micro_batch.eager.iter().chain(&plan.last.eager) {
        *why.entry(reason).or_default() += 1;
    }
    let why: Vec<String> = why.into_iter().map(|(reason, n)| format!("{reason} ×{n}")).collect();
    tracing::debug!(
        "graphs: {} segments record {recorded} instructions a step, {eager} launched eagerly ({})",
        plan.micro_batch.segments.len() + plan.last.segments.len(),
        why.join("; ")
    );
}
