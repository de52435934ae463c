//! Tensor × data parallelism on the host: a plan for `t` tensor-parallel
//! ranks (Megatron-LM layers) and `d` data-parallel ranks (ZeRO over each
//! tensor rank's `d` peers), run as `d·t` threads joined by two in-process
//! groups each, trains as one rank (`t = 1`, `d = 1`, no ZeRO: the
//! reference interpreter) accumulating the same `d` batches.
//!
//! Per step the data ranks' mean loss and every rank's gradient norm equal
//! the reference's within 1e-6 relative; after three steps every parameter
//! (tensor shards joined along their axis, vocabulary padding dropped, ZeRO
//! shards joined in data-rank order) within 2e-5 relative — the bounds of
//! `ranks.rs`, for its reason: AdamW divides each gradient element by its
//! own RMS, so rounding-level differences in a gradient element become
//! differences of up to `lr` in its step. Each rank's measured peak is the
//! plan's arena; two runs give the same bits.
//!
//! Dropout is 0: as Megatron-LM does, each tensor rank draws its own masks
//! at the sharded sites (a rank's heads, its sequence slice), which one
//! rank does not reproduce, while the replicated regions' masks are the
//! same on every tensor rank (`tensor_parallel_dropout.rs` tests both).

use zeroplan_ir::interp::{Feeds, Rounding as Exactness, State};
use zeroplan_ir::plan::{DataParallel, Offload, Program};
use zeroplan_ir::spec::{ModelSpec, TrainingSpec};
use zeroplan_ir::{Bindings, Graph, Init, Op};
use zeroplan_passes::collective_matmul::Chunks;
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_passes::recompute::Policy;
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::comm::InProcess;
use zeroplan_runtime::reference::{ReferenceTrainer, StepLog};

mod common;

use common::{BATCH, SEQ, batch_of, max_abs_diff, model, relative};

const LR: f64 = 1e-3;
const STEPS: i64 = 3;

/// The sequence length of the sequence-parallel cases: a multiple of 2 and 4.
const SP_SEQ: usize = 8;

fn program(model: &ModelSpec, train: &TrainingSpec, t: u64, dp: Option<DataParallel>) -> Program {
    program_of(model, train, Split { t, sp: false, seq: SEQ, recompute: Policy::None, chunks: 1 }, dp)
}

/// How one replica is split: `t` tensor ranks, with sequence parallelism
/// or not, at sequence length `seq`, recomputing as `recompute` says, each
/// sequence-parallel collective and its GEMM cut into `chunks`
/// (`collective-matmul`; 1: whole).
#[derive(Clone, Copy)]
struct Split {
    t: u64,
    sp: bool,
    seq: usize,
    recompute: Policy,
    chunks: u64,
}

fn program_of(model: &ModelSpec, train: &TrainingSpec, split: Split, dp: Option<DataParallel>) -> Program {
    let Split { t, sp, seq, recompute, chunks } = split;
    let bindings: Bindings = [("batch".to_string(), BATCH as u64), ("seq".to_string(), seq as u64)].into();
    let options = PassOptions {
        shape_hint: bindings.clone(),
        data_parallel: dp,
        tensor_parallel: (t > 1).then_some(t),
        sequence_parallel: sp,
        recompute,
        collective_chunks: if chunks > 1 { Chunks::Fixed(chunks) } else { Chunks::Whole },
        ..PassOptions::default()
    };
    let graph = compile(model, &Target::Training(train), options).unwrap_or_else(|e| panic!("{e}")).graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).unwrap();
    zeroplan_passes::planner::program::program(graph, &memory, BATCH as u64, seq as u64)
}

/// The worst errors of a configuration, for the test's output.
#[derive(Default, Debug)]
struct Worst {
    loss: f64,
    grad_norm: f64,
    weight: (f64, String),
}

fn close(what: &str, got: f64, want: f64) -> f64 {
    let err = (got - want).abs() / want.abs().max(1e-12);
    assert!(err <= 1e-6, "{what}: {got} vs one rank's {want} (relative error {err:e})");
    err
}

/// Trains `model` on `t` tensor × `d` data ranks at ZeRO `stage` for three
/// steps and checks it against one rank; returns every rank's final state
/// (global rank order) and the worst errors.
fn agree(model: &ModelSpec, t: usize, d: usize, stage: u8, offload: Offload) -> (Vec<State>, Worst) {
    agree_split(
        model,
        Split { t: t as u64, sp: false, seq: SEQ, recompute: Policy::None, chunks: 1 },
        d,
        stage,
        offload,
    )
}

/// [`agree`] for any [`Split`] of the replica.
fn agree_split(model: &ModelSpec, split: Split, d: usize, stage: u8, offload: Offload) -> (Vec<State>, Worst) {
    let (t, seq) = (split.t as usize, split.seq);
    let train = TrainingSpec { lr: LR, dropout: Some(0.0), ..TrainingSpec::default() };
    let accumulated = TrainingSpec { micro_batches: d as u64, ..train.clone() };
    let dp = DataParallel { ranks: d as u64, zero_stage: stage, offload };
    let sp = if split.sp { " with sequence parallelism" } else { "" };
    let what = format!("{} on {t} tensor × {d} data ranks{sp}, ZeRO-{stage}, offload {offload:?}", model.name);
    let plan = program_of(model, &train, split, Some(dp));
    let scatters = plan.graph.nodes().filter(|n| n.op.name() == "sequence_reduce_scatter").count();
    assert_eq!(scatters > 0, split.sp, "{what}: sequence reduce-scatters in the plan");
    let chunked = plan.graph.nodes().filter(|n| n.name.contains(".chunk1")).count();
    assert_eq!(chunked > 0, split.chunks > 1, "{what}: {chunked} chunks of collective matmuls");
    let recomputed = plan.graph.nodes().filter(|n| n.name.ends_with(".recompute")).count();
    assert_eq!(recomputed > 0, split.recompute != Policy::None, "{what}: {recomputed} recomputed nodes");
    let (arena, host_arena) = (plan.arena_bytes, plan.host_arena_bytes);
    let one = Split { t: 1, sp: false, seq, recompute: Policy::None, chunks: 1 };
    let mut reference =
        ReferenceTrainer::new(program_of(model, &accumulated, one, None).graph, 7, Exactness::Native).unwrap();
    let mut hosts: Vec<HostProgram> = InProcess::grid(d, t)
        .into_iter()
        .map(|groups| {
            HostProgram::load_groups_with(plan.clone(), 7, groups, &State::new())
                .unwrap_or_else(|e| panic!("{what}: {e}"))
        })
        .collect();
    let mut worst = Worst::default();
    for step in 0..STEPS {
        // Data rank r's batch, the same on each of its tensor ranks.
        let feeds: Vec<Feeds> = (0..d as i64).map(|r| batch_of(model, BATCH, seq, step * d as i64 + r)).collect();
        let want = reference.step(&feeds).unwrap();
        let logs: Vec<StepLog> = std::thread::scope(|s| {
            let runs: Vec<_> = hosts
                .iter_mut()
                .enumerate()
                .map(|(global, host)| {
                    let f = &feeds[global / t];
                    s.spawn(move || host.step(std::slice::from_ref(f)).map(|o| o.outputs))
                })
                .collect();
            runs.into_iter()
                .map(|r| r.join().unwrap().unwrap_or_else(|e| panic!("{what}: {e}")))
                .map(|out| StepLog::from_rank_outputs(step as u64 + 1, &out, d as u64).unwrap())
                .collect()
        });
        let at = format!("{what}, step {}", step + 1);
        for replica in logs.chunks(t) {
            assert!(
                replica.iter().all(|l| l.loss == replica[0].loss),
                "{at}: a replica's tensor ranks disagree on the loss"
            );
        }
        let mean_loss = logs.iter().step_by(t).map(|l| l.loss).sum::<f64>() / d as f64;
        worst.loss = worst.loss.max(close(&format!("{at}: the data ranks' mean loss"), mean_loss, want.loss));
        for (r, log) in logs.iter().enumerate() {
            let err = close(&format!("{at}: rank {r}'s gradient norm"), log.grad_norm, want.grad_norm);
            worst.grad_norm = worst.grad_norm.max(err);
        }
    }
    for (r, host) in hosts.iter().enumerate() {
        let peak = host.high_water_bytes();
        assert!(peak <= arena && peak + 256 > arena, "{what}: rank {r}'s peak {peak} B, the plan's arena {arena} B");
        let host_peak = host.host_high_water_bytes();
        assert!(
            host_peak <= host_arena && (host_arena == 0 || host_peak + 256 > host_arena),
            "{what}: rank {r}'s host peak {host_peak} B, the plan's host arena {host_arena} B"
        );
    }
    let states: Vec<State> = hosts.iter().map(HostProgram::state).collect();
    worst.weight = final_weights_agree(&what, &plan.graph, &states, t, reference.state());
    (states, worst)
}

/// Every parameter, joined from the ranks, equals the reference's within
/// 2e-5 relative (the attention key bias, zero-gradient in exact
/// arithmetic, within `lr` a step: see `ranks.rs`; other zero-initialised
/// ones within 5e-3 `lr` where the relative bound fails, see below). Returns the worst
/// relative error and where.
fn final_weights_agree(what: &str, g: &Graph, states: &[State], t: usize, reference: &State) -> (f64, String) {
    let d = states.len() / t;
    let mut worst = (0.0f64, String::new());
    let mut compared = 0;
    for n in g.params() {
        let node = g.node(n);
        let Op::Param { init } = &node.op else { continue };
        // Each tensor rank's value of this node, ZeRO shards joined.
        let per_tensor_rank: Vec<Vec<f64>> = (0..t)
            .map(|k| {
                let shard = |r: usize| states[r * t + k][&*node.name].floats().unwrap().to_vec();
                match init {
                    Init::Flat { shards, .. } if *shards > 1 => (0..d).flat_map(shard).collect(),
                    _ => shard(0),
                }
            })
            .collect();
        let members = match init {
            Init::Flat { members, .. } => {
                members.iter().map(|m| (m.name.to_string(), m.offset as usize, m.len() as usize, &*m.init)).collect()
            }
            other => vec![(node.name.to_string(), 0, per_tensor_rank[0].len(), other)],
        };
        for (name, offset, len, init) in members {
            let parts: Vec<&[f64]> = per_tensor_rank.iter().map(|v| &v[offset..offset + len]).collect();
            let want = reference[&*name].floats().unwrap();
            let got = match init {
                Init::TensorShard { whole, axis, .. } => join(&parts, whole, *axis, want.len()),
                _ => {
                    for (k, p) in parts.iter().enumerate() {
                        assert!(*p == parts[0], "{what}: replicated {name} differs on tensor rank {k}");
                    }
                    parts[0].to_vec()
                }
            };
            if name.ends_with("attn.k.bias") {
                let moved = max_abs_diff(&got, want);
                assert!(moved <= STEPS as f64 * LR * 1.0001, "{what}: {name} moved {moved:e} from one rank's");
            } else {
                let err = relative(&got, want);
                // A parameter that starts at zero (a bias, a beta) is, after
                // three steps, three AdamW steps of at most `lr` each: its
                // relative error measures the rounding of its steps, not of
                // a value. Where a gradient element nearly cancels, rounding-
                // level differences in it (the ranks sum in another order)
                // move its step by a few 1e-4 of `lr` (measured: up to 9e-7
                // for the feed-forward up bias of one-replica ALBERT and the
                // regression BERT, with or without sequence parallelism).
                let bound_step = starts_at_zero(init) && max_abs_diff(&got, want) <= 5e-3 * LR;
                assert!(err <= 2e-5 || bound_step, "{what}: final {name}: relative error {err:e}");
                if err > worst.0 {
                    worst = (err, name.to_string());
                }
            }
            compared += 1;
        }
    }
    assert!(compared > 0, "{what}: no parameter compared");
    worst
}

/// Whether a parameter initialised as `init` starts at zero (its shards too).
fn starts_at_zero(init: &Init) -> bool {
    match init {
        Init::Zeros => true,
        Init::TensorShard { init, .. } => starts_at_zero(init),
        _ => false,
    }
}

/// The whole tensor from its `t` shards along `axis` of `whole`, cut to
/// the unsharded parameter's `len` elements: the vocabulary padding is the
/// last rows of axis 0, so the real rows are a prefix.
fn join(parts: &[&[f64]], whole: &[u64], axis: usize, len: usize) -> Vec<f64> {
    let t = parts.len();
    let (outer, inner): (usize, usize) =
        (whole[..axis].iter().product::<u64>() as usize, whole[axis + 1..].iter().product::<u64>() as usize);
    let block = whole[axis] as usize / t * inner;
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for o in 0..outer {
        for p in parts {
            out.extend_from_slice(&p[o * block..(o + 1) * block]);
        }
    }
    assert!(axis == 0 || out.len() == len, "padding only along axis 0");
    out.truncate(len);
    out
}

fn report(model: &ModelSpec, t: usize, d: usize, stage: u8, worst: &Worst) {
    println!(
        "{} t={t} d={d} ZeRO-{stage}: worst relative errors: loss {:.2e}, grad norm {:.2e}, weights {:.2e} ({})",
        model.name, worst.loss, worst.grad_norm, worst.weight.0, worst.weight.1
    );
}

#[test]
fn tiny_bert_on_every_grid_and_stage_trains_as_one_rank() {
    let model = model("tiny-bert");
    for t in [2, 4] {
        for d in [1, 2] {
            for stage in 0..=3 {
                let (_, worst) = agree(&model, t, d, stage, Offload::None);
                report(&model, t, d, stage, &worst);
            }
        }
    }
}

#[test]
fn every_family_trains_as_one_rank() {
    for (name, t, d, stage) in [
        ("tiny-mosaicbert", 4, 2, 3),
        ("tiny-mosaicbert", 2, 1, 0),
        ("tiny-megatron-bert", 2, 2, 1),
        ("tiny-megatron-bert", 4, 1, 2),
        ("tiny-albert", 2, 2, 3),
        ("tiny-albert", 4, 1, 0),
    ] {
        let model = model(name);
        let (_, worst) = agree(&model, t, d, stage, Offload::None);
        report(&model, t, d, stage, &worst);
    }
}

/// Megatron's sequence parallelism (Korthikanti et al., 2022): the
/// LayerNorm, dropout and residual regions on `seq/t` positions per tensor
/// rank, the partial LayerNorm and bias gradients summed over the tensor
/// ranks, train as one rank within the same bounds; post-norm BERT, pre-norm
/// Megatron-BERT, MosaicBERT (ALiBi, GLU, no position table), ALBERT
/// (factorised embeddings, shared layers) and a regression head (the pooler
/// reads the gathered sequence).
#[test]
fn sequence_parallel_ranks_train_as_one_rank() {
    for (name, t, d, stage) in [
        ("tiny-bert", 2, 1, 0),
        ("tiny-bert", 4, 1, 2),
        ("tiny-bert", 2, 2, 2),
        ("tiny-bert", 4, 2, 0),
        ("tiny-megatron-bert", 4, 1, 0),
        ("tiny-megatron-bert", 2, 2, 2),
        ("tiny-mosaicbert", 2, 1, 2),
        ("tiny-albert", 4, 1, 0),
        ("tiny-albert", 2, 2, 3),
        ("tiny-bert-sts", 2, 1, 0),
        ("tiny-bert-sts", 4, 2, 2),
    ] {
        let model = model(name);
        let split = Split { t, sp: true, seq: SP_SEQ, recompute: Policy::None, chunks: 1 };
        let (_, worst) = agree_split(&model, split, d, stage, Offload::None);
        report(&model, t as usize, d, stage, &worst);
    }
}

/// The backward's recomputation replays the sequence-parallel forward
/// (its collectives included) and still trains as one rank.
#[test]
fn recomputed_sequence_parallel_ranks_train_as_one_rank() {
    for (name, recompute) in [("tiny-bert", Policy::Full), ("tiny-megatron-bert", Policy::Full)] {
        let model = model(name);
        let split = Split { t: 2, sp: true, seq: SP_SEQ, recompute, chunks: 1 };
        let (_, worst) = agree_split(&model, split, 2, 2, Offload::None);
        report(&model, 2, 2, 2, &worst);
    }
}

/// Each sequence-parallel gather and its GEMMs, and each GEMM and its
/// reduce-scatter, cut into two chunks (`collective-matmul`), forward and
/// backward, with the chunks' collectives running on the communication
/// thread beside the GEMMs: the step trains as one rank within the same
/// bounds, with and without (full) recomputation, ZeRO and two data ranks;
/// MosaicBERT's gate and up projections read one gather.
#[test]
fn chunked_collective_matmuls_train_as_one_rank() {
    for (name, t, d, stage, recompute) in [
        ("tiny-bert", 2, 1, 0, Policy::None),
        ("tiny-bert", 4, 1, 0, Policy::None),
        ("tiny-bert", 2, 2, 2, Policy::Full),
        ("tiny-megatron-bert", 2, 2, 1, Policy::None),
        ("tiny-mosaicbert", 2, 1, 0, Policy::None),
    ] {
        let model = model(name);
        let split = Split { t, sp: true, seq: SP_SEQ, recompute, chunks: 2 };
        let (_, worst) = agree_split(&model, split, d, stage, Offload::None);
        report(&model, t as usize, d, stage, &worst);
    }
}

#[test]
fn offloaded_optimizer_and_parameters_train_as_one_rank() {
    let model = model("tiny-bert");
    for (stage, offload) in [(2, Offload::Optimizer), (3, Offload::OptimizerAndParams)] {
        let (_, worst) = agree(&model, 2, 2, stage, offload);
        report(&model, 2, 2, stage, &worst);
    }
}

#[test]
fn a_vocabulary_padded_to_the_ranks_trains_as_one_rank() {
    // 62 rows over 4 ranks: 16 each, the last two padding.
    let model = ModelSpec { vocab_size: 62, ..model("tiny-bert") };
    for (t, d, stage) in [(4, 1, 0), (4, 2, 3)] {
        let (_, worst) = agree(&model, t, d, stage, Offload::None);
        report(&model, t, d, stage, &worst);
    }
}

#[test]
fn two_runs_are_bitwise_identical() {
    let model = model("tiny-mosaicbert");
    let (a, _) = agree(&model, 2, 2, 2, Offload::None);
    let (b, _) = agree(&model, 2, 2, 2, Offload::None);
    assert!(a == b, "two runs of tiny-mosaicbert on 2 × 2 ranks differ");
}

#[test]
fn a_plan_for_two_tensor_ranks_refuses_a_group_of_one() {
    let train = TrainingSpec { dropout: Some(0.0), ..TrainingSpec::default() };
    let plan = program(&model("tiny-bert"), &train, 2, None);
    let err = HostProgram::load(plan, 0).err().expect("refused");
    assert!(err.to_string().contains("2 tensor-parallel ranks"), "{err}");
}
