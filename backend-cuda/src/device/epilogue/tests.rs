//! Which matmul + epilogue pairs go to cuBLASLt on real plans (selected on
//! the host, no GPU), which do not and why, and the bias-dropping rewrite
//! checked numerically against the original kernel with the host's
//! Cranelift kernel compiler.

use crate::Epilogue;
use zeroplan_backend_cpu::KernelCompiler;
use zeroplan_ir::kernel::{Binary, Expr, Kernel, KernelBuilder, Unary};
use zeroplan_ir::spec::{Activation, ModelSpec, TrainingSpec};
use zeroplan_ir::{DType, GeluApproximation, Op, Shape, TensorType};

use super::matching::{Fit, fit};
use super::rewrite::drop_bias;
use super::{Pair, options};
use crate::device::schedule;
use crate::device::testing::{Ir, Selected, model, selected};
use zeroplan_exec::Instr;
use zeroplan_exec::buffers::concrete;
use zeroplan_exec::{Buf, Step, Written};

fn on_gpu(k: &Ir) -> bool {
    k.on_device
}

/// Every epilogue kernel's step and what `options` says of it.
fn decisions(s: &Selected) -> Vec<(String, Result<Vec<Pair>, String>)> {
    let touched = schedule::touches(&s.steps);
    (0..s.steps.len())
        .filter_map(|k| {
            let got = options(&s.program.graph, &s.steps, &touched, k, on_gpu).transpose()?;
            Some((s.program.graph.node(s.steps[k].node).name.to_string(), got))
        })
        .collect()
}

fn tiny_bert(activation: Activation, intermediate: u64) -> ModelSpec {
    ModelSpec { activation, intermediate, ..model("tiny-bert") }
}

#[test]
fn erf_gelu_bert_moves_every_bias_into_the_gemm_and_keeps_the_kernels() {
    let s = selected(&model("tiny-bert"), &TrainingSpec::default());
    let found = decisions(&s);
    // Per layer: attention output + LayerNorm, FFN up + erf GELU, FFN down +
    // LayerNorm; and the MLM transform + GELU + LayerNorm.
    assert_eq!(found.len(), 2 * 3 + 1, "{:?}", found.iter().map(|(n, _)| n).collect::<Vec<_>>());
    for (name, got) in &found {
        let pairs = got.as_ref().unwrap_or_else(|why| panic!("{name}: {why}"));
        assert_eq!(pairs.len(), 1, "{name}: the erf GELU / LayerNorm kernels are no whole epilogue");
        let p = &pairs[0];
        assert!(!p.whole && p.at() == p.matmul && p.gemm.epilogue == Epilogue::Bias, "{name}");
        assert_eq!(p.gemm.name, format!("cublaslt_bias({name})"));
        // The GEMM writes the biased product where the product was.
        let Some(Instr::MatMul { out, .. }) = &s.steps[p.matmul].instr else { panic!("{name}: no matmul") };
        assert_eq!(p.outputs, [*out]);
        let (rest, inputs) = p.rest.as_ref().unwrap();
        let Some(Instr::Kernel { inputs: before, .. }) = &s.steps[p.kernel].instr else { panic!() };
        assert_eq!(inputs.len() + 1, before.len());
        assert!(!inputs.contains(&p.inputs[2]), "{name}: the bias is still an input");
        assert!(rest.epilogue_of.is_none() && rest.name.ends_with(".bias_in_gemm"));
    }
}

#[test]
fn a_tanh_gelu_ffn_is_one_cublaslt_product_with_the_pre_activation_as_aux() {
    let s = selected(&tiny_bert(Activation::GeluTanh, 64), &TrainingSpec::default());
    let found = decisions(&s);
    let ffn: Vec<_> = found.iter().filter(|(n, _)| n.ends_with("ffn.act.fused")).collect();
    assert_eq!(ffn.len(), 2);
    for (name, got) in ffn {
        let pairs = got.as_ref().unwrap();
        let whole = &pairs[0];
        let gelu = Epilogue::Gelu { bias: true, aux: true, approximation: GeluApproximation::Tanh };
        assert!(whole.whole && whole.at() == whole.kernel, "{name}");
        assert_eq!(whole.gemm.epilogue, gelu);
        assert_eq!(whole.gemm.name, format!("cublaslt_bias_gelu_aux({name})"));
        // D is the activation (output 1), aux the biased product (output 0).
        let Some(Instr::Kernel { outputs, .. }) = &s.steps[whole.kernel].instr else { panic!() };
        assert_eq!(whole.outputs, [outputs[1], outputs[0]]);
        // The fallback, should cuBLASLt refuse the whole form on the GPU.
        assert!(!pairs[1].whole && pairs[1].gemm.epilogue == Epilogue::Bias);
    }
}

#[test]
fn an_aux_matrix_cublaslt_cannot_take_falls_back_to_the_bias_alone() {
    // An intermediate width of 60: the aux matrix's leading dimension is not
    // a multiple of 8.
    let s = selected(&tiny_bert(Activation::GeluTanh, 60), &TrainingSpec::default());
    let touched = schedule::touches(&s.steps);
    let k =
        s.steps.iter().position(|st| s.program.graph.node(st.node).name.as_ref() == "layer0.ffn.act.fused").unwrap();
    let pairs = options(&s.program.graph, &s.steps, &touched, k, on_gpu).unwrap().unwrap();
    assert_eq!(pairs.len(), 1);
    assert!(!pairs[0].whole);
}

/// Step `k`'s (the kernel named `name`) options after `edit` changed the steps.
fn after(
    s: &mut Selected,
    name: &str,
    edit: impl FnOnce(&mut Vec<Step<Instr<Ir>>>, usize, usize),
) -> Result<Vec<Pair>, String> {
    let k = s.steps.iter().position(|st| s.program.graph.node(st.node).name.as_ref() == name).unwrap();
    let touched = schedule::touches(&s.steps);
    let m = options(&s.program.graph, &s.steps, &touched, k, on_gpu).unwrap().unwrap()[0].matmul;
    edit(&mut s.steps, m, k);
    let k = s.steps.iter().position(|st| s.program.graph.node(st.node).name.as_ref() == name).unwrap();
    let touched = schedule::touches(&s.steps);
    options(&s.program.graph, &s.steps, &touched, k, on_gpu).map(Option::unwrap)
}

#[test]
fn work_between_the_pair_that_conflicts_keeps_it_apart() {
    let name = "layer0.ffn.act.fused";
    // Something between the matmul and the kernel overwrites the matmul's A
    // (the memory plan may reuse a dead operand's bytes): the whole form
    // would read it late; the bias-only form is still right.
    let mut s = selected(&tiny_bert(Activation::GeluTanh, 64), &TrainingSpec::default());
    let got = after(&mut s, name, |steps, m, _| {
        let Some(Instr::MatMul { a, .. }) = steps[m].instr.clone() else { panic!() };
        steps.insert(
            m + 1,
            Step {
                node: steps[m].node,
                optimizer: false,
                instr: Some(Instr::Fill { value: 0.0, out: a }),
                written: Written::Here,
            },
        );
    })
    .unwrap();
    assert_eq!(got.len(), 1);
    assert!(!got[0].whole);
    // Something between writes the bias: the bias-only form would read it
    // early, and the whole form is gone too (its A is overwritten as well).
    let mut s = selected(&tiny_bert(Activation::GeluTanh, 64), &TrainingSpec::default());
    let got = after(&mut s, name, |steps, m, k| {
        let Some(Instr::MatMul { a, .. }) = steps[m].instr.clone() else { panic!() };
        let Some(Instr::Kernel { inputs, .. }) = steps[k].instr.clone() else { panic!() };
        for out in [a, inputs[1]] {
            steps.insert(
                m + 1,
                Step {
                    node: steps[m].node,
                    optimizer: false,
                    instr: Some(Instr::Fill { value: 0.0, out }),
                    written: Written::Here,
                },
            );
        }
    });
    let why = got.unwrap_err();
    assert!(why.contains("overwrites the product's operands") && why.contains("writes the bias"), "{why}");
    // Reading the operands between is harmless.
    let mut s = selected(&tiny_bert(Activation::GeluTanh, 64), &TrainingSpec::default());
    let got = after(&mut s, name, |steps, m, _| {
        let Some(Instr::MatMul { a, .. }) = steps[m].instr.clone() else { panic!() };
        let copy = Instr::Copy { from: a, to: Buf { offset: 1 << 40, ..a } };
        steps.insert(m + 1, Step { node: steps[m].node, optimizer: false, instr: Some(copy), written: Written::Here });
    })
    .unwrap();
    assert!(got[0].whole);
}

#[test]
fn a_misaligned_or_mistyped_bias_or_a_host_kernel_is_refused_with_the_reason() {
    let name = "layer0.ffn.act.fused";
    let bias_of = |steps: &mut Vec<Step<Instr<Ir>>>, k: usize, f: &dyn Fn(&mut Buf)| {
        let Some(Instr::Kernel { inputs, .. }) = &mut steps[k].instr else { panic!() };
        f(&mut inputs[1]);
    };
    let mut s = selected(&model("tiny-bert"), &TrainingSpec::default());
    let why = after(&mut s, name, |steps, _, k| bias_of(steps, k, &|b| b.offset += 4)).unwrap_err();
    assert!(why.contains("not 16-byte aligned"), "{why}");
    let mut s = selected(&model("tiny-bert"), &TrainingSpec::default());
    let why = after(&mut s, name, |steps, _, k| bias_of(steps, k, &|b| b.dtype = DType::BF16)).unwrap_err();
    assert!(why.contains("BF16 bias on a F32 product"), "{why}");
    let mut s = selected(&model("tiny-bert"), &TrainingSpec::default());
    let why = after(&mut s, name, |steps, _, k| {
        let Some(Instr::Kernel { kernel, .. }) = &mut steps[k].instr else { panic!() };
        kernel.on_device = false;
    })
    .unwrap_err();
    assert!(why.contains("does not run on the GPU"), "{why}");
}

#[test]
fn bf16_plans_fuse_with_bf16_biases() {
    use zeroplan_ir::spec::Precision;
    let train = TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() };
    let s = selected(&tiny_bert(Activation::GeluTanh, 64), &train);
    let found = decisions(&s);
    assert!(!found.is_empty());
    for (name, got) in &found {
        let pairs = got.as_ref().unwrap_or_else(|why| panic!("{name}: {why}"));
        assert_eq!(pairs[0].gemm.dtype, DType::BF16, "{name}");
        assert!(pairs[0].inputs.iter().all(|b| b.dtype == DType::BF16));
    }
}

// ── The kernel IR alone ──

fn f32_at(dims: &[u64]) -> TensorType {
    TensorType::new(Shape::new(dims.iter().map(|&d| zeroplan_ir::Dim::constant(d))), DType::F32)
}

/// `mm + bias`, then `then` on the sum; the sum stored too when `keep`.
fn epilogue_kernel(then: Option<Unary>, keep: bool) -> Kernel {
    let mut k = KernelBuilder::new("ep", Shape::new([4, 8].map(zeroplan_ir::Dim::constant)));
    let mm = k.load("mm", f32_at(&[4, 8]), vec![0, 1]);
    let bias = k.load("bias", f32_at(&[8]), vec![1]);
    let sum = k.binary(Binary::Add, mm, bias);
    if keep {
        k.store("pre", f32_at(&[4, 8]), sum);
    }
    if let Some(u) = then {
        let y = k.unary(u, sum);
        k.store("y", f32_at(&[4, 8]), y);
    }
    k.finish().unwrap()
}

#[test]
fn the_matching_reads_the_kernel_ir() {
    let tanh = Unary::Gelu(GeluApproximation::Tanh);
    assert!(matches!(
        fit(&epilogue_kernel(None, true), 0),
        Ok(Fit::Whole { bias: 1, epilogue: Epilogue::Bias, out: 0, aux: None, .. })
    ));
    let gelu = Epilogue::Gelu { bias: true, aux: false, approximation: GeluApproximation::Tanh };
    assert_eq!(
        fit(&epilogue_kernel(Some(tanh), false), 0),
        Ok(Fit::Whole { bias: 1, add: 2, epilogue: gelu, out: 0, aux: None })
    );
    let aux = Epilogue::Gelu { bias: true, aux: true, approximation: GeluApproximation::Tanh };
    assert_eq!(
        fit(&epilogue_kernel(Some(tanh), true), 0),
        Ok(Fit::Whole { bias: 1, add: 2, epilogue: aux, out: 1, aux: Some(0) })
    );
    // cuBLASLt has no erf GELU and no ReLU epilogue here: the bias alone.
    assert_eq!(
        fit(&epilogue_kernel(Some(Unary::Gelu(GeluApproximation::Erf)), true), 0),
        Ok(Fit::BiasOnly { bias: 1, add: 2 })
    );
    assert_eq!(fit(&epilogue_kernel(Some(Unary::Relu), false), 0), Ok(Fit::BiasOnly { bias: 1, add: 2 }));
    // The product read without its bias, or the bias used again: nothing.
    let mut k = epilogue_kernel(Some(Unary::Relu), false);
    k.body.push(Expr::Binary(Binary::Mul, 0, 3));
    k.stores[0] = 4;
    assert_eq!(fit(&k, 0).unwrap_err(), "the kernel reads the product without its bias too");
    let mut k = epilogue_kernel(Some(Unary::Relu), false);
    k.body.push(Expr::Binary(Binary::Mul, 1, 3));
    k.stores[0] = 4;
    assert_eq!(fit(&k, 0).unwrap_err(), "the kernel reads the bias elsewhere too");
    // No bias add of the product at all.
    assert!(fit(&epilogue_kernel(None, true), 1).unwrap_err().contains("per element"));
}

// ── The rewrite, numerically ──

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

/// Runs `kernel` (f32 operands) on `inputs` at the plan's dims; its outputs.
fn run(compiler: &mut KernelCompiler, kernel: &Kernel, s: &Selected, inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let dims = concrete(&kernel.shape, &s.bindings).unwrap();
    let compiled = compiler.compile(kernel, &dims).unwrap();
    let mut outputs: Vec<Vec<f32>> = kernel
        .outputs
        .iter()
        .map(|o| vec![0.0; concrete(&o.ty.shape, &s.bindings).unwrap().iter().product()])
        .collect();
    let ins: Vec<*const u8> = inputs.iter().map(|v| v.as_ptr().cast()).collect();
    let outs: Vec<*mut u8> = outputs.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
    // SAFETY: every operand holds its argument's elements, f32.
    unsafe { compiled.launch(&ins, &outs, 7, 3) };
    outputs
}

#[test]
fn every_rewritten_kernel_computes_from_the_biased_product_what_the_original_did() {
    let mut compiler = KernelCompiler::new().unwrap();
    for spec in [model("tiny-bert"), tiny_bert(Activation::GeluTanh, 64)] {
        let train = TrainingSpec { dropout: Some(0.1), ..TrainingSpec::default() };
        let s = selected(&spec, &train);
        let mut checked = 0;
        for (name, got) in decisions(&s) {
            let g = &s.program.graph;
            let node = s.steps[got.as_ref().unwrap()[0].kernel].node;
            let Op::Fused { kernel } = &g.node(node).op else { panic!() };
            let product = kernel.epilogue_of.as_deref().unwrap();
            let mm = g.operands(node).iter().position(|v| g.node(v.node).name.as_ref() == product).unwrap();
            let (Fit::Whole { bias, add, .. } | Fit::BiasOnly { bias, add }) = fit(kernel, mm).unwrap();
            assert!(kernel.inputs.iter().all(|a| a.ty.dtype == DType::F32), "{name}");
            let inputs: Vec<Vec<f32>> = kernel
                .inputs
                .iter()
                .enumerate()
                .map(|(i, a)| values(concrete(&a.ty.shape, &s.bindings).unwrap().iter().product(), i as u64))
                .collect();
            let n = inputs[bias].len();
            let mut biased: Vec<Vec<f32>> = inputs.clone();
            biased[mm] = inputs[mm].iter().enumerate().map(|(i, x)| x + inputs[bias][i % n]).collect();
            biased.remove(bias);
            let rest = drop_bias(kernel, mm, bias, add);
            let (want, got) = (run(&mut compiler, kernel, &s, &inputs), run(&mut compiler, &rest, &s, &biased));
            for (w, g) in want.iter().zip(&got) {
                for (a, b) in w.iter().zip(g) {
                    assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{name}: {a} vs {b}");
                }
            }
            checked += 1;
        }
        assert!(checked >= 5, "{checked}");
    }
}

#[test]
fn a_product_that_is_an_output_of_the_program_keeps_the_plain_gemm() {
    // Either form leaves the product unwritten or biased: an output must not.
    let name = "layer0.ffn.act.fused";
    let mut s = selected(&tiny_bert(Activation::GeluTanh, 64), &TrainingSpec::default());
    let g = &s.program.graph;
    let node = g.node_by_name(name).unwrap();
    let Op::Fused { kernel } = &g.node(node).op else { panic!() };
    let mm = g.node_by_name(kernel.epilogue_of.as_deref().unwrap()).unwrap();
    s.program.graph.outputs.push(("ffn_up_product".into(), zeroplan_ir::Value { node: mm, output: 0 }));
    let touched = schedule::touches(&s.steps);
    let k = s.steps.iter().position(|st| st.node == node).unwrap();
    let why = options(&s.program.graph, &s.steps, &touched, k, on_gpu).unwrap_err();
    assert!(why.contains("an output of the program"), "{why}");
}
