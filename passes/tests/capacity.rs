//! Capacity: the largest size of a family that fits, by model states and by
//! a full plan, on a ladder of small sizes (fast enough to plan every size)
//! and budgets a little above the ~1 GiB every plan reserves (CUDA context,
//! NCCL buffers).

#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::{closed_form_params, load_model as model, models_dir};
use zeroplan_ir::plan::Offload;
use zeroplan_ir::spec::{Cluster, GpuProfile, Precision, TrainingSpec};
use zeroplan_passes::planner::capacity::{capacity, scaled, state_bytes_per_param};
use zeroplan_passes::planner::{Pins, Request, plan};

const LADDER: [(u64, u64); 6] = [(2, 128), (4, 256), (4, 512), (8, 768), (8, 1024), (12, 1536)];
const MIB: u64 = 1 << 20;

fn cluster(gpus: u64, budget: u64) -> Cluster {
    let gpu = GpuProfile::load(&models_dir().join("gpus/a100-40gb.ron")).unwrap();
    Cluster { nodes: 1, gpus_per_node: gpus, gpu, memory_budget: Some(budget), host_memory: None, nvme: None }
}

fn request(family: &zeroplan_ir::spec::ModelSpec, gpus: u64, budget: u64, pins: Pins) -> Request<'_> {
    Request {
        model: family,
        train: TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() },
        cluster: cluster(gpus, budget),
        seq: 16,
        global_batch: gpus,
        pins,
        extrapolate_depth: false,
        exhaustive: false,
        shared: Default::default(),
        launches: Default::default(),
    }
}

#[test]
fn the_family_keeps_its_kind_and_scales_depth_and_width() {
    let family = model("tiny/tiny-mosaicbert.ron");
    let big = scaled(&family, 8, 512, 1024);
    assert_eq!((big.layers, big.hidden, big.heads, big.intermediate), (8, 512, 64, 1024));
    assert_eq!((big.feed_forward, big.position, big.norm), (family.feed_forward, family.position, family.norm));
    assert_eq!(big.max_position, 1024.max(family.max_position));
}

#[test]
fn the_largest_size_fits_and_the_next_does_not() {
    let family = model("tiny/tiny-bert.ron");
    // Pinned to ZeRO-3 over 2 GPUs without offload: the figures are the
    // ZeRO formula's and the memory plan's, nothing else to choose.
    let pins = Pins { zero_stage: Some(3), offload: Some(Offload::None), tensor_parallel: Some(1), ..Pins::default() };
    let budget = 1536 * MIB;
    let req = request(&family, 2, budget, pins);
    let found = capacity(&req, &LADDER).unwrap_or_else(|e| panic!("{e}"));
    for s in &found.sizes {
        let full = s.full.as_ref().map(|f| f.as_ref().map(|p| p.memory.peak_bytes));
        eprintln!("{}: {} params, states {} B, full {full:?}", s.model.name, s.params, s.states_bytes);
    }
    assert_eq!(found.sizes.len(), LADDER.len());
    for s in &found.sizes {
        // Model states by the formula, from the closed-form parameter count.
        assert_eq!(s.params, closed_form_params(&s.model), "{}", s.model.name);
        let expected = s.params as f64 * state_bytes_per_param(Precision::Bf16, 3, 2);
        assert_eq!(s.states_bytes, expected as u64, "{}", s.model.name);
        assert_eq!(s.states_fit, s.states_bytes <= budget);
    }
    let largest = found.largest_planned.expect("the smallest size fits");
    assert!(largest + 1 < LADDER.len(), "the budget is meant to cut the ladder");
    // Every size up to the largest plans and fits; the next one does not.
    for (i, s) in found.sizes.iter().enumerate() {
        let sized = Request { model: &s.model, ..req.clone() };
        let fits = plan(&sized).is_ok_and(|p| p.memory.peak_bytes <= budget);
        assert_eq!(fits, i <= largest, "{}", s.model.name);
    }
    let Some(Ok(p)) = &found.sizes[largest].full else { panic!("the largest size carries its plan") };
    assert_eq!((p.strategy.zero_stage, p.strategy.offload), (3, Offload::None));
    // A full plan needs activations and buffers too: never larger than the
    // model states alone allow.
    assert!(found.largest_by_states.is_some_and(|s| s >= largest));
}

#[test]
fn tensor_parallelism_raises_the_capacity() {
    let family = model("tiny/tiny-bert.ron");
    let pinned =
        |t| Pins { tensor_parallel: Some(t), zero_stage: Some(0), offload: Some(Offload::None), ..Pins::default() };
    let alone = capacity(&request(&family, 4, 1280 * MIB, pinned(1)), &LADDER).unwrap();
    let split = capacity(&request(&family, 4, 1280 * MIB, pinned(4)), &LADDER).unwrap();
    let (a, b) = (alone.largest_by_states.unwrap(), split.largest_by_states.unwrap());
    assert!(b > a, "model states: TP-4 {b} vs none {a}");
    assert!(
        split.largest_planned > alone.largest_planned,
        "{:?} vs {:?}",
        split.largest_planned,
        alone.largest_planned
    );
    // The model states of one tensor rank are about a quarter of the model's.
    let s = &split.sizes[b];
    assert_eq!(s.states_tensor_parallel, 4);
    let whole = s.params as f64 * state_bytes_per_param(Precision::Bf16, 0, 1);
    assert!((s.states_bytes as f64) < 0.3 * whole, "{} of {whole}", s.states_bytes);
}
