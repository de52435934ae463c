//! Capacity: the largest model of a family that trains on a cluster — the
//! question the ZeRO paper answers with its memory analysis of the maximum
//! model size per configuration (Rajbhandari et al., 2020, §5 and Table 2).
//!
//! The family is the spec scaled along [`LADDER`]: its depth and width
//! change, everything else stays (head width, feed-forward ratio,
//! normalisation, GLU, ALiBi, sharing, vocabulary). Each size is judged two
//! ways:
//!
//! - **model states only**, the paper's analysis: parameters, gradients
//!   and AdamW states per GPU by the ZeRO formulas over the data-parallel
//!   ranks, of the parameters one tensor rank holds (counted on its graph,
//!   so replicated LayerNorms and position embeddings count whole), against
//!   the whole budget — no activations, no buffers, no fragmentation;
//! - **full**: the planner's own answer at one sequence per GPU and step —
//!   activations from the memory plan with the recomputation the
//!   search picks, the CUDA context, GEMM workspace and NCCL buffers, the
//!   arena's fragmentation — with the pins the request carries.
//!
//! Memory grows with the size, so the full plans are searched by bisection
//! over the ladder.

use zeroplan_ir::DType;
use zeroplan_ir::build::{self, BuildOptions, check_tensor_parallel};
use zeroplan_ir::plan::Plan;
use zeroplan_ir::spec::{ModelSpec, Precision};

use super::{PlanError, Request, compute_dtype, plan, search};

/// `(layers, hidden)`: GPT-3's eight sizes (Brown et al., 2020, Table 2.1:
/// 125M to 175B; 13B's width rounded to 5120), with sizes between 13B and
/// 175B at the 175B model's width-to-depth ratio of 128.
pub const LADDER: [(u64, u64); 11] = [
    (12, 768),
    (24, 1024),
    (24, 1536),
    (24, 2048),
    (32, 2560),
    (32, 4096),
    (40, 5120),
    (48, 6144),
    (64, 8192),
    (80, 10240),
    (96, 12288),
];

/// One size of the family and what fits of it.
#[derive(Clone, Debug)]
pub struct Size {
    pub model: ModelSpec,
    /// Trainable parameters of the whole model.
    pub params: u64,
    /// Model states per GPU under the most sharded configuration the pins
    /// allow (below), and whether they fit the budget.
    pub states_bytes: u64,
    pub states_fit: bool,
    /// The tensor-parallel degree and ZeRO stage `states_bytes` is for.
    pub states_tensor_parallel: u64,
    pub states_zero_stage: u8,
    /// The planner's answer, where the bisection asked: the plan, or why
    /// nothing fits.
    pub full: Option<Result<Box<Plan>, String>>,
}

/// The family's sizes, smallest first, and the largest of each kind that fits.
pub struct Capacity {
    pub sizes: Vec<Size>,
    /// Index into `sizes` of the largest whose model states fit.
    pub largest_by_states: Option<usize>,
    /// Index into `sizes` of the largest with a full plan.
    pub largest_planned: Option<usize>,
}

/// `family` at `layers × hidden` (and at least `seq` positions).
pub fn scaled(family: &ModelSpec, layers: u64, hidden: u64, seq: u64) -> ModelSpec {
    let head_dim = family.hidden / family.heads.max(1);
    ModelSpec {
        name: format!("{}-{layers}x{hidden}", family.name),
        layers,
        hidden,
        heads: hidden / head_dim.max(1),
        intermediate: family.intermediate * hidden / family.hidden.max(1),
        max_position: family.max_position.max(seq),
        ..family.clone()
    }
}

/// Model-state bytes per parameter on a GPU at `zero_stage` over `ranks`
/// data-parallel ranks: 16-bit parameters and gradients and 12 bytes of
/// f32 master, momentum and variance under mixed precision; 4 + 4 + 8 in
/// f32 (ZeRO, §3.1 and §5.1). At stages 1–2 the whole parameters are the
/// copy the forward gathers, beside the `1/n` shard the rank keeps between
/// steps (the `partition` pass).
pub fn state_bytes_per_param(precision: Precision, zero_stage: u8, ranks: u64) -> f64 {
    let (p, g, o) = match compute_dtype(precision) {
        DType::F32 => (4.0, 4.0, 8.0),
        _ => (2.0, 2.0, 12.0),
    };
    let n = ranks.max(1) as f64;
    match zero_stage {
        0 => p + g + o,
        1 => p + p / n + g + o / n,
        2 => p + (p + g + o) / n,
        _ => (p + g + o) / n,
    }
}

/// Plans each size of `req.model`'s family along `ladder` (`(layers,
/// hidden)`, growing; [`LADDER`] for the real question) on `req.cluster` (the request's
/// global batch is ignored: one sequence per GPU and step, so `t` per
/// data-parallel rank under `t`-way tensor parallelism). Sizes whose heads
/// the pinned tensor-parallel degree does not split are left out.
pub fn capacity(req: &Request, ladder: &[(u64, u64)]) -> Result<Capacity, PlanError> {
    let world = req.cluster.world_size();
    let budget = req.cluster.budget_bytes();
    let mut sizes = Vec::with_capacity(ladder.len());
    for &(layers, hidden) in ladder {
        let model = scaled(req.model, layers, hidden, req.seq);
        let sized = Request { model: &model, ..req.clone() };
        // The most sharded configuration the pins allow.
        let Some(&t) = search::tensor_degrees(&sized).last() else { continue };
        if check_tensor_parallel(&model, t).is_err() {
            continue;
        }
        let zero_stage = req.pins.zero_stage.unwrap_or(3);
        let count = |t: u64| -> Result<u64, PlanError> {
            let options = BuildOptions {
                dtype: compute_dtype(req.train.precision),
                tensor_parallel: t,
                sequence_parallel: false,
            };
            let graph = build::forward(&model, &options).map_err(|e| PlanError::Compile(e.to_string()))?;
            Ok(graph.parameter_count())
        };
        let params = count(1)?;
        let bytes = count(t)? as f64 * state_bytes_per_param(req.train.precision, zero_stage, world / t);
        sizes.push(Size {
            params,
            states_bytes: bytes as u64,
            states_fit: bytes <= budget as f64,
            states_tensor_parallel: t,
            states_zero_stage: zero_stage,
            full: None,
            model,
        });
    }
    let largest_by_states = sizes.iter().rposition(|s| s.states_fit);
    // Bisection: sizes[..lo] have plans, sizes[hi..] do not.
    let (mut lo, mut hi) = (0, sizes.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        let sized = Request { model: &sizes[mid].model, global_batch: world, ..req.clone() };
        let outcome = match plan(&sized) {
            Ok(p) => Ok(Box::new(p)),
            Err(e @ PlanError::NothingFits { .. }) => Err(e.to_string()),
            Err(e) => return Err(e),
        };
        let fits = outcome.is_ok();
        sizes[mid].full = Some(outcome);
        if fits {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(Capacity { largest_planned: lo.checked_sub(1), largest_by_states, sizes })
}
