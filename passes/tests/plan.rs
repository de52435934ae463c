//! The planner: its search, its pins, its errors, its plan files, the
//! depth extrapolation and the cost model's sense.

#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::{load_model as model, models_dir};
use zeroplan_ir::plan::{Attention, Offload, OffloadTo, Plan};
use zeroplan_ir::spec::{Cluster, GpuProfile, ModelSpec, Nvme, Precision, TrainingSpec};
use zeroplan_ir::{DType, Phase};
use zeroplan_passes::cost::Machine;
use zeroplan_passes::cost::nccl::{self, Collective, Fabric};
use zeroplan_passes::cost::work::GemmShape;
use zeroplan_passes::memory::Category;
use zeroplan_passes::planner::depth::Probe;
use zeroplan_passes::planner::evaluate::{Choice, Step};
use zeroplan_passes::planner::explain::gpus_for_budget;
use zeroplan_passes::planner::floor::Floors;
use zeroplan_passes::planner::search::divisors;
use zeroplan_passes::planner::{Pins, PlanError, Request, plan};
use zeroplan_passes::recompute::Policy;

const GIB: u64 = 1 << 30;

fn gpu(name: &str) -> GpuProfile {
    GpuProfile::load(&models_dir().join(format!("gpus/{name}.ron"))).unwrap_or_else(|e| panic!("{e}"))
}

fn cluster(name: &str, gpus: u64, budget: Option<u64>) -> Cluster {
    let gpus_per_node = gpus.min(8);
    Cluster {
        nodes: gpus / gpus_per_node,
        gpus_per_node,
        gpu: gpu(name),
        memory_budget: budget,
        host_memory: None,
        nvme: None,
    }
}

fn request<'a>(model: &'a ModelSpec, cluster: Cluster, seq: u64, global_batch: u64) -> Request<'a> {
    Request {
        model,
        train: TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() },
        cluster,
        seq,
        global_batch,
        pins: Pins::default(),
        extrapolate_depth: true,
        exhaustive: false,
        shared: Default::default(),
        launches: Default::default(),
    }
}

fn planned(req: &Request) -> Plan {
    plan(req).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_winner_fits_and_is_the_fastest_candidate() {
    let m = model("bert-base.ron");
    let req = request(&m, cluster("a100-40gb", 8, Some(4 * GIB)), 128, 256);
    let p = planned(&req);
    let s = &p.strategy;
    assert!(p.memory.peak_bytes <= 4 * GIB, "{}", p.memory.peak_bytes);
    assert_eq!(s.ranks * s.micro_batch * s.micro_batches, 256);
    assert_eq!(p.candidates[0].strategy, *s, "the winner heads the candidates");
    let best = p.candidates[0].tokens_per_second.unwrap();
    // A dominated choice was not compiled: it has no figures
    // (`passes/tests/pruning.rs` checks its twin is at least as fast).
    for c in p.candidates.iter().filter(|c| c.dominated_by.is_none()) {
        assert_eq!(c.fits, c.peak_bytes <= 4 * GIB, "{c:?}");
        assert!(c.min_peak_bytes <= c.peak_bytes);
        assert!(c.tokens_per_second.is_none_or(|t| t <= best), "{c:?} beats the winner");
    }
    // The search saw every tensor-parallel degree inside a node that splits
    // bert-base's 12 heads (1, 2, 4), and at each every ZeRO stage, offload
    // and fixed policy (with sequence parallelism and without at 2 and 4
    // ranks), and an optimal one where keeping every activation did not fit.
    let fixed = p.candidates.iter().filter(|c| !c.strategy.recompute.starts_with("optimal:")).count();
    assert_eq!(fixed, (1 + 2 * 2) * (4 * 3 + 3 * 3 + 3));
    assert!(p.candidates.iter().any(|c| c.strategy.sequence_parallel), "no sequence-parallel candidate");
    for t in [1, 2, 4] {
        assert!(p.candidates.iter().any(|c| c.strategy.tensor_parallel == t && c.strategy.ranks == 8 / t), "TP-{t}");
    }
    let runner = p.runner_up.as_ref().expect("others fit");
    let choice = |s: &zeroplan_ir::plan::Strategy| {
        (s.tensor_parallel, s.sequence_parallel, s.zero_stage, s.offload, s.recompute.clone())
    };
    assert_ne!(choice(&runner.strategy), choice(s));
    assert!(runner.reason.contains("fewer tokens/s"), "{}", runner.reason);
    // The program places every tensor inside the arena.
    assert_eq!(p.program.arena_bytes, p.memory.arena_bytes);
    for b in &p.program.buffers {
        let size =
            if b.place == zeroplan_ir::Place::Device { p.program.arena_bytes } else { p.program.host_arena_bytes };
        assert!(b.offset + b.bytes <= size, "{b:?}");
    }
}

#[test]
fn a_smaller_budget_buys_memory_with_time() {
    let m = model("bert-base.ron");
    let roomy = planned(&request(&m, cluster("a100-40gb", 8, None), 128, 256));
    let tight = planned(&request(&m, cluster("a100-40gb", 8, Some(2 * GIB)), 128, 256));
    assert!(tight.memory.peak_bytes <= 2 * GIB);
    assert!(tight.memory.peak_bytes < roomy.memory.peak_bytes);
    assert!(tight.predicted.tokens_per_second <= roomy.predicted.tokens_per_second);
}

#[test]
fn pins_are_honoured() {
    let m = model("bert-base.ron");
    let mut req = request(&m, cluster("h100-80gb-sxm", 8, None), 128, 256);
    req.pins = Pins {
        tensor_parallel: Some(1),
        zero_stage: Some(3),
        offload: Some(Offload::None),
        recompute: Some(Policy::Full),
        micro_batch: Some(8),
        sequence_parallel: None,
        tiles: None,
        offload_to: None,
        attention: Default::default(),
    };
    let p = planned(&req);
    let s = &p.strategy;
    assert_eq!(
        (s.tensor_parallel, s.zero_stage, s.offload, s.recompute.as_str(), s.micro_batch, s.micro_batches),
        (1, 3, Offload::None, "full", 8, 4)
    );
    assert_eq!(p.candidates.len(), 1, "a pinned policy is the only one tried");
    assert!(p.runner_up.is_none());

    // Tensor parallelism over 2 GPUs leaves 4 data-parallel ranks: each
    // trains 64 sequences of the 256 per step.
    req.pins.tensor_parallel = Some(2);
    let p = planned(&req);
    let s = &p.strategy;
    assert_eq!((s.tensor_parallel, s.ranks, s.micro_batch, s.micro_batches), (2, 4, 8, 8));
    assert_eq!(p.program.graph.tensor_parallel(), 2);
    for (t, why) in [(3, "do not split into groups of 3"), (8, "12 attention heads do not split evenly")] {
        req.pins.tensor_parallel = Some(t);
        let e = plan(&req).unwrap_err();
        assert!(matches!(e, PlanError::TensorParallel { .. }) && e.to_string().contains(why), "{e}");
    }
    req.pins.tensor_parallel = Some(1);

    // An optimal policy is searched only when pinned, and named in the plan.
    let optimal = Policy::Optimal { budget_bytes: 200 << 20 };
    req.pins = Pins { recompute: Some(optimal), ..req.pins };
    let p = planned(&req);
    assert_eq!((p.strategy.recompute.as_str(), p.candidates.len()), ("optimal:200MiB", 1));

    req.pins = Pins { micro_batch: Some(5), ..Pins::default() };
    let e = plan(&req).unwrap_err();
    assert!(matches!(e, PlanError::MicroBatch { .. }) && e.to_string().contains("1, 2, 4, 8, 16, 32"), "{e}");
    req.pins = Pins { zero_stage: Some(0), offload: Some(Offload::Optimizer), ..Pins::default() };
    assert!(matches!(plan(&req), Err(PlanError::Pins(_))));
}

#[test]
fn unfused_attention_is_pinned_and_pays_for_its_probabilities() {
    // At sequence 512 BERT-base's [B, 12, 512, 512] probabilities outweigh
    // the layer's other activations; pinned to one strategy so the two plans
    // differ only in how attention runs.
    let m = model("bert-base.ron");
    let mut req = request(&m, cluster("a100-80gb", 1, None), 512, 8);
    req.pins = Pins { zero_stage: Some(0), recompute: Some(Policy::None), micro_batch: Some(8), ..Pins::default() };
    let fused = planned(&req);
    req.pins.attention = Attention::Unfused;
    let unfused = planned(&req);
    let count = |p: &Plan, op: &str| p.program.graph.nodes().filter(|n| n.op.name() == op).count();
    assert_eq!((count(&fused, "flash_attention"), count(&fused, "flash_attention_grad")), (12, 12));
    assert_eq!((count(&unfused, "flash_attention"), count(&unfused, "flash_attention_grad")), (0, 0));
    assert_eq!((fused.workload.attention, unfused.workload.attention), (Attention::Fused, Attention::Unfused));
    // Each layer keeps at least its bf16 probabilities, 8·12·512² · 2 bytes.
    let probabilities = 12 * 8 * 12 * 512 * 512 * 2;
    assert!(
        unfused.memory.activations_bytes >= fused.memory.activations_bytes + probabilities,
        "{} against {}",
        unfused.memory.activations_bytes,
        fused.memory.activations_bytes
    );
    // The same matmul FLOPs (the unfused softmax's elementwise work is
    // counted, the fused kernel's is not: < 1%), more memory traffic.
    assert!(unfused.predicted.step_seconds > fused.predicted.step_seconds);
    assert!((unfused.predicted.model_flops / fused.predicted.model_flops - 1.0).abs() < 0.01);
    let text = serde_json::to_string(&unfused.workload).unwrap();
    assert!(text.contains(r#""attention":"unfused""#), "{text}");
    assert!(!serde_json::to_string(&fused.workload).unwrap().contains("attention"), "fused is the default, left out");
}

#[test]
fn bad_requests_are_clear_errors() {
    let m = model("bert-base.ron");
    // 101 sequences split over no data-parallel degree that 8 GPUs with
    // 1, 2 or 4 tensor ranks leave (12 heads rule out 8).
    let e = plan(&request(&m, cluster("a100-40gb", 8, None), 128, 101)).unwrap_err();
    assert!(
        e.to_string().contains("over 2 data-parallel ranks") && e.to_string().contains("--global-batch 102"),
        "{e}"
    );
    // 100 split over 4 data-parallel ranks: the search keeps to the tensor
    // degrees that leave such a split.
    let p = planned(&request(&m, cluster("a100-40gb", 8, None), 128, 100));
    assert!(p.strategy.tensor_parallel >= 2, "{:?}", p.strategy);
    let e = plan(&request(&m, cluster("v100-32gb", 8, None), 128, 64)).unwrap_err();
    assert!(e.to_string().contains("no tensor cores for bf16: use --precision f16"), "{e}");
}

/// Nothing fits: the error keeps every choice with its least memory but
/// lists only the 5 closest, and names one change: here the budget (the
/// card has 40 GB), and planning with that budget works. Where a choice's
/// GPU count is known, planning on that many GPUs works too.
#[test]
fn nothing_fits_names_what_would() {
    let m = model("bert-large.ron");
    let budget = 1536 << 20;
    let mut req = request(&m, cluster("a100-40gb", 2, Some(budget)), 512, 2);
    // (Split over both GPUs by tensor parallelism, bert-large would fit;
    // offloaded, its states leave the GPU and it fits too.)
    req.pins.tensor_parallel = Some(1);
    req.pins.offload = Some(Offload::None);
    // The 12 offload-free choices, untiled (tiling would add choices of its own).
    req.pins.tiles = Some(1);
    let Err(PlanError::NothingFits { shortfalls, .. }) = plan(&req) else { panic!("bert-large fits in 1.5 GiB") };
    assert_eq!(shortfalls.len(), 12);
    assert!(shortfalls.iter().all(|s| s.min_peak_bytes > budget));
    assert!(shortfalls.iter().filter(|s| s.choice.starts_with("ZeRO-0")).all(|s| s.gpus_to_fit.is_none()));
    let (choice, gpus) = shortfalls
        .iter()
        .filter_map(|s| Some((s.choice.clone(), s.gpus_to_fit?)))
        .min_by_key(|(_, n)| *n)
        .expect("some sharded choice fits on more GPUs");
    let message = plan(&req).unwrap_err().to_string();
    let listed = message.lines().filter(|l| l.starts_with("  ")).count();
    assert!((1..=5).contains(&listed), "{message}");
    // The one change named makes a plan fit: more GPUs, or a budget that
    // holds the leanest choice (within the 40 GB card).
    let change = message.lines().last().unwrap();
    let figure = |flag: &str| -> Option<f64> {
        change.split(flag).nth(1)?.split([' ', ':']).next()?.trim_end_matches("GiB").parse().ok()
    };
    let mut changed = req.clone();
    if let Some(n) = figure("--gpus ") {
        // As named: whole nodes of this cluster's 2 GPUs (`--nodes`).
        let (n, nodes) = (n as u64, figure("--nodes ").map_or(1, |k| k as u64));
        assert_eq!(n, nodes * req.cluster.gpus_per_node, "{message}");
        (changed.cluster.nodes, changed.global_batch) = (nodes, n);
    } else if let Some(named) = figure("--memory ") {
        let least = shortfalls.iter().map(|s| s.min_peak_bytes).min().unwrap();
        let raised = (named * GIB as f64) as u64;
        assert!(raised >= least && raised <= least + GIB / 10, "{raised} against {least}: {message}");
        changed.cluster = cluster("a100-40gb", 2, Some(raised));
    } else {
        panic!("names neither GPUs nor a budget: {message}");
    }
    assert!(plan(&changed).is_ok(), "the change named does not fit: {message}");
    assert!(gpus <= 64, "{choice}: {gpus} GPUs");
    let zero_stage = choice[5..6].parse().unwrap();
    let recompute = Policy::from_name(choice.rsplit(' ').next().unwrap()).unwrap();
    let offload = Offload::from_name(choice.split(' ').nth(2).unwrap()).unwrap();
    // Whole nodes of 8 (sharding over more GPUs only takes memory off).
    let gpus = if gpus > 8 { gpus.next_multiple_of(8) } else { gpus };
    req.cluster = cluster("a100-40gb", gpus, Some(budget));
    req.global_batch = gpus;
    req.pins = Pins {
        tensor_parallel: Some(1),
        zero_stage: Some(zero_stage),
        offload: Some(offload),
        recompute: Some(recompute),
        micro_batch: None,
        sequence_parallel: None,
        tiles: Some(1),
        offload_to: None,
        attention: Default::default(),
    };
    let p = plan(&req).unwrap_or_else(|e| panic!("{choice} on {gpus} GPUs: {e}"));
    assert!(p.memory.peak_bytes <= budget);
}

#[test]
fn gpu_count_from_two_points() {
    // peak(N) = 1 GiB + 64 GiB / N, seen at 4 and 8 GPUs.
    let peak = |n: f64| (1.0 + 64.0 / n) * GIB as f64;
    assert_eq!(gpus_for_budget(peak(4.0), peak(8.0), 4, 5.0 * GIB as f64, 8), Some(16));
    assert_eq!(gpus_for_budget(peak(4.0), peak(8.0), 4, 9.0 * GIB as f64, 16), Some(8));
    assert_eq!(gpus_for_budget(peak(4.0), peak(8.0), 4, 0.5 * GIB as f64, 8), None, "below the floor");
    assert_eq!(gpus_for_budget(peak(4.0), peak(4.0), 4, 0.5 * GIB as f64, 8), None, "nothing sharded");
    assert_eq!(divisors(12), [1, 2, 3, 4, 6, 12]);
    assert_eq!(divisors(16), [1, 2, 4, 8, 16]);
}

#[test]
fn plan_files_round_trip() {
    let m = model("tiny/tiny-bert.ron");
    let p = planned(&request(&m, cluster("a100-80gb", 2, None), 16, 8));
    let text = p.to_ron();
    let mut streamed = Vec::new();
    p.write_ron(&mut streamed).unwrap();
    assert_eq!(String::from_utf8(streamed).unwrap(), text, "the streamed file is the text");
    let back = Plan::from_ron(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back.to_ron(), text);
    assert_eq!(back.program.graph.node_count(), p.program.graph.node_count());
    assert_eq!(back.strategy, p.strategy);
    let newer = text.replacen("format: 1", "format: 99", 1);
    assert!(Plan::from_ron(&newer).unwrap_err().to_string().contains("compile the plan again"));
}

/// The search's two-short-stacks line against whole planning.
#[test]
fn depth_extrapolation_tracks_whole_planning() {
    let m = model("bert-base.ron");
    let req = request(&m, cluster("a100-40gb", 8, None), 128, 256);
    let machine = Machine {
        cluster: req.cluster.clone(),
        dtype: DType::BF16,
        offload_to: OffloadTo::Cpu,
        launches: Default::default(),
    };
    for choice in [
        Choice {
            tensor_parallel: 1,
            sequence_parallel: false,
            zero_stage: 0,
            offload: Offload::None,
            offload_to: OffloadTo::Cpu,
            recompute: Policy::None,
            tiles: 1,
        },
        Choice {
            tensor_parallel: 1,
            sequence_parallel: false,
            zero_stage: 1,
            offload: Offload::None,
            offload_to: OffloadTo::Cpu,
            recompute: Policy::Selective,
            tiles: 1,
        },
        Choice {
            tensor_parallel: 1,
            sequence_parallel: false,
            zero_stage: 3,
            offload: Offload::None,
            offload_to: OffloadTo::Cpu,
            recompute: Policy::Full,
            tiles: 1,
        },
        Choice {
            tensor_parallel: 1,
            sequence_parallel: false,
            zero_stage: 2,
            offload: Offload::Optimizer,
            offload_to: OffloadTo::Cpu,
            recompute: Policy::None,
            tiles: 1,
        },
    ] {
        let (b, micro_batches) = (8, 4);
        let probe = Probe::compile(&req, choice, 8, b, micro_batches).unwrap();
        assert!(matches!(probe, Probe::Stacks { .. }));
        let whole = Step::compile(&req, &m, choice, 8, b, micro_batches).unwrap();
        let (estimate, exact) = (probe.memory(&req, b).unwrap(), whole.memory(&req, b).unwrap().1);
        let (_, predicted) = probe.predict(&req, &machine, b, micro_batches).unwrap();
        let (_, truth) = whole.predict(&req, &machine, b, micro_batches).unwrap();
        let memory_error = estimate.peak_bytes as f64 / exact.peak_bytes as f64 - 1.0;
        let time_error = predicted.step_seconds / truth.step_seconds - 1.0;
        assert!(memory_error.abs() < 0.03, "{choice}: peak {} vs {}", estimate.peak_bytes, exact.peak_bytes);
        assert!(time_error.abs() < 0.03, "{choice}: step {} vs {}", predicted.step_seconds, truth.step_seconds);
    }
}

#[test]
fn gemm_efficiency_grows_with_the_shape() {
    let machine = Machine {
        cluster: cluster("h100-80gb-sxm", 8, None),
        dtype: DType::BF16,
        offload_to: OffloadTo::Cpu,
        launches: Default::default(),
    };
    let eff = |m, n, k| machine.shape_efficiency(GemmShape { batch: 1, m, n, k });
    assert!(eff(64, 64, 64) < eff(512, 512, 512));
    assert!(eff(512, 512, 512) < eff(8192, 8192, 8192));
    assert!(eff(8192, 8192, 8192) > 0.9);
    // 132 tiles of 128×128 fill the H100's 132 SMs once; one row more
    // needs a 133rd tile and a second wave.
    assert!(eff(128 * 132 + 1, 128, 4096) < 0.6 * eff(128 * 132, 128, 4096));
    // Across nodes an all-reduce runs at the network's speed.
    let fabric = Fabric::of(&machine.cluster.gpu);
    let busbw = |span| nccl::reported_bus_gbps(Collective::AllReduce, 1e9, machine.group(span, span), &fabric);
    assert!(busbw(16) < busbw(8));
}

/// With memory to spare, sharding costs communication: ZeRO-3 gathers
/// parameters twice more per step than stage 0 moves, and the cost model
/// sees it; communication issued in the backward, and ZeRO-1's gathers in
/// the forward, mostly hide behind compute.
#[test]
fn sharding_costs_time_when_memory_is_ample() {
    let m = model("bert-large.ron");
    let mut req = request(&m, cluster("a100-80gb", 16, None), 512, 256);
    let machine = Machine {
        cluster: req.cluster.clone(),
        dtype: DType::BF16,
        offload_to: OffloadTo::Cpu,
        launches: Default::default(),
    };
    req.pins.micro_batch = Some(16);
    let time = |zero_stage| {
        let choice = Choice {
            tensor_parallel: 1,
            sequence_parallel: false,
            zero_stage,
            offload: Offload::None,
            offload_to: OffloadTo::Cpu,
            recompute: Policy::None,
            tiles: 1,
        };
        let probe = Probe::compile(&req, choice, 16, 16, 1).unwrap();
        probe.predict(&req, &machine, 16, 1).unwrap()
    };
    let ((c0, p0), (c1, p1), (c3, p3)) = (time(0), time(1), time(3));
    assert!(c3.bytes_per_step > 1.4 * c0.bytes_per_step);
    // The gathers keep NCCL busier. They hide behind compute, and AdamW
    // over a 1/16 shard is shorter than over every parameter, so the step
    // itself need not be slower: collectives timed as NCCL runs them cost
    // less than the ring with a full latency per step did.
    let busy = |p: &zeroplan_ir::plan::Predicted| p.busy_seconds["comm"];
    assert!(busy(&p3) > 1.2 * busy(&p0), "{} vs {} s of communication", busy(&p3), busy(&p0));
    let comm = p0.busy_seconds["comm"];
    assert!(p0.stalled_seconds < 0.5 * comm, "stalled {} of {comm} s of communication", p0.stalled_seconds);
    // ZeRO-1 sends what ZeRO-0 does, and its parameter all-gathers run in
    // the forward under the layers before them, not after the update where
    // nothing is left to hide them: a quarter of its communication at most
    // waits (gathered after the update, 43% did: 4.6 of 10.7 ms).
    assert!((c1.bytes_per_step / c0.bytes_per_step - 1.0).abs() < 0.01);
    let comm = p1.busy_seconds["comm"];
    assert!(p1.stalled_seconds < 0.25 * comm, "ZeRO-1 stalled {} of {comm} s of communication", p1.stalled_seconds);
}

/// Where keeping every activation does not fit the micro-batch that full
/// recomputation reaches, the search sizes an `optimal` policy to the
/// budget: it fits, and recomputes less than `full` at the same micro-batch.
#[test]
fn the_search_sizes_an_optimal_policy_to_the_budget() {
    let m = model("bert-base.ron");
    let mut req = request(&m, cluster("a100-40gb", 2, Some(3 * GIB)), 512, 32);
    req.pins.zero_stage = Some(1);
    req.pins.offload = Some(Offload::None);
    let p = planned(&req);
    let optimal =
        p.candidates.iter().find(|c| c.strategy.recompute.starts_with("optimal:")).expect("an optimal candidate");
    let full = p.candidates.iter().find(|c| c.strategy.recompute == "full").unwrap();
    assert!(optimal.fits && optimal.peak_bytes <= 3 * GIB, "{optimal:?}");
    assert_eq!(optimal.strategy.micro_batch, full.strategy.micro_batch);
    assert!(optimal.tokens_per_second.unwrap() > full.tokens_per_second.unwrap(), "{optimal:?} vs {full:?}");
    assert!(Policy::from_name(&optimal.strategy.recompute).is_some(), "the name reads back");
    // The search plans each `optimal` candidate whole: its figure is exact,
    // so none is faster than the winner (past the 0.1 % tie).
    for c in p.candidates.iter().filter(|c| c.strategy.recompute.starts_with("optimal:")) {
        let speed = c.tokens_per_second.unwrap_or(0.0);
        assert!(speed <= 1.001 * p.predicted.tokens_per_second, "{} at {speed:.0} tokens/s", c.strategy);
    }
}

/// `--host-memory` bounds what a node's GPUs offload: bert-large on one
/// A100 at a 3 GiB budget must offload (its states alone are 5.6 GiB) and,
/// unchecked, puts over 4 GiB on the host; a node with exactly that much
/// gets the same plan, which records the bound; with 4 GiB nothing fits,
/// and the error names the host memory that would.
#[test]
fn host_memory_bounds_what_is_offloaded() {
    let m = model("bert-large.ron");
    let mut req = request(&m, cluster("a100-40gb", 1, Some(3 * GIB)), 128, 8);
    let unchecked = planned(&req);
    assert_ne!(unchecked.strategy.offload, Offload::None, "{:?}", unchecked.strategy);
    let host = unchecked.memory.host_bytes;
    assert!(host > 4 * GIB, "{host}");

    req.cluster.host_memory = Some(host);
    let bounded = planned(&req);
    assert_eq!(bounded.strategy, unchecked.strategy);
    assert!(bounded.memory.host_bytes <= host && bounded.memory.peak_bytes <= 3 * GIB);
    assert_eq!(bounded.cluster.host_memory_bytes, Some(host), "the plan records the bound");

    req.cluster.host_memory = Some(4 * GIB);
    let Err(e @ PlanError::NothingFits { .. }) = plan(&req) else { panic!("fits 4 GiB of host") };
    let PlanError::NothingFits { shortfalls, .. } = &e else { unreachable!() };
    let least = shortfalls.iter().filter_map(|s| s.host_bytes_per_node).min().expect("host-limited choices");
    assert!(least > 4 * GIB, "{least}");
    assert!(shortfalls.iter().all(|s| s.host_bytes_per_node.is_some() == (s.choice.contains("offload optimizer"))));
    let message = e.to_string();
    assert!(message.contains("over --host-memory") && message.contains("the GPUs fit, the hosts do not"), "{message}");
    // The one change named, the host memory, makes a plan fit.
    let named = message
        .split("Cheapest change: --host-memory ")
        .nth(1)
        .and_then(|rest| rest.split("GiB").next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("names no host memory: {message}"));
    let host = (named * GIB as f64) as u64;
    assert!(host >= least, "{host} < {least}: {message}");
    req.cluster.host_memory = Some(host);
    assert!(plan(&req).is_ok(), "--host-memory {named}GiB does not fit: {message}");
}

/// ZeRO-Infinity's NVMe tier: where the hosts are too small for the
/// offloaded states (bert-large on one A100 at 3 GiB, 3 GiB of host), a node
/// with NVMe takes them; CPU memory then holds only the pinned buffers they
/// stream through, within `--host-memory`. The drives' capacity bounds the
/// plan as the host's does, and the nothing-fits error names what is over.
#[test]
fn the_nvme_tier_holds_what_the_host_cannot() {
    let m = model("bert-large.ron");
    let mut req = request(&m, cluster("a100-40gb", 1, Some(3 * GIB)), 128, 8);
    req.cluster.host_memory = Some(3 * GIB);
    let Err(e) = plan(&req) else { panic!("fits 3 GiB of host without NVMe") };
    let message = e.to_string();
    assert!(message.contains("over --host-memory") && message.contains("--nvme SIZE"), "{message}");

    // One PCIe 3.0 x4 drive (Samsung PM1725a: 3.3 GB/s read, 3.0 GB/s write).
    let drives = Nvme { bytes: 1 << 40, read_gbps: 3.3, write_gbps: 3.0 };
    req.cluster.nvme = Some(drives);
    let p = planned(&req);
    assert_eq!(p.strategy.offload_to, OffloadTo::Nvme, "{}", p.strategy);
    assert_ne!(p.strategy.offload, Offload::None);
    let m = &p.memory;
    assert!(m.peak_bytes <= 3 * GIB && m.host_bytes <= 3 * GIB, "{m:?}");
    // The NVMe holds at least the fp32 masters and both moments: 12 bytes a parameter.
    assert!(m.nvme_bytes >= 12 * p.params && m.nvme_bytes <= drives.bytes, "{m:?}");
    assert_eq!(p.cluster.nvme, Some(drives), "the plan records the drives");
    assert!(p.strategy.to_string().contains("@nvme"), "{}", p.strategy);
    // Streaming from one drive costs time: its 8 GB of states a step read
    // and written back take longer than CPU AdamW over them, so the same
    // choice on the CPU tier (unbounded host) is faster.
    let mut cpu = req.clone();
    cpu.cluster.host_memory = None;
    cpu.pins = Pins {
        zero_stage: Some(p.strategy.zero_stage),
        offload: Some(p.strategy.offload),
        offload_to: Some(OffloadTo::Cpu),
        micro_batch: Some(p.strategy.micro_batch),
        ..Pins::default()
    };
    let on_cpu = planned(&cpu);
    let (cpu_step, nvme_step) = (on_cpu.predicted.step_seconds, p.predicted.step_seconds);
    assert!(cpu_step < nvme_step, "{cpu_step} vs {nvme_step}");
    assert_eq!(on_cpu.memory.nvme_bytes, 0);

    // Drives too small: nothing fits, and the error says they are.
    req.cluster.nvme = Some(Nvme { bytes: GIB, ..drives });
    let Err(e @ PlanError::NothingFits { .. }) = plan(&req) else { panic!("fits 1 GiB of NVMe") };
    let message = e.to_string();
    assert!(message.contains("over --nvme"), "{message}");

    // The NVMe tier pinned where there is none is refused by name.
    req.cluster.nvme = None;
    req.pins.offload_to = Some(OffloadTo::Nvme);
    let message = plan(&req).unwrap_err().to_string();
    assert!(message.contains("--offload-to nvme") && message.contains("--nvme SIZE"), "{message}");
}

/// `--sp` pins sequence parallelism (Korthikanti et al., 2022) on: the plan
/// says so and keeps fewer activations than `--no-sp` at the same pins;
/// without tensor ranks, or with a sequence the ranks do not divide, it is
/// refused by name.
#[test]
fn sequence_parallelism_is_pinned_or_refused_by_name() {
    let m = model("bert-base.ron");
    let mut req = request(&m, cluster("h100-80gb-sxm", 8, None), 128, 256);
    let pinned = |sp: bool| Pins {
        tensor_parallel: Some(2),
        zero_stage: Some(1),
        offload: Some(Offload::None),
        recompute: Some(Policy::None),
        micro_batch: Some(8),
        sequence_parallel: Some(sp),
        tiles: None,
        offload_to: None,
        attention: Default::default(),
    };
    req.pins = pinned(true);
    let with = planned(&req);
    assert!(with.strategy.sequence_parallel && with.strategy.to_string().starts_with("TP-2+SP "), "{}", with.strategy);
    req.pins = pinned(false);
    let without = planned(&req);
    assert!(!without.strategy.sequence_parallel);
    assert!(
        with.memory.activations_bytes < without.memory.activations_bytes,
        "activations {} B with sequence parallelism, {} B without",
        with.memory.activations_bytes,
        without.memory.activations_bytes
    );
    req.pins = Pins { tensor_parallel: Some(1), ..pinned(true) };
    let err = plan(&req).expect_err("refused").to_string();
    assert!(err.starts_with("--sp:") && err.contains("--tp 2 or more"), "{err}");
    req.pins = pinned(true);
    req.seq = 127;
    let err = plan(&req).expect_err("refused").to_string();
    assert!(err.starts_with("--sp:") && err.contains("multiple of 2"), "{err}");
}

/// Deep models are searched on a line through two short stacks; a choice
/// whose estimate beats the winner's exact figure is compiled whole too, so
/// the runner-up shown is never faster than the plan (bert-base on 8 A100s
/// showed a runner-up at 91.4 ms against a 92.3 ms winner before).
#[test]
fn the_runner_up_is_never_faster_than_the_winner() {
    let m = model("bert-base.ron");
    for (gpus, global_batch) in [(8, 256), (8, 64), (1, 32)] {
        let p = planned(&request(&m, cluster("a100-40gb", gpus, None), 128, global_batch));
        let runner = p.runner_up.as_ref().expect("others fit");
        assert!(
            runner.tokens_per_second <= 1.001 * p.predicted.tokens_per_second,
            "{gpus} GPUs, batch {global_batch}: runner-up {} at {:.0} tokens/s beats {} at {:.0}",
            runner.strategy,
            runner.tokens_per_second,
            p.strategy,
            p.predicted.tokens_per_second
        );
        assert!(!runner.reason.contains("-"), "{}", runner.reason);
        assert_eq!(p.candidates[0].strategy.to_string(), p.strategy.to_string(), "the winner heads the candidates");
    }
}

/// On one GPU the nothing-fits answer fits what more GPUs would do from two
/// ranks up: one rank has no NCCL buffers (nor gathers to run), so its peak
/// is no point of the line `A + B/N`, and fitted through it `A`, what stays
/// on each GPU, came out above what two GPUs need.
#[test]
fn on_one_gpu_what_stays_on_each_is_fitted_from_two_ranks_up() {
    let m = model("bert-large.ron");
    let answer = |gpus: u64| {
        let mut req = request(&m, cluster("a100-40gb", gpus, Some(600 << 20)), 512, 8);
        req.pins.tensor_parallel = Some(1);
        match plan(&req) {
            Err(PlanError::NothingFits { shortfalls, .. }) => shortfalls,
            other => panic!("bert-large fits in 600 MiB on {gpus}: {:?}", other.map(|p| p.strategy)),
        }
    };
    let (one, two) = (answer(1), answer(2));
    for s in one.iter().filter(|s| s.choice.starts_with("ZeRO-3")) {
        let on_two = two.iter().find(|t| t.choice == s.choice).expect("the same choices").min_peak_bytes;
        let floor = s.floor_bytes.expect("a sharded choice has a floor");
        assert!(floor <= on_two + on_two / 100, "{}: {floor} bytes stay on each, {on_two} on two GPUs", s.choice);
    }
    let mut req = request(&m, cluster("a100-40gb", 1, Some(600 << 20)), 512, 8);
    req.pins.tensor_parallel = Some(1);
    let message = plan(&req).unwrap_err().to_string();
    assert!(message.contains("with NCCL's buffers"), "{message}");
}

/// Under full recomputation every layer's input is live at the end of the
/// forward, beside the model states: the floor by which the search skips a
/// choice without compiling it ([`Floors`]) is at most what the step
/// compiled whole holds there, and two layers more hold two checkpoints
/// more — post- and pre-LayerNorm, GLU, factorised embeddings, with and
/// without sequence parallelism, ZeRO-0 to 3, offloaded, tiled.
#[test]
fn the_checkpoint_floor_is_what_full_recomputation_keeps() {
    let gpt = zeroplan_ir::spec::load(&models_dir().join("../bench/fidelity/models/gpt-1.7b.ron"))
        .unwrap_or_else(|e| panic!("{e}"));
    let models = [model("bert-large.ron"), model("albert-base.ron"), model("mosaicbert-base.ron"), gpt];
    let layouts = [
        (1, false, 0, Offload::None, 1),
        (2, false, 1, Offload::None, 1),
        (2, true, 2, Offload::Optimizer, 1),
        (4, true, 3, Offload::OptimizerAndParams, 1),
        (1, false, 3, Offload::Optimizer, 4),
    ];
    for m in &models {
        for (tensor_parallel, sequence_parallel, zero_stage, offload, tiles) in layouts {
            let choice = Choice {
                tensor_parallel,
                sequence_parallel,
                zero_stage,
                offload,
                offload_to: OffloadTo::Cpu,
                recompute: Policy::Full,
                tiles,
            };
            let ranks = choice.data_ranks(8);
            // The floor, and the device bytes (all, and activations) live
            // at the forward's last instruction, at 2 and 4 layers.
            let at = |layers: u64| {
                let m = ModelSpec { layers, ..m.clone() };
                let mut req = request(&m, cluster("a100-80gb", 8, None), 512, 8 * ranks);
                req.pins.micro_batch = Some(8);
                let (floor, _) = Floors::default().of(&req, choice).unwrap();
                let whole = Step::compile(&req, &m, choice, ranks, 8, 1).unwrap();
                let (plan, _) = whole.memory(&req, 8).unwrap();
                let phase = |n| whole.graph.node(n).phase;
                let end = plan.order.iter().rposition(|&n| phase(n) == Phase::Forward).unwrap();
                let live = plan.intervals.iter().filter(|i| i.alias_of.is_none() && i.start <= end && end <= i.end);
                let activations = live.clone().filter(|i| i.category == Category::Activations);
                (floor, live.map(|i| i.bytes).sum::<u64>(), activations.map(|i| i.bytes).sum::<u64>())
            };
            let ((_, _, short), (floor, live, long)) = (at(2), at(4));
            let split = if sequence_parallel { tensor_parallel } else { 1 };
            let layer = 8 * 512 / split * m.hidden * 2;
            assert_eq!(floor.checkpoints, 4 * layer, "{}: {choice}", m.name);
            assert!(floor.gpu + floor.checkpoints <= live, "{}: {choice}: {floor:?}, {live} bytes live", m.name);
            assert_eq!(long - short, 2 * layer, "{}: {choice}: what two layers more keep", m.name);
            let selective = Choice { recompute: Policy::Selective, ..choice };
            let req = request(m, cluster("a100-80gb", 8, None), 512, 16);
            assert_eq!(Floors::default().of(&req, selective).unwrap().0.checkpoints, 0, "only full recomputation");
        }
    }
}
