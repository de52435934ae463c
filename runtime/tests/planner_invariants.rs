//! The planner's promises, checked over random requests by running what it
//! plans: a tiny spec of any family (its width, depth and heads varied),
//! 1–4 ranks over 1–2 nodes, seq 4–16, f32, bf16 or fp16, random pins or
//! none, and a per-GPU budget from "nothing fits" to "everything fits".
//!
//! - **A plan reported to fit stays inside its budget when it runs.** The
//!   plan's `peak_bytes` is its device arena (every tensor of the step at
//!   its planned offset, `arena_bytes`) plus the reserve a process holds
//!   outside it (CUDA context, cuBLASLt workspace, NCCL buffers:
//!   `reserve_bytes`, `passes/src/memory/reserve.rs`); it fits when
//!   `peak_bytes ≤ budget`. The host runtime allocates exactly the plan's
//!   arenas and cannot see a CUDA context, so what is measured is the arena
//!   part: each rank's device high water over two training steps (the end
//!   of the highest buffer any executed node wrote,
//!   `HostProgram::high_water_bytes`) must be within `arena_bytes`, hence
//!   `high water + reserve ≤ peak ≤ budget`, and its host high water within
//!   the plan's host arena; both within the arenas' last 256 bytes (the
//!   plan's alignment), so the figures are not met by a run that used less
//!   than was planned. The figures must be those of the program the
//!   plan carries (arena sizes, reserve of its graph), and the strategy
//!   must honour the pins and make up the global batch.
//! - **An infeasible request gets a reason a user can act on**: a pin that
//!   cannot hold (micro-batch not dividing a rank's sequences, offload the
//!   stage cannot take, no ZeRO stage 4) is named as such, and otherwise the
//!   answer is "nothing fits" with every choice's least memory, each above
//!   the budget. Never a compile error of the planner's own making, never a
//!   panic.
//! - **The same request gives the same plan file**, byte for byte
//!   (`Plan::to_ron`, what `zeroplan compile -o` writes).
//!
//! Found by it: under full recomputation Megatron-BERT's plans carried a
//! dead recomputed kernel the host runtime could not load (fixed in the
//! `recompute` pass; `passes/tests/recompute.rs::every_recomputed_value_is_read`).

use std::path::PathBuf;

use proptest::prelude::*;
use zeroplan_ir::build::check_tensor_parallel;
use zeroplan_ir::interp::Feeds;
use zeroplan_ir::interp::State;
use zeroplan_ir::plan::{Offload, Plan};
use zeroplan_ir::spec::{Cluster, GpuProfile, LossScaling, ModelSpec, Precision, TrainingSpec};
use zeroplan_passes::planner::search::divisors;
use zeroplan_passes::planner::{Pins, PlanError, Request, plan};
use zeroplan_passes::recompute::Policy;
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::comm::InProcess;

mod common;

use common::{batch_of, model};

const FAMILIES: [&str; 6] =
    ["tiny-bert", "tiny-albert", "tiny-megatron-bert", "tiny-mosaicbert", "tiny-bert-sts", "tiny-ssn-bert"];
const MIB: u64 = 1 << 20;

fn a100() -> GpuProfile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/gpus/a100-40gb.ron");
    GpuProfile::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// A family's tiny spec with `layers` layers of `heads` heads of width
/// `head_dim` (the feed-forward twice the hidden width).
fn spec(family: usize, layers: u64, heads: u64, head_dim: u64) -> ModelSpec {
    let hidden = heads * head_dim;
    let spec = ModelSpec { layers, heads, hidden, intermediate: 2 * hidden, ..model(FAMILIES[family]) };
    zeroplan_ir::spec::validate(&spec).unwrap_or_else(|p| panic!("the generated spec is invalid: {p:?}"));
    spec
}

/// A request's random parts (the spec aside).
#[derive(Clone, Debug)]
struct Draw {
    nodes: u64,
    gpus_per_node: u64,
    per_rank: u64,
    seq: u64,
    precision: Precision,
    pins: Pins,
    micro_batch: MicroBatchPin,
    budget: u64,
    extrapolate_depth: bool,
}

/// The micro-batch pin, drawn against the sequences each rank trains on.
#[derive(Clone, Copy, Debug)]
enum MicroBatchPin {
    None,
    /// The divisor of that many at this index (modulo their count).
    Divisor(usize),
    /// One more than that many: never a divisor.
    NotDividing,
}

fn precisions() -> impl Strategy<Value = Precision> {
    prop::sample::select(vec![Precision::F32, Precision::Bf16, Precision::F16(LossScaling::default())])
}

/// Pins (the micro-batch's aside) drawn so that most hold and a few
/// cannot: stage 4, an offload the stage cannot take.
fn pins() -> impl Strategy<Value = Pins> {
    let stage = prop_oneof![12 => Just(None), 7 => (0..=3u8).prop_map(Some), 1 => Just(Some(4))];
    let offload = prop::option::weighted(
        0.3,
        prop::sample::select(vec![Offload::None, Offload::Optimizer, Offload::OptimizerAndParams]),
    );
    let recompute = prop::option::weighted(
        0.3,
        prop_oneof![
            Just(Policy::None),
            Just(Policy::Selective),
            Just(Policy::Full),
            (1u64..=256).prop_map(|kib| Policy::Optimal { budget_bytes: kib << 10 }),
        ],
    );
    // Searched, none, or pinned to a degree that may not split the GPUs or the heads.
    let tensor_parallel = prop_oneof![4 => Just(None), 2 => Just(Some(1)), 2 => Just(Some(2)), 1 => Just(Some(3))];
    (tensor_parallel, stage, offload, recompute).prop_map(|(tensor_parallel, zero_stage, offload, recompute)| Pins {
        tensor_parallel,
        zero_stage,
        offload,
        recompute,
        micro_batch: None,
        offload_to: None,
        attention: Default::default(),
        // The search tries sequence parallelism wherever there are several tensor ranks.
        sequence_parallel: None,
        tiles: None,
    })
}

fn micro_batch_pins() -> impl Strategy<Value = MicroBatchPin> {
    prop_oneof![
        12 => Just(MicroBatchPin::None),
        7 => (0..4usize).prop_map(MicroBatchPin::Divisor),
        1 => Just(MicroBatchPin::NotDividing),
    ]
}

/// A per-GPU budget around what tiny plans need: a reserve (none; the CUDA
/// context and the GEMM workspace; those and NCCL's buffers, most often, so
/// that plans for several ranks fit) and then 32 KiB to 2 MiB for the arena
/// (tiny plans' arenas are 20–300 KiB), log-uniform, so every outcome from
/// "nothing fits" to "everything fits at the largest micro-batch" is drawn.
fn budgets() -> impl Strategy<Value = u64> {
    let reserve = prop_oneof![1 => Just(0), 1 => Just(544 * MIB), 8 => Just(1056 * MIB)];
    (reserve, 15.0f64..21.0).prop_map(|(reserve, log2)| reserve + 2f64.powf(log2) as u64)
}

fn draws() -> impl Strategy<Value = Draw> {
    let cluster = (1..=2u64, 1..=2u64, 1..=4u64);
    (cluster, 4..=16u64, precisions(), pins(), micro_batch_pins(), budgets(), any::<bool>()).prop_map(
        |((nodes, gpus_per_node, per_rank), seq, precision, pins, micro_batch, budget, extrapolate_depth)| Draw {
            nodes,
            gpus_per_node,
            per_rank,
            seq,
            precision,
            pins,
            micro_batch,
            budget,
            extrapolate_depth,
        },
    )
}

fn request<'a>(model: &'a ModelSpec, d: &Draw) -> Request<'a> {
    let divisors = divisors(d.per_rank);
    let micro_batch = match d.micro_batch {
        MicroBatchPin::None => None,
        MicroBatchPin::Divisor(i) => Some(divisors[i % divisors.len()]),
        MicroBatchPin::NotDividing => Some(d.per_rank + 1),
    };
    Request {
        model,
        train: TrainingSpec { precision: d.precision, ..TrainingSpec::default() },
        cluster: Cluster {
            nodes: d.nodes,
            gpus_per_node: d.gpus_per_node,
            gpu: a100(),
            memory_budget: Some(d.budget),
            host_memory: None,
            nvme: None,
        },
        seq: d.seq,
        global_batch: d.per_rank * d.nodes * d.gpus_per_node,
        pins: Pins { micro_batch, ..d.pins },
        extrapolate_depth: d.extrapolate_depth,
        exhaustive: false,
        shared: Default::default(),
        launches: Default::default(),
    }
}

/// The planner's answer is a reason a user can act on: the pin that cannot
/// hold, or "nothing fits" with each choice's least memory above the budget.
fn a_reason(req: &Request, err: &PlanError) -> Result<(), TestCaseError> {
    let pins = req.pins;
    let world = req.cluster.world_size();
    let bad_tensor_parallel = pins
        .tensor_parallel
        .is_some_and(|t| t == 0 || !world.is_multiple_of(t) || check_tensor_parallel(req.model, t).is_err());
    if bad_tensor_parallel {
        prop_assert!(matches!(err, PlanError::TensorParallel { .. }), "{err}: the bad --tp should be named first");
        return Ok(());
    }
    // The sequences each data-parallel rank trains at `t` tensor ranks.
    let per_rank = |t: u64| req.global_batch / (world / t);
    // A micro-batch pin is bad only where no tensor-parallel degree the
    // search may take (the pinned one, else those within a node the heads
    // split into) gives each rank a multiple of it: with more tensor ranks
    // there are fewer, larger data-parallel shares.
    let degrees: Vec<u64> = match pins.tensor_parallel {
        Some(t) => vec![t],
        None => (1..=req.cluster.gpus_per_node)
            .filter(|&t| world.is_multiple_of(t) && check_tensor_parallel(req.model, t).is_ok())
            .collect(),
    };
    let bad_stage = pins.zero_stage.is_some_and(|z| z > 3);
    let bad_micro_batch = pins.micro_batch.is_some_and(|b| degrees.iter().all(|&t| !per_rank(t).is_multiple_of(b)));
    match err {
        // Only a pinned `--sp` can be refused.
        PlanError::SequenceParallel(_) => prop_assert!(pins.sequence_parallel == Some(true), "{err}: not pinned"),
        PlanError::Stage(z) => prop_assert!(bad_stage && pins.zero_stage == Some(*z)),
        PlanError::MicroBatch { micro_batch, per_rank: p } => {
            prop_assert!(
                !bad_stage && bad_micro_batch && pins.micro_batch == Some(*micro_batch) && *p == per_rank(degrees[0])
            )
        }
        PlanError::Pins(_) => {
            let allowed = |stage: u8, offload: Offload| match offload {
                Offload::None => true,
                Offload::Optimizer => stage >= 1,
                Offload::OptimizerAndParams => stage == 3,
            };
            let offload = pins.offload.expect("only an offload pin leaves nothing to search");
            let some_stage = (0..=3u8).any(|s| pins.zero_stage.is_none_or(|z| z == s) && allowed(s, offload));
            prop_assert!(!some_stage, "{err}: but a stage takes offload {offload:?}");
        }
        PlanError::NothingFits { cluster, shortfalls } => {
            prop_assert!(!bad_stage && !bad_micro_batch, "{err}: a bad pin should have been named first");
            let budget_bytes = &cluster.budget_bytes;
            prop_assert_eq!(*budget_bytes, req.cluster.budget_bytes());
            prop_assert_eq!(cluster.gpus, req.cluster.world_size());
            prop_assert!(!shortfalls.is_empty(), "nothing fits, and no choice is listed");
            for s in shortfalls {
                prop_assert!(s.min_peak_bytes > *budget_bytes, "{}: its least memory fits, yet nothing fits", s.choice);
            }
        }
        PlanError::Batch { .. }
        | PlanError::Precision { .. }
        | PlanError::Compile(_)
        | PlanError::NoNvme
        | PlanError::TensorParallel { .. } => {
            prop_assert!(false, "not a reason the request deserves: {err}")
        }
    }
    Ok(())
}

/// The plan's figures are its program's, its strategy honours the pins
/// and makes up the global batch, and it fits the budget it reports.
fn consistent(req: &Request, plan: &Plan) -> Result<(), TestCaseError> {
    let (m, s, p) = (&plan.memory, &plan.strategy, &plan.program);
    prop_assert_eq!(m.budget_bytes, req.cluster.budget_bytes());
    prop_assert!(m.peak_bytes <= m.budget_bytes, "a plan over its budget: {} > {}", m.peak_bytes, m.budget_bytes);
    prop_assert_eq!(m.peak_bytes, m.arena_bytes + m.reserve_bytes);
    prop_assert_eq!(m.arena_bytes, p.arena_bytes);
    prop_assert_eq!(m.host_bytes, p.host_arena_bytes);
    prop_assert_eq!(m.reserve_bytes, zeroplan_passes::memory::reserve::reserve(&p.graph).total());
    prop_assert_eq!(s.world(), req.cluster.world_size());
    prop_assert!(
        pins_tp_honoured(req, s.tensor_parallel),
        "--tp pin {:?}: {}",
        req.pins.tensor_parallel,
        s.tensor_parallel
    );
    prop_assert_eq!(p.graph.tensor_parallel(), s.tensor_parallel);
    prop_assert_eq!(s.micro_batch * s.micro_batches * s.ranks, req.global_batch);
    prop_assert_eq!((p.batch, p.seq), (s.micro_batch, req.seq));
    let pins = req.pins;
    prop_assert!(pins.zero_stage.is_none_or(|z| z == s.zero_stage), "ZeRO pin {:?}: {}", pins.zero_stage, s.zero_stage);
    prop_assert!(pins.offload.is_none_or(|o| o == s.offload), "offload pin {:?}: {:?}", pins.offload, s.offload);
    prop_assert!(pins.micro_batch.is_none_or(|b| b == s.micro_batch), "micro-batch pin {:?}", pins.micro_batch);
    if let Some(r) = pins.recompute {
        prop_assert_eq!(&r.name(), &s.recompute);
    }
    Ok(())
}

fn pins_tp_honoured(req: &Request, t: u64) -> bool {
    req.pins.tensor_parallel.is_none_or(|p| p == t)
}

/// Runs two steps of `plan` on its `d × t` ranks (threads joined by
/// in-process data and tensor groups; a replica's tensor ranks share its
/// batch) and returns each rank's measured device and host high water.
fn run(model: &ModelSpec, plan: &Plan) -> Vec<(u64, u64)> {
    let (d, t) = (plan.strategy.ranks as usize, plan.strategy.tensor_parallel as usize);
    let k = plan.strategy.micro_batches as usize;
    let (b, seq) = (plan.program.batch as usize, plan.program.seq as usize);
    let mut hosts: Vec<HostProgram> = InProcess::grid(d, t)
        .into_iter()
        .map(|groups| {
            HostProgram::load_groups_with(plan.program.clone(), 7, groups, &State::new())
                .unwrap_or_else(|e| panic!("loading the plan: {e}"))
        })
        .collect();
    for step in 0..2 {
        let feeds: Vec<Vec<Feeds>> = (0..d * t)
            .map(|r| (0..k).map(|i| batch_of(model, b, seq, ((step * d + r / t) * k + i) as i64)).collect())
            .collect();
        std::thread::scope(|s| {
            let running: Vec<_> =
                hosts.iter_mut().zip(&feeds).map(|(host, f)| s.spawn(move || host.step(f).map(|_| ()))).collect();
            for r in running {
                r.join().expect("a rank panicked").unwrap_or_else(|e| panic!("step {}: {e}", step + 1));
            }
        });
    }
    hosts.iter().map(|h| (h.high_water_bytes(), h.host_high_water_bytes())).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    #[test]
    fn plans_fit_when_run_reasons_come_otherwise_and_plan_files_repeat(
        family in 0..FAMILIES.len(),
        layers in 2..=6u64,
        heads in 1..=4u64,
        head_dim in prop::sample::select(vec![4u64, 8, 16]),
        d in draws(),
    ) {
        let model = spec(family, layers, heads, head_dim);
        let req = request(&model, &d);
        let planned = match plan(&req) {
            Err(e) => return a_reason(&req, &e),
            Ok(p) => p,
        };
        let (file, again) = (planned.to_ron(), plan(&req).map(|p| p.to_ron()));
        let again = again.map_err(|e| TestCaseError::fail(format!("planned once, then refused: {e}")))?;
        if file != again {
            let line = file.lines().zip(again.lines()).position(|(x, y)| x != y).unwrap_or(0);
            return Err(TestCaseError::fail(format!("two plan files of one request differ from line {}", line + 1)));
        }
        consistent(&req, &planned)?;
        let (arena, host_arena) = (planned.memory.arena_bytes, planned.memory.host_bytes);
        for (rank, (device, host)) in run(&model, &planned).into_iter().enumerate() {
            prop_assert!(
                device <= arena && device + planned.memory.reserve_bytes <= planned.memory.budget_bytes,
                "rank {rank} reached {device} B of device arena; the plan has {arena} B (budget {} B, reserve {} B)",
                planned.memory.budget_bytes, planned.memory.reserve_bytes
            );
            prop_assert!(host <= host_arena, "rank {rank} reached {host} B of host arena; the plan has {host_arena} B");
            // Not far below either: the plan's offsets are the ones in use.
            prop_assert!(device + 256 > arena, "rank {rank} used {device} B of the plan's {arena} B arena");
            prop_assert!(host_arena == 0 || host + 256 > host_arena, "rank {rank}: host {host} B of {host_arena} B");
        }
    }
}
