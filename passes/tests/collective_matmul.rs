//! The `collective-matmul` pass: where it cuts the sequence-parallel
//! collectives, and what that does to the predicted step; and the two
//! groups' communication streams it overlaps them on. (That the
//! chunked step trains as the whole one does is checked by running it:
//! `runtime/tests/tensor_parallel.rs`.)

#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::{load_model, models_dir};
use zeroplan_ir::plan::{DataParallel, Offload, OffloadTo, Predicted};
use zeroplan_ir::spec::{Cluster, GpuProfile, ModelSpec, Precision, TrainingSpec};
use zeroplan_ir::{Bindings, DType, Graph, Phase};
use zeroplan_passes::collective_matmul::Chunks;
use zeroplan_passes::cost::simulate::timeline;
use zeroplan_passes::cost::work::Stream;
use zeroplan_passes::cost::{Machine, simulate};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};

fn h100s(gpus: u64) -> Machine {
    let gpu = GpuProfile::load(&models_dir().join("gpus/h100-80gb-sxm.ron")).unwrap();
    let cluster = Cluster {
        nodes: gpus.div_ceil(8),
        gpus_per_node: gpus.min(8),
        gpu,
        memory_budget: None,
        host_memory: None,
        nvme: None,
    };
    Machine { cluster, dtype: DType::BF16, offload_to: OffloadTo::Cpu, launches: Default::default() }
}

/// Two layers of the fidelity suite's GPT-32B shape (hidden 7168, 56
/// heads), as the Megatron-LM H100 row runs it: TP 8 with sequence
/// parallelism, 4 sequences of 4096 per micro-batch, ZeRO-1.
fn gpt_32b_layers() -> ModelSpec {
    let path = models_dir().join("../bench/fidelity/models/gpt-h100-32b.ron");
    let mut m = zeroplan_ir::spec::load(&path).unwrap_or_else(|e| panic!("{e}"));
    m.layers = 2;
    m
}

fn bindings(batch: u64, seq: u64) -> Bindings {
    [("batch".to_string(), batch), ("seq".to_string(), seq)].into()
}

fn step(m: &ModelSpec, t: u64, bound: &Bindings, chunks: Chunks) -> Graph {
    let train = TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() };
    let options = PassOptions {
        shape_hint: bound.clone(),
        tensor_parallel: Some(t),
        sequence_parallel: true,
        data_parallel: Some(DataParallel { ranks: 8, zero_stage: 1, offload: Offload::None }),
        collective_chunks: chunks,
        ..PassOptions::default()
    };
    compile(m, &Target::Training(&train), options).unwrap_or_else(|e| panic!("{e}")).graph
}

fn predict(g: &Graph, bound: &Bindings, machine: &Machine) -> Predicted {
    let order = g.topo_order();
    simulate(g, &order, bound, machine, 1, bound["batch"] * bound["seq"]).unwrap()
}

/// Chunk collectives of `op` in `phase`.
fn chunked(g: &Graph, phase: Phase, op: &str) -> usize {
    g.nodes().filter(|n| n.phase == phase && n.op.name() == op && n.name.contains(".chunk")).count()
}

/// On the Megatron-LM H100 row's shape the cost model cuts the gathers
/// before the column-parallel GEMMs (and the backward's before the
/// row-parallel input gradients) and the reduce-scatters after the
/// row-parallel GEMMs, and the predicted step falls
/// by communication it no longer exposes: the compute stream waits less,
/// the communication stream is busy a little longer (every chunk pays its
/// collective's latency), and the GEMMs' FLOPs are the same.
#[test]
fn chunks_hide_the_sequence_parallel_collectives_behind_the_gemms() {
    let (m, bound, machine) = (gpt_32b_layers(), bindings(4, 4096), h100s(64));
    let whole = step(&m, 8, &bound, Chunks::Whole);
    let cut = step(&m, 8, &bound, Chunks::Cost(Box::new(machine.clone())));
    // The backward's input-gradient reduce-scatters already run beside the
    // weight-gradient GEMM the schedule puts after them: left whole.
    for (phase, op) in [
        (Phase::Forward, "sequence_all_gather"),
        (Phase::Forward, "sequence_reduce_scatter"),
        (Phase::Backward, "sequence_all_gather"),
    ] {
        assert_eq!(chunked(&whole, phase, op), 0);
        assert!(chunked(&cut, phase, op) > 0, "no chunked {op} in the {phase:?}");
    }
    assert_eq!(chunked(&cut, Phase::Backward, "sequence_reduce_scatter"), 0);
    let (before, after) = (predict(&whole, &bound, &machine), predict(&cut, &bound, &machine));
    // The same GEMMs; the copies add their elements, one FLOP each as every kernel's.
    let relative = (after.model_flops - before.model_flops) / before.model_flops;
    assert!((0.0..1e-4).contains(&relative), "model FLOPs {} against {}", after.model_flops, before.model_flops);
    // Each of the two layers hides over a millisecond (the step's rest is
    // the 131,072-word head and ZeRO-1's parameter all-gather).
    let saved = before.step_seconds - after.step_seconds;
    assert!(saved > 2e-3, "step {} s against {} s", after.step_seconds, before.step_seconds);
    let hidden = before.stalled_seconds - after.stalled_seconds;
    assert!(hidden > 2e-3, "exposed {} s against {} s", after.stalled_seconds, before.stalled_seconds);
    let comm = |p: &Predicted| p.busy_seconds["tensor_comm"];
    assert!(comm(&after) >= comm(&before), "communication {} s against {} s", comm(&after), comm(&before));
}

/// The data-parallel group's collectives (ZeRO-1's gradient
/// reduce-scatters) and the tensor-parallel group's (the sequence
/// all-gathers and reduce-scatters) queue on streams of their own, so the
/// simulation runs some of them at once: across nodes on the network
/// ports, inside the node on NVLink.
#[test]
fn the_two_groups_communicate_on_streams_of_their_own() {
    let (m, bound, machine) = (gpt_32b_layers(), bindings(4, 4096), h100s(64));
    let g = step(&m, 8, &bound, Chunks::Whole);
    let order = g.topo_order();
    let events = timeline(&g, &order, &bound, &machine).unwrap();
    let on = |stream: Stream| -> Vec<(f64, f64)> {
        let mut spans = Vec::new();
        for e in events.iter().filter(|e| e.stream == Some(stream)) {
            let op = &g.node(e.node).op;
            assert!(op.is_collective() && op.is_tensor_collective() == (stream == Stream::TensorComm), "{op:?}");
            spans.push((e.start, e.end));
        }
        spans
    };
    let (data, tensor) = (on(Stream::Comm), on(Stream::TensorComm));
    assert!(!data.is_empty() && !tensor.is_empty());
    let overlapping = data.iter().any(|&(s, e)| tensor.iter().any(|&(ts, te)| ts < e && s < te));
    assert!(overlapping, "no data-parallel collective runs beside a tensor-parallel one");
    let p = predict(&g, &bound, &machine);
    assert!(p.busy_seconds["comm"] > 0.0 && p.busy_seconds["tensor_comm"] > 0.0, "{:?}", p.busy_seconds);
}

/// Where a chunk would hold less than one GEMM tile (tiny-bert's 8
/// positions), the cost model leaves the step as it was.
#[test]
fn tiny_shapes_stay_whole() {
    let (m, bound) = (load_model("tiny/tiny-bert.ron"), bindings(2, 8));
    let whole = step(&m, 2, &bound, Chunks::Whole);
    let cut = step(&m, 2, &bound, Chunks::Cost(Box::new(h100s(16))));
    assert_eq!(whole.to_text(), cut.to_text());
}

/// tiny-bert's training step at TP 2 with sequence parallelism, every
/// collective matmul cut in two, under `options`' other settings.
fn tiny_in_two_chunks(options: PassOptions) -> Graph {
    let (m, bound) = (load_model("tiny/tiny-bert.ron"), bindings(2, 8));
    let options = PassOptions {
        shape_hint: bound,
        tensor_parallel: Some(2),
        sequence_parallel: true,
        collective_chunks: Chunks::Fixed(2),
        ..options
    };
    compile(&m, &Target::Training(&TrainingSpec::default()), options).unwrap_or_else(|e| panic!("{e}")).graph
}

/// A fixed count cuts every site whose axis it divides; the chunks of a
/// recomputed node stay `*.recompute`, which model FLOPs leave out.
#[test]
fn fixed_chunks_cut_every_site_and_keep_recomputed_names() {
    let g = tiny_in_two_chunks(PassOptions {
        recompute: zeroplan_passes::recompute::Policy::Full,
        ..PassOptions::default()
    });
    let names: Vec<&str> = g.nodes().map(|n| &*n.name).collect();
    assert!(names.iter().any(|n| n.ends_with(".chunk1.recompute")), "no recomputed chunk");
    let misnamed: Vec<&&str> = names.iter().filter(|n| n.contains(".recompute.chunk")).collect();
    assert!(misnamed.is_empty(), "chunks named after .recompute: {misnamed:?}");
    for phase in [Phase::Forward, Phase::Backward] {
        assert!(chunked(&g, phase, "sequence_all_gather") > 0);
        assert!(chunked(&g, phase, "sequence_reduce_scatter") > 0);
    }
}

/// A tiled operator's GEMMs take the gathered chunks one tile after
/// another, never chunk by chunk across the tiles: that would keep every
/// tile's (gathered) weight live at once, which tiling is there to
/// prevent (on transformer-100t over 512 H100 it put 56 GiB of weights at
/// the peak where one tile's 6 GiB belong).
#[test]
fn a_tiled_operator_is_multiplied_one_tile_at_a_time() {
    let g = tiny_in_two_chunks(PassOptions { tiles: Some(2), ..PassOptions::default() });
    // Each tile parameter's forward GEMMs by place in the schedule.
    let mut spans: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    let mut chunked_tiles = 0;
    for (at, n) in g.topo_order().into_iter().enumerate() {
        let node = g.node(n);
        if node.phase != Phase::Forward || node.op.name() != "matmul" {
            continue;
        }
        let mut w = g.operands(n)[1].node;
        while g.node(w).op.is_view() || matches!(g.node(w).op.name(), "cast" | "tensor_copy") {
            w = g.operands(w)[0].node;
        }
        if !matches!(&g.node(w).op, zeroplan_ir::Op::Param { init: zeroplan_ir::Init::Slice { .. } }) {
            continue;
        }
        chunked_tiles += usize::from(node.name.contains(".chunk"));
        let span = spans.entry(g.node(w).name.to_string()).or_insert((at, at));
        span.1 = at;
    }
    assert!(chunked_tiles > 0, "no tile GEMM was chunked: {spans:?}");
    let spans: Vec<(usize, usize)> = spans.into_values().collect();
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            assert!(a.1 < b.0 || b.1 < a.0, "two tiles' GEMMs interleave: {a:?} and {b:?}");
        }
    }
}
