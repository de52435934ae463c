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
    /// `a + b`.
    Add,
    /// `a − b`.
    Sub,
    /// `a · b`.
    Mul,
}

/// One instruction and the buffers it reads and writes; `K` is the
/// device's compiled kernel .
#[derive(Clone)]
pub enum Instr<K> {
    /// Copies the fed tensor of input `name` in.
    Input {
        /// The input node's name, which the caller's feeds are keyed by.
        name: String,
        /// The shape the plan was compiled for; a fed tensor of another
        /// shape is refused.
        shape: Vec<usize>,
        /// Where the fed tensor is written, converted to the buffer's dtype.
        out: Buf,
    },
    /// Sets every element to one constant.
    Fill {
        /// The constant (truncated for an integer buffer).
        value: f64,
        /// The buffer filled.
        out: Buf,
    },
    /// `0, 1, …, n-1` (position ids).
    Arange {
        /// The integer buffer written; `n` is its length.
        out: Buf,
    },
    /// A view whose buffer is not its operand's (another place): a copy.
    /// Identical buffers need no instruction at all.
    Copy {
        /// The bytes read.
        from: Buf,
        /// Where they are written, of the same length and dtype.
        to: Buf,
    },
    /// The sum over the data-parallel ranks, through the communicator:
    /// every rank gets the sum.
    AllReduce {
        /// This rank's addend.
        x: Buf,
        /// Where the sum is written.
        out: Buf,
    },
    /// The sum over the data-parallel ranks of a rank-1 tensor, of which
    /// this rank keeps its `1/ranks` slice (a ZeRO gradient shard).
    ReduceScatter {
        /// This rank's whole addend.
        x: Buf,
        /// This rank's slice of the sum.
        out: Buf,
    },
    /// Every data-parallel rank's rank-1 tensor, concatenated in rank order
    /// (ZeRO's shards back into the whole).
    AllGather {
        /// This rank's part.
        x: Buf,
        /// Where every rank's parts are written, `ranks` times `x`'s length.
        out: Buf,
    },
    /// Megatron-LM's `g`: the sum over the tensor-parallel group, on the
    /// compute thread (the next node needs it).
    TensorAllReduce {
        /// This tensor rank's partial result.
        x: Buf,
        /// Where the sum is written.
        out: Buf,
    },
    /// Sequence parallelism: every tensor rank's `[outer, S/t, …]` slice,
    /// gathered into `[outer, S, …]`.
    SequenceAllGather {
        /// This tensor rank's slice of the sequence.
        x: Buf,
        /// The length of the axes before the sequence (the batch), over
        /// which the ranks' slices interleave.
        outer: usize,
        /// Where the whole sequence is written.
        out: Buf,
    },
    /// The sum over the tensor ranks of `[outer, S, …]`, of which this rank
    /// keeps its `[outer, S/t, …]` slice.
    SequenceReduceScatter {
        /// This tensor rank's partial whole-sequence tensor.
        x: Buf,
        /// The length of the axes before the sequence (the batch).
        outer: usize,
        /// This rank's slice of the sum.
        out: Buf,
    },
    /// This tensor rank's slice of `axis` (ids or floats).
    SequenceSlice {
        /// The whole tensor, which every tensor rank holds.
        x: Buf,
        /// `x`'s shape.
        shape: Vec<usize>,
        /// The axis cut into `ranks` equal blocks (the sequence).
        axis: usize,
        /// This tensor rank: which block it keeps.
        rank: usize,
        /// The tensor-parallel ranks, as many as blocks.
        ranks: usize,
        /// Where block `rank` is written.
        out: Buf,
    },
    /// Ids to this tensor rank's rows of a vocabulary-parallel table.
    VocabShard {
        /// The ids into the whole table.
        ids: Buf,
        /// This tensor rank, which holds rows `rank·rows …` of the table.
        rank: u64,
        /// The tensor-parallel ranks the table is split over.
        ranks: u64,
        /// The table's rows per rank.
        rows: u64,
        /// The local ids: an id's row in this rank's shard, −1 where
        /// another rank holds it.
        out: Buf,
    },
    /// A vocabulary-parallel cross-entropy's first step: this tensor rank's
    /// per-row statistics (maximum, `Σ exp(x − max)`, the label's logit
    /// where this rank holds the label) in its slot of `[ranks, N, 3]`, the
    /// other slots 0, for a tensor all-reduce to gather.
    CrossEntropyStats {
        /// This rank's `[N, C]` columns of the logits.
        logits: Buf,
        /// The `N` labels, as classes of the whole vocabulary.
        labels: Buf,
        /// `C`, the logits' columns on this rank.
        classes: usize,
        /// This tensor rank, which holds classes `rank·C …`.
        rank: u64,
        /// The tensor-parallel ranks: the statistics' slots.
        ranks: u64,
        /// The real classes of the whole vocabulary: columns at or past it
        /// are padding and count for nothing.
        vocab: u64,
        /// Where the `[ranks, N, 3]` statistics are written.
        out: Buf,
    },
    /// The mean loss of a vocabulary-parallel cross-entropy, from every
    /// rank's gathered statistics.
    CrossEntropyCombine {
        /// The `[ranks, N, 3]` statistics, every rank's slot filled.
        stats: Buf,
        /// The `N` labels, checked against the whole vocabulary.
        labels: Buf,
        /// The whole (padded) vocabulary: ranks × the logits' columns.
        vocab: usize,
        /// The label of rows left out of the mean (padding tokens).
        ignore_index: i64,
        /// The f32 scalar loss.
        out: Buf,
    },
    /// The gradient of a vocabulary-parallel cross-entropy on this rank's
    /// columns, `dloss·(softmax − onehot)/count`, the softmax normalised
    /// by the gathered statistics.
    CrossEntropyShardGrad {
        /// This rank's `[N, C]` columns of the logits.
        logits: Buf,
        /// The `N` labels, as classes of the whole vocabulary.
        labels: Buf,
        /// The gathered `[ranks, N, 3]` statistics.
        stats: Buf,
        /// The scalar gradient of the loss.
        dloss: Buf,
        /// `C`, the logits' columns on this rank.
        classes: usize,
        /// This tensor rank, which holds classes `rank·C …`.
        rank: u64,
        /// The real classes of the whole vocabulary; padding columns get 0.
        vocab: u64,
        /// The label of rows that get no gradient.
        ignore_index: i64,
        /// Where the `[N, C]` gradient of the logits is written.
        out: Buf,
    },
    /// ALiBi on a tensor rank's heads (a row kernel knows only all heads').
    AlibiBias {
        /// The attention scores.
        x: Buf,
        /// `[B, H, Sq, Sk]` of the scores, `H` this rank's heads.
        shape: [usize; 4],
        /// ALiBi's slope of each of this rank's heads.
        slopes: Vec<f32>,
        /// Where the biased scores are written.
        out: Buf,
    },
    /// Fused attention: `(q, k, v, mask) -> (out, lse)` ([`Attention`]).
    FlashAttention {
        /// The shapes, scale, ALiBi slopes and dropout it is specialised on.
        attention: Box<Attention>,
        /// `q`, `k`, `v` and the `[B, S]` integer padding mask.
        inputs: [Buf; 4],
        /// The attention's output and the f32 log-sum-exp of each score row,
        /// which the backward recomputes the probabilities from.
        outputs: [Buf; 2],
    },
    /// Its adjoint: `(q, k, v, mask, out, lse, dout) -> (dq, dk, dv)`.
    FlashAttentionGrad {
        /// The forward's specialisation, which the adjoint shares.
        attention: Box<Attention>,
        /// The forward's inputs and outputs, then the output's gradient.
        inputs: [Buf; 7],
        /// The gradients of `q`, `k` and `v`.
        outputs: [Buf; 3],
    },
    /// A row kernel compiled by the device: a fused kernel, or a lone node
    /// lowered to one.
    Kernel {
        /// The device's compiled kernel.
        kernel: K,
        /// The kernel's inputs, in its operand order.
        inputs: Vec<Buf>,
        /// The kernel's outputs, in order; one may be an input updated in place.
        outputs: Vec<Buf>,
    },
    /// `a @ b`, batched: a GEMM per output batch.
    MatMul {
        /// The GEMM's dimensions, transposes and batch operand indices.
        shape: MatMulShape,
        /// The left operand.
        a: Buf,
        /// The right operand.
        b: Buf,
        /// Where the product is written.
        out: Buf,
    },
    /// Row gather: `out[i] = table[ids[i]]` (zeros for an id of −1).
    Embedding {
        /// The `[V, E]` table.
        table: Buf,
        /// The integer row ids.
        ids: Buf,
        /// `E`, the elements of one row.
        width: usize,
        /// Where the gathered rows are written, one per id.
        out: Buf,
    },
    /// The embedding's adjoint: `dy`'s rows scatter-added into the table
    /// rows the ids name.
    EmbeddingGrad {
        /// The gradient of the gathered rows.
        dy: Buf,
        /// The ids the forward gathered.
        ids: Buf,
        /// `E`, the elements of one row.
        width: usize,
        /// Where the table's gradient is written (zero on rows no id names).
        out: Buf,
    },
    /// Mean negative log-likelihood over the rows whose label is not
    /// `ignore_index`.
    CrossEntropy {
        /// The `[N, C]` logits.
        logits: Buf,
        /// The `N` integer labels.
        labels: Buf,
        /// `C`, the classes.
        classes: usize,
        /// The label of rows left out of the mean (padding tokens).
        ignore_index: i64,
        /// The f32 scalar loss.
        out: Buf,
    },
    /// Its gradient: `dloss · (softmax(logits) − onehot(label)) / count` on
    /// counted rows.
    CrossEntropyGrad {
        /// The `[N, C]` logits.
        logits: Buf,
        /// The `N` integer labels.
        labels: Buf,
        /// The scalar gradient of the loss.
        dloss: Buf,
        /// `C`, the classes.
        classes: usize,
        /// The label of rows that get no gradient.
        ignore_index: i64,
        /// Where the gradient of the logits is written.
        out: Buf,
    },
    /// Mean squared error.
    Mse {
        /// The predictions.
        p: Buf,
        /// The targets.
        t: Buf,
        /// The f32 scalar loss.
        out: Buf,
    },
    /// Its gradient: `dloss · 2(p − t)/N`.
    MseGrad {
        /// The predictions.
        p: Buf,
        /// The targets.
        t: Buf,
        /// The scalar gradient of the loss.
        dloss: Buf,
        /// Where the gradient of the predictions is written.
        out: Buf,
    },
    /// Permutes the axes.
    Transpose {
        /// The tensor read.
        x: Buf,
        /// `x`'s shape.
        shape: Vec<usize>,
        /// Output axis `d` takes input axis `perm[d]`.
        perm: Vec<usize>,
        /// Where the permuted tensor is written.
        out: Buf,
    },
    /// The `len` elements of `axis` starting at `start`, copied out (a
    /// slice of the first axis is a view of its operand's buffer instead).
    Slice {
        /// The tensor sliced.
        x: Buf,
        /// `x`'s shape.
        shape: Vec<usize>,
        /// The axis cut.
        axis: usize,
        /// The first index kept along `axis`.
        start: usize,
        /// How many indices are kept.
        len: usize,
        /// Where the slice is written.
        out: Buf,
    },
    /// The adjoint of a slice: `dy` placed at `[start, start + len)` of
    /// the axis, zeros elsewhere.
    SliceGrad {
        /// The gradient of the slice.
        dy: Buf,
        /// `dy`'s shape.
        shape: Vec<usize>,
        /// The axis the forward cut.
        axis: usize,
        /// Where along `axis` the slice began.
        start: usize,
        /// The axis's whole length, in the output.
        axis_len: usize,
        /// Where the gradient of the sliced tensor is written.
        out: Buf,
    },
    /// Cuts `axis` into pieces of the given sizes, one output per piece.
    Split {
        /// The tensor cut.
        x: Buf,
        /// `x`'s shape.
        shape: Vec<usize>,
        /// The axis cut.
        axis: usize,
        /// Each piece's length along `axis`, in order.
        sizes: Vec<usize>,
        /// Where the pieces are written, one buffer per size.
        outs: Vec<Buf>,
    },
    /// Joins the parts along `axis`, in order.
    Concat {
        /// The tensors joined.
        parts: Vec<Buf>,
        /// Each part's shape, which differ only along `axis`.
        shapes: Vec<Vec<usize>>,
        /// The axis they are joined along.
        axis: usize,
        /// Where the joined tensor is written.
        out: Buf,
    },
    /// Operands flattened back to back, zero padding after.
    Flatten {
        /// The tensors flattened, in order.
        parts: Vec<Buf>,
        /// The rank-1 bucket they are written into, its tail zeroed.
        out: Buf,
    },
    /// Broadcast arithmetic no row kernel takes (scalars, inner broadcasts).
    Broadcast {
        /// The op applied to each pair of elements.
        op: Arith,
        /// The left operand.
        a: Buf,
        /// `a`'s shape, broadcast to `shape` as in NumPy.
        a_shape: Vec<usize>,
        /// The right operand.
        b: Buf,
        /// `b`'s shape, broadcast to `shape` as in NumPy.
        b_shape: Vec<usize>,
        /// The output's shape.
        shape: Vec<usize>,
        /// Where the result is written.
        out: Buf,
    },
    /// Multiplication by a constant that no row kernel took.
    Scale {
        /// The tensor scaled.
        x: Buf,
        /// The constant it is multiplied by.
        factor: f64,
        /// Where the result is written.
        out: Buf,
    },
    /// Sums broadcast axes away, down to `shape`: the adjoint of NumPy
    /// broadcasting, where no row kernel takes the axes summed.
    SumTo {
        /// The tensor summed.
        x: Buf,
        /// `x`'s shape.
        x_shape: Vec<usize>,
        /// The shape it is summed down to.
        shape: Vec<usize>,
        /// Where the sums are written.
        out: Buf,
    },
    /// Converts between the buffers' dtypes (a non-finite float to an
    /// integer is an error).
    Cast {
        /// The values read, in their dtype.
        x: Buf,
        /// Where they are written, in its dtype.
        out: Buf,
    },
    /// The learning rate after the completed steps: linear warm-up, then
    /// linear decay (Hugging Face's `get_linear_schedule_with_warmup`).
    LrSchedule {
        /// The scalar count of completed optimizer steps.
        step: Buf,
        /// The learning rate at the end of the warm-up.
        peak: f64,
        /// The steps of the linear warm-up from 0.
        warmup_steps: u64,
        /// The step at which the rate has decayed to 0; `None`: constant
        /// after the warm-up.
        total_steps: Option<u64>,
        /// The scalar learning rate.
        out: Buf,
    },
    /// The multiplier that turns the summed, loss-scaled gradients into
    /// their clipped mean, and whether their norm is finite.
    GradScale {
        /// The scalar squared norm of all gradients.
        sq: Buf,
        /// The scalar loss scale the gradients carry.
        scale: Buf,
        /// The global norm the mean gradient is clipped to, if any.
        max_norm: Option<f64>,
        /// The micro-batches the gradients were summed over.
        micro_batches: u64,
        /// Where the scalar multiplier is written (0 when not finite).
        multiplier: Buf,
        /// Where 1 is written when the norm is finite, else 0 (the step is
        /// skipped).
        finite: Buf,
    },
    /// Dynamic loss scaling: the scale backs off on overflow and grows
    /// after `interval` finite steps in a row.
    LossScaleUpdate {
        /// The scalar loss scale.
        scale: Buf,
        /// The scalar count of finite steps in a row.
        good: Buf,
        /// This step's finite flag, from [`Instr::GradScale`].
        finite: Buf,
        /// The finite steps in a row after which the scale grows.
        interval: u64,
        /// The factor the scale grows by.
        growth: f64,
        /// The factor the scale shrinks by on overflow.
        backoff: f64,
        /// Where the new scale and the new count are written.
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
