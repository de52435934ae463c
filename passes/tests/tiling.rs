//! Memory-centric tiling: a tiled step trains as the untiled one, and
//! under ZeRO-3 the gathered working set is the tile the pass states.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::{load_model as model, models_dir};
use std::collections::BTreeMap;
use zeroplan_ir::interp::{Interpreter, Rounding};
use zeroplan_ir::plan::{DataParallel, Offload};
use zeroplan_ir::spec::{Cluster, GpuProfile, ModelSpec, Precision, TrainingSpec};
use zeroplan_ir::{Bindings, DType, Graph, Init, Op, Tensor};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::memory;
use zeroplan_passes::pipeline::{Compiled, Target, compile};
use zeroplan_passes::planner::{Pins, PlanError, Request, plan};

fn compiled(m: &ModelSpec, train: &TrainingSpec, dp: Option<DataParallel>, tiles: Option<u64>) -> Compiled {
    let options = PassOptions {
        data_parallel: dp,
        tiles,
        shape_hint: [("batch".to_string(), 2), ("seq".to_string(), 4)].into(),
        ..PassOptions::default()
    };
    compile(m, &Target::Training(train), options).unwrap_or_else(|e| panic!("{}: {e}", m.name))
}

fn feeds(k: i64) -> BTreeMap<String, Tensor> {
    let int = |v: Vec<i64>| Tensor::int(vec![2, 4], DType::I64, v).unwrap();
    BTreeMap::from([
        ("input_ids".to_string(), int(vec![3, 9, 1, 22, 7, 4, 4, 18].into_iter().map(|x| (x + k) % 30).collect())),
        ("token_type_ids".to_string(), int(vec![0, 0, 1, 1, 0, 0, 1, 1])),
        ("attention_mask".to_string(), int(vec![1, 1, 1, 0, 1, 1, 1, 1])),
        ("labels".to_string(), int(vec![-100, 9, -100, 2, 7, -100, 5, -100])),
    ])
}

/// The losses of three steps (the later ones read every updated
/// parameter) and the gradient norm of the first.
fn losses(graph: &Graph, rounding: Rounding) -> Vec<f64> {
    let interp = Interpreter { rounding, seed: 5 };
    let mut state = interp.init_state(graph).unwrap_or_else(|e| panic!("{e}"));
    (0..3)
        .map(|step| {
            let out = interp.step(graph, &mut state, &[feeds(step)], step as u64).unwrap_or_else(|e| panic!("{e}"));
            out.micro_batches[0]["loss"].item().unwrap()
        })
        .collect()
}

/// The tile parameters, whole or as members of ZeRO's flat buffers.
fn tile_params(graph: &Graph) -> Vec<String> {
    let mut names = Vec::new();
    for n in graph.params() {
        let node = graph.node(n);
        match &node.op {
            Op::Param { init: Init::Slice { .. } } => names.push(node.name.to_string()),
            Op::Param { init: Init::Flat { members, .. } } => names
                .extend(members.iter().filter(|m| matches!(*m.init, Init::Slice { .. })).map(|m| m.name.to_string())),
            _ => {}
        }
    }
    names
}

fn stat(c: &Compiled, name: &str) -> u64 {
    let record = c.records.iter().find(|r| r.name == "tiling").expect("the tiling pass ran");
    record
        .stats
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no stat {name}"))
}

#[test]
fn a_tiled_step_trains_as_the_untiled_one() {
    // f64 arithmetic: only the order of the input gradient's sum over
    // tiles differs, so 1e-12 relative; f32 as the hardware rounds: 1e-5.
    let cases = [(Rounding::F64, 1e-12), (Rounding::Native, 1e-5)];
    for file in ["tiny/tiny-bert.ron", "tiny/tiny-mosaicbert.ron", "tiny/tiny-albert.ron"] {
        let m = model(file);
        let train = TrainingSpec { precision: Precision::F32, dropout: Some(0.1), ..TrainingSpec::default() };
        for dp in [None, Some(DataParallel { ranks: 1, zero_stage: 3, offload: Offload::None })] {
            let untiled = compiled(&m, &train, dp, None).graph;
            for tiles in [2, 3, 8] {
                let c = compiled(&m, &train, dp, Some(tiles));
                assert!(!tile_params(&c.graph).is_empty(), "{file} tiles {tiles}: nothing tiled");
                for (rounding, tolerance) in cases {
                    let (want, got) = (losses(&untiled, rounding), losses(&c.graph, rounding));
                    for (a, b) in got.iter().zip(&want) {
                        assert!(
                            (a - b).abs() <= tolerance * b.abs(),
                            "{file} {dp:?} tiles {tiles} {rounding:?}: {got:?} vs {want:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn one_tile_changes_nothing() {
    let m = model("tiny/tiny-bert.ron");
    let train = TrainingSpec::default();
    let untiled = compiled(&m, &train, None, None).graph;
    let one = compiled(&m, &train, None, Some(1));
    assert_eq!(stat(&one, "tiled operators"), 0);
    assert_eq!(one.graph.to_text(), untiled.to_text());
}

#[test]
fn the_largest_operator_splits_into_the_tiles_asked_for() {
    let m = model("tiny/tiny-bert.ron");
    let train = TrainingSpec::default();
    for tiles in [2, 4, 8] {
        let c = compiled(&m, &train, None, Some(tiles));
        let names = tile_params(&c.graph);
        // Widest weights: the feed-forward's [64, 32] (2048 elements), or
        // Q, K and V merged (3 × 1024) when `rewrite` merges them.
        let up: Vec<&String> = names.iter().filter(|n| n.starts_with("layer0.ffn.up.weight.tile")).collect();
        let max_tile = stat(&c, "max tile elements");
        assert_eq!(up.len() as u64, 2048u64.div_ceil(max_tile), "tiles {tiles}: {names:?}");
        for n in c.graph.params() {
            let ty = &c.graph.node(n).outputs[0];
            if let Op::Param { init: Init::Slice { .. } } = c.graph.node(n).op {
                assert!(ty.shape.numel().as_constant().unwrap() <= max_tile, "{}", c.graph.node(n).name);
            }
        }
    }
}

#[test]
fn tiled_graph_snapshot() {
    let mut m = model("tiny/tiny-bert.ron");
    m.layers = 1;
    let options = PassOptions {
        tiles: Some(2),
        disabled: ["mixed-precision", "training-step", "recompute", "fuse"].map(String::from).into(),
        shape_hint: [("batch".to_string(), 2), ("seq".to_string(), 8)].into(),
        ..PassOptions::default()
    };
    let c = compile(&m, &Target::Training(&TrainingSpec::default()), options).unwrap();
    insta::assert_snapshot!("tiny-bert_tiled_forward", c.graph.to_text());
}

/// From the memory plan of `graph`: the most bytes of gathered parameters
/// (ZeRO-3 all-gathers) live at once, the most of gathered tiles, and each
/// gather's name and bytes.
fn gathered(graph: &Graph, bindings: &Bindings) -> (u64, u64, Vec<(String, u64)>) {
    let p = memory::plan(graph, bindings).unwrap();
    let is_gather = |v: zeroplan_ir::Value| matches!(graph.node(v.node).op, Op::AllGather { .. });
    let (mut live, mut tiles) = (vec![0u64; p.order.len() + 1], vec![0u64; p.order.len() + 1]);
    let mut gathers = Vec::new();
    for iv in p.intervals.iter().filter(|iv| is_gather(iv.value) && iv.alias_of.is_none()) {
        let name = graph.node(iv.value.node).name.to_string();
        for at in iv.start..=iv.end {
            live[at] += iv.bytes;
            tiles[at] += if name.contains(".tile") { iv.bytes } else { 0 };
        }
        gathers.push((name, iv.bytes));
    }
    (live.into_iter().max().unwrap(), tiles.into_iter().max().unwrap(), gathers)
}

/// Under ZeRO-3 the gathered tiles live at once are the tile in use and the
/// one prefetched behind it — with full recomputation too (the recomputed
/// forward gathers its tiles apart from the backward's), and with tensor
/// and sequence parallelism (whose replicated head weight the backward
/// reads through Megatron's `f`, gathered again there).
#[test]
fn under_zero3_the_working_set_is_a_tile_as_the_plan_says() {
    use zeroplan_passes::recompute::Policy;
    for (recompute, tensor_parallel) in [(Policy::None, None), (Policy::Full, None), (Policy::Full, Some(2))] {
        working_set_is_a_tile(recompute, tensor_parallel);
    }
}

fn working_set_is_a_tile(recompute: zeroplan_passes::recompute::Policy, tensor_parallel: Option<u64>) {
    // A model whose feed-forward dominates: 4 ranks, bf16.
    let mut m = model("tiny/tiny-bert.ron");
    m.intermediate = 512;
    let train = TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() };
    let dp = Some(DataParallel { ranks: 4, zero_stage: 3, offload: Offload::None });
    let bindings: Bindings = [("batch".to_string(), 2), ("seq".to_string(), 8)].into();
    let compiled = |tiles: Option<u64>| {
        let options = PassOptions {
            data_parallel: dp,
            tiles,
            recompute,
            tensor_parallel,
            sequence_parallel: tensor_parallel.is_some(),
            shape_hint: [("batch".to_string(), 2), ("seq".to_string(), 8)].into(),
            ..PassOptions::default()
        };
        compile(&m, &Target::Training(&train), options).unwrap_or_else(|e| panic!("{}: {e}", m.name))
    };
    let case = format!("{recompute:?}, tensor-parallel {tensor_parallel:?}");
    let (mut before, _, untiled) = gathered(&compiled(None).graph, &bindings);
    let untiled_largest = untiled.iter().map(|g| g.1).max().unwrap();
    for tiles in [2, 4, 8] {
        let c = compiled(Some(tiles));
        let (live, tiles_live, gathers) = gathered(&c.graph, &bindings);
        // Every gathered tile is the tile the pass states, in bf16, padded
        // to the shard alignment (4 ranks × 128 elements).
        let unit = 4 * zeroplan_passes::partition::SHARD_ALIGN;
        let tile_bytes = 2 * stat(&c, "max tile elements").div_ceil(unit) * unit;
        let tile_gathers: Vec<&(String, u64)> = gathers.iter().filter(|g| g.0.contains(".tile")).collect();
        assert!(!tile_gathers.is_empty(), "{case}, tiles {tiles}: {gathers:?}");
        assert!(tile_gathers.iter().all(|g| g.1 <= tile_bytes), "{case}, tiles {tiles}: {gathers:?}");
        // The tiled operators' working set: the tile in use and the one
        // prefetched behind it, never more (each freed after its last
        // reader, before the one after next is gathered).
        assert!(tiles_live <= 2 * tile_bytes, "{case}, tiles {tiles}: {tiles_live} B of tiles live, {gathers:?}");
        // All gathered parameters live at once shrink with the tiles.
        let largest = gathers.iter().map(|g| g.1).max().unwrap();
        assert!(largest < untiled_largest, "{case}, tiles {tiles}");
        assert!(live < before, "{case}, tiles {tiles}: {live} B live, {before} B with fewer tiles");
        println!(
            "{case}, tiles {tiles}: gathered live {live} B (tiles {tiles_live} B), largest gather {largest} B, tile {tile_bytes} B"
        );
        before = live;
    }
}

/// A model whose feed-forward weights dwarf the rest: two `[2^20, 1024]`
/// matrices per layer, 2 GiB each in bf16.
fn wide_feed_forward() -> ModelSpec {
    ModelSpec { hidden: 1024, heads: 16, intermediate: 1 << 20, layers: 2, ..model("bert-base.ron") }
}

fn request(m: &ModelSpec, budget: u64, pins: Pins) -> Request<'_> {
    let gpu = GpuProfile::load(&models_dir().join("gpus/h100-80gb-sxm.ron")).unwrap();
    let cluster =
        Cluster { nodes: 1, gpus_per_node: 8, gpu, memory_budget: Some(budget), host_memory: None, nvme: None };
    let train = TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() };
    Request {
        model: m,
        train,
        cluster,
        seq: 128,
        global_batch: 8,
        pins,
        extrapolate_depth: true,
        exhaustive: false,
        shared: Default::default(),
        launches: Default::default(),
    }
}

#[test]
fn the_planner_tiles_an_operator_that_does_not_fit_gathered() {
    let m = wide_feed_forward();
    let pins = Pins {
        tensor_parallel: Some(1),
        micro_batch: Some(1),
        recompute: Some(zeroplan_passes::recompute::Policy::Full),
        ..Pins::default()
    };
    // Untiled ZeRO-3's least memory (everything else offloaded), with room to spare.
    let untiled = Pins { zero_stage: Some(3), offload: Some(Offload::OptimizerAndParams), tiles: Some(1), ..pins };
    let roomy = plan(&request(&m, 80 << 30, untiled)).unwrap_or_else(|e| panic!("{e}"));
    let untiled_peak = roomy.memory.peak_bytes;
    // A budget 1 GiB under it: every untiled choice fails (ZeRO-3 holds the
    // least), and the search tiles.
    let budget = untiled_peak - (1 << 30);
    match plan(&request(&m, budget, Pins { tiles: Some(1), ..pins })) {
        Err(e @ PlanError::NothingFits { .. }) => assert!(e.to_string().contains("--tiles"), "{e}"),
        other => panic!("untiled should not fit {budget} B: {:?}", other.map(|p| p.strategy)),
    }
    let p = plan(&request(&m, budget, pins)).unwrap_or_else(|e| panic!("{e}"));
    let s = &p.strategy;
    assert!(s.tiles > 1 && s.zero_stage == 3, "{s}");
    assert!(s.to_string().ends_with(&format!("tiles {}", s.tiles)), "{s}");
    assert!(p.memory.peak_bytes <= budget, "{} > {budget}", p.memory.peak_bytes);
    // The plan's program is the tiled step: each tile its own bucket.
    let tile_buckets = p.program.graph.params().into_iter().filter(|&n| p.program.graph.node(n).name.contains(".tile"));
    assert!(tile_buckets.count() >= 2 * s.tiles as usize, "tiles {}", s.tiles);
    // The least count that fits: one fewer doubling does not.
    let fewer = Pins { zero_stage: Some(3), offload: Some(s.offload), tiles: Some(s.tiles / 2), ..pins };
    if let Ok(q) = plan(&request(&m, budget, fewer)) {
        panic!("{} tiles fit too: {}", s.tiles / 2, q.strategy);
    }
    println!("untiled peak {untiled_peak} B; {s}: {} B", p.memory.peak_bytes);
}

/// What the nothing-fits answer assumes (`planner/explain.rs`): tiling
/// changes what is gathered, not what is sharded, so a ZeRO-3 choice's peak
/// falls from `N` to `2N` data-parallel ranks by nearly the same bytes
/// tiled and untiled: within 3% (2.5% here, where the arena places the
/// tiles' working set around the shards differently).
#[test]
fn tiling_leaves_the_sharded_fall_with_the_ranks_unchanged() {
    use zeroplan_passes::planner::depth::Probe;
    use zeroplan_passes::planner::evaluate::Choice;
    use zeroplan_passes::recompute::Policy;
    let m = wide_feed_forward();
    let req = request(&m, 80 << 30, Pins::default());
    for offload in [Offload::None, Offload::Optimizer] {
        let fall = |tiles: u64| {
            let choice = Choice {
                tensor_parallel: 1,
                sequence_parallel: false,
                zero_stage: 3,
                offload,
                offload_to: zeroplan_ir::plan::OffloadTo::Cpu,
                recompute: Policy::Full,
                tiles,
            };
            let peak = |ranks: u64| {
                let probe = Probe::compile(&req, choice, ranks, 1, 1).unwrap_or_else(|e| panic!("{e}"));
                probe.memory(&req, 1).unwrap_or_else(|e| panic!("{e}")).peak_bytes as i64
            };
            peak(8) - peak(16)
        };
        let (flat, tiled) = (fall(1), fall(4));
        assert!(flat > 0, "{offload:?}: sharding over more ranks saves nothing ({flat} bytes)");
        let off = (flat - tiled).abs() as f64 / flat as f64;
        assert!(off < 0.03, "{offload:?}: the fall from 8 to 16 ranks is {flat} bytes untiled, {tiled} tiled");
    }
}
