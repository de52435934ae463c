//! The planner: from a model, a training spec and a cluster to the plan
//! with the highest predicted throughput that fits in memory.
//!
//! [`search`] tries every choice of ZeRO stage × offload × recomputation
//! (less what the user pinned, and less what [`dominance`] shows cannot
//! win) at the micro-batches that fit, and [`tiles`]
//! the tile counts of ZeRO-3 choices whose gathered operators do not fit, judging
//! memory with the memory pass and time with the cost model; [`depth`]
//! makes that cheap for deep models by planning each distinct layer once.
//! The winner is then compiled and planned whole — its figures in the plan
//! are exact, not extrapolated — and [`program`] lays out what the runtime
//! executes. [`explain`] says why the runner-up lost, or, when nothing
//! fits, what budget or GPU count would make each choice fit. [`capacity`]
//! asks the reverse question: the largest model of a family that fits.

pub mod capacity;
pub mod depth;
pub mod dominance;
pub mod evaluate;
pub mod explain;
pub mod floor;
pub mod optimal_budget;
pub mod program;
pub mod search;
pub mod shared;
pub mod tier;
pub mod tiles;

use rayon::prelude::*;
use zeroplan_ir::DType;
use zeroplan_ir::plan::{
    Attention, Candidate, ClusterDescription, Offload, OffloadTo, PLAN_FORMAT, Plan, RunnerUp, Workload,
};
use zeroplan_ir::spec::{Cluster, ModelSpec, Precision, TrainingSpec};

use crate::cost::Machine;
use crate::recompute::Policy;
use evaluate::{Evaluation, Step};
pub use explain::Shortfall;
use search::Outcome;

/// Choices the user fixed; the search varies the rest.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pins {
    pub tensor_parallel: Option<u64>,
    /// The offload tier (`--offload-to`); `None`: CPU memory, and NVMe
    /// too where the cluster has it.
    pub offload_to: Option<OffloadTo>,
    /// Sequence parallelism on or off (`None`: the search tries both where
    /// there are several tensor ranks).
    pub sequence_parallel: Option<bool>,
    pub zero_stage: Option<u8>,
    pub offload: Option<Offload>,
    pub recompute: Option<Policy>,
    pub micro_batch: Option<u64>,
    /// Tiles of the largest gathered operator (`--tiles`; `None`: the
    /// search tiles ZeRO-3 choices that do not fit untiled).
    pub tiles: Option<u64>,
    /// How attention runs (`--attention`): never searched, since fused
    /// attention does the same FLOPs with less memory traffic and memory.
    pub attention: Attention,
}

/// What to plan.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    pub model: &'a ModelSpec,
    pub train: TrainingSpec,
    pub cluster: Cluster,
    /// Tokens per sequence.
    pub seq: u64,
    /// Sequences per optimizer step over all ranks.
    pub global_batch: u64,
    pub pins: Pins,
    /// Search deep independent stacks by two short ones ([`depth`]); off,
    /// every candidate is compiled whole.
    pub extrapolate_depth: bool,
    /// Compile every choice, the dominated ones ([`dominance`]) too:
    /// slower, for checking and for every candidate's figures.
    pub exhaustive: bool,
    /// The graphs the search's choices share ([`shared`]); [`plan`] starts
    /// with an empty store whatever this holds.
    pub shared: shared::Shared,
    /// How the ranks launch their instructions (the launch term's).
    pub launches: zeroplan_ir::plan::Launches,
}

/// Why no plan came out.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    Compile(String),
    #[error(
        "the global batch of {global_batch} sequences does not split over {ranks} data-parallel ranks \
         (the GPUs over the largest tensor-parallel degree): use a multiple of {ranks} (e.g. --global-batch {})",
        global_batch.div_ceil(*ranks).max(1) * ranks
    )]
    Batch { global_batch: u64, ranks: u64 },
    #[error(
        "--micro-batch {micro_batch} does not divide the {per_rank} sequences each GPU trains on per step: \
         use one of {}",
        search::divisors(*per_rank).iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
    )]
    MicroBatch { micro_batch: u64, per_rank: u64 },
    #[error("the {gpu} has no tensor cores for {precision}: use --precision {instead}")]
    Precision { gpu: String, precision: &'static str, instead: &'static str },
    #[error("--zero {0}: ZeRO has stages 0 to 3")]
    Stage(u8),
    #[error("--sp: {0}")]
    SequenceParallel(String),
    #[error("--tp {tensor_parallel}: {why}")]
    TensorParallel { tensor_parallel: u64, why: String },
    #[error(
        "--offload-to nvme: the cluster has no NVMe tier: give each node's drives with --nvme SIZE \
         (e.g. --nvme 28TiB for a DGX-2)"
    )]
    NoNvme,
    #[error("the pins leave nothing to search: {0}")]
    Pins(String),
    #[error("{}", explain::nothing_fits_text(.cluster, .shortfalls))]
    NothingFits { cluster: explain::SearchedOn, shortfalls: Vec<Shortfall> },
}

/// The dtype GEMMs compute in under `precision`.
pub fn compute_dtype(precision: Precision) -> DType {
    match precision {
        Precision::F32 => DType::F32,
        Precision::Bf16 => DType::BF16,
        Precision::F16(_) => DType::F16,
    }
}

pub fn precision_name(precision: Precision) -> &'static str {
    match precision {
        Precision::F32 => "f32",
        Precision::Bf16 => "bf16",
        Precision::F16(_) => "f16",
    }
}

/// Plans `req`: the fastest strategy that fits, compiled and placed.
pub fn plan(req: &Request) -> Result<Plan, PlanError> {
    let req = &Request { shared: shared::Shared::default(), ..req.clone() };
    let machine = check(req)?;
    let choices = search::choices(req);
    if choices.is_empty() && req.pins.sequence_parallel == Some(true) {
        return Err(PlanError::SequenceParallel(format!(
            "no tensor-parallel degree the search may use (a divisor of the GPU count within a node that splits \
             the model) divides the sequence of {} tokens: pin --tp, or leave --sp to the search",
            req.seq
        )));
    }
    if choices.is_empty() {
        return Err(PlanError::Pins("offloading the optimizer needs ZeRO stage ≥ 1, the parameters stage 3".into()));
    }
    let outcomes = {
        let _span = tracing::info_span!("plan.search", choices = choices.len()).entered();
        search::search(req, &machine, &choices)?
    };
    if outcomes.iter().all(|o| o.best.is_none()) {
        let _span = tracing::info_span!("plan.nothing_fits").entered();
        return Err(explain::nothing_fits(req, &outcomes)?);
    }
    // Each `full` outcome's `optimal` twin planned whole, where the exact
    // stage may lean on it (before that stage takes the whole steps).
    let lighter: Vec<Option<usize>> =
        outcomes.iter().map(|o| dominance::lighter_twin(o, &outcomes).filter(|_| !req.exhaustive)).collect();
    let ((winner, step, memory_plan), beaten, unfit) = exact_best(req, &machine, &outcomes, &lighter)?;
    let unfit_peak = |c: evaluate::Choice| unfit.iter().find(|(u, _)| *u == c).map(|&(_, peak)| peak);
    // The fastest other choice: exact where it was compiled whole, else the
    // search's estimate (the first of equals, as the search listed them).
    // Not the winner's twin: a choice the search predicts as the same plan
    // (`explain::same_plan`, estimate against estimate) is no alternative;
    // nor a choice whose exact plan did not fit.
    let estimate = |c: evaluate::Choice| outcomes.iter().find(|o| o.choice == c).and_then(|o| o.best.as_ref());
    let twin = |c: evaluate::Choice| {
        estimate(c).zip(estimate(step.0)).is_some_and(|(e, w)| c != step.0 && explain::same_plan(e, w))
    };
    // Nor a `full` choice whose `optimal` twin, planned whole, it cannot beat.
    let estimates = outcomes
        .iter()
        .zip(&lighter)
        .filter(|(o, _)| o.choice != step.0 && !twin(o.choice) && !beaten.iter().any(|(c, _)| *c == o.choice))
        .filter(|(o, lighter)| unfit_peak(o.choice).is_none() && lighter.is_none())
        .filter_map(|(o, _)| o.best.as_ref());
    let fastest_first =
        |a: &&Evaluation, b: &&Evaluation| b.predicted.tokens_per_second.total_cmp(&a.predicted.tokens_per_second);
    let exact_losers = beaten.iter().filter(|(c, _)| !twin(*c)).map(|(_, e)| e);
    let runner_up = exact_losers.chain(estimates).min_by(fastest_first).map(|r| RunnerUp {
        strategy: r.strategy.clone(),
        peak_bytes: r.memory.peak_bytes,
        step_seconds: r.predicted.step_seconds,
        tokens_per_second: r.predicted.tokens_per_second,
        reason: explain::why_slower(&winner, r),
    });
    // Each candidate with its figures: exact for the winner, its twins and
    // the choices compiled whole to check it, else the search's estimate; a
    // choice whose exact plan did not fit, its least exact peak.
    let figures = |o: &Outcome| -> Option<(u64, f64)> {
        if unfit_peak(o.choice).is_some() {
            return None;
        }
        let exact = if o.choice == step.0 || twin(o.choice) {
            Some(&winner)
        } else {
            beaten.iter().find(|(c, _)| *c == o.choice).map(|(_, e)| e)
        };
        exact.or(o.best.as_ref()).map(|e| (e.memory.peak_bytes, e.predicted.tokens_per_second))
    };
    let lighter_strategy = |at: Option<usize>| at.and_then(|t| outcomes[t].best.as_ref()).map(|e| e.strategy.clone());
    let candidates: Vec<Candidate> = outcomes
        .iter()
        .zip(&lighter)
        .map(|(o, &lighter)| Candidate {
            strategy: match &o.best {
                // The winner's exact plan may use a smaller micro-batch than its estimate.
                _ if o.choice == step.0 => winner.strategy.clone(),
                Some(b) => b.strategy.clone(),
                None => o.choice.strategy(req.cluster.world_size(), 1, 0),
            },
            peak_bytes: figures(o).map_or_else(|| unfit_peak(o.choice).unwrap_or(o.min_peak_bytes), |(peak, _)| peak),
            min_peak_bytes: o.min_peak_bytes,
            fits: o.best.is_some() && unfit_peak(o.choice).is_none(),
            tokens_per_second: figures(o).map(|(_, speed)| speed),
            states_exceed: o.bounded,
            dominated_by: o.dominated_by.and_then(&estimate).map(|e| e.strategy.clone()),
            recomputes_more_than: lighter_strategy(lighter),
        })
        .collect();
    // The winner first, then the fastest; those that do not fit keep the
    // search's order (least memory first). A choice its lighter twin
    // bounds ranks at the twin's figure, not its estimate, right after it.
    let rank: Vec<Option<f64>> = candidates
        .iter()
        .zip(&lighter)
        .map(|(c, lighter)| lighter.map_or(c.tokens_per_second, |t| figures(&outcomes[t]).map(|(_, speed)| speed)))
        .collect();
    let at = outcomes.iter().position(|o| o.choice == step.0).expect("the winner is a candidate");
    let mut ranked: Vec<(Option<f64>, Candidate)> = rank.into_iter().zip(candidates).collect();
    let first = ranked.remove(at);
    ranked.sort_by(|(a, x), (b, y)| {
        let order = match (a, b) {
            (Some(a), Some(b)) => b.total_cmp(a),
            (a, b) => b.is_some().cmp(&a.is_some()),
        };
        order.then(x.recomputes_more_than.is_some().cmp(&y.recomputes_more_than.is_some()))
    });
    let candidates: Vec<Candidate> = std::iter::once(first).chain(ranked).map(|(_, c)| c).collect();
    // The check and the buffers only read the step: at once, the names
    // indexed beside the check's per-node part, which asks for them last
    // (on a tiled 100T step, two million nodes: 0.25 s for the index, 0.3 s
    // for the buffers, 0.6 s for the per-node checks where the memory plan
    // left no time to make them).
    let (checked, buffers) = rayon::join(
        || step.1.verify(),
        || {
            step.1.graph.index_names();
            program::buffers(&step.1.graph, &memory_plan)
        },
    );
    checked.map_err(|e| PlanError::Compile(format!("{}: the compiled step is malformed: {e}", step.0)))?;
    let graph = step.1.graph;
    let plan = Plan {
        format: PLAN_FORMAT,
        model: req.model.name.clone(),
        params: graph.model_parameter_count(),
        cluster: ClusterDescription {
            gpu: req.cluster.gpu.clone(),
            nodes: req.cluster.nodes,
            gpus_per_node: req.cluster.gpus_per_node,
            budget_bytes: req.cluster.budget_bytes(),
            host_memory_bytes: req.cluster.host_memory,
            nvme: req.cluster.nvme,
        },
        workload: Workload {
            seq: req.seq,
            global_batch: req.global_batch,
            precision: precision_name(req.train.precision).to_string(),
            attention: req.pins.attention,
        },
        program: program::with_buffers(graph, buffers, &memory_plan, winner.strategy.micro_batch, req.seq),
        train: Some(TrainingSpec { micro_batches: winner.strategy.micro_batches, ..req.train.clone() }),
        strategy: winner.strategy,
        memory: winner.memory,
        comm: winner.comm,
        predicted: winner.predicted,
        runner_up,
        candidates,
    };
    // What the search and the memory plan leave is freed off the critical
    // path: a deep step's intervals and probes take a tenth of a second.
    let shared = req.shared.take_graphs();
    rayon::spawn(move || drop((outcomes, memory_plan, shared)));
    Ok(plan)
}

/// The request's own errors, before any search; the machine it runs on.
fn check(req: &Request) -> Result<Machine, PlanError> {
    let world = req.cluster.world_size();
    if let Some(t) = req.pins.tensor_parallel {
        let why = if t == 0 || !world.is_multiple_of(t) {
            Some(format!("the {world} GPUs do not split into groups of {t}: use a divisor of {world}"))
        } else {
            zeroplan_ir::build::check_tensor_parallel(req.model, t).err()
        };
        if let Some(why) = why {
            return Err(PlanError::TensorParallel { tensor_parallel: t, why });
        }
    }
    if req.pins.sequence_parallel == Some(true) {
        let why = match req.pins.tensor_parallel {
            Some(1) => Some("sequence parallelism splits the sequence over the tensor-parallel ranks: pin --tp 2 or more (or leave --tp to the search)".to_string()),
            Some(t) if !req.seq.is_multiple_of(t) => Some(format!(
                "the {t} tensor ranks do not divide the sequence of {} tokens: use a --seq that is a multiple of {t}",
                req.seq
            )),
            None if req.cluster.gpus_per_node < 2 && req.cluster.world_size() < 2 => {
                Some("sequence parallelism needs at least two GPUs for its tensor ranks".to_string())
            }
            _ => None,
        };
        if let Some(why) = why {
            return Err(PlanError::SequenceParallel(why));
        }
    }
    // The data-parallel ranks split the batch at some tensor-parallel
    // degree the search may try (the search tries only those).
    let allowed = search::model_tensor_degrees(req);
    let degrees: Vec<u64> = allowed.iter().copied().filter(|&t| search::splits_batch(req, t)).collect();
    if degrees.is_empty() {
        let most = allowed.into_iter().max().unwrap_or(1);
        return Err(PlanError::Batch { global_batch: req.global_batch, ranks: (world / most).max(1) });
    }
    if req.pins.tiles == Some(0) {
        return Err(PlanError::Pins("--tiles 0: an operator is at least one tile (1: untiled)".into()));
    }
    if req.pins.offload_to == Some(OffloadTo::Nvme) && req.cluster.nvme.is_none() {
        return Err(PlanError::NoNvme);
    }
    if req.pins.offload_to == Some(OffloadTo::Nvme) && req.pins.offload == Some(Offload::None) {
        return Err(PlanError::Pins(
            "--offload-to nvme places what is offloaded, and --offload none offloads nothing: \
             pin --offload optimizer or optimizer+params, or leave it to the search"
                .into(),
        ));
    }
    if let Some(z) = req.pins.zero_stage.filter(|z| *z > 3) {
        return Err(PlanError::Stage(z));
    }
    if let Some(b) = req.pins.micro_batch
        && search::tensor_degrees(req).is_empty()
    {
        return Err(PlanError::MicroBatch { micro_batch: b, per_rank: search::per_rank_at(req, degrees[0]) });
    }
    let dtype = compute_dtype(req.train.precision);
    if req.cluster.gpu.peak_flops(dtype).is_none() {
        let instead = if req.cluster.gpu.peak_flops(DType::F16).is_some() { "f16" } else { "f32" };
        return Err(PlanError::Precision {
            gpu: req.cluster.gpu.name.clone(),
            precision: precision_name(req.train.precision),
            instead,
        });
    }
    Ok(Machine { cluster: req.cluster.clone(), dtype, offload_to: OffloadTo::Cpu, launches: req.launches })
}

/// A choice compiled and planned whole: its evaluation, the compiled step
/// and the step's memory plan.
type Exact = (Evaluation, (evaluate::Choice, Step), crate::memory::MemoryPlan);

/// Choices the search estimated to fit whose exact plans, compiled and
/// planned whole, fit at no micro-batch: each with the least exact peak.
type Unfit = Vec<(evaluate::Choice, u64)>;

/// Choices compiled whole to check the winner, slower than it: each with
/// its exact figures.
type Beaten = Vec<(evaluate::Choice, Evaluation)>;

/// The best outcome compiled and planned whole, and its place in
/// `outcomes`. The search's figures for deep models are extrapolated; where
/// the exact plan no longer fits, the next smaller micro-batch of the same
/// choice is tried, then the next choice (the one that did not fit goes to
/// `unfit`). Outcomes in `ahead` were compiled already.
fn exact_winner(
    req: &Request,
    machine: &Machine,
    outcomes: &[Outcome],
    unfit: &mut Unfit,
    ahead: &mut Ahead,
) -> Result<(usize, Exact), PlanError> {
    let budget = req.cluster.budget_bytes();
    for (at, outcome) in outcomes.iter().enumerate() {
        let compiled = match ahead.take(at) {
            Some(compiled) => compiled?,
            None => exact(req, machine, outcome)?,
        };
        match compiled {
            Ok(exact) => return Ok((at, exact)),
            Err(peak) if outcome.best.is_some() => unfit.push((outcome.choice, peak)),
            Err(_) => {}
        }
    }
    let smallest_peak = unfit.iter().map(|&(_, peak)| peak).min().unwrap_or(u64::MAX);
    Err(PlanError::Compile(format!(
        "the search's estimates fit but no exact plan does (least peak {smallest_peak} bytes, budget {budget}): \
         a bug in the depth extrapolation; plan again with a larger --memory"
    )))
}

/// What [`exact`] gave for one outcome.
type Compiled = Result<Result<Exact, u64>, PlanError>;

/// Exact plans compiled ahead of need, by place in the outcomes.
#[derive(Default)]
struct Ahead(Vec<(usize, Compiled)>);

impl Ahead {
    /// The first outcome and the next distinct one at once where the
    /// second may be needed.
    ///
    /// The first compiles whole on one core while the other idles. The
    /// next outcome that is not the first's twin (`explain::same_plan`: the
    /// same plan under another name, bert-large's ZeRO-1 and ZeRO-2) is
    /// needed if the first does not fit exactly, or if its estimate beats
    /// the first's exact figure, which lies within the depth
    /// extrapolation's [`DEPTH_ERROR`] of its estimate: where the estimates
    /// are that close, it is compiled on the idle core rather than after.
    fn compile(req: &Request, machine: &Machine, outcomes: &[Outcome]) -> Ahead {
        let Some(first) = outcomes.first().and_then(|o| o.best.as_ref()) else { return Ahead::default() };
        let next = outcomes
            .iter()
            .enumerate()
            .skip(1)
            .find_map(|(at, o)| o.best.as_ref().filter(|e| !explain::same_plan(e, first)).map(|e| (at, e)));
        let Some((at, second)) = next else { return Ahead::default() };
        let close =
            second.predicted.tokens_per_second > (1.0 + TIE) * (1.0 - DEPTH_ERROR) * first.predicted.tokens_per_second;
        if !close {
            return Ahead::default();
        }
        let (a, b) = rayon::join(|| exact(req, machine, &outcomes[0]), || exact(req, machine, &outcomes[at]));
        Ahead(vec![(0, a), (at, b)])
    }

    fn take(&mut self, at: usize) -> Option<Compiled> {
        let i = self.0.iter().position(|(a, _)| *a == at)?;
        Some(self.0.swap_remove(i).1)
    }
}

/// How far an estimate extrapolated from the short stacks may lie from the
/// whole plan's figure: `passes/tests/plan.rs` holds the line to 3 %.
const DEPTH_ERROR: f64 = 0.03;

/// `outcome`'s choice compiled and planned whole at its estimated
/// micro-batch, else the largest smaller one that fits; where none does,
/// the least peak seen (`u64::MAX` where the search estimated none).
fn exact(req: &Request, machine: &Machine, outcome: &Outcome) -> Result<Result<Exact, u64>, PlanError> {
    let world = req.cluster.world_size();
    let mut smallest_peak = u64::MAX;
    let Some(best) = &outcome.best else { return Ok(Err(smallest_peak)) };
    let (ranks, per_rank) = (outcome.choice.data_ranks(world), search::per_rank(req, outcome.choice));
    let sizes: Vec<u64> = search::divisors(per_rank)
        .into_iter()
        .filter(|&b| b <= best.strategy.micro_batch && req.pins.micro_batch.is_none_or(|p| p == b))
        .rev()
        .collect();
    for b in sizes {
        let strategy = outcome.choice.strategy(world, b, per_rank / b);
        let (step, (memory_plan, evaluated)) = match outcome.whole.take(b) {
            // The search's evaluation of that step is exact, and fits.
            Some((step, plan)) => (step, (plan, Ok(best.clone()))),
            None => {
                let step = Step::compile(req, req.model, outcome.choice, ranks, b, per_rank / b)?;
                let evaluated = step.evaluate(req, machine, strategy)?;
                (step, evaluated)
            }
        };
        match evaluated {
            Ok(evaluation) => return Ok(Ok((evaluation, (outcome.choice, step), memory_plan))),
            Err(memory) => smallest_peak = smallest_peak.min(memory.peak_bytes),
        }
    }
    Ok(Err(smallest_peak))
}

/// How many estimates the exact stage compiles whole at most, fastest
/// first: the first winner, where it is an estimate, and the choices whose
/// estimates beat the winner's exact figure.
const WHOLE_COMPILES: usize = 4;

/// How much faster one plan must be than another not to tie with it: 0.1 %.
pub const TIE: f64 = 0.001;

/// `a` is faster than `b` by more than a [`TIE`].
fn faster(a: &Evaluation, b: &Evaluation) -> bool {
    a.predicted.tokens_per_second > (1.0 + TIE) * b.predicted.tokens_per_second
}

/// The winner, the exact figures of the choices it beat whole, and the
/// choices whose exact plans did not fit.
///
/// A deep model's estimates come from a line through two short stacks
/// ([`depth`]), so the next choice's estimate can beat the winner's exact
/// figure (bert-base on 8 A100s: 91.4 against 92.3 ms). Such a choice is
/// compiled whole too, and the faster exact plan wins; the user never
/// reads a runner-up faster than the plan they got.
///
/// The first winner is the fastest plan the search already planned whole
/// (an `optimal` probe's, exact at no cost), where there is one; else the
/// fastest estimate, compiled whole. Either way only estimates that beat
/// the exact winner are compiled after it, and not a `full` choice whose
/// `optimal` twin the search planned whole (`lighter`: it can at best tie
/// the twin, [`dominance::lighter_twin`]).
fn exact_best(
    req: &Request,
    machine: &Machine,
    outcomes: &[Outcome],
    lighter: &[Option<usize>],
) -> Result<(Exact, Beaten, Unfit), PlanError> {
    let mut unfit = Unfit::new();
    let mut ahead = Ahead::default();
    let planned = outcomes.iter().position(|o| o.best.as_ref().is_some_and(|e| o.whole.holds(e.strategy.micro_batch)));
    let (at, mut winner) = match planned {
        Some(at) => match exact(req, machine, &outcomes[at])? {
            Ok(exact) => (at, exact),
            Err(_) => return Err(PlanError::Compile("a step the search planned whole and kept does not fit".into())),
        },
        None => {
            ahead = Ahead::compile(req, machine, outcomes);
            exact_winner(req, machine, outcomes, &mut unfit, &mut ahead)?
        }
    };
    // The choices whose estimates beat the winner's exact figure (the
    // fastest first: before a winner planned in the search, after one
    // compiled here) are compiled whole at once; then weighed in order,
    // each against the winner so far (faster with each change, so no later
    // choice is weighed that the first exact winner would not have let
    // through).
    let (rest, rechecks) =
        if planned.is_some() { (0..at, WHOLE_COMPILES) } else { (at + 1..outcomes.len(), WHOLE_COMPILES - 1) };
    let contenders: Vec<(usize, &Outcome)> = rest
        .filter(|&place| lighter[place].is_none())
        .map(|place| (place, &outcomes[place]))
        .take(rechecks)
        .take_while(|(_, o)| o.best.as_ref().is_some_and(|estimate| faster(estimate, &winner.0)))
        .collect();
    let early: Vec<Option<Compiled>> = contenders.iter().map(|&(place, _)| ahead.take(place)).collect();
    // One whole compile a task, less those compiled ahead.
    let compiled: Vec<Compiled> = (&contenders, early)
        .into_par_iter()
        .with_max_len(1)
        .map(|(&(_, o), early)| early.unwrap_or_else(|| exact(req, machine, o)))
        .collect();
    let mut beaten = Vec::new();
    for ((_, outcome), compiled) in contenders.into_iter().zip(compiled) {
        match &outcome.best {
            Some(estimate) if faster(estimate, &winner.0) => {}
            _ => break,
        }
        let candidate = match compiled? {
            Ok(candidate) => candidate,
            Err(peak) => {
                unfit.push((outcome.choice, peak));
                continue;
            }
        };
        let loser = if faster(&candidate.0, &winner.0) { std::mem::replace(&mut winner, candidate) } else { candidate };
        beaten.push((loser.1.0, loser.0));
    }
    Ok((winner, beaten, unfit))
}
