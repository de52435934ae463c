//! The load-time validation refuses no plan zeroplan itself compiles: over
//! a grid of strategies (ZeRO 0–3, optimizer and parameter offload to CPU
//! or NVMe, recomputation none, selective and full, tensor and sequence
//! parallelism, several micro-batches, tiling, f32, bf16 and fp16 with loss
//! scaling) of every tiny
//! family and of bundled full-size models, each plan's program passes
//! `zeroplan_exec::validate::buffers` — buffer sizes, places, arenas, views
//! and the liveness check that no two values live at once share bytes —
//! on every one of its ranks.
//!
//! The plans come from the planner with every choice pinned, as
//! `zeroplan compile --zero … --offload … --tp …` makes them; the check is
//! what `train PLAN.ron` runs before anything is allocated.

use std::path::PathBuf;

use zeroplan_exec::Rank;
use zeroplan_ir::plan::{Offload, OffloadTo, Plan};
use zeroplan_ir::spec::{self, Cluster, GpuProfile, LossScaling, ModelSpec, Nvme, Precision, TrainingSpec};
use zeroplan_ir::{Bindings, Place};
use zeroplan_passes::planner::{Pins, Request, plan};
use zeroplan_passes::recompute::Policy;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn model(path: &str) -> ModelSpec {
    spec::load(&repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One strategy, every choice of it pinned.
#[derive(Clone, Copy, Debug)]
struct Strategy {
    tensor_parallel: u64,
    sequence_parallel: bool,
    data_parallel: u64,
    zero: u8,
    offload: Offload,
    to_nvme: bool,
    recompute: Policy,
    micro_batches: u64,
    tiles: Option<u64>,
    precision: Precision,
}

/// The plan `zeroplan compile` makes for `model` under `s`, at `seq`
/// tokens and one sequence per micro-batch.
fn compiled(model: &ModelSpec, s: &Strategy, seq: u64) -> Plan {
    let gpu = GpuProfile::load(&repo("models/gpus/a100-80gb.ron")).unwrap();
    let world = s.tensor_parallel * s.data_parallel;
    let nvme = s.to_nvme.then_some(Nvme { bytes: 1 << 44, read_gbps: 6.0, write_gbps: 3.0 });
    let req = Request {
        model,
        train: TrainingSpec { precision: s.precision, dropout: Some(0.1), ..TrainingSpec::default() },
        cluster: Cluster { nodes: 1, gpus_per_node: world, gpu, memory_budget: None, host_memory: None, nvme },
        seq,
        global_batch: s.micro_batches * s.data_parallel,
        pins: Pins {
            tensor_parallel: Some(s.tensor_parallel),
            offload_to: Some(if s.to_nvme { OffloadTo::Nvme } else { OffloadTo::Cpu }),
            sequence_parallel: Some(s.sequence_parallel),
            zero_stage: Some(s.zero),
            offload: Some(s.offload),
            recompute: Some(s.recompute),
            micro_batch: Some(1),
            tiles: s.tiles,
            attention: Default::default(),
        },
        extrapolate_depth: false,
        exhaustive: false,
        shared: Default::default(),
        launches: Default::default(),
    };
    let plan = plan(&req).unwrap_or_else(|e| panic!("{} under {s:?}: {e}", model.name));
    let got = &plan.strategy;
    let want = (s.tiles.unwrap_or(1), s.micro_batches, s.sequence_parallel, s.to_nvme);
    assert_eq!((got.tiles, got.micro_batches, got.sequence_parallel, got.offload_to == OffloadTo::Nvme), want, "{s:?}");
    plan
}

/// Validates `plan`'s program on each of its ranks; the error names the
/// rank.
fn loads_on_every_rank(plan: &Plan, s: &Strategy) -> Result<(), String> {
    let program = &plan.program;
    let g = &program.graph;
    let order = g.topo_order();
    let bindings: Bindings = [("batch".to_string(), program.batch), ("seq".to_string(), program.seq)].into();
    for tensor in 0..s.tensor_parallel as usize {
        for index in 0..s.data_parallel as usize {
            let rank =
                Rank { index, ranks: s.data_parallel as usize, tensor, tensor_ranks: s.tensor_parallel as usize };
            zeroplan_exec::validate::buffers(program, &order, &bindings, rank)
                .map_err(|e| format!("data rank {index}, tensor rank {tensor}: {e}"))?;
        }
    }
    Ok(())
}

/// Every ZeRO stage with each offload it takes, over one or two tensor
/// ranks (sequence parallelism on every other), the recomputation
/// policies, micro-batch counts, NVMe, tiling and precisions taking turns.
fn grid(data_parallel: u64, tensor_parallel: &[u64]) -> Vec<Strategy> {
    let stages = [
        (0, Offload::None),
        (1, Offload::None),
        (1, Offload::Optimizer),
        (2, Offload::None),
        (2, Offload::Optimizer),
        (3, Offload::None),
        (3, Offload::Optimizer),
        (3, Offload::OptimizerAndParams),
    ];
    let recompute = [Policy::None, Policy::Selective, Policy::Full];
    let mut grid = Vec::new();
    for &t in tensor_parallel {
        for (i, &(zero, offload)) in stages.iter().enumerate() {
            for (j, &recompute) in recompute.iter().enumerate() {
                let turn = i + j;
                grid.push(Strategy {
                    tensor_parallel: t,
                    sequence_parallel: t > 1 && turn % 2 == 1,
                    data_parallel,
                    zero,
                    offload,
                    to_nvme: offload != Offload::None && turn % 3 == 2,
                    recompute,
                    micro_batches: 1 + (i % 2) as u64,
                    tiles: (zero == 3 && turn % 3 == 0).then_some(2),
                    precision: [Precision::F32, Precision::Bf16, Precision::F16(LossScaling::default())]
                        [(2 * i + j) % 3],
                });
            }
        }
    }
    grid
}

/// Checks every strategy of `grid` for `model`, listing every refusal.
fn check(path: &str, seq: u64, grid: &[Strategy]) {
    let model = model(path);
    let mut refused = Vec::new();
    for s in grid {
        let plan = compiled(&model, s, seq);
        if let Err(e) = loads_on_every_rank(&plan, s) {
            refused.push(format!("{path} under {s:?}:\n  {e}"));
        }
    }
    assert!(refused.is_empty(), "{} of {} plans refused:\n{}", refused.len(), grid.len(), refused.join("\n"));
}

#[test]
fn every_tiny_family_s_plans_load_on_every_rank() {
    for family in ["tiny-bert", "tiny-albert", "tiny-megatron-bert", "tiny-mosaicbert", "tiny-bert-sts"] {
        check(&format!("models/tiny/{family}.ron"), 8, &grid(2, &[1, 2]));
    }
    // Template-bank weights are computed whole: no tensor parallelism.
    check("models/tiny/tiny-ssn-bert.ron", 8, &grid(2, &[1]));
    // Three data ranks pad the ZeRO shards to split evenly.
    check("models/tiny/tiny-bert.ron", 8, &grid(3, &[1]));
}

#[test]
fn full_size_models_plans_load_on_every_rank() {
    let some = |grid: Vec<Strategy>| grid.into_iter().step_by(5).collect::<Vec<_>>();
    check("models/minilm-l6.ron", 128, &some(grid(2, &[1, 2])));
    check("models/bert-base.ron", 128, &some(grid(2, &[1])));
    check("models/albert-base.ron", 128, &some(grid(2, &[2])));
    check("models/megatron-bert-345m.ron", 64, &some(grid(2, &[2])));
}

/// The host arena is checked as its own: offloaded plans have one.
#[test]
fn offloaded_plans_place_values_in_the_host_arena() {
    let s = grid(2, &[1]).into_iter().find(|s| s.offload == Offload::OptimizerAndParams).unwrap();
    let plan = compiled(&model("models/tiny/tiny-bert.ron"), &s, 8);
    assert!(plan.program.host_arena_bytes > 0);
    assert!(plan.program.buffers.iter().any(|b| b.place == Place::Host));
}
