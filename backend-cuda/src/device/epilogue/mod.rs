//! GEMM epilogues on a CUDA rank: a matmul and the fused kernel that adds
//! its bias (`Kernel::epilogue_of`, marked by the `fuse` pass) run as one
//! cuBLASLt product.
//!
//! Two forms, tried in this order for each such pair (decided at load,
//! [`options`], from the kernel IR ([`matching::fit`]), the buffers and the
//! schedule):
//!
//! - **Whole**: the kernel is only `mm + bias`, maybe followed by the tanh
//!   GELU cuBLASLt implements. The cuBLASLt `BIAS` / `GELU_BIAS` /
//!   `GELU_AUX_BIAS` product writes the kernel's outputs at the kernel's
//!   step (the pre-activation, when the kernel keeps it for the backward,
//!   as the epilogue's aux matrix); the matmul's step is left empty and its
//!   product never written (no one reads it).
//! - **Bias only**: the kernel does more (BERT's erf GELU, which cuBLASLt
//!   lacks; dropout, a residual, LayerNorm). The `BIAS` product writes
//!   `mm + bias` into the product's own buffer at the matmul's step, and the
//!   kernel, rewritten without the add and the bias input
//!   ([`rewrite::drop_bias`]), reads it there. This is clean because the
//!   add is the only use of the product and of the bias in the kernel (the
//!   fuse pass's `epilogue_of` promises the product has no other reader; the
//!   matching checks the kernel itself): the biased product is all anyone
//!   reads. It saves the kernel one operand and an add, not a pass over
//!   memory; the fusion that removes a pass is the whole form.
//!
//! Either form needs the pair on the device, in one phase, the bias of the
//! product's dtype (cuBLASLt adds a bias of D's type) and 16-byte aligned,
//! the GEMM's output apart from its inputs; and the moved work must not
//! cross an instruction that conflicts with it ([`super::schedule`]): the
//! whole form reads A and B at the kernel's step, so nothing between may
//! overwrite them (the memory plan may reuse a dead operand's bytes); the
//! bias-only form reads the bias at the matmul's step, so nothing between
//! may write it. cuBLASLt's own limits come from its plan (`LtGemm::plan`:
//! an aux matrix needs `n % 8 == 0`, batches must step evenly) and, on the
//! GPU, from its heuristic at the pointers' alignments (`BlasLt::check`);
//! any refusal keeps the pair as it was, never fails the load.
//!
//! Either way the matmul's product is no longer the graph's value (never
//! written, or biased): neither form is taken when it is an output of the
//! program, and its step is marked [`Written::Never`], so `Runner::capture`
//! refuses it with an error naming it.
//!
//! What was fused shows in the profile (`kernel cublaslt_bias_gelu_aux(…)`
//! and `kernel ….bias_in_gemm` in place of `matmul …` and the kernel) and in
//! a `tracing` debug line at load with the counts and each refusal's reason.

pub mod matching;
pub mod rewrite;

use std::sync::Arc;

use crate::{BlasLt, Epilogue, LtGemm, gemm::LtPointers};
use zeroplan_ir::kernel::Kernel;
use zeroplan_ir::{Bindings, DType, Graph, Op};

use super::{Cuda, CudaKernel, gemm, kernels::Kernels, memory::GpuMemory, schedule};
use matching::Fit;
use zeroplan_exec::MatMulShape;
use zeroplan_exec::buffers::concrete;
use zeroplan_exec::{Buf, Instruction, SelectError, Step, Written};
use zeroplan_exec::{Instr, KernelCompile};

/// Where cuBLASLt reads the bias and writes the aux matrix: at least this
/// aligned (an assumption kept on the safe side: the heuristic takes no
/// alignment preference for either, unlike A, B, C and D).
const BIAS_ALIGNMENT: usize = 16;

/// A matmul with its epilogue as one cuBLASLt product. Its instruction's
/// inputs are `[a, b, bias]`, its outputs `[d]` or `[d, aux]`; for a bias
/// gradient ([`super::bias_grad`]) `[a, b]` and `[d, db]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceGemm {
    /// The matmul's dimensions and transposes.
    pub shape: MatMulShape,
    /// The type of A, B and D alike (and of the bias, aux and bias gradient).
    pub dtype: DType,
    /// What cuBLASLt does after the product.
    pub epilogue: Epilogue,
    /// `cublaslt_<epilogue>(<kernel>)`, as profiles count it.
    pub name: String,
}

impl DeviceGemm {
    pub(crate) fn lt(&self) -> LtGemm<'_> {
        LtGemm { gemm: gemm(&self.shape, self.dtype), epilogue: self.epilogue }
    }

    /// The cuBLASLt pointers of the instruction's buffers: inputs `[a, b]`
    /// then the bias for a forward epilogue, outputs `[d]` then the aux
    /// matrix (GELU) or the bias gradient (`BiasGrad*`).
    pub(crate) fn pointers(&self, inputs: &[Buf], outputs: &[Buf], ptr: impl Fn(Buf) -> u64) -> LtPointers {
        let grad = matches!(self.epilogue, Epilogue::BiasGradA | Epilogue::BiasGradB);
        LtPointers {
            a: ptr(inputs[0]),
            b: ptr(inputs[1]),
            d: ptr(outputs[0]),
            bias: if grad { outputs.get(1) } else { inputs.get(2) }.copied().map(&ptr),
            aux: if grad { None } else { outputs.get(1).copied().map(&ptr) },
        }
    }

    /// The product's floating-point operations (the epilogue not counted).
    pub fn flops(&self) -> f64 {
        self.shape.flops()
    }
}

/// One way to run a matmul and its epilogue kernel, all checks that need
/// no GPU passed.
#[derive(Clone, Debug, PartialEq)]
pub struct Pair {
    /// The matmul's step.
    pub matmul: usize,
    /// The epilogue kernel's step.
    pub kernel: usize,
    /// Whether the whole kernel goes (else only its bias add).
    pub whole: bool,
    /// The product with its epilogue.
    pub gemm: DeviceGemm,
    /// `[a, b, bias]`.
    pub inputs: [Buf; 3],
    /// `[d]`, or `[d, aux]` when the epilogue keeps the biased product for
    /// the backward.
    pub outputs: Vec<Buf>,
    /// Bias only: the rewritten kernel, its inputs (the bias gone).
    pub rest: Option<(Kernel, Vec<Buf>)>,
}

impl Pair {
    /// The step the cuBLASLt product runs at.
    pub fn at(&self) -> usize {
        if self.whole { self.kernel } else { self.matmul }
    }
}

fn epilogue_name(e: Epilogue) -> &'static str {
    match e {
        Epilogue::Bias => "bias",
        Epilogue::Gelu { aux: true, .. } => "bias_gelu_aux",
        Epilogue::Gelu { aux: false, .. } => "bias_gelu",
        Epilogue::BiasGradA | Epilogue::BiasGradB => "bias_grad",
        _ => "other",
    }
}

/// The ways step `k` (a fused kernel) and its matmul can run through
/// cuBLASLt, best first; `Ok(None)` when `k` is no epilogue kernel at all;
/// `Err` says why a marked pair cannot (it then runs as selected).
/// `touched` is [`schedule::touches`] of `steps`; `on_gpu` says whether a
/// selected kernel is a device kernel.
pub fn options<K>(
    graph: &Graph,
    steps: &[Step<Instr<K>>],
    touched: &[Vec<(Buf, bool)>],
    k: usize,
    on_gpu: impl Fn(&K) -> bool,
) -> Result<Option<Vec<Pair>>, String> {
    let node = graph.node(steps[k].node);
    let (Op::Fused { kernel: ir }, Some(Instr::Kernel { kernel, inputs, outputs })) = (&node.op, &steps[k].instr)
    else {
        return Ok(None);
    };
    let Some(name) = &ir.epilogue_of else { return Ok(None) };
    if !on_gpu(kernel) {
        return Err("the kernel does not run on the GPU (its operands are not all on the device)".into());
    }
    let mm_node = graph.node_by_name(name).ok_or_else(|| format!("no matmul `{name}` in the program"))?;
    let operands = graph.operands(steps[k].node);
    let reads: Vec<usize> = (0..operands.len()).filter(|&i| operands[i].node == mm_node).collect();
    let mm = match reads[..] {
        [i] => i,
        _ => return Err(format!("the kernel does not read `{name}` as exactly one operand")),
    };
    let m = steps.iter().position(|s| s.node == mm_node).ok_or("the matmul has no step")?;
    let Some(Instr::MatMul { shape, a, b, out }) = &steps[m].instr else {
        return Err("the matmul is not selected as a GEMM".into());
    };
    if m >= k || steps[m].optimizer != steps[k].optimizer {
        return Err("the matmul is not scheduled before the kernel in its phase".into());
    }
    if graph.users(mm_node) != [steps[k].node] || *out != inputs[mm] {
        return Err("the product has another reader".into());
    }
    // Either form leaves the product unwritten or biased.
    if graph.outputs.iter().any(|(_, v)| v.node == mm_node) {
        return Err("the product is an output of the program, which neither form writes as it is".into());
    }
    let fit = matching::fit(ir, mm)?;
    let (bias, add) = match fit {
        Fit::Whole { bias, add, .. } | Fit::BiasOnly { bias, add } => (bias, add),
    };
    let (a, b, bias_buf, dtype) = (*a, *b, inputs[bias], a.dtype);
    if bias_buf.dtype != dtype {
        return Err(format!(
            "a {:?} bias on a {dtype:?} product (cuBLASLt adds a bias of the product's type)",
            bias_buf.dtype
        ));
    }
    if bias_buf.offset % BIAS_ALIGNMENT != 0 {
        return Err(format!("the bias at byte {} is not {BIAS_ALIGNMENT}-byte aligned", bias_buf.offset));
    }
    let label = |e: Epilogue| format!("cublaslt_{}({})", epilogue_name(e), ir.name);
    let mut found = Vec::new();
    let mut refused = Vec::new();
    if let Fit::Whole { epilogue, out, aux, .. } = fit {
        let outs: Vec<Buf> = std::iter::once(outputs[out]).chain(aux.map(|x| outputs[x])).collect();
        let gemm = DeviceGemm { shape: shape.clone(), dtype, epilogue, name: label(epilogue) };
        let why = if outs.iter().any(|o| o.dtype != dtype) {
            Some("an output of another dtype than the product".to_string())
        } else if outs.iter().skip(1).any(|x| x.offset % BIAS_ALIGNMENT != 0) {
            Some(format!("the aux matrix is not {BIAS_ALIGNMENT}-byte aligned"))
        } else if outs.iter().any(|o| [a, b, bias_buf].iter().any(|x| x.overlaps(o))) {
            Some("an output overlaps the GEMM's inputs".into())
        } else if let Some(at) = schedule::first_conflict(touched, m + 1..k, &[a, b], &[]) {
            Some(format!("step {at} between the matmul and the kernel overwrites the product's operands"))
        } else {
            gemm.lt().plan().err().map(|e| e.to_string())
        };
        match why {
            None => found.push(Pair {
                matmul: m,
                kernel: k,
                whole: true,
                gemm,
                inputs: [a, b, bias_buf],
                outputs: outs,
                rest: None,
            }),
            Some(why) => refused.push(format!("whole kernel: {why}")),
        }
    }
    let gemm = DeviceGemm { shape: shape.clone(), dtype, epilogue: Epilogue::Bias, name: label(Epilogue::Bias) };
    let why = if let Some(at) = schedule::first_conflict(touched, m + 1..k, &[bias_buf], &[]) {
        Some(format!("step {at} between the matmul and the kernel writes the bias"))
    } else if bias_buf.overlaps(out) {
        Some("the bias overlaps the product".into())
    } else {
        gemm.lt().plan().err().map(|e| e.to_string())
    };
    match why {
        None => {
            let rest = rewrite::drop_bias(ir, mm, bias, add);
            let mut rest_inputs = inputs.clone();
            rest_inputs.remove(bias);
            let pair = Pair {
                matmul: m,
                kernel: k,
                whole: false,
                gemm,
                inputs: [a, b, bias_buf],
                outputs: vec![*out],
                rest: Some((rest, rest_inputs)),
            };
            found.push(pair);
        }
        Some(why) => refused.push(format!("bias only: {why}")),
    }
    if found.is_empty() { Err(refused.join("; ")) } else { Ok(Some(found)) }
}

/// What [`select`] did, for the load's debug line and the tests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fused {
    /// Pairs whose whole kernel went into the GEMM's epilogue.
    pub whole: usize,
    /// Pairs where the GEMM took only the bias add.
    pub bias_only: usize,
    /// `(kernel, why)` of each marked pair left as it was.
    pub left: Vec<(String, String)>,
}

/// Rewrites every matmul + epilogue kernel pair cuBLASLt can run.
pub fn select(
    graph: &Graph,
    steps: &mut [Step<Instr<CudaKernel>>],
    bindings: &Bindings,
    memory: &GpuMemory,
    lt: &BlasLt,
    compilers: &mut Kernels,
) -> Result<Fused, SelectError> {
    let mut touched = schedule::touches(steps);
    let mut fused = Fused::default();
    for k in 0..steps.len() {
        let on_gpu = |kernel: &CudaKernel| matches!(kernel, CudaKernel::Gpu(_));
        let tried = options(graph, steps, &touched, k, on_gpu);
        let node = steps[k].node;
        let name = || graph.node(node).name.clone();
        let pairs = match tried {
            Ok(None) => continue,
            Ok(Some(pairs)) => pairs,
            Err(why) => {
                fused.left.push((name().to_string(), why));
                continue;
            }
        };
        let mut refused = Vec::new();
        for pair in pairs {
            let pointers = pair.gemm.pointers(&pair.inputs, &pair.outputs, |b| memory.device_ptr(b));
            if let Err(e) = lt.check(&pair.gemm.lt(), &pointers) {
                refused.push(e.to_string());
                continue;
            }
            let rest = match &pair.rest {
                None => None,
                Some((kernel, inputs)) => {
                    let Some(dims) = concrete(&kernel.shape, bindings) else {
                        refused.push("the kernel's shape is unbound".into());
                        continue;
                    };
                    let Instr::Kernel { outputs, .. } = steps[k].instr.as_ref().expect("a kernel step") else {
                        unreachable!("`options` matched a kernel step")
                    };
                    let outputs = outputs.clone();
                    match compilers.compile(kernel, &dims, &[inputs.as_slice(), &outputs].concat()) {
                        Ok(compiled) => Some(Instr::Kernel { kernel: compiled, inputs: inputs.clone(), outputs }),
                        Err(e) => {
                            refused.push(format!("compiling the kernel without its bias: {e}"));
                            continue;
                        }
                    }
                }
            };
            let product = Instr::Kernel {
                kernel: CudaKernel::Gemm(Arc::new(pair.gemm.clone())),
                inputs: pair.inputs.to_vec(),
                outputs: pair.outputs.clone(),
            };
            // The product is no longer the graph's (unwritten, or biased).
            steps[pair.matmul].written = Written::Never;
            if pair.whole {
                steps[pair.matmul].instr = None;
                steps[pair.kernel].instr = Some(product);
                fused.whole += 1;
            } else {
                steps[pair.matmul].instr = Some(product);
                steps[pair.kernel].instr = rest;
                fused.bias_only += 1;
            }
            for at in [pair.matmul, pair.kernel] {
                touched[at] = steps[at].instr.as_ref().map(Instruction::touches).unwrap_or_default();
            }
            refused.clear();
            break;
        }
        if !refused.is_empty() {
            fused.left.push((name().to_string(), refused.join("; ")));
        }
    }
    Ok(fused)
}

/// Queues the product on the compute stream.
pub fn run(cuda: &Cuda, g: &DeviceGemm, inputs: &[Buf], outputs: &[Buf]) -> Result<(), String> {
    let lt = cuda.lt.as_ref().ok_or("a cuBLASLt product was selected without a cuBLASLt handle")?;
    let pointers = g.pointers(inputs, outputs, |b| cuda.memory.device_ptr(b));
    // SAFETY: selection (here or in `bias_grad`) checked the operands lie
    // on the device, of the product's dtype, at the shape's sizes, the
    // outputs apart from the inputs; the arenas outlive the stream's work.
    unsafe { lt.matmul(&g.lt(), &pointers) }.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
