//! The search: every choice of ZeRO stage × offload × recomputation, each
//! at the largest micro-batches that fit, ranked by predicted throughput.
//!
//! Memory grows with the micro-batch, so for each choice the largest
//! micro-batch that fits is found by bisection over the divisors of the
//! sequences each rank trains on per step (gradient accumulation makes up
//! the rest of the global batch). Accumulating adds fp32 accumulators, so
//! the one micro-batch without accumulation (all of a rank's sequences at
//! once) is checked on its own. Every micro-batch that fits is then timed
//! by the cost model — the largest is usually but not always the fastest
//! (wave quantisation, per-micro-batch collectives). A choice that a
//! cheaper twin beats at every micro-batch it could use is not compiled
//! ([`super::dominance`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use zeroplan_ir::plan::{CommSummary, MemorySummary, Offload, OffloadTo, Predicted, StatesExceed};

use super::depth::Probe;
use super::dominance;
use super::evaluate::{Choice, Evaluation, Step};
use super::floor::Floors;
use super::{PlanError, Request};
use crate::cost::Machine;
use crate::memory::MemoryPlan;
use crate::recompute::Policy;
use zeroplan_ir::build::check_tensor_parallel;

/// What the search found for one choice.
#[derive(Clone)]
pub struct Outcome {
    pub choice: Choice,
    /// The least memory the choice needs per GPU (its smallest micro-batch);
    /// where `bounded`, a lower bound on it.
    pub min_peak_bytes: u64,
    /// Its fastest micro-batch that fits, if one does.
    pub best: Option<Evaluation>,
    /// Not compiled: its model states alone ([`super::floor`]), or with its
    /// checkpoints, exceed this capacity, and `min_peak_bytes` is what they
    /// need on the GPU.
    pub bounded: Option<StatesExceed>,
    /// Every micro-batch the choice may use fits (so it dominates its
    /// dearer twins: [`super::dominance`]).
    pub fits_every: bool,
    /// Not compiled: this cheaper twin fits every micro-batch it could use
    /// and is at least as fast at each ([`super::dominance`]).
    pub dominated_by: Option<Choice>,
    /// Its memory at one sequence per micro-batch (accumulating the rest),
    /// where the search measured it: what the nothing-fits answer starts
    /// from ([`super::explain`]).
    pub at_one: Option<MemorySummary>,
    /// The step of `best`, where the search compiled and planned it whole.
    pub whole: Whole,
}

/// A step the search compiled whole and planned at its best micro-batch
/// (an `optimal` recomputation probe), handed on to the exact planning
/// ([`super::plan`]) so that a deep model's step — 300k nodes for the 100T
/// model — is not compiled and planned a second time. Taken at most once.
#[derive(Clone, Default)]
pub struct Whole(Arc<Mutex<Option<(u64, Step, MemoryPlan)>>>);

impl Whole {
    fn keep(micro_batch: u64, step: Step, plan: MemoryPlan) -> Whole {
        Whole(Arc::new(Mutex::new(Some((micro_batch, step, plan)))))
    }

    /// Whether the step at `micro_batch` is kept.
    pub fn holds(&self, micro_batch: u64) -> bool {
        let kept = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        kept.as_ref().is_some_and(|(b, _, _)| *b == micro_batch)
    }

    /// The step and its memory plan at `micro_batch`, if kept, and no
    /// longer kept.
    pub fn take(&self, micro_batch: u64) -> Option<(Step, MemoryPlan)> {
        let mut kept = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match kept.take() {
            Some((b, step, plan)) if b == micro_batch => Some((step, plan)),
            other => {
                *kept = other;
                None
            }
        }
    }
}

impl Outcome {
    /// A choice that was not compiled: `bounded` by its states, or
    /// `dominated_by` a twin.
    fn not_compiled(choice: Choice, min_peak_bytes: u64, bounded: Option<StatesExceed>) -> Outcome {
        Outcome {
            choice,
            min_peak_bytes,
            best: None,
            bounded,
            fits_every: false,
            dominated_by: None,
            at_one: None,
            whole: Whole::default(),
        }
    }

    /// A compiled choice's outcome.
    fn compiled(choice: Choice, min_peak_bytes: u64, best: Option<Evaluation>, fits_every: bool) -> Outcome {
        Outcome {
            choice,
            min_peak_bytes,
            best,
            bounded: None,
            fits_every,
            dominated_by: None,
            at_one: None,
            whole: Whole::default(),
        }
    }

    /// With its memory at one sequence per micro-batch, if `memory` holds it.
    fn measured_at_one(self, memory: &HashMap<u64, MemorySummary>) -> Outcome {
        Outcome { at_one: memory.get(&1).cloned(), ..self }
    }
}

/// The tensor-parallel degrees the search tries: the pinned one, or each
/// divisor of the GPU count that fits inside a node (Megatron-LM keeps
/// tensor parallelism on NVLink: its all-reduces sit on the critical path)
/// and splits the model's heads and feed-forward evenly.
pub fn tensor_degrees(req: &Request) -> Vec<u64> {
    let micro_batch_divides =
        |t: u64| req.pins.micro_batch.is_none_or(|b| b > 0 && per_rank_at(req, t).is_multiple_of(b));
    model_tensor_degrees(req).into_iter().filter(|&t| splits_batch(req, t) && micro_batch_divides(t)).collect()
}

/// The tensor-parallel degrees the model and the nodes allow, whatever the
/// batch: the pinned one, else the divisors of the GPUs within a node.
pub fn model_tensor_degrees(req: &Request) -> Vec<u64> {
    if let Some(t) = req.pins.tensor_parallel {
        return vec![t];
    }
    divisors(req.cluster.world_size())
        .into_iter()
        .filter(|&t| t <= req.cluster.gpus_per_node.max(1) && check_tensor_parallel(req.model, t).is_ok())
        .collect()
}

/// Whether the global batch splits evenly over the data-parallel ranks
/// that `t` tensor ranks leave.
pub fn splits_batch(req: &Request, t: u64) -> bool {
    let ranks = req.cluster.world_size() / t.max(1);
    ranks > 0 && req.global_batch > 0 && req.global_batch.is_multiple_of(ranks)
}

/// Sequence parallelism at `t` tensor ranks: none with one rank; the pinned
/// choice; else both (it moves what tensor parallelism moves and keeps
/// `1/t` of the LayerNorm, dropout and residual activations, but adds a
/// small gradient all-reduce per LayerNorm and bias parameter, and a
/// sequence length that `t` does not divide cannot have it).
fn sequence_parallel_choices(req: &Request, t: u64) -> Vec<bool> {
    let possible = t > 1 && req.seq.is_multiple_of(t);
    match req.pins.sequence_parallel {
        Some(true) if possible => vec![true],
        Some(true) => Vec::new(),
        Some(false) => vec![false],
        None if possible => vec![false, true],
        None => vec![false],
    }
}

/// The choices the pins leave, in a fixed order.
pub fn choices(req: &Request) -> Vec<Choice> {
    let mut out = Vec::new();
    for tensor_parallel in tensor_degrees(req) {
        out.extend(data_parallel_choices(req, tensor_parallel));
    }
    out
}

/// The tiers offloaded states may live on: CPU memory, and the node's
/// NVMe where the cluster has it; the pinned one alone.
fn tiers(req: &Request) -> Vec<OffloadTo> {
    match req.pins.offload_to {
        Some(tier) => vec![tier],
        None if req.cluster.nvme.is_some() => vec![OffloadTo::Cpu, OffloadTo::Nvme],
        None => vec![OffloadTo::Cpu],
    }
}

/// The ZeRO × offload × tier × recomputation choices at one
/// tensor-parallel degree.
fn data_parallel_choices(req: &Request, tensor_parallel: u64) -> Vec<Choice> {
    let mut out = Vec::new();
    for zero_stage in 0..=3u8 {
        for offload in [Offload::None, Offload::Optimizer, Offload::OptimizerAndParams] {
            // ZeRO-Offload partitions what it moves: the optimizer needs
            // stage ≥ 1 (DeepSpeed's rule), the parameters stage 3.
            let allowed = match offload {
                Offload::None => true,
                Offload::Optimizer => zero_stage >= 1,
                Offload::OptimizerAndParams => zero_stage == 3,
            };
            // Nothing offloaded has no tier: it is listed once, as CPU,
            // unless the NVMe tier is pinned.
            let tiers = match offload {
                Offload::None if req.pins.offload_to == Some(OffloadTo::Nvme) => Vec::new(),
                Offload::None => vec![OffloadTo::Cpu],
                _ => tiers(req),
            };
            // The search tries the fixed policies; an `optimal` one only when pinned.
            let policies = req.pins.recompute.map_or(vec![Policy::None, Policy::Selective, Policy::Full], |r| vec![r]);
            for (offload_to, recompute) in tiers.iter().flat_map(|&t| policies.iter().map(move |&r| (t, r))) {
                let pins = &req.pins;
                if allowed
                    && pins.zero_stage.is_none_or(|z| z == zero_stage)
                    && pins.offload.is_none_or(|o| o == offload)
                {
                    for sequence_parallel in sequence_parallel_choices(req, tensor_parallel) {
                        let tiles = req.pins.tiles.unwrap_or(1);
                        out.push(Choice {
                            tensor_parallel,
                            sequence_parallel,
                            zero_stage,
                            offload,
                            offload_to,
                            recompute,
                            tiles,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The divisors of `n`, ascending.
pub fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1;
    while d * d <= n {
        if n.is_multiple_of(d) {
            small.push(d);
            if d * d != n {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// Sequences each data-parallel rank trains on per step under `choice`.
pub fn per_rank(req: &Request, choice: Choice) -> u64 {
    per_rank_at(req, choice.tensor_parallel)
}

/// Sequences each data-parallel rank trains on per step at `t` tensor ranks.
pub fn per_rank_at(req: &Request, t: u64) -> u64 {
    req.global_batch / (req.cluster.world_size() / t.max(1)).max(1)
}

/// Runs the search over `choices`; outcomes best first (fitting ones by
/// throughput, then the others by least memory). A choice whose model
/// states alone (with its checkpoints under full recomputation) exceed the
/// budget is not compiled, unless nothing fits:
/// then every choice is, so the nothing-fits answer gives each one's least
/// memory exactly.
pub fn search(req: &Request, machine: &Machine, choices: &[Choice]) -> Result<Vec<Outcome>, PlanError> {
    let aliases = selective_aliases(req, choices)?;
    let searched: Vec<Choice> = choices.iter().copied().filter(|c| !aliases.contains(c)).collect();
    let mut floors = Floors::default();
    let floors: Vec<_> = searched.iter().map(|&c| Ok((c, floors.of(req, c)?))).collect::<Result<_, PlanError>>()?;
    // Each choice compiles on its own, one task a choice (rayon's default
    // split runs neighbours in one task, one after the other); the cheaper
    // twins first, so the dearer ones they dominate are not compiled.
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(floors.len());
    for wave in 0..dominance::WAVES {
        let this_wave: Vec<_> = floors.iter().filter(|(c, _)| dominance::wave(c) == wave).collect();
        let found = this_wave
            .into_par_iter()
            .with_max_len(1)
            .map(|&(choice, (floor, exceeds))| {
                if let Some(exceeds) = exceeds {
                    let least =
                        if exceeds == StatesExceed::Checkpoints { floor.gpu + floor.checkpoints } else { floor.gpu };
                    return Ok(Outcome::not_compiled(choice, least, Some(exceeds)));
                }
                if let Some(twin) = dominance::dominator(choice, &outcomes).filter(|_| !req.exhaustive) {
                    return Ok(Outcome { dominated_by: Some(twin), ..Outcome::not_compiled(choice, 0, None) });
                }
                let _span = tracing::debug_span!("plan.choice", ?choice).entered();
                search_choice(req, machine, choice)
            })
            .collect::<Result<Vec<_>, PlanError>>()?;
        outcomes.extend(found);
    }
    // In the choices' order, each alias beside its twin's outcome.
    let mut outcomes: Vec<Outcome> = choices
        .iter()
        .map(|c| {
            let twin = if aliases.contains(c) { Choice { recompute: Policy::None, ..*c } } else { *c };
            let at = outcomes.iter().position(|o| o.choice == twin).expect("every searched choice has an outcome");
            if aliases.contains(c) { renamed(&outcomes[at], *c) } else { outcomes[at].clone() }
        })
        .collect();
    if req.pins.tiles.is_none() {
        let tiled = super::tiles::tiled_outcomes(req, machine, &outcomes, search_choice)?;
        outcomes.extend(tiled);
    }
    if outcomes.iter().all(|o| o.best.is_none()) {
        let bounded = |o: &&mut Outcome| o.bounded.is_some() && !aliases.contains(&o.choice);
        outcomes.par_iter_mut().filter(bounded).try_for_each(|o| -> Result<(), PlanError> {
            *o = Outcome { bounded: o.bounded, ..search_choice(req, machine, o.choice)? };
            Ok(())
        })?;
        for at in 0..outcomes.len() {
            let alias = outcomes[at].choice;
            if aliases.contains(&alias) {
                let twin = outcomes.iter().find(|o| o.choice == Choice { recompute: Policy::None, ..alias });
                outcomes[at] = renamed(twin.expect("an alias's twin is searched"), alias);
            }
        }
        let exact: Vec<Outcome> = outcomes
            .iter_mut()
            .filter(|o| o.bounded.is_some())
            .map(|o| {
                o.bounded = None;
                Outcome::not_compiled(o.choice, o.min_peak_bytes, None)
            })
            .collect();
        if req.pins.tiles.is_none() {
            outcomes.extend(super::tiles::tiled_outcomes(req, machine, &exact, search_choice)?);
        }
    }
    if req.pins.recompute.is_none() {
        let optimal = optimal_outcomes(req, machine, &outcomes)?;
        outcomes.extend(optimal);
    }
    outcomes.sort_by(|a, b| match (&a.best, &b.best) {
        (Some(x), Some(y)) => y.predicted.tokens_per_second.total_cmp(&x.predicted.tokens_per_second),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        // Dominated choices, not compiled, last.
        (None, None) => (a.dominated_by.is_some(), a.min_peak_bytes).cmp(&(b.dominated_by.is_some(), b.min_peak_bytes)),
    });
    Ok(outcomes)
}

/// The `selective` choices that plan as their `none` twins
/// ([`super::shared`]): searched once, as the twin.
fn selective_aliases(req: &Request, choices: &[Choice]) -> Result<Vec<Choice>, PlanError> {
    let twin_searched = |c: &Choice| choices.contains(&Choice { recompute: Policy::None, ..*c });
    let mut aliases = Vec::new();
    for &c in choices.iter().filter(|c| c.recompute == Policy::Selective && twin_searched(c)) {
        // The structure, not the size, decides: the shortest stack the
        // search compiles, at one sequence per micro-batch.
        let layers = if super::depth::repeats(req.model) { super::depth::SHORT } else { req.model.layers };
        let model = zeroplan_ir::spec::ModelSpec { layers, ..req.model.clone() };
        let (train, options) = super::evaluate::Step::options(req, c, c.data_ranks(req.cluster.world_size()), 1, 1);
        if req.shared.selective_is_none(&model, &train, &options)? {
            aliases.push(c);
        }
    }
    Ok(aliases)
}

/// `twin`'s outcome as `alias`'s: the same plan under another name.
fn renamed(twin: &Outcome, alias: Choice) -> Outcome {
    let mut outcome = twin.clone();
    outcome.choice = alias;
    if let Some(best) = &mut outcome.best {
        best.strategy.recompute = alias.recompute.name();
    }
    outcome
}

/// `optimal` recomputation for the choices where keeping every activation
/// does not fit the micro-batch full recomputation reaches: its budget is
/// the largest whose peak the steps that keep every activation and that
/// recompute every layer predict within the GPU's ([`super::optimal_budget`]),
/// corrected by the measured overshoot until the whole plan fits (a few
/// tries, most often one). It recomputes the least that fits, so at that
/// micro-batch it is never slower than `full`; a budget that leaves every layer recomputed is
/// `full`'s plan, and is not compiled again.
///
/// Nor is it faster than keeping every activation at that micro-batch
/// ([`super::dominance`]'s argument), which the short stacks estimate
/// cheaply; a choice whose bound is [`OPTIMAL_MARGIN`] below the fastest
/// plan found is not compiled: `optimal`'s probes compile the whole stack
/// (its budget is for all layers), bert-32t's 400 layers, tiled, 186k nodes.
/// Nor is one whose first budget recomputes enough layers whole that
/// [`recomputing_estimate`] puts it that far below: the budget is chosen on
/// the step before the `recompute` pass, the dear part of the compile.
fn optimal_outcomes(req: &Request, machine: &Machine, outcomes: &[Outcome]) -> Result<Vec<Outcome>, PlanError> {
    let world = req.cluster.world_size();
    let budget = req.cluster.budget_bytes();
    let fastest =
        outcomes.iter().filter_map(|o| o.best.as_ref()).map(|e| e.predicted.tokens_per_second).fold(0.0, f64::max);
    let best_of_choice = |c: Choice| outcomes.iter().find(|o| o.choice == c).and_then(|o| o.best.as_ref());
    let full: Vec<&Outcome> = outcomes.iter().filter(|o| o.choice.recompute == Policy::Full).collect();
    // One task a choice: most return at their bound in milliseconds, and
    // rayon's default split would leave two whole-stack compiles in one
    // task, one after the other, while the other core idles.
    let found = full.into_par_iter().with_max_len(1).map(|o| -> Result<Option<Outcome>, PlanError> {
        let Some(full) = &o.best else { return Ok(None) };
        let (ranks, per_rank) = (o.choice.data_ranks(world), per_rank(req, o.choice));
        let b = full.strategy.micro_batch;
        let keep = Choice { recompute: Policy::None, ..o.choice };
        if best_of_choice(keep).is_some_and(|e| e.strategy.micro_batch >= b) {
            return Ok(None);
        }
        let micro_batches = per_rank / b;
        let none = Probe::compile(req, keep, ranks, b, micro_batches)?;
        let (_, kept) = none.predict(req, machine, b, micro_batches)?;
        let beaten = |bound: f64| bound < (1.0 - OPTIMAL_MARGIN) * fastest && !req.exhaustive;
        if beaten(kept.tokens_per_second) {
            return Ok(None);
        }
        let peak_none = none.memory(req, b)?.peak_bytes;
        let choice_at = |budget_bytes| Choice { recompute: Policy::Optimal { budget_bytes }, ..o.choice };
        // The step before recomputation, which each try continues from.
        // The first try takes the weighed one; a later try (the first one's
        // plan overshot) builds it again rather than keep a copy: held
        // through the first try, a tiled 100T step's copy (1.1M nodes) was
        // 90–290 MB of the planner's peak, and on the identity grid of
        // `passes/tests/pruning.rs` no second try is made.
        let before = || Step::before_recompute(req, choice_at(0), ranks, b, micro_batches);
        let first = before()?;
        let weighed = crate::recompute::optimal::step_costs(&first, &super::evaluate::bindings(b, req.seq));
        let weighed = Arc::new(
            weighed.ok_or_else(|| PlanError::Compile("a tensor size is unbound after binding batch and seq".into()))?,
        );
        let costs = &weighed.costs;
        let mut first = Some(first);
        let model = super::optimal_budget::PeakModel::measured(costs, peak_none, full.memory.peak_bytes);
        let mut target = super::optimal_budget::first_target(costs, &model, budget);
        for attempt in 0..3 {
            // Whole MiB, so the policy's name reads `optimal:9625MiB`.
            target = target >> 20 << 20;
            let decision = crate::recompute::optimal::choose(costs, target);
            if decision.is_full() {
                return Ok(None); // Every layer recomputed: `full`'s plan, searched already.
            }
            // The first budget recomputes the least (the tries only tighten it).
            if attempt == 0 {
                let layer = crate::recompute::regions::Choice::Layer;
                let whole = decision.choices.values().filter(|&&c| c == layer).count();
                let share = whole as f64 / decision.choices.len().max(1) as f64;
                if beaten(recomputing_estimate(&kept, &full.predicted, share)) {
                    return Ok(None);
                }
            }
            let choice = choice_at(target);
            let graph = match first.take() {
                Some(graph) => graph,
                None => before()?,
            };
            let step = Step::after_training_step(req, choice, ranks, b, micro_batches, graph, Some(weighed.clone()))?;
            // A whole step, kept if its plan fits.
            let memory = match step.evaluate(req, machine, choice.strategy(world, b, micro_batches))? {
                (plan, Ok(best)) => {
                    let min_peak_bytes = best.memory.peak_bytes;
                    let whole = Whole::keep(b, step, plan);
                    return Ok(Some(Outcome { whole, ..Outcome::compiled(choice, min_peak_bytes, Some(best), false) }));
                }
                (_, Err(memory)) => memory,
            };
            if memory.peak_bytes <= budget {
                break; // It is the host or NVMe that does not fit: recomputing more cannot help.
            }
            // Tighten by the overshoot and a little more, from the bytes
            // this decision stored (a budget between them and the target
            // would choose it again).
            let over = memory.peak_bytes - budget;
            target = target.min(decision.cost.bytes).saturating_sub(over + over / 8 + (1 << 20));
        }
        Ok(None)
    });
    Ok(found.collect::<Result<Vec<_>, PlanError>>()?.into_iter().flatten().collect())
}

/// Tokens/s of an `optimal` plan that recomputes `share` of its layers
/// whole, estimated from the short stacks at its micro-batch: each such
/// layer recomputes, and re-gathers for it, what it does under `full`, so
/// its step is `kept`'s (every activation kept) and that share of the
/// time `full` adds; the other layers' partial recomputation is taken as
/// free, so the estimate errs fast: against the 53 probes `--exhaustive`
/// compiles for bert-32t (32 DGX-2s), bert-1t (one DGX-2) and bert-large
/// (8 A100, 12 GiB), 0.03% below to 8.2% above their compiled figure. A
/// choice whose estimate is [`OPTIMAL_MARGIN`] below the fastest plan found
/// is not compiled (bert-32t: TP-4+SP's 400-layer step, estimated 40.38
/// tokens/s against the fastest 45.87, compiled 40.39).
fn recomputing_estimate(kept: &Predicted, full: &Predicted, share: f64) -> f64 {
    let added = (full.step_seconds - kept.step_seconds).max(0.0) * share;
    kept.tokens_per_second * kept.step_seconds / (kept.step_seconds + added)
}

/// How far below the fastest plan found an `optimal` choice's bound must
/// be for it to be skipped: the bound is a short-stack estimate, which
/// `passes/tests/plan.rs` holds to 3% of whole planning; the margin keeps
/// that error from skipping a choice that would have won.
const OPTIMAL_MARGIN: f64 = 0.05;

/// Whether a plan's memory fits: its peak on each GPU, and what it
/// offloads on each node's host and NVMe.
pub fn fits(req: &Request, memory: &MemorySummary) -> bool {
    memory.peak_bytes <= req.cluster.budget_bytes()
        && req.cluster.host_fits(memory.host_bytes)
        && req.cluster.nvme_fits(memory.nvme_bytes)
}

/// One choice at every micro-batch its rank's sequences divide into: those
/// that accumulate gradients, and the whole per-rank batch at once.
fn search_choice(req: &Request, machine: &Machine, choice: Choice) -> Result<Outcome, PlanError> {
    let per_rank = per_rank(req, choice);
    let sizes: Vec<u64> =
        divisors(per_rank).into_iter().filter(|b| req.pins.micro_batch.is_none_or(|p| p == *b)).collect();
    let (accumulating, whole): (Vec<u64>, Vec<u64>) = sizes.iter().partition(|&&b| b < per_rank);
    if accumulating.is_empty() {
        if whole.is_empty() {
            return Err(PlanError::MicroBatch { micro_batch: req.pins.micro_batch.unwrap_or(0), per_rank });
        }
        return search_whole(req, machine, choice, per_rank);
    }
    // The two compile different steps (with and without accumulators):
    // at once where a core is free.
    let (accumulated, rest) = rayon::join(
        || search_accumulating(req, machine, choice, &accumulating, per_rank),
        || (!whole.is_empty()).then(|| search_whole(req, machine, choice, per_rank)).transpose(),
    );
    let Accumulated { best, min_peak_bytes, fits_every, memory } = accumulated?;
    let Some(rest) = rest? else {
        return Ok(Outcome::compiled(choice, min_peak_bytes, best, fits_every).measured_at_one(&memory));
    };
    let best = [best, rest.best]
        .into_iter()
        .flatten()
        .max_by(|x, y| x.predicted.tokens_per_second.total_cmp(&y.predicted.tokens_per_second));
    let min_peak_bytes = min_peak_bytes.min(rest.min_peak_bytes);
    let outcome = Outcome::compiled(choice, min_peak_bytes, best, fits_every && rest.fits_every);
    Ok(outcome.measured_at_one(&memory))
}

/// What the micro-batches that accumulate gradients gave.
struct Accumulated {
    /// The fastest that fits.
    best: Option<Evaluation>,
    /// The least peak: at the smallest micro-batch.
    min_peak_bytes: u64,
    /// Whether every one fits.
    fits_every: bool,
    /// The memory of each one measured.
    memory: HashMap<u64, MemorySummary>,
}

/// The micro-batches `accumulating` (ascending, each below `per_rank`):
/// the largest that fits by bisection, then the fastest of those that fit.
fn search_accumulating(
    req: &Request,
    machine: &Machine,
    choice: Choice,
    accumulating: &[u64],
    per_rank: u64,
) -> Result<Accumulated, PlanError> {
    let ranks = choice.data_ranks(req.cluster.world_size());
    let (first, last) = (accumulating[0], accumulating[accumulating.len() - 1]);
    let probe = Probe::compile(req, choice, ranks, last, per_rank / first)?;
    let mut memory: HashMap<u64, MemorySummary> = HashMap::new();
    // A micro-batch's peak, and whether it fits.
    let measure = |b: u64, memory: &mut HashMap<u64, MemorySummary>| -> Result<(u64, bool), PlanError> {
        let m = probe.memory(req, b)?;
        let measured = (m.peak_bytes, fits(req, &m));
        memory.insert(b, m);
        Ok(measured)
    };
    let (min_peak_bytes, least_fits) = measure(first, &mut memory)?;
    let mut fitting: &[u64] = &[];
    if least_fits {
        // Invariant: accumulating[..lo] fit, accumulating[hi..] do not.
        let (mut lo, mut hi) = (1, accumulating.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if measure(accumulating[mid], &mut memory)?.1 {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        fitting = &accumulating[..lo];
    }
    let best = best_of(req, machine, &probe, choice, fitting, per_rank, &memory)?;
    Ok(Accumulated { best, min_peak_bytes, fits_every: fitting.len() == accumulating.len(), memory })
}

/// The one micro-batch without accumulation: all of a rank's sequences.
fn search_whole(req: &Request, machine: &Machine, choice: Choice, per_rank: u64) -> Result<Outcome, PlanError> {
    let probe = Probe::compile(req, choice, choice.data_ranks(req.cluster.world_size()), per_rank, 1)?;
    let memory = probe.memory(req, per_rank)?;
    let min_peak_bytes = memory.peak_bytes;
    let fits = fits(req, &memory);
    let cache = HashMap::from([(per_rank, memory)]);
    let sizes: &[u64] = if fits { &[per_rank] } else { &[] };
    let best = best_of(req, machine, &probe, choice, sizes, per_rank, &cache)?;
    Ok(Outcome::compiled(choice, min_peak_bytes, best, fits).measured_at_one(&cache))
}

/// The fastest of the micro-batches `sizes` (all known to fit); `memory`
/// holds the summaries the bisection already made.
fn best_of(
    req: &Request,
    machine: &Machine,
    probe: &Probe,
    choice: Choice,
    sizes: &[u64],
    per_rank: u64,
    memory: &HashMap<u64, MemorySummary>,
) -> Result<Option<Evaluation>, PlanError> {
    let mut best: Option<(u64, CommSummary, Predicted)> = None;
    for &b in sizes {
        let (comm, predicted) = probe.predict(req, machine, b, per_rank / b)?;
        if best.as_ref().is_none_or(|(_, _, p)| predicted.tokens_per_second > p.tokens_per_second) {
            best = Some((b, comm, predicted));
        }
    }
    let Some((b, comm, predicted)) = best else { return Ok(None) };
    let memory = match memory.get(&b) {
        Some(m) => m.clone(),
        None => probe.memory(req, b)?,
    };
    let strategy = choice.strategy(req.cluster.world_size(), b, per_rank / b);
    Ok(Some(Evaluation { strategy, memory, comm, predicted }))
}
