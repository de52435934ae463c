//! The host runtime against the reference interpreter: a plan's program run
//! on the host (Cranelift kernels, GEMMs, host routines, the plan's arena)
//! gives the interpreter's forward outputs, gradients and weights after
//! three optimizer steps, within 1e-5 relative in fp32, on a tiny model of
//! every family, with each pass on and off; and the arena's measured peak
//! is the plan's.

use zeroplan_ir::interp::{Feeds, Interpreter, Rounding as Exactness};
use zeroplan_ir::plan::Program;
use zeroplan_ir::spec::{ModelSpec, TrainingSpec};
use zeroplan_ir::{DType, Graph, Tensor, Value};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_passes::recompute::Policy;
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::reference::{ReferenceTrainer, StepLog};

const FAMILIES: [&str; 6] =
    ["tiny-bert", "tiny-albert", "tiny-megatron-bert", "tiny-mosaicbert", "tiny-bert-sts", "tiny-ssn-bert"];
mod common;

use common::{BATCH, SEQ, batch, max_abs_diff, model};

/// The program of `model`'s training step with `disabled` passes off.
fn program(model: &ModelSpec, train: &TrainingSpec, disabled: &[&str], recompute: Policy) -> Program {
    let bindings: zeroplan_ir::Bindings = [("batch".to_string(), BATCH as u64), ("seq".to_string(), SEQ as u64)].into();
    let options = PassOptions {
        disabled: disabled.iter().map(|s| s.to_string()).collect(),
        recompute,
        shape_hint: bindings.clone(),
        ..PassOptions::default()
    };
    let graph = compile(model, &Target::Training(train), options).unwrap_or_else(|e| panic!("{e}")).graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).unwrap();
    zeroplan_passes::planner::program::program(graph, &memory, BATCH as u64, SEQ as u64)
}

/// A tensor's relative error (see [`common::relative`]).
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    common::relative(a.floats().unwrap(), b.floats().unwrap())
}

/// Each parameter's gradient as its optimizer reads it, and the parameter's name.
fn gradients(g: &Graph) -> Vec<(Value, String)> {
    g.node_indices()
        .filter_map(|n| zeroplan_ir::kernel::adamw_operands(g, n))
        .map(|ops| (ops[1], g.node(ops[0].node).name.to_string()))
        .collect()
}

/// The parameters whose first gradient is zero up to rounding (RMS below
/// 1e-7; the attention key bias: softmax ignores a shift of a row), by the
/// interpreter on the unaccumulated step with every pass on.
fn zero_gradients(model: &ModelSpec, train: &TrainingSpec) -> std::collections::BTreeSet<String> {
    let train = TrainingSpec { micro_batches: 1, ..train.clone() };
    let graph = program(model, &train, &[], Policy::None).graph;
    let interpreter = Interpreter::new(Exactness::Native, 7);
    let state = interpreter.init_state(&graph).unwrap();
    let values = interpreter.evaluate(&graph, &state, &batch(model, 0), 0).unwrap();
    gradients(&graph)
        .into_iter()
        .filter(|(v, _)| {
            let x = values.value(&graph, *v).floats().unwrap();
            x.iter().map(|x| x * x).sum::<f64>().sqrt() < 1e-7 * (x.len() as f64).sqrt()
        })
        .map(|(_, p)| p)
        .collect()
}

/// Runs three steps of `model` under `disabled`/`recompute` on the host
/// and on the interpreter (the same program graph), and compares.
fn agree(name: &str, disabled: &[&str], recompute: Policy, micro_batches: u64) {
    let model = model(name);
    let train = TrainingSpec { micro_batches, dropout: Some(0.1), ..TrainingSpec::default() };
    let program = program(&model, &train, disabled, recompute);
    let graph = program.graph.clone();
    let arena = program.arena_bytes;
    let mut host = HostProgram::load(program, 7).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (grads, _): (Vec<Value>, Vec<String>) = gradients(&graph).into_iter().unzip();
    let noise_gradients = zero_gradients(&model, &train);
    host.capture(grads.clone()).unwrap();
    let mut reference = ReferenceTrainer::new(graph.clone(), 7, Exactness::Native).unwrap();
    let what = format!("{name} with {disabled:?} off, recompute {recompute:?}, {micro_batches} micro-batches");
    let tol = 1e-5;
    for step in 0..3u64 {
        let feeds: Vec<Feeds> = (0..micro_batches).map(|i| batch(&model, (step * micro_batches + i) as i64)).collect();
        if micro_batches == 1 {
            // Gradients of the first micro-batch, from the interpreter's whole-graph evaluation.
            let values = Interpreter::new(Exactness::Native, 7)
                .evaluate(&graph, reference.state(), &feeds[0], step)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let ran = host.step(&feeds).unwrap_or_else(|e| panic!("{what}: {e}"));
            for v in &grads {
                let name = graph.value_ref(*v);
                let want = values.value(&graph, *v);
                let err = relative(&ran.captured[0][&name], want);
                assert!(err <= tol, "{what}: step {step}, gradient {name}: relative error {err:e}");
            }
            for (out, t) in &ran.outputs.micro_batches[0] {
                let want = values.graph_output(&graph, out).unwrap();
                if want.dtype().is_float() {
                    let err = relative(t, want);
                    assert!(err <= tol, "{what}: step {step}, output {out}: relative error {err:e}");
                }
            }
        } else {
            host.step(&feeds).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        reference.step(&feeds).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let (got, want) = (host.state(), reference.state().clone());
    for (name, t) in &want {
        if !t.dtype().is_float() {
            continue;
        }
        if noise_gradients.contains(name) {
            // AdamW normalises the gradient, so a gradient that is zero in exact
            // arithmetic (rounding noise) still moves each element by up to lr a step.
            let bound = 3.0 * train.lr * 1.0001;
            let (a, b) = (got[name].floats().unwrap(), t.floats().unwrap());
            let worst = max_abs_diff(a, b);
            assert!(worst <= bound, "{what}: after 3 steps, {name} (a zero gradient): {worst:e} > {bound:e}");
            continue;
        }
        let err = relative(&got[name], t);
        assert!(err <= tol, "{what}: after 3 steps, {name}: relative error {err:e}");
    }
    // The plan places buffers at 256-byte alignment: the last one written
    // ends within the arena's last 256 bytes.
    let peak = host.high_water_bytes();
    assert!(peak <= arena && peak + 256 > arena, "{what}: measured peak {peak} B, the plan's arena {arena} B");
}

#[test]
fn every_family_agrees_with_the_interpreter_with_every_pass_on() {
    for name in FAMILIES {
        agree(name, &[], Policy::None, 1);
    }
}

#[test]
fn every_family_agrees_with_fusion_and_rewrites_off() {
    for name in FAMILIES {
        agree(name, &["fuse"], Policy::None, 1);
        agree(name, &["rewrite", "fuse"], Policy::None, 1);
        agree(name, &["attention"], Policy::None, 1);
    }
}

#[test]
fn recomputation_and_accumulation_agree() {
    for name in ["tiny-bert", "tiny-mosaicbert"] {
        agree(name, &[], Policy::Full, 1);
        agree(name, &["fuse"], Policy::Selective, 1);
        agree(name, &[], Policy::None, 2);
        agree(name, &["fuse"], Policy::None, 2);
    }
    // Pre-LN: a layer's last dropout is needed by no backward node, so it is
    // not recomputed (its clone was once a kernel with no output).
    agree("tiny-megatron-bert", &[], Policy::Full, 1);
}

/// The `attention` pass on the host: three training steps with fused
/// attention (the host's FlashAttention routines) and with the unfused
/// chain (GEMMs and softmax kernels), dropout on, give the same losses
/// within 1e-5 relative: the two draw the same dropout masks.
#[test]
fn fused_and_unfused_attention_train_alike() {
    for name in ["tiny-bert", "tiny-mosaicbert"] {
        let model = model(name);
        let train = TrainingSpec { dropout: Some(0.1), lr: 1e-2, ..TrainingSpec::default() };
        let losses = |disabled: &[&str]| -> Vec<f64> {
            let plan = program(&model, &train, disabled, Policy::None);
            let flash = plan.graph.nodes().filter(|n| n.op.name() == "flash_attention").count();
            assert_eq!(flash, if disabled.is_empty() { model.layers as usize } else { 0 }, "{name} {disabled:?}");
            let mut host = HostProgram::load(plan, 7).unwrap_or_else(|e| panic!("{name}: {e}"));
            (0..3)
                .map(|step| {
                    let out = host.step(&[batch(&model, step)]).unwrap_or_else(|e| panic!("{name}: {e}")).outputs;
                    StepLog::from_outputs(step as u64 + 1, &out).unwrap().loss
                })
                .collect()
        };
        let (fused, unfused) = (losses(&[]), losses(&["attention"]));
        assert!(fused[0] != fused[2], "{name}: the loss should move: {fused:?}");
        for (a, b) in fused.iter().zip(&unfused) {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{name}: fused {fused:?} vs unfused {unfused:?}");
        }
    }
}

#[test]
fn a_step_reads_back_only_the_fetched_outputs_and_profiles_on_request() {
    let m = model("tiny-bert");
    let mut host = HostProgram::load(program(&m, &TrainingSpec::default(), &[], Policy::None), 7).unwrap();
    let err = host.fetch(&["no_such_output"]).unwrap_err().to_string();
    assert!(err.contains("no_such_output") && err.contains("loss"), "{err}");
    host.fetch(&["loss", "lr"]).unwrap();
    host.set_profiling(true);
    let out = host.step(&[batch(&m, 0)]).unwrap().outputs;
    assert_eq!(out.micro_batches[0].keys().collect::<Vec<_>>(), ["loss"]);
    assert_eq!(out.optimizer.keys().collect::<Vec<_>>(), ["lr"]);

    let profile = host.profile().expect("profiling is on");
    let kinds = profile.by_kind();
    assert!(kinds.iter().any(|(k, e)| k.starts_with("matmul") && e.calls > 0 && e.flops > 0.0), "{kinds:?}");
    assert!(kinds.iter().any(|(k, _)| k.starts_with("kernel layer*")), "layers are folded: {kinds:?}");
    assert!(kinds.windows(2).all(|w| w[0].1.seconds >= w[1].1.seconds), "slowest first");
    host.set_profiling(false);
    assert!(host.profile().is_none());
}

/// Mixed precision: 16-bit activations and weights in the arena, converted
/// in the kernels and GEMMs, f32 masters and moments. The interpreter rounds
/// every op's result to the 16-bit type exactly; the host rounds at the same
/// stores but computes inside a fused kernel in f32, so the two differ by
/// 16-bit roundings: within 1e-2 relative (bf16's ~4e-3 step, compounded).
#[test]
fn mixed_precision_steps_agree_within_sixteen_bit_rounding() {
    use zeroplan_ir::spec::{LossScaling, Precision};
    for (name, precision) in [
        ("tiny-bert", Precision::Bf16),
        ("tiny-mosaicbert", Precision::Bf16),
        ("tiny-bert", Precision::F16(LossScaling::default())),
    ] {
        let model = model(name);
        let train = TrainingSpec { precision, lr: 1e-2, dropout: Some(0.0), ..TrainingSpec::default() };
        let plan = program(&model, &train, &[], Policy::None);
        let mut reference = ReferenceTrainer::new(plan.graph.clone(), 7, Exactness::Native).unwrap();
        let mut host = HostProgram::load(plan, 7).unwrap_or_else(|e| panic!("{name} {precision:?}: {e}"));
        let what = format!("{name} in {precision:?}");
        for step in 0..3 {
            let feeds = [batch(&model, step)];
            let want = reference.step(&feeds).unwrap();
            let got = StepLog::from_outputs(step as u64 + 1, &host.step(&feeds).unwrap().outputs).unwrap();
            let err = (got.loss - want.loss).abs() / want.loss.abs();
            assert!(err <= 1e-2, "{what}: step {}: loss {} vs {} ({err:e})", step + 1, got.loss, want.loss);
            assert_eq!(got.skipped, want.skipped, "{what}: step {}", step + 1);
        }
        let (got, want) = (host.state(), reference.state().clone());
        // The key bias's gradient is zero in exact arithmetic (softmax ignores a
        // shift of its row), so it moves by AdamW-normalised rounding noise, up to
        // lr a step (see `agree`); under fp16's loss scale the noise is scaled too,
        // so it is named here rather than found by its size.
        for (name, t) in want.iter().filter(|(_, t)| t.dtype() == DType::F32) {
            if name.ends_with("attn.k.bias") {
                let (a, b) = (got[name].floats().unwrap(), t.floats().unwrap());
                let worst = max_abs_diff(a, b);
                assert!(worst <= 3.0 * train.lr * 1.0001, "{what}: {name} moved {worst:e} from the reference");
                continue;
            }
            let err = relative(&got[name], t);
            assert!(err <= 1e-2, "{what}: after 3 steps, {name}: relative error {err:e}");
        }
    }
}

#[test]
fn finite_checks_pass_a_healthy_step_and_name_where_a_nan_starts() {
    let train = TrainingSpec { dropout: Some(0.1), ..TrainingSpec::default() };
    for name in FAMILIES {
        let model = model(name);
        let mut host = HostProgram::load(program(&model, &train, &[], Policy::None), 7).unwrap();
        host.set_finite_checks(true);
        // Masked attention scores are −∞ by design: no false alarm.
        host.step(&[batch(&model, 0)]).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // One NaN in the first layer's FFN input projection: the first value
    // that is not finite is the product that reads it.
    let model = model("tiny-bert");
    let mut host = HostProgram::load(program(&model, &train, &[], Policy::None), 7).unwrap();
    let weight = "layer0.ffn.up.weight";
    let mut w = host.weights()[weight].clone();
    w.floats_mut().unwrap()[5] = f64::NAN;
    host.set_state(&[(weight.to_string(), w)].into()).unwrap();
    host.set_finite_checks(true);
    let err = host.step(&[batch(&model, 0)]).err().expect("the NaN is found");
    match err {
        zeroplan_runtime::runner::RunError::NonFinite { node, micro_batch: 0, what: "NaN" } => {
            assert!(node.starts_with("layer0.ffn.up"), "the NaN starts at `{node}`");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_plan_whose_buffers_leave_the_arena_is_refused_before_anything_runs() {
    let model = model("tiny-bert");
    let plan = program(&model, &TrainingSpec::default(), &[], Policy::None);
    for (what, edit) in [
        (
            "an offset past the end",
            Box::new(|b: &mut zeroplan_ir::plan::Buffer, arena: u64| b.offset = arena)
                as Box<dyn Fn(&mut zeroplan_ir::plan::Buffer, u64)>,
        ),
        ("an offset that wraps", Box::new(|b: &mut zeroplan_ir::plan::Buffer, _| b.offset = u64::MAX - 3)),
    ] {
        let mut crafted = plan.clone();
        let arena = crafted.arena_bytes;
        let victim = crafted.buffers.iter_mut().find(|b| b.alias_of.is_none() && b.bytes > 0).unwrap();
        edit(victim, arena);
        let err = HostProgram::load(crafted, 0).err().unwrap_or_else(|| panic!("{what}: loaded"));
        assert!(err.to_string().contains("lies outside the device arena"), "{what}: {err}");
    }
}
