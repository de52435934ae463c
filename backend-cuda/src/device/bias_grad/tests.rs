//! Which bias gradients go into their weight gradient's GEMM on real
//! tiny-bert plans (selected on the host, no GPU), which do not and why, a
//! schedule mutation that must refuse, and the kernel left after the sum is
//! dropped checked against the original under Cranelift.

use crate::Epilogue;
use zeroplan_backend_cpu::KernelCompiler;
use zeroplan_ir::spec::{Precision, TrainingSpec};
use zeroplan_ir::{DType, Op};

use super::{Pair, options};
use crate::device::schedule;
use crate::device::testing::{Ir, Selected, model, selected};
use zeroplan_exec::Instr;
use zeroplan_exec::buffers::concrete;
use zeroplan_exec::{Step, Written};

/// Every step that sums a bias gradient, by node name, with what
/// `options` says of each of its sums.
fn decisions(s: &Selected) -> Vec<(String, Vec<Result<Pair, String>>)> {
    let touched = schedule::touches(&s.steps);
    (0..s.steps.len())
        .filter_map(|at| {
            let got = options(&s.program.graph, &s.steps, &touched, at, |k: &Ir| k.on_device);
            (!got.is_empty()).then(|| (s.program.graph.node(s.steps[at].node).name.to_string(), got))
        })
        .collect()
}

fn taken(found: &[(String, Vec<Result<Pair, String>>)]) -> Vec<(&str, &Pair)> {
    found.iter().filter_map(|(n, got)| got.iter().find_map(|p| p.as_ref().ok()).map(|p| (n.as_str(), p))).collect()
}

fn name(s: &Selected, at: usize) -> &str {
    &s.program.graph.node(s.steps[at].node).name
}

/// Per layer: the attention output's and the FFN down-projection's bias
/// gradients (in the LayerNorm backward kernels), the FFN up-projection's
/// (in the GELU backward kernel); the MLM transform's (in its GELU +
/// LayerNorm backward kernel) and the decoder's (a lone `sum_to` of the
/// cross-entropy gradient). Not the q/k/v biases: their weight gradient
/// reads the concatenated dQKV, no buffer of theirs.
fn check_plan(precision: Precision) {
    let train = TrainingSpec { precision, dropout: Some(0.1), ..TrainingSpec::default() };
    let s = selected(&model("tiny-bert"), &train);
    let found = decisions(&s);
    let pairs = taken(&found);
    let mut names: Vec<&str> = pairs.iter().map(|(n, _)| *n).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "layer0.attn.norm.back0.fused",
            "layer0.ffn.act.back0.fused",
            "layer0.ffn.norm.back0.fused",
            "layer1.attn.norm.back0.fused",
            "layer1.ffn.act.back0.fused",
            "layer1.ffn.norm.back0.fused",
            "mlm.act.back0.fused",
            "mlm.logits.back1",
        ],
        "{precision:?}"
    );
    let dtype = if precision == Precision::F32 { DType::F32 } else { DType::BF16 };
    for (sum, p) in &pairs {
        // dW = dYᵀ·X (weights stored [out, in]): dY is A, transposed.
        assert_eq!(p.gemm.epilogue, Epilogue::BiasGradA, "{sum}");
        assert!(p.gemm.shape.transpose_a && p.gemm.shape.batches.len() == 1, "{sum}");
        assert_eq!(p.gemm.dtype, dtype, "{sum}");
        let mm = name(&s, p.matmul);
        assert!(mm.ends_with(".mm.back1"), "{sum} with {mm}");
        assert_eq!(p.gemm.name, format!("cublaslt_bias_grad({mm})"));
        assert!(p.matmul > p.sum, "{sum}: the GEMM runs after the kernel producing dY");
        // The GEMM writes the weight gradient and the bias gradient.
        let Some(Instr::MatMul { a, b, out, .. }) = &s.steps[p.matmul].instr else { panic!("{mm}") };
        assert_eq!(p.inputs, [*a, *b]);
        assert_eq!(p.outputs[0], *out);
        assert_eq!(p.outputs[1].len, p.gemm.shape.m, "{sum}: db has one value per row of dW");
        // The decoder's lone sum leaves its step empty; the fused kernels
        // keep running without the summed output.
        let Some(Instr::Kernel { outputs, .. }) = &s.steps[p.sum].instr else { panic!("{sum}") };
        match &p.rest {
            None => assert_eq!(*sum, "mlm.logits.back1"),
            Some((kernel, rest)) => {
                assert_eq!(rest.len() + 1, outputs.len(), "{sum}");
                assert!(!rest.contains(&p.outputs[1]) && outputs.contains(&p.outputs[1]), "{sum}");
                assert_eq!(kernel.outputs.len(), rest.len());
                assert!(kernel.name.ends_with(".bias_grad_in_gemm"));
            }
        }
    }
    // The q/k/v bias gradients are refused with the reason.
    for layer in 0..2 {
        for x in ["q", "k", "v"] {
            let sum = format!("layer{layer}.attn.{x}.back1");
            let (_, got) = found.iter().find(|(n, _)| *n == sum).unwrap_or_else(|| panic!("{sum} not seen"));
            let why = got[0].as_ref().unwrap_err();
            assert!(why.contains("no unbatched matmul reads the summed value"), "{sum}: {why}");
        }
    }
    // The LayerNorm kernels' dβ (Σ of their input) finds no GEMM either.
    let (_, got) = found.iter().find(|(n, _)| n == "layer0.ffn.norm.back0.fused").unwrap();
    assert!(got.iter().filter(|g| g.is_err()).count() >= 1, "{got:?}");
}

#[test]
fn f32_tiny_bert_sums_eight_bias_gradients_in_their_weight_gradients_gemm() {
    check_plan(Precision::F32);
}

#[test]
fn bf16_tiny_bert_sums_the_same_eight_in_bf16() {
    check_plan(Precision::Bf16);
}

#[test]
fn a_vocabulary_wide_bias_gradient_is_summed_on_its_own() {
    let mut wide = model("tiny-bert");
    wide.vocab_size = 9000;
    let s = selected(&wide, &TrainingSpec { dropout: Some(0.1), ..TrainingSpec::default() });
    let found = decisions(&s);
    let (_, got) = found.iter().find(|(n, _)| n == "mlm.logits.back1").expect("the decoder's bias gradient");
    let why = got[0].as_ref().unwrap_err();
    assert!(why.contains("a bias gradient of 9000 values"), "{why}");
    // The layers' bias gradients are still taken.
    assert_eq!(taken(&found).len(), 7);
}

/// The options of the step named `sum` after `edit` changed the steps
/// (given the matmul's and the sum's steps).
fn after(
    s: &mut Selected,
    sum: &str,
    edit: impl FnOnce(&mut Vec<Step<Instr<Ir>>>, usize, usize),
) -> Vec<Result<Pair, String>> {
    let at = |s: &Selected| s.steps.iter().position(|st| s.program.graph.node(st.node).name.as_ref() == sum).unwrap();
    let k = at(s);
    let touched = schedule::touches(&s.steps);
    let p = options(&s.program.graph, &s.steps, &touched, k, |k: &Ir| k.on_device)
        .into_iter()
        .find_map(Result::ok)
        .unwrap_or_else(|| panic!("{sum}: nothing taken before the edit"));
    edit(&mut s.steps, p.matmul, p.sum);
    let k = at(s);
    let touched = schedule::touches(&s.steps);
    options(&s.program.graph, &s.steps, &touched, k, |k: &Ir| k.on_device)
}

fn fill(steps: &[Step<Instr<Ir>>], at: usize, out: zeroplan_exec::Buf) -> Step<Instr<Ir>> {
    Step {
        node: steps[at].node,
        optimizer: false,
        instr: Some(Instr::Fill { value: 0.0, out }),
        written: Written::Here,
    }
}

#[test]
fn a_dy_written_between_the_kernel_and_the_gemm_is_refused() {
    let sum = "layer0.ffn.act.back0.fused";
    let train = TrainingSpec::default();
    let mut s = selected(&model("tiny-bert"), &train);
    let got = after(&mut s, sum, |steps, m, _| {
        let Some(Instr::MatMul { a, .. }) = steps[m].instr.clone() else { panic!() };
        let step = fill(steps, m, a);
        steps.insert(m, step);
    });
    assert!(got.iter().all(Result::is_err), "{got:?}");
    let why = got.iter().filter_map(|g| g.as_ref().err()).find(|w| w.contains("with `")).unwrap();
    assert!(why.contains("writes dY or the kernel's outputs, or touches db"), "{why}");
    // Reading dY between is harmless.
    let mut s = selected(&model("tiny-bert"), &train);
    let got = after(&mut s, sum, |steps, m, _| {
        let Some(Instr::MatMul { a, .. }) = steps[m].instr.clone() else { panic!() };
        let copy = Instr::Copy { from: a, to: zeroplan_exec::Buf { offset: 1 << 40, ..a } };
        steps.insert(m, Step { node: steps[m].node, optimizer: false, instr: Some(copy), written: Written::Here });
    });
    assert!(got.iter().any(Result::is_ok), "{got:?}");
    // Touching db between (the moved sum would be overwritten): refused.
    let mut s = selected(&model("tiny-bert"), &train);
    let got = after(&mut s, sum, |steps, m, k| {
        let Some(Instr::Kernel { outputs, .. }) = steps[k].instr.clone() else { panic!() };
        let step = fill(steps, m, outputs[1]);
        steps.insert(m, step);
    });
    assert!(got.iter().all(Result::is_err), "{got:?}");
}

#[test]
fn a_misaligned_or_mistyped_bias_gradient_or_a_host_kernel_is_refused_with_the_reason() {
    let sum = "layer0.ffn.act.back0.fused";
    let train = TrainingSpec::default();
    fn edit_db(f: fn(&mut zeroplan_exec::Buf)) -> impl FnOnce(&mut Vec<Step<Instr<Ir>>>, usize, usize) {
        move |steps, _, k| {
            let Some(Instr::Kernel { outputs, .. }) = &mut steps[k].instr else { panic!() };
            f(&mut outputs[1]);
        }
    }
    let why = |got: Vec<Result<Pair, String>>| got.into_iter().map(|g| g.unwrap_err()).collect::<Vec<_>>().join("; ");
    let mut s = selected(&model("tiny-bert"), &train);
    let w = why(after(&mut s, sum, edit_db(|b| b.offset += 4)));
    assert!(w.contains("not 16-byte aligned"), "{w}");
    let mut s = selected(&model("tiny-bert"), &train);
    let w = why(after(&mut s, sum, edit_db(|b| b.dtype = DType::BF16)));
    assert!(w.contains("BF16 bias gradient of a F32"), "{w}");
    let mut s = selected(&model("tiny-bert"), &train);
    let w = why(after(&mut s, sum, |steps, _, k| {
        let Some(Instr::Kernel { kernel, .. }) = &mut steps[k].instr else { panic!() };
        kernel.on_device = false;
    }));
    assert!(w.contains("does not run on the GPU"), "{w}");
}

/// Deterministic values in [−1, 1).
fn values(n: usize, salt: u64) -> Vec<f32> {
    let mut x = salt.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn the_kernel_left_computes_the_other_outputs_and_its_dy_sums_to_the_dropped_bias_gradient() {
    let mut compiler = KernelCompiler::new().unwrap();
    let train = TrainingSpec { dropout: Some(0.1), ..TrainingSpec::default() };
    let s = selected(&model("tiny-bert"), &train);
    let mut checked = 0;
    for (sum, p) in taken(&decisions(&s)) {
        let Some((rest, _)) = &p.rest else { continue };
        let Op::Fused { kernel } = &s.program.graph.node(s.steps[p.sum].node).op else { panic!("{sum}") };
        let dims = concrete(&kernel.shape, &s.bindings).unwrap();
        let len = |a: &zeroplan_ir::kernel::KernelArg| concrete(&a.ty.shape, &s.bindings).unwrap().iter().product();
        let inputs: Vec<Vec<f32>> = kernel.inputs.iter().enumerate().map(|(i, a)| values(len(a), i as u64)).collect();
        let run = |compiler: &mut KernelCompiler, k: &zeroplan_ir::kernel::Kernel| {
            let compiled = compiler.compile(k, &dims).unwrap();
            let mut outs: Vec<Vec<f32>> = k.outputs.iter().map(|o| vec![0.0; len(o)]).collect();
            let ins: Vec<*const u8> = inputs.iter().map(|v| v.as_ptr().cast()).collect();
            let out_ptrs: Vec<*mut u8> = outs.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
            // SAFETY: every operand holds its argument's elements, f32.
            unsafe { compiled.launch(&ins, &out_ptrs, 7, 3) };
            outs
        };
        let (want, got) = (run(&mut compiler, kernel), run(&mut compiler, rest));
        let Some(Instr::Kernel { outputs, .. }) = &s.steps[p.sum].instr else { panic!() };
        let dropped = outputs.iter().position(|b| *b == p.outputs[1]).unwrap();
        let dy = outputs.iter().position(|b| *b == p.inputs[0]).unwrap();
        let kept: Vec<&Vec<f32>> = want.iter().enumerate().filter(|(o, _)| *o != dropped).map(|(_, v)| v).collect();
        assert_eq!(kept, got.iter().collect::<Vec<_>>(), "{sum}: the other outputs change");
        // What cuBLASLt sums: the stored dY's columns, in f64 here.
        let cols = want[dropped].len();
        let mut column = vec![0.0f64; cols];
        for (i, x) in want[dy].iter().enumerate() {
            column[i % cols] += *x as f64;
        }
        for (c, (&w, &g)) in want[dropped].iter().zip(&column).enumerate() {
            assert!((w as f64 - g).abs() <= 1e-5 * g.abs().max(1.0), "{sum}: column {c}: {w} vs {g}");
        }
        checked += 1;
    }
    assert_eq!(checked, 7);
}

#[test]
fn under_data_parallelism_a_bias_gradient_whose_bytes_the_weight_gradient_reuses_is_refused() {
    use zeroplan_ir::plan::{DataParallel, Offload};
    for zero_stage in [0, 2, 3] {
        let dp = DataParallel { ranks: 2, zero_stage, offload: Offload::None };
        let s = crate::device::testing::selected_with(&model("tiny-bert"), &TrainingSpec::default(), Some(dp));
        let found = decisions(&s);
        assert_eq!(taken(&found).len(), 7, "ZeRO-{zero_stage}");
        // At stages 0 and 3 the MLM transform's db lies inside its dW's
        // bytes (the plan frees it, read into the flat gradients, before dW
        // is written): summing it in the GEMM would write into dW. At stage 2
        // the arena places them apart, and the flat gradients' read of db
        // (the bucket's `flatten`, a step between the sum and the matmul)
        // refuses it instead.
        let (_, got) = found.iter().find(|(n, _)| n == "mlm.act.back0.fused").unwrap();
        let why: Vec<&String> = got.iter().filter_map(|g| g.as_ref().err()).collect();
        let reason = if zero_stage == 2 {
            "`mlm.no_decay.grad`) between the sum and the matmul"
        } else {
            "overlaps the GEMM's buffers"
        };
        assert!(why.iter().any(|w| w.contains(reason)), "ZeRO-{zero_stage}: {why:?}");
    }
}
