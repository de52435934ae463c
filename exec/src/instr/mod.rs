//! The instructions a rank's program runs: one per scheduled node, each
//! naming the buffers the plan placed it on. Every device runs the same
//! instructions (what to compute); only how differs — the host's routines
//! and Cranelift kernels, a GPU's NVRTC kernels and cuBLAS — so selection
//! ([`crate::select`]) is written once, generic over the device's compiled
//! kernel `K`.

mod access;
mod attention;
mod matmul;

use crate::buffers::Buf;
use crate::device::Instruction;
use crate::select::Named;

pub use access::Access;
pub use attention::Attention;
pub use matmul::MatMulShape;

/// Which elementwise binary op a broadcast routine computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arith {
    Add,
    Sub,
    Mul,
}

/// One instruction and the buffers it reads and writes; `K` is the
/// device's compiled kernel .
#[derive(Clone)]
pub enum Instr<K> {
    /// Copies the fed tensor of input `name` in.
    Input {
        name: String,
        shape: Vec<usize>,
        out: Buf,
    },
    Fill {
        value: f64,
        out: Buf,
    },
    Arange {
        out: Buf,
    },
    /// A view whose buffer is not its operand's (another place): a copy.
    /// Identical buffers need no instruction at all.
    Copy {
        from: Buf,
        to: Buf,
    },
    /// Collectives over the data-parallel ranks, through the communicator.
    AllReduce {
        x: Buf,
        out: Buf,
    },
    ReduceScatter {
        x: Buf,
        out: Buf,
    },
    AllGather {
        x: Buf,
        out: Buf,
    },
    /// Megatron-LM's `g`: the sum over the tensor-parallel group, on the
    /// compute thread (the next node needs it).
    TensorAllReduce {
        x: Buf,
        out: Buf,
    },
    /// Sequence parallelism: every tensor rank's `[outer, S/t, …]` slice,
    /// gathered into `[outer, S, …]`.
    SequenceAllGather {
        x: Buf,
        outer: usize,
        out: Buf,
    },
    /// The sum over the tensor ranks of `[outer, S, …]`, of which this rank
    /// keeps its `[outer, S/t, …]` slice.
    SequenceReduceScatter {
        x: Buf,
        outer: usize,
        out: Buf,
    },
    /// This tensor rank's slice of `axis` (ids or floats).
    SequenceSlice {
        x: Buf,
        shape: Vec<usize>,
        axis: usize,
        rank: usize,
        ranks: usize,
        out: Buf,
    },
    /// Ids to this tensor rank's rows of a vocabulary-parallel table.
    VocabShard {
        ids: Buf,
        rank: u64,
        ranks: u64,
        rows: u64,
        out: Buf,
    },
    CrossEntropyStats {
        logits: Buf,
        labels: Buf,
        classes: usize,
        rank: u64,
        ranks: u64,
        vocab: u64,
        out: Buf,
    },
    CrossEntropyCombine {
        stats: Buf,
        labels: Buf,
        /// The whole (padded) vocabulary: ranks × the logits' columns.
        vocab: usize,
        ignore_index: i64,
        out: Buf,
    },
    CrossEntropyShardGrad {
        logits: Buf,
        labels: Buf,
        stats: Buf,
        dloss: Buf,
        classes: usize,
        rank: u64,
        vocab: u64,
        ignore_index: i64,
        out: Buf,
    },
    /// ALiBi on a tensor rank's heads (a row kernel knows only all heads').
    AlibiBias {
        x: Buf,
        shape: [usize; 4],
        slopes: Vec<f32>,
        out: Buf,
    },
    /// Fused attention: `(q, k, v, mask) -> (out, lse)` ([`Attention`]).
    FlashAttention {
        attention: Box<Attention>,
        inputs: [Buf; 4],
        outputs: [Buf; 2],
    },
    /// Its adjoint: `(q, k, v, mask, out, lse, dout) -> (dq, dk, dv)`.
    FlashAttentionGrad {
        attention: Box<Attention>,
        inputs: [Buf; 7],
        outputs: [Buf; 3],
    },
    Kernel {
        kernel: K,
        inputs: Vec<Buf>,
        outputs: Vec<Buf>,
    },
    MatMul {
        shape: MatMulShape,
        a: Buf,
        b: Buf,
        out: Buf,
    },
    Embedding {
        table: Buf,
        ids: Buf,
        width: usize,
        out: Buf,
    },
    EmbeddingGrad {
        dy: Buf,
        ids: Buf,
        width: usize,
        out: Buf,
    },
    CrossEntropy {
        logits: Buf,
        labels: Buf,
        classes: usize,
        ignore_index: i64,
        out: Buf,
    },
    CrossEntropyGrad {
        logits: Buf,
        labels: Buf,
        dloss: Buf,
        classes: usize,
        ignore_index: i64,
        out: Buf,
    },
    Mse {
        p: Buf,
        t: Buf,
        out: Buf,
    },
    MseGrad {
        p: Buf,
        t: Buf,
        dloss: Buf,
        out: Buf,
    },
    Transpose {
        x: Buf,
        shape: Vec<usize>,
        perm: Vec<usize>,
        out: Buf,
    },
    Slice {
        x: Buf,
        shape: Vec<usize>,
        axis: usize,
        start: usize,
        len: usize,
        out: Buf,
    },
    SliceGrad {
        dy: Buf,
        shape: Vec<usize>,
        axis: usize,
        start: usize,
        axis_len: usize,
        out: Buf,
    },
    Split {
        x: Buf,
        shape: Vec<usize>,
        axis: usize,
        sizes: Vec<usize>,
        outs: Vec<Buf>,
    },
    Concat {
        parts: Vec<Buf>,
        shapes: Vec<Vec<usize>>,
        axis: usize,
        out: Buf,
    },
    /// Operands flattened back to back, zero padding after.
    Flatten {
        parts: Vec<Buf>,
        out: Buf,
    },
    /// Broadcast arithmetic no row kernel takes (scalars, inner broadcasts).
    Broadcast {
        op: Arith,
        a: Buf,
        a_shape: Vec<usize>,
        b: Buf,
        b_shape: Vec<usize>,
        shape: Vec<usize>,
        out: Buf,
    },
    Scale {
        x: Buf,
        factor: f64,
        out: Buf,
    },
    SumTo {
        x: Buf,
        x_shape: Vec<usize>,
        shape: Vec<usize>,
        out: Buf,
    },
    Cast {
        x: Buf,
        out: Buf,
    },
    LrSchedule {
        step: Buf,
        peak: f64,
        warmup_steps: u64,
        total_steps: Option<u64>,
        out: Buf,
    },
    GradScale {
        sq: Buf,
        scale: Buf,
        max_norm: Option<f64>,
        micro_batches: u64,
        multiplier: Buf,
        finite: Buf,
    },
    LossScaleUpdate {
        scale: Buf,
        good: Buf,
        finite: Buf,
        interval: u64,
        growth: f64,
        backoff: f64,
        outs: [Buf; 2],
    },
}

impl<K> Instr<K> {
    /// The instruction's kind, as profiles and errors name it.
    pub fn name(&self) -> &'static str {
        match self {
            Instr::Input { .. } => "input",
            Instr::Fill { .. } => "fill",
            Instr::Arange { .. } => "arange",
            Instr::Copy { .. } => "copy",
            Instr::AllReduce { .. } => "all_reduce",
            Instr::ReduceScatter { .. } => "reduce_scatter",
            Instr::AllGather { .. } => "all_gather",
            Instr::TensorAllReduce { .. } => "tensor_all_reduce",
            Instr::SequenceAllGather { .. } => "sequence_all_gather",
            Instr::SequenceReduceScatter { .. } => "sequence_reduce_scatter",
            Instr::SequenceSlice { .. } => "sequence_slice",
            Instr::VocabShard { .. } => "vocab_shard",
            Instr::CrossEntropyStats { .. } => "cross_entropy_stats",
            Instr::CrossEntropyCombine { .. } => "cross_entropy_combine",
            Instr::CrossEntropyShardGrad { .. } => "cross_entropy_shard_grad",
            Instr::AlibiBias { .. } => "alibi_bias",
            Instr::FlashAttention { .. } => "flash_attention",
            Instr::FlashAttentionGrad { .. } => "flash_attention_grad",
            Instr::Kernel { .. } => "kernel",
            Instr::MatMul { .. } => "mat_mul",
            Instr::Embedding { .. } => "embedding",
            Instr::EmbeddingGrad { .. } => "embedding_grad",
            Instr::CrossEntropy { .. } => "cross_entropy",
            Instr::CrossEntropyGrad { .. } => "cross_entropy_grad",
            Instr::Mse { .. } => "mse",
            Instr::MseGrad { .. } => "mse_grad",
            Instr::Transpose { .. } => "transpose",
            Instr::Slice { .. } => "slice",
            Instr::SliceGrad { .. } => "slice_grad",
            Instr::Split { .. } => "split",
            Instr::Concat { .. } => "concat",
            Instr::Flatten { .. } => "flatten",
            Instr::Broadcast { .. } => "broadcast",
            Instr::Scale { .. } => "scale",
            Instr::SumTo { .. } => "sum_to",
            Instr::Cast { .. } => "cast",
            Instr::LrSchedule { .. } => "lr_schedule",
            Instr::GradScale { .. } => "grad_scale",
            Instr::LossScaleUpdate { .. } => "loss_scale_update",
        }
    }
}

/// The kind an instruction is counted under: its variant, and for a
/// generated kernel its name less the layer number (so `layer3.attn.softmax`
/// and `layer4.attn.softmax` add up), for a matmul its m×n×k.
impl<K: Named + Clone> Instruction for Instr<K> {
    fn kind(&self) -> String {
        match self {
            Instr::Kernel { kernel, .. } => format!("kernel {}", strip_layer(kernel.name())),
            Instr::MatMul { shape, .. } => format!(
                "matmul {}x{}x{}{}{} ×{}",
                shape.m,
                shape.n,
                shape.k,
                if shape.transpose_a { " Aᵀ" } else { "" },
                if shape.transpose_b { " Bᵀ" } else { "" },
                shape.batches.len()
            ),
            other => other.name().to_string(),
        }
    }

    fn flops(&self) -> f64 {
        match self {
            Instr::MatMul { shape, .. } => shape.flops(),
            Instr::Kernel { kernel, .. } => kernel.flops(),
            _ => 0.0,
        }
    }

    fn touches(&self) -> Vec<(Buf, bool)> {
        let mut touched = Vec::new();
        self.clone().for_each_buf(|b, access| touched.push((*b, access == Access::Write)));
        touched
    }
}

/// `layer12_attn_softmax` → `layer*_attn_softmax`: digits after `layer` dropped.
fn strip_layer(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find("layer") {
        out.push_str(&rest[..at + 5]);
        rest = &rest[at + 5..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            out.push('*');
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::strip_layer;

    #[test]
    fn layer_numbers_are_folded() {
        assert_eq!(strip_layer("zeroplan_kernel_layer11_attn_softmax"), "zeroplan_kernel_layer*_attn_softmax");
        assert_eq!(strip_layer("mlm_logits_back1"), "mlm_logits_back1");
        assert_eq!(strip_layer("layers"), "layers");
    }
}
