//! One choice compiled for the search, and its figures at a micro-batch:
//! memory from the memory pass, communication and time from the cost model.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use zeroplan_ir::plan::{
    Attention, CollectiveTraffic, CommSummary, DataParallel, MemorySummary, Offload, OffloadTo, Predicted, Strategy,
    offload_label,
};
use zeroplan_ir::spec::{ModelSpec, TrainingSpec};
use zeroplan_ir::{Bindings, Graph, NodeChecks, NodeIndex, Op, Phase, Value, VerifyError};

use super::search::fits;
use super::shared::SHARED_THROUGH;
use super::{PlanError, Request};
use crate::cost::{self, Machine};
use crate::manager::PassOptions;
use crate::memory::{self, Category, MemoryPlan};
use crate::pipeline::{Resume, Target, compile_between};
use crate::recompute::Policy;
use crate::recompute::optimal::Weighed;
use std::sync::{Arc, OnceLock};

/// A strategy less its micro-batch: what `--tp`, `--zero`, `--offload`,
/// `--offload-to`, `--recompute` and `--tiles` pin, and what the runner-up
/// differs from the winner in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Tensor-parallel ranks per data-parallel replica.
    pub tensor_parallel: u64,
    /// Sequence parallelism over them (only with more than one).
    pub sequence_parallel: bool,
    pub zero_stage: u8,
    pub offload: Offload,
    /// The tier what `offload` moves lives on (CPU without offload).
    pub offload_to: OffloadTo,
    pub recompute: Policy,
    /// Tiles of the largest gathered operator (the `tiling` pass); 1: none.
    pub tiles: u64,
}

impl Choice {
    /// The data-parallel ranks (ZeRO's `N_d`) of `world` GPUs.
    pub fn data_ranks(&self, world: u64) -> u64 {
        world / self.tensor_parallel
    }

    /// The strategy on `world` GPUs.
    pub fn strategy(&self, world: u64, micro_batch: u64, micro_batches: u64) -> Strategy {
        Strategy {
            ranks: self.data_ranks(world),
            tensor_parallel: self.tensor_parallel,
            sequence_parallel: self.sequence_parallel,
            zero_stage: self.zero_stage,
            offload: self.offload,
            offload_to: self.offload_to,
            recompute: self.recompute.name(),
            micro_batch,
            micro_batches,
            tiles: self.tiles,
        }
    }
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.tensor_parallel > 1 {
            let sp = if self.sequence_parallel { "+SP" } else { "" };
            write!(f, "TP-{}{sp} ", self.tensor_parallel)?;
        }
        let offload = offload_label(self.offload, self.offload_to);
        write!(f, "ZeRO-{} offload {offload} recompute {}", self.zero_stage, self.recompute.name())?;
        if self.tiles > 1 {
            write!(f, " tiles {}", self.tiles)?;
        }
        Ok(())
    }
}

/// A candidate's figures.
#[derive(Clone, Debug)]
pub struct Evaluation {
    pub strategy: Strategy,
    pub memory: MemorySummary,
    pub comm: CommSummary,
    pub predicted: Predicted,
}

/// A training step compiled for one choice, in schedule order.
pub struct Step {
    pub graph: Graph,
    pub order: Vec<NodeIndex>,
    /// Where its host-placed model states live.
    pub offload_to: OffloadTo,
    /// The whole model's step, which may become the plan (not a short
    /// stack the search extrapolates from).
    whole: bool,
    /// Its nodes' checks, made on a spare core while its memory plan was
    /// being finished ([`Step::evaluate`]): the plan's step is verified
    /// once chosen ([`Step::verify`]), and these are most of that.
    checked: OnceLock<NodeChecks>,
}

impl Step {
    /// Compiles `model`'s step for `choice` over `ranks` data-parallel
    /// ranks (of `choice.tensor_parallel` tensor ranks each), accumulating `micro_batches` micro-batches (the graph only
    /// depends on whether there is more than one), its cost decisions
    /// (matmul merging) made for `hint_batch` sequences per micro-batch.
    pub fn compile(
        req: &Request,
        model: &ModelSpec,
        choice: Choice,
        ranks: u64,
        hint_batch: u64,
        micro_batches: u64,
    ) -> Result<Step, PlanError> {
        let (train, options) = Step::options(req, choice, ranks, hint_batch, micro_batches);
        // The search's short stacks share their first passes; a deep model
        // compiled whole (the winner, `optimal` recomputation) is compiled
        // straight through: copying its shared graph cost more than it saved
        // (bert-1t: 12.0 s against 14.1 s).
        let from = if model.layers <= super::depth::LONG {
            let shared =
                req.shared.prefix(model, &train, &options).map_err(|e| PlanError::Compile(format!("{choice}: {e}")))?;
            Resume::After { graph: Box::new((*shared).clone()), after: SHARED_THROUGH }
        } else {
            Resume::Build
        };
        Step::resume(model, choice, &train, options, from, model.layers == req.model.layers)
    }

    /// The whole model's step for `choice` through [`SHARED_THROUGH`], the
    /// last pass before `recompute`: what an `optimal` policy weighs ([`crate::recompute::optimal::step_costs`])
    /// and [`Step::after_training_step`] continues from.
    pub fn before_recompute(
        req: &Request,
        choice: Choice,
        ranks: u64,
        hint_batch: u64,
        micro_batches: u64,
    ) -> Result<Graph, PlanError> {
        let (train, options) = Step::options(req, choice, ranks, hint_batch, micro_batches);
        compile_between(req.model, &Target::Training(&train), options, Resume::Build, Some(SHARED_THROUGH))
            .map(|compiled| compiled.graph)
            .map_err(|e| PlanError::Compile(format!("{choice}: {e}")))
    }

    /// The whole model's step for `choice` from `graph`, which
    /// [`Step::before_recompute`] made with the same arguments but the
    /// recomputation policy, and which `weighed` weighs, if given.
    pub fn after_training_step(
        req: &Request,
        choice: Choice,
        ranks: u64,
        hint_batch: u64,
        micro_batches: u64,
        graph: Graph,
        weighed: Option<Arc<Weighed>>,
    ) -> Result<Step, PlanError> {
        let (train, options) = Step::options(req, choice, ranks, hint_batch, micro_batches);
        let options = PassOptions { weighed, ..options };
        let from = Resume::After { graph: Box::new(graph), after: SHARED_THROUGH };
        Step::resume(req.model, choice, &train, options, from, true)
    }

    /// The passes from `from` to the last, in schedule order.
    fn resume(
        model: &ModelSpec,
        choice: Choice,
        train: &TrainingSpec,
        options: PassOptions,
        from: Resume,
        whole: bool,
    ) -> Result<Step, PlanError> {
        let graph = compile_between(model, &Target::Training(train), options, from, None)
            .map_err(|e| PlanError::Compile(format!("{choice}: {e}")))?
            .graph;
        let order = graph.topo_order();
        Ok(Step { graph, order, offload_to: choice.offload_to, whole, checked: OnceLock::new() })
    }

    /// The checks a plan's step must pass ([`Graph::verify`]), with those
    /// of its nodes already made taken as found.
    pub fn verify(&self) -> Result<(), VerifyError> {
        match self.checked.get() {
            Some(checks) => self.graph.verify_checked(checks.clone()),
            None => self.graph.verify(),
        }
    }

    /// The training spec and pass options [`Step::compile`] compiles with.
    pub fn options(
        req: &Request,
        choice: Choice,
        ranks: u64,
        hint_batch: u64,
        micro_batches: u64,
    ) -> (TrainingSpec, PassOptions) {
        let train = TrainingSpec { micro_batches, ..req.train.clone() };
        let options = PassOptions {
            recompute: choice.recompute,
            shape_hint: bindings(hint_batch, req.seq),
            data_parallel: Some(DataParallel { ranks, zero_stage: choice.zero_stage, offload: choice.offload }),
            tensor_parallel: Some(choice.tensor_parallel),
            sequence_parallel: choice.sequence_parallel,
            tiles: (choice.tiles > 1).then_some(choice.tiles),
            // The planned GPU weighs each collective matmul's chunks.
            collective_chunks: crate::collective_matmul::Chunks::Cost(Box::new(Machine {
                cluster: req.cluster.clone(),
                dtype: super::compute_dtype(req.train.precision),
                offload_to: choice.offload_to,
                launches: req.launches,
            })),
            // Measured, not run: the plan's step is verified once chosen.
            skip_verify: true,
            disabled: match req.pins.attention {
                Attention::Fused => Default::default(),
                Attention::Unfused => [crate::manager::Pass::name(&crate::attention::Attention).to_string()].into(),
            },
            ..PassOptions::default()
        };
        (train, options)
    }

    /// Plans the memory at `micro_batch` sequences.
    pub fn memory(&self, req: &Request, micro_batch: u64) -> Result<(MemoryPlan, MemorySummary), PlanError> {
        let plan = memory::plan_in_order(&self.graph, self.order.clone(), &bindings(micro_batch, req.seq))
            .map_err(|e| PlanError::Compile(e.to_string()))?;
        let reserve = memory::reserve::reserve(&self.graph);
        let live = |c: Category| plan.at_peak.get(&c).copied().unwrap_or(0);
        let (host_bytes, nvme_bytes) = super::tier::split(&self.graph, &plan, self.offload_to, micro_batch, req);
        let summary = MemorySummary {
            peak_bytes: plan.arena.size + reserve.total(),
            budget_bytes: req.cluster.budget_bytes(),
            arena_bytes: plan.arena.size,
            lower_bound_bytes: plan.arena.lower_bound,
            reserve,
            reserve_bytes: reserve.total(),
            params_bytes: live(Category::Parameters),
            grads_bytes: live(Category::Gradients),
            optimizer_bytes: live(Category::OptimizerState),
            activations_bytes: live(Category::Activations) + live(Category::Inputs),
            host_bytes,
            nvme_bytes,
        };
        Ok((plan, summary))
    }

    /// The cost model's figures for one step of `micro_batches`
    /// micro-batches of `micro_batch` sequences.
    pub fn predict(
        &self,
        req: &Request,
        machine: &Machine,
        micro_batch: u64,
        micro_batches: u64,
    ) -> Result<(CommSummary, Predicted), PlanError> {
        let bindings = bindings(micro_batch, req.seq);
        let tokens = req.global_batch * req.seq;
        let machine = &machine.offloading_to(self.offload_to);
        let predicted = cost::simulate(&self.graph, &self.order, &bindings, machine, micro_batches, tokens)
            .ok_or_else(|| PlanError::Compile("a tensor size is unbound after binding batch and seq".into()))?;
        let traffic = cost::comm::traffic(&self.graph, micro_batches, &bindings);
        let by_collective: BTreeMap<String, CollectiveTraffic> = traffic
            .iter()
            .map(|(kind, t)| (kind.to_string(), CollectiveTraffic { count: t.count, bytes: t.bytes }))
            .collect();
        let mut host_copy_bytes = 0.0;
        for n in self.graph.node_indices() {
            let node = self.graph.node(n);
            if matches!(node.op, Op::Copy) {
                let value = Value { node: n, output: 0 };
                let bytes = self.graph.value_type(value).size_bytes(&bindings).unwrap_or(0) as f64;
                host_copy_bytes += bytes * if node.phase == Phase::Optimizer { 1.0 } else { micro_batches as f64 };
            }
        }
        let comm =
            CommSummary { bytes_per_step: traffic.values().map(|t| t.bytes).sum(), by_collective, host_copy_bytes };
        Ok((comm, predicted))
    }

    /// Memory and, where the plan fits, time at `strategy`'s micro-batch:
    /// the evaluation, or the memory of a plan that does not fit. The two
    /// run at once where a core is free; where none is, the time runs after
    /// the memory plan on the same core (rayon's `join`), and is skipped
    /// when the plan does not fit: an `optimal` probe's tries that overshoot
    /// the budget (bert-1t: five of nine whole steps) simulate nothing.
    /// A whole step that fits is then checked on the time's core until
    /// the memory plan is done: its placement, a million buffers for a
    /// tiled 100T step, takes longer than its time, and the checks would
    /// otherwise wait until the step is chosen.
    pub fn evaluate(
        &self,
        req: &Request,
        machine: &Machine,
        strategy: Strategy,
    ) -> Result<(MemoryPlan, Result<Evaluation, MemorySummary>), PlanError> {
        let (b, micro_batches) = (strategy.micro_batch, strategy.micro_batches);
        let (unfit, placed) = (AtomicBool::new(false), AtomicBool::new(false));
        let (planned, timed) = rayon::join(
            || {
                let planned = self.memory(req, b);
                if planned.as_ref().is_ok_and(|(_, memory)| !fits(req, memory)) {
                    unfit.store(true, Ordering::Relaxed);
                }
                placed.store(true, Ordering::Relaxed);
                planned
            },
            || {
                let timed = (!unfit.load(Ordering::Relaxed)).then(|| self.predict(req, machine, b, micro_batches));
                if self.whole && timed.is_some() && self.checked.get().is_none() {
                    let go_on = || !placed.load(Ordering::Relaxed);
                    if let Some(checks) = self.graph.check_nodes_while(&go_on) {
                        let _ = self.checked.set(checks);
                    }
                }
                timed
            },
        );
        let (plan, memory) = planned?;
        if !fits(req, &memory) {
            return Ok((plan, Err(memory)));
        }
        let (comm, predicted) = match timed {
            Some(timed) => timed?,
            None => self.predict(req, machine, b, micro_batches)?,
        };
        Ok((plan, Ok(Evaluation { strategy, memory, comm, predicted })))
    }
}

pub fn bindings(batch: u64, seq: u64) -> Bindings {
    [("batch".to_string(), batch), ("seq".to_string(), seq)].into()
}
