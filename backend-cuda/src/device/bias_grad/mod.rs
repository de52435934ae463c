//! Bias gradients summed inside the weight gradient's GEMM on a CUDA rank.
//!
//! In a training graph a linear layer `y = x·W + b` has two backward
//! products of the same output gradient `dY[tokens × out]`: the weight
//! gradient, one GEMM over the folded `batch·seq` axis (`dW = Xᵀ·dY` for
//! `W[in × out]`, `dW = dYᵀ·X` for a tied `W[out × in]`, autodiff's
//! `matmul_rhs_grad`), and the bias gradient `db = Σ_tokens dY` (autodiff's
//! `sum_to`). cuBLASLt's `BGRADA` / `BGRADB` epilogues compute that column
//! sum of the operand the GEMM already streams, so the pair runs as one
//! product writing `dW` and `db` (`backend-cuda/src/gemm/epilogue.rs`:
//! [`Epilogue::BiasGradB`] when dY is our B, [`Epilogue::BiasGradA`] when
//! it is our A, transposed).
//!
//! **What is taken** ([`options`]): a reduction that is exactly the column
//! sum of one buffer — a `sum_to` node down to the last axis (run as its
//! lone kernel or as the host routine, staged), or a fused kernel whose
//! whole body is `load in0` stored as a cross-row per-column output — and a
//! single (unbatched) matmul in the same phase reading that same buffer as
//! `op(B) = dY` (`k` = tokens, `n` = columns) or `op(A) = dYᵀ` (`m` =
//! columns). The product runs at the matmul's step; the sum's step keeps
//! the rest of its kernel (the kernel without the summed output) or is left
//! empty, and is marked [`Written::At`] the matmul's step, so finite checks
//! and captures read its results after the GEMM.
//!
//! **Not taken** (the pair runs as selected; each reason is debug-logged at
//! load): a reduction fused with other work (the FFN's
//! `act_grad_bias_grad` kernel sums `dY·gelu′(x)`, a value no GEMM
//! operand holds — cuBLASLt's `DGELU_BGRAD` would need the GELU's input as
//! the aux matrix of the *previous* GEMM, and only in the tanh form), a sum
//! that is scaled or cast (the kernel body is more than the load), a bias
//! gradient of another dtype than the GEMM's (cuBLASLt writes the bias
//! gradient in D's type), operands off the device, a `db` not 16-byte
//! aligned or overlapping the GEMM's buffers, a batched product (cuBLASLt's
//! limit), and any instruction between the two steps that writes dY or
//! what the sum's kernel keeps writing, or touches `db` (the sum, moved to
//! the matmul's step, would read or write them at the wrong time), and a
//! bias gradient longer than [`MAX_BIAS_GRAD_LEN`] (measured slow). On the
//! GPU the heuristic at the
//! pointers' alignments may refuse too ([`BlasLt::check`]).
//!
//! The sums differ from the generated kernel's in order only: cuBLASLt
//! reduces in f32 over the stored (for bf16: rounded) dY.

use std::sync::Arc;

use crate::{BlasLt, Epilogue};
use zeroplan_ir::kernel::{Expr, Kernel};
use zeroplan_ir::{Bindings, Graph, Op, Place, Value};

use super::epilogue::DeviceGemm;
use super::kernels::Kernels;
use super::memory::GpuMemory;
use super::{CudaKernel, schedule};
use zeroplan_exec::buffers::concrete;
use zeroplan_exec::{Buf, Instruction, Step, Written};
use zeroplan_exec::{Instr, KernelCompile};

/// Where cuBLASLt writes the bias gradient: at least this aligned (as the
/// forward epilogue's bias).
const BIAS_ALIGNMENT: usize = 16;

/// The longest bias gradient taken into a GEMM. Measured on an H100
/// (bench/RESULTS.md, 2026-11-26, bert-base bf16 batch 32 × 128): with 768
/// and 3,072 values the weight gradient with `BGRADA` ran at 113–318
/// TFLOP/s, as fast as without; with the MLM decoder's 30,522 it ran at 35
/// TFLOP/s (5.4 ms) where the same product without the epilogue (its
/// `back0` twin) runs at 219, and a separate column sum would read its
/// 250 MB in about 0.1 ms. The bound sits between the measured points.
const MAX_BIAS_GRAD_LEN: usize = 8192;

/// A column sum over every row of one buffer, and what of its step remains
/// once cuBLASLt computes it.
#[derive(Clone, Debug, PartialEq)]
pub struct RowSum {
    /// `dY`, `rows × cols`: its buffer.
    pub x: Buf,
    /// `dY`'s value seen through reshapes, which the matmul must read too
    /// (a buffer alone could be another value's, the memory plan reusing
    /// bytes).
    pub value: Value,
    /// `db`, `cols`.
    pub out: Buf,
    /// The rows summed over (the tokens): the GEMM's `k`.
    pub rows: usize,
    /// The columns, one sum each: the bias's length.
    pub cols: usize,
    /// The step's kernel without the sum (its output `out` dropped), or
    /// `None` when the step did nothing else.
    pub rest: Option<Kernel>,
}

/// `kernel` without output `o` (stored expressions stay; an unused one is
/// harmless).
fn drop_output(kernel: &Kernel, o: usize) -> Kernel {
    let mut rest = kernel.clone();
    rest.outputs.remove(o);
    rest.stores.remove(o);
    rest.name = format!("{}.bias_grad_in_gemm", kernel.name);
    rest
}

/// The exact column sums step `s` computes, each with what would remain of
/// the step; `Err` for a sum that is not exactly one (scaled, cast, of a
/// value no buffer holds), with the reason.
fn sums<K>(
    graph: &Graph,
    steps: &[Step<Instr<K>>],
    s: usize,
    on_gpu: &impl Fn(&K) -> bool,
) -> Vec<Result<RowSum, String>> {
    let node = graph.node(steps[s].node);
    let operands = graph.operands(steps[s].node);
    let whole = |x: Buf, value: Value, out: Buf| -> Result<RowSum, String> {
        let cols = out.len;
        if cols == 0 || !x.len.is_multiple_of(cols) {
            return Err("the summed buffer is not whole rows of the bias".into());
        }
        Ok(RowSum { x, value: through_reshapes(graph, value), out, rows: x.len / cols, cols, rest: None })
    };
    match (&node.op, &steps[s].instr) {
        (Op::SumTo { shape }, Some(instr)) => {
            let x_shape = &graph.value_type(graph.operands(steps[s].node)[0]).shape;
            if x_shape.rank() < 2 || shape.rank() != 1 || shape.dims()[0] != x_shape.dims()[x_shape.rank() - 1] {
                return vec![Err("the sum is not down to the last axis (not a bias gradient)".into())];
            }
            match instr {
                Instr::SumTo { x, out, .. } => vec![whole(*x, operands[0], *out)],
                Instr::Kernel { kernel, inputs, outputs } if inputs.len() == 1 && outputs.len() == 1 => {
                    if on_gpu(kernel) {
                        vec![whole(inputs[0], operands[0], outputs[0])]
                    } else {
                        vec![Err("the sum does not run on the GPU (its operands are not all on the device)".into())]
                    }
                }
                _ => vec![],
            }
        }
        (Op::Fused { kernel: ir }, Some(Instr::Kernel { kernel, inputs, outputs })) => {
            let r = ir.shape.rank();
            let full = |axes: &[usize]| axes.iter().copied().eq(0..r);
            let mut found = Vec::new();
            for (o, arg) in ir.outputs.iter().enumerate() {
                if r < 2 || arg.axes != [r - 1] {
                    continue;
                }
                if !on_gpu(kernel) {
                    found.push(Err("the kernel does not run on the GPU".into()));
                    continue;
                }
                let e = ir.stores[o];
                // The summed value as a buffer: an input loaded as it is, or
                // another output storing the same expression per element.
                let x = match ir.body[e as usize] {
                    Expr::Load(i) if full(&ir.inputs[i as usize].axes) => {
                        Some((inputs[i as usize], operands[i as usize]))
                    }
                    _ => (0..ir.outputs.len())
                        .find(|&p| ir.stores[p] == e && full(&ir.outputs[p].axes))
                        .map(|p| (outputs[p], Value { node: steps[s].node, output: p as u32 })),
                };
                let Some((x, value)) = x else {
                    found.push(Err(format!(
                        "`{}` sums a value no buffer holds as it is (scaled, cast or not stored)",
                        arg.name
                    )));
                    continue;
                };
                found.push(whole(x, value, outputs[o]).map(|sum| {
                    let rest = (ir.outputs.len() > 1).then(|| drop_output(ir, o));
                    RowSum { rest, ..sum }
                }));
            }
            found
        }
        _ => vec![],
    }
}

/// `v`, or the value it is a reshape of (a view of the same buffer).
fn through_reshapes(graph: &Graph, mut v: Value) -> Value {
    while let Op::Reshape { .. } = graph.node(v.node).op {
        v = graph.operands(v.node)[0];
    }
    v
}

/// A weight-gradient matmul and a bias-gradient sum over the same dY as one
/// cuBLASLt `BGRAD` product, at the matmul's step.
#[derive(Clone, Debug, PartialEq)]
pub struct Pair {
    /// The weight-gradient matmul's step, where the product runs.
    pub matmul: usize,
    /// The bias-gradient sum's step, marked written at `matmul`.
    pub sum: usize,
    /// The matmul's GEMM with a `BGRADA` or `BGRADB` epilogue.
    pub gemm: DeviceGemm,
    /// `[a, b]`.
    pub inputs: [Buf; 2],
    /// `[dW, db]`.
    pub outputs: [Buf; 2],
    /// What the sum's step keeps running: its kernel without the sum, its
    /// outputs (`None`: the step is left empty).
    pub rest: Option<(Kernel, Vec<Buf>)>,
}

/// The matmul that can take `sum` as its `BGRAD` epilogue, or why none can.
fn pair<K>(
    graph: &Graph,
    steps: &[Step<Instr<K>>],
    touched: &[Vec<(Buf, bool)>],
    s: usize,
    sum: &RowSum,
) -> Result<Pair, String> {
    let RowSum { x: dy, out: db, rows, cols, .. } = *sum;
    let mut rest_outputs = Vec::new();
    if let (Some(rest), Some(Instr::Kernel { outputs, .. })) = (&sum.rest, &steps[s].instr) {
        rest_outputs = outputs.iter().copied().filter(|b| *b != db).collect();
        debug_assert_eq!(rest_outputs.len(), rest.outputs.len());
    }
    if [dy, db].iter().any(|b| b.place != Place::Device) {
        return Err("the sum's buffers are not on the device".into());
    }
    let mut refused = Vec::new();
    for (m, step) in steps.iter().enumerate() {
        let Some(Instr::MatMul { shape, a, b, out }) = &step.instr else { continue };
        let reads = |i: usize| through_reshapes(graph, graph.operands(step.node)[i]) == sum.value;
        let epilogue = if !shape.transpose_b && *b == dy && reads(1) && shape.k == rows && shape.n == cols {
            Epilogue::BiasGradB
        } else if shape.transpose_a && *a == dy && reads(0) && shape.k == rows && shape.m == cols {
            Epilogue::BiasGradA
        } else {
            continue;
        };
        let mm = &graph.node(step.node).name;
        let (lo, hi) = (m.min(s), m.max(s));
        let dtype = a.dtype;
        let gemm = DeviceGemm { shape: shape.clone(), dtype, epilogue, name: format!("cublaslt_bias_grad({mm})") };
        // The GEMM runs where the matmul did; only the sum moves there. So
        // between the steps nothing may write dY (the sum reads it late) or
        // what the sum's kernel keeps writing (its node's results are read
        // after the GEMM), nor touch db (written late).
        let reads: Vec<Buf> = std::iter::once(dy).chain(rest_outputs.iter().copied()).collect();
        let why = if step.optimizer != steps[s].optimizer {
            Some("the matmul runs in another phase".to_string())
        } else if sum.rest.is_some() && m < s {
            Some("the matmul runs before the kernel that keeps running".into())
        } else if [a, b, out].iter().any(|x| x.place != Place::Device) {
            Some("the matmul's operands are not on the device".into())
        } else if [b.dtype, out.dtype, db.dtype].iter().any(|&d| d != dtype) {
            Some(format!(
                "a {:?} bias gradient of a {:?} × {:?} → {:?} product (cuBLASLt writes it in the product's type)",
                db.dtype, a.dtype, b.dtype, out.dtype
            ))
        } else if cols > MAX_BIAS_GRAD_LEN {
            Some(format!(
                "a bias gradient of {cols} values (cuBLASLt's bias-gradient GEMMs slow down past {MAX_BIAS_GRAD_LEN})"
            ))
        } else if db.offset % BIAS_ALIGNMENT != 0 {
            Some(format!("the bias gradient at byte {} is not {BIAS_ALIGNMENT}-byte aligned", db.offset))
        } else if [a, b, out].iter().any(|x| x.overlaps(&db)) {
            Some("the bias gradient overlaps the GEMM's buffers".into())
        } else if let Some(at) = schedule::first_conflict(touched, lo + 1..hi, &reads, &[db]) {
            Some(format!(
                "step {at} (`{}`) between the sum and the matmul writes dY or the kernel's outputs, or touches db",
                graph.node(steps[at].node).name
            ))
        } else {
            gemm.lt().plan().err().map(|e| e.to_string())
        };
        match why {
            None => {
                let rest = sum.rest.clone().map(|k| (k, rest_outputs));
                return Ok(Pair { matmul: m, sum: s, gemm, inputs: [*a, *b], outputs: [*out, db], rest });
            }
            Some(why) => refused.push(format!("with `{mm}`: {why}")),
        }
    }
    if refused.is_empty() {
        return Err("no unbatched matmul reads the summed value as op(B) or as op(A)ᵀ".into());
    }
    Err(refused.join("; "))
}

/// What cuBLASLt can take of step `s`'s bias-gradient sums, in the
/// kernel's output order: for each, the pair or why not. Empty when the
/// step sums nothing. `touched` is [`schedule::touches`] of `steps`.
pub fn options<K>(
    graph: &Graph,
    steps: &[Step<Instr<K>>],
    touched: &[Vec<(Buf, bool)>],
    s: usize,
    on_gpu: impl Fn(&K) -> bool,
) -> Vec<Result<Pair, String>> {
    sums(graph, steps, s, &on_gpu)
        .into_iter()
        .map(|sum| sum.and_then(|sum| pair(graph, steps, touched, s, &sum)))
        .collect()
}

/// What [`select`] did, for the load's debug line and the tests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summed {
    /// The bias gradients now summed inside a GEMM.
    pub taken: usize,
    /// `(sum, why)` of each bias gradient left as it was.
    pub left: Vec<(String, String)>,
}

/// Runs every bias-gradient sum cuBLASLt can take inside its weight
/// gradient's GEMM (at most one per step: a kernel summing two is rare).
pub fn select(
    graph: &Graph,
    steps: &mut [Step<Instr<CudaKernel>>],
    bindings: &Bindings,
    memory: &GpuMemory,
    lt: &BlasLt,
    compilers: &mut Kernels,
) -> Summed {
    let mut touched = schedule::touches(steps);
    let mut summed = Summed::default();
    for s in 0..steps.len() {
        let on_gpu = |kernel: &CudaKernel| matches!(kernel, CudaKernel::Gpu(_));
        let name = graph.node(steps[s].node).name.clone();
        let mut refused = Vec::new();
        let mut taken = false;
        for option in options(graph, steps, &touched, s, on_gpu) {
            let pair = match option {
                Ok(pair) => pair,
                Err(why) => {
                    refused.push(why);
                    continue;
                }
            };
            let pointers = pair.gemm.pointers(&pair.inputs, &pair.outputs, |b| memory.device_ptr(b));
            if let Err(e) = lt.check(&pair.gemm.lt(), &pointers) {
                refused.push(e.to_string());
                continue;
            }
            let rest = match &pair.rest {
                None => None,
                Some((kernel, outputs)) => {
                    let Some(Instr::Kernel { inputs, .. }) = &steps[s].instr else { unreachable!("a kernel step") };
                    let inputs = inputs.clone();
                    let compiled = concrete(&kernel.shape, bindings)
                        .ok_or_else(|| "the kernel's shape is unbound".to_string())
                        .and_then(|dims| compilers.compile(kernel, &dims, &[inputs.as_slice(), outputs].concat()));
                    match compiled {
                        Ok(k) => Some(Instr::Kernel { kernel: k, inputs, outputs: outputs.clone() }),
                        Err(e) => {
                            refused.push(format!("compiling the kernel without its sum: {e}"));
                            continue;
                        }
                    }
                }
            };
            let m = pair.matmul;
            steps[m].instr = Some(Instr::Kernel {
                kernel: CudaKernel::Gemm(Arc::new(pair.gemm)),
                inputs: pair.inputs.to_vec(),
                outputs: pair.outputs.to_vec(),
            });
            steps[s].instr = rest;
            steps[s].written = Written::At(m);
            for x in [m, s] {
                touched[x] = steps[x].instr.as_ref().map(Instruction::touches).unwrap_or_default();
            }
            summed.taken += 1;
            taken = true;
            break;
        }
        if !taken && !refused.is_empty() {
            summed.left.push((name.to_string(), refused.join("; ")));
        }
    }
    summed
}

#[cfg(test)]
mod tests;
