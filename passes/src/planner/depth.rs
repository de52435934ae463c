//! Planning deep models in the time of shallow ones.
//!
//! A stack of independent layers adds the same bytes and the same seconds
//! per layer: its weights, gradients and optimizer states, its stored
//! activations, its GEMMs, its collectives. So the search compiles each
//! choice at [`SHORT`] and [`LONG`] layers — every distinct layer planned
//! once, with the embeddings and head around it — and extends every figure
//! along the line through the two: `x(L) = x(LONG) + (L − LONG)·Δ`. A
//! 100-trillion-parameter spec of 312 layers then costs the search what a
//! 3-layer one does; the winner is compiled and planned whole, so the plan
//! file's figures are exact. Shared layers (ALBERT, template banks) are
//! not a repetition of independent layers and are always planned whole, as
//! is a pinned `optimal` recomputation (its budget is for the whole stack).
//! `passes/tests/plan.rs` checks the line against whole planning.

use std::collections::BTreeMap;
use zeroplan_ir::plan::{CommSummary, MemorySummary, Predicted};
use zeroplan_ir::spec::{ModelSpec, Sharing};

use super::evaluate::{Choice, Step};
use super::{PlanError, Request};
use crate::cost::Machine;
use crate::memory::{Category, MemoryPlan};
use crate::recompute::Policy;

/// The two stack depths the line goes through.
pub const SHORT: u64 = 3;
pub const LONG: u64 = 4;

/// A choice compiled for the search.
pub enum Probe {
    /// The whole model.
    Whole(Box<Step>),
    /// Two short stacks and the layers the line extends over.
    Stacks { short: Box<Step>, long: Box<Step>, extra_layers: u64 },
}

/// Whether `model`'s layers repeat independently, so the line applies.
pub fn repeats(model: &ModelSpec) -> bool {
    model.sharing == Sharing::Independent && model.layers > LONG
}

impl Probe {
    /// Compiles `choice` for the search: as two short stacks where the
    /// request allows and the layers repeat, otherwise whole.
    pub fn compile(
        req: &Request,
        choice: Choice,
        ranks: u64,
        hint_batch: u64,
        micro_batches: u64,
    ) -> Result<Probe, PlanError> {
        // An optimal policy's budget is for the whole stack: its layers' choices do not repeat.
        let per_layer_policy = !matches!(choice.recompute, Policy::Optimal { .. });
        if !(req.extrapolate_depth && repeats(req.model) && per_layer_policy) {
            return Ok(Probe::Whole(Box::new(Step::compile(
                req,
                req.model,
                choice,
                ranks,
                hint_batch,
                micro_batches,
            )?)));
        }
        let at = |layers: u64| {
            let model = ModelSpec { layers, ..req.model.clone() };
            Step::compile(req, &model, choice, ranks, hint_batch, micro_batches).map(Box::new)
        };
        // The two stacks are independent: compiled at once where a core is free.
        let (short, long) = rayon::join(|| at(SHORT), || at(LONG));
        Ok(Probe::Stacks { short: short?, long: long?, extra_layers: req.model.layers - LONG })
    }

    /// Memory at `micro_batch` sequences.
    pub fn memory(&self, req: &Request, micro_batch: u64) -> Result<MemorySummary, PlanError> {
        Ok(match self {
            Probe::Whole(step) => step.memory(req, micro_batch)?.1,
            Probe::Stacks { short, long, extra_layers } => {
                let (short, long) = rayon::join(|| short.memory(req, micro_batch), || long.memory(req, micro_batch));
                let ((short_plan, short), (long_plan, long)) = (short?, long?);
                extend_memory((&short_plan, &short), (&long_plan, &long), *extra_layers as f64)
            }
        })
    }

    /// Communication and time of one step of `micro_batches` micro-batches
    /// of `micro_batch` sequences.
    pub fn predict(
        &self,
        req: &Request,
        machine: &Machine,
        micro_batch: u64,
        micro_batches: u64,
    ) -> Result<(CommSummary, Predicted), PlanError> {
        match self {
            Probe::Whole(step) => step.predict(req, machine, micro_batch, micro_batches),
            Probe::Stacks { short, long, extra_layers } => {
                let extra = *extra_layers as f64;
                let (short, long) = rayon::join(
                    || short.predict(req, machine, micro_batch, micro_batches),
                    || long.predict(req, machine, micro_batch, micro_batches),
                );
                let ((sc, sp), (lc, lp)) = (short?, long?);
                Ok((extend_comm(&sc, &lc, extra), extend_predicted(&sp, &lp, extra)))
            }
        }
    }
}

/// The line through `short` and `long`, `extra` layers past `long`.
fn line(short: f64, long: f64, extra: f64) -> f64 {
    (long + extra * (long - short)).max(0.0)
}

fn line_bytes(short: u64, long: u64, extra: f64) -> u64 {
    line(short as f64, long as f64, extra).round() as u64
}

/// Each phase's peak follows its own line — the backward's grows with
/// stored activations, the optimizer's with model states — and the
/// step's peak is the largest at the full depth; the long stack's
/// fragmentation is carried over.
fn extend_memory(s: (&MemoryPlan, &MemorySummary), l: (&MemoryPlan, &MemorySummary), extra: f64) -> MemorySummary {
    let mut peak: Option<(u64, BTreeMap<Category, u64>)> = None;
    for (phase, long) in &l.0.phase_peaks {
        let short = s.0.phase_peaks.get(phase).cloned().unwrap_or_default();
        let live = line_bytes(short.live_bytes, long.live_bytes, extra);
        if peak.as_ref().is_some_and(|(p, _)| *p >= live) {
            continue;
        }
        let by_category = long
            .by_category
            .iter()
            .map(|(c, &b)| (*c, line_bytes(short.by_category.get(c).copied().unwrap_or(0), b, extra)))
            .collect();
        peak = Some((live, by_category));
    }
    let (lower_bound_bytes, by_category) = peak.unwrap_or_default();
    let (s, l) = (s.1, l.1);
    let live = |c: Category| by_category.get(&c).copied().unwrap_or(0);
    let arena_bytes = lower_bound_bytes + l.arena_bytes.saturating_sub(l.lower_bound_bytes);
    MemorySummary {
        peak_bytes: arena_bytes + l.reserve_bytes,
        budget_bytes: l.budget_bytes,
        arena_bytes,
        lower_bound_bytes,
        reserve: l.reserve,
        reserve_bytes: l.reserve_bytes,
        params_bytes: live(Category::Parameters),
        grads_bytes: live(Category::Gradients),
        optimizer_bytes: live(Category::OptimizerState),
        activations_bytes: live(Category::Activations) + live(Category::Inputs),
        host_bytes: line_bytes(s.host_bytes, l.host_bytes, extra),
        nvme_bytes: line_bytes(s.nvme_bytes, l.nvme_bytes, extra),
    }
}

fn extend_comm(s: &CommSummary, l: &CommSummary, extra: f64) -> CommSummary {
    let mut by_collective = BTreeMap::new();
    for (kind, lt) in &l.by_collective {
        let st = s.by_collective.get(kind).copied().unwrap_or_default();
        let mut t = *lt;
        t.count = line_bytes(st.count, lt.count, extra);
        t.bytes = line(st.bytes, lt.bytes, extra);
        by_collective.insert(kind.clone(), t);
    }
    CommSummary {
        bytes_per_step: line(s.bytes_per_step, l.bytes_per_step, extra),
        by_collective,
        host_copy_bytes: line(s.host_copy_bytes, l.host_copy_bytes, extra),
    }
}

fn extend_predicted(s: &Predicted, l: &Predicted, extra: f64) -> Predicted {
    let step_seconds = line(s.step_seconds, l.step_seconds, extra);
    let model_flops = line(s.model_flops, l.model_flops, extra);
    let busy_seconds = l
        .busy_seconds
        .iter()
        .map(|(stream, &t)| (stream.clone(), line(s.busy_seconds.get(stream).copied().unwrap_or(0.0), t, extra)))
        .collect();
    // Tokens per step and the GPU's peak are the same at every depth.
    let tokens = l.tokens_per_second * l.step_seconds;
    let peak = l.model_flops / (l.mfu * l.step_seconds);
    Predicted {
        step_seconds,
        tokens_per_second: tokens / step_seconds,
        mfu: model_flops / (step_seconds * peak),
        model_flops,
        hardware_flops: line(s.hardware_flops, l.hardware_flops, extra),
        busy_seconds,
        stalled_seconds: line(s.stalled_seconds, l.stalled_seconds, extra),
        launches: l.launches,
    }
}
