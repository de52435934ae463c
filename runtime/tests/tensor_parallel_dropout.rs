//! Dropout under tensor parallelism (`zeroplan_ir::dropout_stream`): at a
//! sharded site (attention probabilities of a rank's heads, with sequence
//! parallelism a rank's `seq/t` slice) each tensor rank draws its own mask,
//! as Megatron-LM's model-parallel RNG tracker does; at a replicated site
//! every tensor rank draws the same one, so replicated parameters stay
//! equal bit for bit.
//!
//! The mask tests give every tensor rank tensor rank 0's initial state (its
//! shards copied over the others'), so the ranks compute the same numbers
//! and differ only where their masks do. A control run with the dropout in
//! question at 0 shows the ranks then agree to the bit: what differs is the
//! masks, nothing else.

use std::collections::BTreeSet;

use zeroplan_ir::interp::{Feeds, State};
use zeroplan_ir::plan::Program;
use zeroplan_ir::spec::{ModelSpec, TrainingSpec};
use zeroplan_ir::{Bindings, Graph, Init, Op, Tensor, Value, dropout_stream};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::comm::InProcess;

mod common;

use common::{BATCH, batch_of, model};

/// Divisible by the tensor ranks, for sequence parallelism.
const SEQ: usize = 8;
const T: usize = 2;

/// One tensor rank's training step of `model` for `T` tensor ranks (one
/// replica, no ZeRO), with the passes in `disabled` left out.
fn program(model: &ModelSpec, train: &TrainingSpec, sp: bool, disabled: &[&str]) -> Program {
    let bindings: Bindings = [("batch".to_string(), BATCH as u64), ("seq".to_string(), SEQ as u64)].into();
    let options = PassOptions {
        shape_hint: bindings.clone(),
        tensor_parallel: Some(T as u64),
        sequence_parallel: sp,
        disabled: disabled.iter().map(|s| s.to_string()).collect(),
        ..PassOptions::default()
    };
    let graph = compile(model, &Target::Training(train), options).unwrap_or_else(|e| panic!("{e}")).graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).unwrap();
    zeroplan_passes::planner::program::program(graph, &memory, BATCH as u64, SEQ as u64)
}

/// The `T` tensor ranks of `plan`, each loaded from seed 7.
fn ranks(plan: &Program) -> Vec<HostProgram> {
    InProcess::grid(1, T)
        .into_iter()
        .map(|groups| HostProgram::load_groups_with(plan.clone(), 7, groups, &State::new()).unwrap())
        .collect()
}

/// The first forward node named `name`, or of op `op`.
fn find(g: &Graph, pick: impl Fn(&str, &Op) -> bool) -> Value {
    let order = g.topo_order();
    let node = order.into_iter().find(|&n| pick(&g.node(n).name, &g.node(n).op)).expect("the node");
    Value { node, output: 0 }
}

/// One step of every rank (threads: their collectives meet), capturing
/// `value` of the first micro-batch; returns each rank's capture and loss.
fn step_capturing(hosts: &mut [HostProgram], value: Value, feeds: &Feeds) -> Vec<(Tensor, f64)> {
    std::thread::scope(|s| {
        let runs: Vec<_> = hosts
            .iter_mut()
            .map(|host| {
                s.spawn(move || {
                    let name = host.program().graph.value_ref(value);
                    host.capture(vec![value]).expect("the host runtime writes every value");
                    let result = host.step(std::slice::from_ref(feeds)).unwrap();
                    let loss = result.outputs.micro_batches[0]["loss"].floats().unwrap()[0];
                    (result.captured[0][&name].clone(), loss)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

/// Every tensor rank starts from tensor rank 0's state, so the ranks differ
/// only in their masks.
fn same_start(hosts: &mut [HostProgram]) {
    let first = hosts[0].state();
    for host in &mut hosts[1..] {
        host.set_state(&first).unwrap();
    }
}

fn floats(t: &Tensor) -> Vec<f64> {
    t.floats().unwrap().to_vec()
}

/// The dropped elements (exact zeros) of a captured dropout output.
fn dropped(t: &Tensor) -> Vec<bool> {
    floats(t).iter().map(|&v| v == 0.0).collect()
}

/// The fraction of positions where two masks differ.
fn disagreement(a: &[bool], b: &[bool]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x != y).count() as f64 / a.len() as f64
}

fn train(hidden: f64, attention: f64) -> (ModelSpec, TrainingSpec) {
    let model = ModelSpec { hidden_dropout: hidden, attention_dropout: attention, ..model("tiny-bert") };
    (model, TrainingSpec { lr: 1e-3, ..TrainingSpec::default() })
}

/// Unfused attention dropout on `[B, H/t, S, S]`: the ranks' masks differ.
/// Two independent masks at p = 0.5 disagree on half the elements; the
/// same mask (the bug) on none.
#[test]
fn tensor_ranks_draw_their_own_attention_dropout_masks() {
    let (model, train) = train(0.0, 0.5);
    let plan = program(&model, &train, false, &["attention", "fuse"]);
    let probs = find(&plan.graph, |name, _| name == "layer0.attn.probs_dropout");
    let mut hosts = ranks(&plan);
    same_start(&mut hosts);
    let got = step_capturing(&mut hosts, probs, &batch_of(&model, BATCH, SEQ, 0));
    let (a, b) = (dropped(&got[0].0), dropped(&got[1].0));
    let kept = a.iter().filter(|d| !**d).count() as f64 / a.len() as f64;
    assert!((0.35..0.65).contains(&kept), "rank 0 keeps {kept} of its probabilities at p = 0.5");
    let differ = disagreement(&a, &b);
    println!("attention dropout p = 0.5: rank 0 keeps {kept:.3}, the ranks' masks disagree on {differ:.3}");
    assert!((0.3..0.7).contains(&differ), "the tensor ranks' attention masks differ at {differ} of the elements");
    assert_eq!(got[0].1, got[1].1, "the tensor ranks' losses (after the row-parallel all-reduce) differ");
}

/// The fused FlashAttention (the default pipeline) draws the rank's mask
/// too: with equal weights the ranks' attention outputs differ with
/// attention dropout and agree to the bit without it.
#[test]
fn fused_attention_draws_a_mask_per_tensor_rank() {
    for p in [0.0, 0.3] {
        let (model, train) = train(0.0, p);
        let plan = program(&model, &train, false, &[]);
        let flash = find(&plan.graph, |_, op| matches!(op, Op::FlashAttention { .. }));
        let mut hosts = ranks(&plan);
        same_start(&mut hosts);
        let got = step_capturing(&mut hosts, flash, &batch_of(&model, BATCH, SEQ, 1));
        let (a, b) = (floats(&got[0].0), floats(&got[1].0));
        let same = a.iter().zip(&b).filter(|(x, y)| x.to_bits() == y.to_bits()).count();
        println!("attention dropout p = {p}: {same} of {} fused attention outputs equal on both ranks", a.len());
        if p == 0.0 {
            assert_eq!(
                same,
                a.len(),
                "without dropout the ranks' attention outputs differ: the test is not isolating masks"
            );
        } else {
            assert!(
                same < a.len() / 4,
                "{same} of {} attention outputs equal on both tensor ranks at p = {p}",
                a.len()
            );
        }
    }
}

/// Sequence parallelism: each rank's `[B, S/t, H]` slice draws its own
/// hidden-dropout mask (compared as positions of the local slice).
#[test]
fn sequence_parallel_slices_draw_their_own_masks() {
    let (model, train) = train(0.5, 0.0);
    let plan = program(&model, &train, true, &["fuse"]);
    let ffn = find(&plan.graph, |name, _| name == "layer0.ffn.dropout");
    let mut hosts = ranks(&plan);
    let got = step_capturing(&mut hosts, ffn, &batch_of(&model, BATCH, SEQ, 2));
    let (a, b) = (dropped(&got[0].0), dropped(&got[1].0));
    assert_eq!(a.len(), BATCH * SEQ / T * model.hidden as usize, "a sequence-parallel slice");
    let differ = disagreement(&a, &b);
    println!("sequence-parallel hidden dropout p = 0.5: the slices' masks disagree on {differ:.3}");
    assert!((0.3..0.7).contains(&differ), "the sequence slices' masks differ at {differ} of the positions");
    assert_eq!(got[0].1, got[1].1, "the tensor ranks' losses differ");
}

/// Every stream in a loaded rank's graph, fused kernels' included, by node
/// name (and position in a kernel's body).
fn streams(g: &Graph) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for n in g.topo_order() {
        let node = g.node(n);
        match &node.op {
            Op::Dropout { stream, .. } | Op::FlashAttention { stream, .. } | Op::FlashAttentionGrad { stream, .. } => {
                out.push((node.name.to_string(), *stream))
            }
            Op::Fused { kernel } => {
                for (i, e) in kernel.body.iter().enumerate() {
                    if let zeroplan_ir::kernel::Expr::Keep { stream, .. } = e {
                        out.push((format!("{}[{i}]", node.name), *stream));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The rewrite at load reaches every place a stream lives in the default
/// pipeline's graph (FlashAttention and its gradient, fused kernels'
/// `keep`): sharded streams differ between the ranks, replicated ones not.
#[test]
fn loaded_ranks_rewrite_sharded_streams_everywhere() {
    for sp in [false, true] {
        let (model, train) = train(0.1, 0.1);
        let plan = program(&model, &train, sp, &[]);
        let hosts = ranks(&plan);
        let per_rank: Vec<_> = hosts.iter().map(|h| streams(&h.program().graph)).collect();
        let (mut sharded, mut replicated, mut kinds) = (0, 0, BTreeSet::new());
        for ((name, a), (name_b, b)) in per_rank[0].iter().zip(&per_rank[1]) {
            assert_eq!(name, name_b);
            if dropout_stream::is_sharded(*a) {
                assert_ne!(a, b, "sp {sp}: sharded {name} has one stream on both ranks");
                sharded += 1;
                kinds.insert(if name.contains('[') { "keep" } else { "op" });
            } else {
                assert_eq!(a, b, "sp {sp}: replicated {name} differs between ranks");
                replicated += 1;
            }
        }
        assert!(kinds.contains("op"), "sp {sp}: no sharded FlashAttention");
        // Without sequence parallelism the hidden dropouts are replicated;
        // with it, tiny BERT (no classifier) has none left.
        assert!(sharded > 0 && (sp || replicated > 0), "sp {sp}: {sharded} sharded, {replicated} replicated");
        if sp {
            assert!(kinds.contains("keep"), "sequence-parallel hidden dropout in no fused kernel");
        }
    }
}

/// With dropout everywhere and no sequence parallelism (the hidden dropout
/// replicated), or with it (the slices' parameters all-reduced), three
/// steps leave every replicated parameter bit-identical on the tensor ranks.
#[test]
fn replicated_parameters_stay_identical_with_dropout() {
    for sp in [false, true] {
        let (model, train) = train(0.2, 0.2);
        let plan = program(&model, &train, sp, &[]);
        let loss = find(&plan.graph, |name, _| name == "loss");
        let mut hosts = ranks(&plan);
        for step in 0..3 {
            let got = step_capturing(&mut hosts, loss, &batch_of(&model, BATCH, SEQ, step));
            assert_eq!(got[0].1.to_bits(), got[1].1.to_bits(), "sp {sp}, step {step}: the ranks' losses differ");
        }
        let g = &hosts[0].program().graph;
        let states: Vec<State> = hosts.iter().map(HostProgram::state).collect();
        let mut compared = 0;
        for n in g.params() {
            let node = g.node(n);
            if matches!(&node.op, Op::Param { init: Init::TensorShard { .. } }) {
                continue;
            }
            let bits = |s: &State| floats(&s[&*node.name]).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert!(bits(&states[0]) == bits(&states[1]), "sp {sp}: replicated {} differs between ranks", node.name);
            compared += 1;
        }
        assert!(compared > 4, "sp {sp}: {compared} replicated parameters");
    }
}
