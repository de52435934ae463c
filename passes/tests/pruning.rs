//! The search's pruning never changes the answer: a fixed grid of models,
//! clusters, budgets and batches planned with the dominated choices skipped
//! (`passes/src/planner/dominance.rs`) and with every choice compiled
//! (`--exhaustive`) gives the same winner with the same figures, and no
//! skipped choice is faster, in the exhaustive search, than the twin said
//! to dominate it. The same holds for the `optimal` choices bounded out
//! (`search::optimal_outcomes`), and for the `full` choices the exact
//! stage does not compile whole for their `optimal` twin
//! (`dominance::lighter_twin`).

#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::{load_model as model, models_dir};
use zeroplan_ir::plan::{Candidate, Plan, Strategy};
use zeroplan_ir::spec::{Cluster, GpuProfile, LossScaling, Nvme, Precision, TrainingSpec};
use zeroplan_passes::planner::{Pins, Request, plan};
use zeroplan_passes::recompute::Policy;

const GIB: u64 = 1 << 30;

/// One planning question of the grid.
struct Case {
    model: &'static str,
    gpu: &'static str,
    gpus: u64,
    /// Per-GPU budget, GiB (`None`: the GPU's own).
    budget_gib: Option<u64>,
    /// Host memory per node, GiB.
    host_gib: Option<u64>,
    /// NVMe per node, GiB.
    nvme_gib: Option<u64>,
    seq: u64,
    global_batch: u64,
    tensor_parallel: Option<u64>,
}

/// A case on one node (or `gpus` GPUs of one), tensor parallelism pinned
/// off: the two dimensions pruning skips are ZeRO × offload ×
/// recomputation × tier within one tensor-parallel degree, and a few cases
/// search the degrees too.
const fn case(model: &'static str, gpu: &'static str, gpus: u64, seq: u64, global_batch: u64) -> Case {
    Case {
        model,
        gpu,
        gpus,
        budget_gib: None,
        host_gib: None,
        nvme_gib: None,
        seq,
        global_batch,
        tensor_parallel: Some(1),
    }
}

/// Loose and tight budgets, one GPU to two nodes, with and without a host
/// limit and an NVMe tier: cases where everything fits (most dearer
/// choices skipped), where only recomputation or offload fits, and where
/// the winner recomputes.
const GRID: [Case; 32] = [
    case("bert-base.ron", "a100-40gb", 1, 128, 32),
    case("bert-base.ron", "a100-40gb", 8, 128, 256),
    Case { budget_gib: Some(4), ..case("bert-base.ron", "a100-40gb", 8, 128, 256) },
    Case { budget_gib: Some(3), ..case("bert-base.ron", "a100-40gb", 8, 512, 256) },
    Case { budget_gib: Some(2), ..case("bert-base.ron", "v100-32gb", 8, 512, 128) },
    Case { budget_gib: Some(6), ..case("bert-base.ron", "v100-32gb", 1, 512, 64) },
    Case { budget_gib: Some(3), ..case("bert-base.ron", "h100-80gb-sxm", 16, 512, 512) },
    case("bert-base.ron", "h100-80gb-sxm", 4, 128, 64),
    case("bert-large.ron", "v100-32gb", 1, 512, 16),
    Case { budget_gib: Some(8), ..case("bert-large.ron", "v100-32gb", 1, 512, 32) },
    Case { budget_gib: Some(5), ..case("bert-large.ron", "a100-40gb", 2, 512, 64) },
    Case { budget_gib: Some(12), ..case("bert-large.ron", "a100-80gb", 8, 512, 256) },
    case("bert-large.ron", "h100-80gb-sxm", 16, 512, 1024),
    Case { budget_gib: Some(6), host_gib: Some(64), ..case("bert-large.ron", "a100-40gb", 4, 512, 64) },
    Case {
        budget_gib: Some(6),
        host_gib: Some(16),
        nvme_gib: Some(2048),
        ..case("bert-large.ron", "a100-40gb", 2, 512, 32)
    },
    Case { nvme_gib: Some(2048), ..case("bert-large.ron", "v100-32gb", 2, 128, 64) },
    Case { budget_gib: Some(3), nvme_gib: Some(2048), ..case("bert-base.ron", "v100-32gb", 2, 512, 32) },
    case("megatron-bert-345m.ron", "a100-40gb", 8, 512, 64),
    Case { budget_gib: Some(10), ..case("megatron-bert-345m.ron", "a100-40gb", 8, 512, 512) },
    Case { budget_gib: Some(6), tensor_parallel: Some(2), ..case("megatron-bert-345m.ron", "a100-80gb", 8, 128, 128) },
    case("megatron-bert-3.9b.ron", "a100-80gb", 8, 512, 64),
    Case { budget_gib: Some(30), tensor_parallel: Some(4), ..case("megatron-bert-3.9b.ron", "a100-40gb", 8, 512, 32) },
    Case { host_gib: Some(256), ..case("megatron-bert-3.9b.ron", "v100-32gb", 4, 512, 32) },
    case("albert-base.ron", "a100-40gb", 4, 512, 64),
    Case { budget_gib: Some(2), ..case("albert-base.ron", "v100-32gb", 2, 512, 32) },
    Case { tensor_parallel: None, ..case("minilm-l6.ron", "v100-32gb", 2, 128, 64) },
    Case { budget_gib: Some(1), ..case("minilm-l6.ron", "a100-40gb", 8, 512, 256) },
    case("mosaicbert-base.ron", "a100-80gb", 8, 128, 4096),
    Case { budget_gib: Some(4), ..case("mosaicbert-base.ron", "a100-40gb", 4, 512, 128) },
    Case { budget_gib: Some(2), ..case("mosaicbert-base.ron", "h200", 2, 1024, 16) },
    Case { budget_gib: Some(3), host_gib: Some(8), ..case("bert-large.ron", "h200", 1, 512, 8) },
    Case { budget_gib: Some(20), ..case("bert-large.ron", "h100-80gb-sxm", 8, 2048, 64) },
];

fn request<'a>(m: &'a zeroplan_ir::spec::ModelSpec, c: &Case, exhaustive: bool) -> Request<'a> {
    let gpu = GpuProfile::load(&models_dir().join(format!("gpus/{}.ron", c.gpu))).unwrap_or_else(|e| panic!("{e}"));
    let gpus_per_node = c.gpus.min(8);
    let precision = if c.gpu.starts_with("v100") { Precision::F16(LossScaling::default()) } else { Precision::Bf16 };
    let nvme = c.nvme_gib.map(|g| Nvme { bytes: g * GIB, read_gbps: 25.0, write_gbps: 22.7 });
    Request {
        model: m,
        // The V100 has no bf16 tensor cores.
        train: TrainingSpec { precision, ..TrainingSpec::default() },
        cluster: Cluster {
            nodes: c.gpus / gpus_per_node,
            gpus_per_node,
            gpu,
            memory_budget: c.budget_gib.map(|g| g * GIB),
            host_memory: c.host_gib.map(|g| g * GIB),
            nvme,
        },
        seq: c.seq,
        global_batch: c.global_batch,
        pins: Pins { tensor_parallel: c.tensor_parallel, ..Pins::default() },
        extrapolate_depth: true,
        exhaustive,
        shared: Default::default(),
        launches: Default::default(),
    }
}

/// The same choice: everything but the micro-batch.
fn same_choice(a: &Strategy, b: &Strategy) -> bool {
    let strip = |s: &Strategy| Strategy { micro_batch: 0, micro_batches: 0, ..s.clone() };
    strip(a) == strip(b)
}

fn find<'p>(plan: &'p Plan, strategy: &Strategy) -> &'p Candidate {
    plan.candidates
        .iter()
        .find(|c| same_choice(&c.strategy, strategy))
        .unwrap_or_else(|| panic!("{strategy} is not a candidate of the exhaustive search"))
}

#[test]
fn pruning_keeps_the_exhaustive_winner_on_a_grid_of_cases() {
    let (mut skipped, mut recomputing_winners, mut nvme_skipped, mut optimal_skipped) = (0, 0, 0, 0);
    let mut lighter = 0;
    for c in &GRID {
        let m = model(c.model);
        let what = format!(
            "{} on {} × {} (budget {:?} GiB, seq {}, batch {})",
            c.model, c.gpus, c.gpu, c.budget_gib, c.seq, c.global_batch
        );
        let pruned = plan(&request(&m, c, false));
        let exhaustive = plan(&request(&m, c, true));
        let (pruned, exhaustive) = match (pruned, exhaustive) {
            (Ok(p), Ok(e)) => (p, e),
            (Err(p), Err(e)) => {
                assert_eq!(p.to_string(), e.to_string(), "{what}: the nothing-fits answers differ");
                continue;
            }
            (p, e) => {
                panic!("{what}: pruned {:?} against exhaustive {:?}", p.map(|p| p.strategy), e.map(|e| e.strategy))
            }
        };
        assert_eq!(pruned.strategy, exhaustive.strategy, "{what}: the winner changed");
        assert_eq!(pruned.predicted, exhaustive.predicted, "{what}: the winner's figures changed");
        assert_eq!(pruned.memory, exhaustive.memory, "{what}: the winner's memory changed");
        assert!(exhaustive.candidates.iter().all(|x| x.dominated_by.is_none()), "{what}: --exhaustive skipped one");
        recomputing_winners += usize::from(pruned.strategy.recompute != Policy::None.name());
        // `optimal` choices bounded below the fastest plan are not compiled.
        let optimal = |p: &Plan| p.candidates.iter().filter(|x| x.strategy.recompute.starts_with("optimal:")).count();
        optimal_skipped += optimal(&exhaustive) - optimal(&pruned);
        for d in pruned.candidates.iter().filter(|x| x.dominated_by.is_some()) {
            skipped += 1;
            let twin = d.dominated_by.as_ref().expect("filtered");
            nvme_skipped += usize::from(d.strategy.offload_to != twin.offload_to);
            let (dearer, cheaper) = (find(&exhaustive, &d.strategy), find(&exhaustive, twin));
            let cheaper_speed = cheaper.tokens_per_second.expect("the dominating twin fits");
            assert!(
                dearer.tokens_per_second.is_none_or(|t| t <= cheaper_speed),
                "{what}: {} ({:?} tokens/s) beats {} ({cheaper_speed}), which was said to dominate it",
                dearer.strategy,
                dearer.tokens_per_second,
                cheaper.strategy
            );
        }
        // A `full` choice left an estimate for its `optimal` twin: where
        // the exhaustive search compiled it whole (its figure is no longer
        // the estimate), that figure is no faster than the twin's.
        for d in pruned.candidates.iter().filter(|x| x.recomputes_more_than.is_some()) {
            lighter += 1;
            let twin = d.recomputes_more_than.as_ref().expect("filtered");
            let (full, twin) = (find(&exhaustive, &d.strategy), find(&exhaustive, twin));
            let (whole, twin_speed) =
                (full.tokens_per_second.expect("it fit"), twin.tokens_per_second.expect("planned"));
            assert!(
                whole == d.tokens_per_second.expect("estimated") || whole <= twin_speed,
                "{what}: {} ({whole} tokens/s whole) beats {} ({twin_speed}), which recomputes less",
                full.strategy,
                twin.strategy
            );
        }
    }
    // The grid exercises what it checks.
    assert!(lighter > 0, "no full choice left to its optimal twin");
    assert!(skipped > 100, "only {skipped} choices skipped over the grid");
    assert!(nvme_skipped > 0, "no NVMe choice skipped for its CPU-memory twin");
    assert!(recomputing_winners > 0, "no case where the winner recomputes");
    assert!(optimal_skipped > 0, "no optimal choice bounded out");
}
