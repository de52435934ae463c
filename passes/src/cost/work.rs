//! The work of one instruction: which engine runs it, its FLOPs, the bytes
//! it moves.
//!
//! FLOP counts: a matmul of `[.., m, k] @ [.., k, n]` is `2mnk` per batch
//! entry (a multiply and an add per term). Elementwise and row ops count
//! one FLOP per output element, softmax and LayerNorm (and their
//! gradients) a handful — they are memory-bound, so their time comes from
//! the bytes, and their FLOPs matter only for totals. Fused attention is
//! its products: `4·B·H·S²·D` forward, 2.5 times that backward (with the
//! recomputation of the scores), timed as a GEMM of `B·H` batches of
//! `S × S × D`. Bytes: every operand
//! read once and every output written once, which is what a fused kernel
//! does and what a GEMM does when its tiles fit in cache. Views and sources
//! move nothing.

use zeroplan_ir::{Bindings, Graph, NodeIndex, Op, Place, Value};

/// The engine an instruction occupies: the streams of the step simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// Tensor-core matrix products (cuBLASLt).
    Gemm,
    /// Memory-bound kernels: fused or single elementwise, row and layout ops.
    Kernel,
    /// NCCL collectives, on their own stream.
    Collective,
    /// Host ↔ device copies over PCIe, on the copy engine.
    Copy,
    /// Work on the host's CPUs (ZeRO-Offload's AdamW).
    Host,
    /// Views and sources: nothing runs.
    Free,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Gemm => "gemm",
            Engine::Kernel => "kernel",
            Engine::Collective => "collective",
            Engine::Copy => "copy",
            Engine::Host => "host",
            Engine::Free => "free",
        }
    }

    /// The stream an instruction of this engine waits in: GEMMs and
    /// kernels share the compute stream. A collective's is its group's:
    /// see [`stream`].
    pub fn stream(self) -> Option<Stream> {
        match self {
            Engine::Gemm | Engine::Kernel => Some(Stream::Compute),
            Engine::Collective => Some(Stream::Comm),
            Engine::Copy => Some(Stream::Copy),
            Engine::Host => Some(Stream::Host),
            Engine::Free => None,
        }
    }
}

/// The stream instruction `op`, run by `engine`, waits in. A rank holds
/// one NCCL communicator per group, each on a stream of its own (as
/// Megatron-LM and PyTorch DDP run theirs): the tensor-parallel group's
/// collectives cross the node's NVLink, the data-parallel group's its
/// network ports, so a gradient reduce-scatter does not queue the
/// sequence-parallel all-gather the next GEMM waits for.
pub fn stream(op: &Op, engine: Engine) -> Option<Stream> {
    match engine.stream() {
        Some(Stream::Comm) if op.is_tensor_collective() => Some(Stream::TensorComm),
        other => other,
    }
}

/// One in-order queue of the step simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Compute,
    /// The data-parallel group's collectives.
    Comm,
    /// The tensor-parallel group's collectives.
    TensorComm,
    Copy,
    Host,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Compute => "compute",
            Stream::Comm => "comm",
            Stream::TensorComm => "tensor_comm",
            Stream::Copy => "copy",
            Stream::Host => "host",
        }
    }
}

/// A GEMM's problem size, for its efficiency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmShape {
    pub batch: u64,
    pub m: u64,
    pub n: u64,
    pub k: u64,
}

/// What one instruction does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    pub engine: Engine,
    pub flops: f64,
    /// Bytes read and written (for collectives and copies: the whole tensor).
    pub bytes: f64,
    pub gemm: Option<GemmShape>,
}

/// The share of an op's FLOPs that recompute what the forward computed,
/// which model FLOPs (MFU) leave out as they leave out `*.recompute` nodes:
/// fused attention's backward redoes `q·kᵀ`, 2 of its 10 `B·H·S²·D`.
pub fn recomputed_share(op: &Op) -> f64 {
    match op {
        Op::FlashAttentionGrad { .. } => 0.2,
        _ => 0.0,
    }
}

/// The work of node `n` under `bindings`; `None` where a size is unbound.
pub fn work(graph: &Graph, n: NodeIndex, bindings: &Bindings) -> Option<Work> {
    let node = graph.node(n);
    // Sources and views move no bytes, so their tensors are not sized.
    if node.op.is_source() || node.op.is_view() {
        return Some(Work { engine: Engine::Free, flops: 0.0, bytes: 0.0, gemm: None });
    }
    let operands = graph.operands(n);
    let size = |v: Value| graph.value_type(v).size_bytes(bindings);
    let mut bytes = 0u64;
    for v in operands {
        bytes += size(*v)?;
    }
    for t in node.outputs.iter() {
        bytes += t.size_bytes(bindings)?;
    }
    let out_elements = node.outputs.iter().map(|t| t.shape.numel_value(bindings)).sum::<Option<u64>>()? as f64;
    let mut work = Work { engine: Engine::Kernel, flops: out_elements, bytes: bytes as f64, gemm: None };
    let output = Value { node: n, output: 0 };
    match &node.op {
        Op::MatMul { transpose_a, .. } => {
            let a = graph.value_type(operands[0]).shape.dims();
            let k = a[if *transpose_a { a.len() - 2 } else { a.len() - 1 }].eval(bindings)?;
            let out = graph.value_type(output).shape.dims();
            let (m, nn) = (out[out.len() - 2].eval(bindings)?, out[out.len() - 1].eval(bindings)?);
            let batch = out_elements as u64 / (m * nn).max(1);
            work.engine = Engine::Gemm;
            work.flops = 2.0 * (batch * m * nn * k) as f64;
            work.gemm = Some(GemmShape { batch, m, n: nn, k });
        }
        op if op.is_collective() => {
            work.engine = Engine::Collective;
            work.flops = 0.0;
            work.bytes = super::comm::whole_elements(graph, output, bindings)? as f64
                * node.outputs[0].dtype.size_bytes() as f64;
        }
        Op::Copy => {
            work.engine = Engine::Copy;
            work.flops = 0.0;
            work.bytes = size(output)? as f64;
        }
        Op::FlashAttention { .. } | Op::FlashAttentionGrad { .. } => {
            let q = graph.value_type(operands[0]).shape.dims();
            let [b, h, s, d] = [0, 1, 2, 3].map(|i| q.get(i).and_then(|x| x.eval(bindings)));
            let (b, h, s, d) = (b?, h?, s?, d?);
            // Forward: q·kᵀ and P·v, 2·S²·D each per head. Backward: q·kᵀ
            // again (the recomputation), then dv, dP, dq and dk.
            let forward = 4.0 * (b * h * s * s * d) as f64;
            let backward = matches!(node.op, Op::FlashAttentionGrad { .. });
            work.engine = Engine::Gemm;
            work.flops = if backward { 2.5 * forward } else { forward };
            work.gemm = Some(GemmShape { batch: b * h, m: s, n: s, k: d });
        }
        Op::Softmax | Op::SoftmaxGrad | Op::LayerNorm { .. } | Op::LayerNormGrad { .. } => work.flops *= 5.0,
        Op::AdamW { .. } => work.flops *= 12.0,
        Op::Fused { kernel } => {
            work.flops = out_elements.max(kernel.shape.numel_value(bindings)? as f64) * kernel.body.len() as f64;
            // A GEMM epilogue reads the product from registers, not memory.
            if let Some(matmul) = &kernel.epilogue_of {
                for v in operands {
                    if &*graph.node(v.node).name == matmul.as_str() {
                        work.bytes -= size(*v)? as f64;
                    }
                }
            }
        }
        _ => {}
    }
    if node.place == Place::Host && work.engine != Engine::Copy {
        work.engine = Engine::Host;
    }
    Some(work)
}
