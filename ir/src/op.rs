//! The operations of the graph IR.
//!
//! Each op has a fixed number of operands and outputs; [`crate::infer`] holds
//! the typing rule of each. The variants' doc comments state their semantics;
//! `docs/ir.md` gathers them with the naming and layout conventions.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

use crate::dtype::DType;
use crate::shape::Shape;

/// How a parameter is initialised when no checkpoint supplies it.
///
/// The parts of a flat buffer, a shard or a tile are shared (`Arc`): every
/// pass that rebuilds a step copies every parameter's op, and a tiled step
/// has tens of thousands of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Init {
    /// Truncation-free normal with mean 0 (BERT's `initializer_range`).
    Normal {
        std: f64,
    },
    Zeros,
    Ones,
    /// Every element `value` (the fp16 loss scale's starting value).
    Constant {
        value: f64,
    },
    /// A ZeRO flat buffer: `members` back to back, each initialised as a
    /// parameter of its name would be (so a flat buffer starts bitwise where
    /// the separate parameters would), zero padding after the last; with
    /// `shards > 1`, this rank's `1/shards` of it.
    Flat {
        members: Arc<[FlatMember]>,
        shards: u64,
    },
    /// A tensor-parallel shard: tensor rank `r`'s `1/ranks` along `axis` of
    /// a whole tensor of shape `whole` initialised as `init` (under this
    /// parameter's name), so that `ranks` shards start bitwise where the
    /// unsharded parameter would.
    TensorShard {
        whole: Arc<[u64]>,
        axis: usize,
        ranks: u64,
        init: Arc<Init>,
    },
    /// A tile: the `len` rows from `start` (axis 0) of a whole tensor of
    /// shape `whole` named `of`, initialised as that tensor would be (under
    /// its name), so the tiles of a split parameter start bitwise where the
    /// unsplit parameter would (memory-centric tiling, `passes::tiling`).
    Slice {
        of: Arc<str>,
        whole: Arc<[u64]>,
        start: u64,
        len: u64,
        init: Arc<Init>,
    },
}

/// One parameter inside a flat buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlatMember {
    /// The parameter's name (`layer0.attn.q.weight`): checkpoints and init use it.
    pub name: String,
    pub shape: Vec<u64>,
    /// First element in the flat buffer.
    pub offset: u64,
    pub init: Box<Init>,
}

impl FlatMember {
    pub fn len(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Init {
    /// Calls `f` on this initialiser and every one nested in it (a flat
    /// buffer's members', a shard's or a tile's whole), parents first.
    pub fn visit<'i>(&'i self, f: &mut impl FnMut(&'i Init)) {
        f(self);
        match self {
            Init::Flat { members, .. } => members.iter().for_each(|m| m.init.visit(f)),
            Init::TensorShard { init, .. } | Init::Slice { init, .. } => init.visit(f),
            Init::Zeros | Init::Ones | Init::Constant { .. } | Init::Normal { .. } => {}
        }
    }

    /// The tensor-parallel ranks a parameter of this init is split over:
    /// `Some(t)` for a tensor shard (or a flat buffer of them), `None` for
    /// a tensor every tensor rank holds whole and computes identically.
    pub fn tensor_shard_ranks(&self) -> Option<u64> {
        match self {
            Init::TensorShard { ranks, .. } => Some(*ranks),
            Init::Flat { members, .. } => members.first().and_then(|m| m.init.tensor_shard_ranks()),
            Init::Slice { init, .. } => init.tensor_shard_ranks(),
            _ => None,
        }
    }
}

impl fmt::Display for Init {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Init::Normal { std } => write!(f, "normal(std={std})"),
            Init::Zeros => f.write_str("zeros"),
            Init::Ones => f.write_str("ones"),
            Init::Constant { value } => write!(f, "constant({value})"),
            Init::Flat { members, shards } => {
                let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
                write!(f, "flat([{}], shards={shards})", names.join(", "))
            }
            Init::TensorShard { axis, ranks, init, .. } => {
                write!(f, "tensor_shard({init}, axis={axis}, ranks={ranks})")
            }
            Init::Slice { of, start, len, init, .. } => write!(f, "slice({of}[{start}..{}], {init})", start + len),
        }
    }
}

/// The two GELU forms in use: exact (`erf`, BERT's `gelu`) and the tanh
/// approximation (`gelu_new`, `gelu_pytorch_tanh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GeluApproximation {
    Erf,
    Tanh,
}

/// One operation. Attributes are the op's compile-time constants; operand and
/// result types live on the graph's nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    // ── Sources (no operands; the node's declared type is its type) ──
    /// A tensor fed by the caller each step: token ids, masks, labels.
    Input,
    /// A trainable parameter.
    Param {
        init: Init,
    },
    /// `0, 1, …, n-1` along a rank-1 integer output (position ids).
    Arange,
    /// A persistent tensor that is not trained: optimizer moments, gradient
    /// accumulators, the step count, the loss scale. Updated through the
    /// graph's state updates.
    State {
        init: Init,
    },
    /// A tensor of one constant value.
    Fill {
        value: f64,
    },

    // ── Dense ──
    /// Row gather: `(table[V, E], ids[...]) -> [..., E]`.
    Embedding,
    /// `a @ b` over the last two axes, leading axes broadcast; either side may
    /// be transposed in its last two axes.
    MatMul {
        transpose_a: bool,
        transpose_b: bool,
    },

    // ── Elementwise (operands broadcast as in NumPy) ──
    Add,
    Sub,
    Mul,
    /// Multiplication by a constant, e.g. attention's `1/sqrt(d_head)`.
    Scale {
        factor: f64,
    },
    Gelu {
        approximation: GeluApproximation,
    },
    Silu,
    Relu,
    Tanh,
    Cast {
        to: DType,
    },

    // ── Rows (over the last axis) ──
    /// `(x, gamma, beta)`: normalise each row of `x`, then scale and shift.
    LayerNorm {
        eps: f64,
    },
    Softmax,
    /// Zero each element with probability `p`, scale survivors by `1/(1-p)`.
    /// `stream` names this site's random stream, so a recomputed forward and
    /// every backend draw the identical mask. Under tensor parallelism a
    /// sharded site's stream carries a mark and, once loaded, its tensor
    /// rank ([`crate::dropout_stream`]).
    Dropout {
        p: f64,
        stream: u32,
    },

    // ── Attention ──
    /// `(scores[B, H, Sq, Sk], mask[B, Sk])`: scores of keys whose mask is 0
    /// become -inf (the padding mask).
    AttentionMask,
    /// `scores[B, H, Sq, Sk] + m_h · -|i - j|` with ALiBi's geometric head
    /// slopes `m_h` (symmetric distance, for bidirectional encoders). Under
    /// tensor parallelism over `ranks`, the `H` heads are tensor rank `r`'s
    /// heads `r·H … (r+1)·H − 1` of `ranks·H`, and take those heads' slopes.
    AlibiBias {
        ranks: u64,
    },
    /// Fused (FlashAttention-style) attention: `(q[B, H, S, D], k[B, H, S,
    /// D], v[B, H, S, D], mask[B, S] int) -> (out[B, H, S, D], lse[B, H, S]
    /// f32)`. With the scores `s = scale·q·kᵀ`, minus ALiBi's `m_h·|i − j|`
    /// when `alibi_ranks` is `Some(t)` (this tensor rank's heads of `t·H`, as
    /// [`Op::AlibiBias`]), and −∞ where `mask[b, j] == 0`:
    /// `P = softmax(s)`, `out = dropout(P)·v` and `lse = log Σ_j exp(s_ij)`
    /// (f32 whatever `q`'s dtype). It is exactly the unfused chain
    /// `matmul(q, kᵀ) → scale → (alibi_bias) → attention_mask → softmax →
    /// (dropout) → matmul(·, v)`, which the `attention` pass replaces by it,
    /// without storing the `[B, H, S, S]` probabilities: the backward
    /// recomputes them from `lse`.
    ///
    /// Dropout (`dropout > 0`) draws on `P` exactly the mask
    /// [`Op::Dropout`]`{p: dropout, stream}` draws on the `[B, H, S, S]`
    /// probabilities: element `((b·H + h)·S + i)·S + j`, same seed, stream
    /// and offset; `dropout == 0` draws nothing.
    ///
    /// A query row whose every key is masked gives `out = 0` — what the
    /// unfused chain computes, since the interpreter's softmax of an all −∞
    /// row is all zeros — and `lse = −∞` (the log of an empty sum); its
    /// gradients are 0. A kernel recomputing `exp(s − lse)` must treat that
    /// row as `P = 0` rather than evaluate `−∞ − (−∞)`.
    FlashAttention {
        scale: f64,
        alibi_ranks: Option<u64>,
        dropout: f64,
        stream: u32,
    },

    // ── Layout ──
    Reshape {
        shape: Shape,
    },
    Transpose {
        perm: Vec<usize>,
    },
    /// Cuts `axis` into pieces of the given sizes: one output per piece.
    Split {
        axis: usize,
        sizes: Vec<u64>,
    },
    /// The `len` elements of `axis` starting at `start`.
    Slice {
        axis: usize,
        start: u64,
        len: u64,
    },
    Concat {
        axis: usize,
    },

    // ── Losses (f32 scalars) ──
    /// `(logits[N, C], labels[N])`: mean negative log-likelihood over the rows
    /// whose label is not `ignore_index`.
    CrossEntropy {
        ignore_index: i64,
    },
    /// `(prediction[N], target[N])`: mean squared error.
    Mse,

    // ── Backward (written by the autodiff pass) ──
    /// Sums the broadcast axes of the operand away, down to `shape`: the
    /// adjoint of NumPy broadcasting.
    SumTo {
        shape: Shape,
    },
    /// `(x, dy) -> dy · gelu'(x)`.
    GeluGrad {
        approximation: GeluApproximation,
    },
    /// `(x, dy) -> dy · silu'(x)`.
    SiluGrad,
    /// `(x, dy) -> dy · [x > 0]`.
    ReluGrad,
    /// `(y, dy) -> dy · (1 - y²)`, from the forward output `y = tanh(x)`.
    TanhGrad,
    /// `(x, gamma, dy) -> (dx, dgamma, dbeta)`, recomputing the row
    /// statistics from `x`.
    LayerNormGrad {
        eps: f64,
    },
    /// `(y, dy) -> y · (dy - Σ dy·y)` per row, from the forward output `y`.
    SoftmaxGrad,
    /// `(dy, mask)`: `dy` with the masked keys' entries zeroed.
    AttentionMaskGrad,
    /// `(q, k, v, mask, out, lse, dout) -> (dq, dk, dv)`: the adjoint of
    /// [`Op::FlashAttention`] with the same attributes, from its outputs
    /// (`lse` gives back the probabilities without storing them; `out`
    /// gives `D_i = Σ_d dout·out`, FlashAttention-2's row term). The
    /// dropout mask is redrawn, not stored.
    FlashAttentionGrad {
        scale: f64,
        alibi_ranks: Option<u64>,
        dropout: f64,
        stream: u32,
    },
    /// `dy` placed at `[start, start+len)` of an axis of length `axis_len`,
    /// zeros elsewhere: the adjoint of `slice`.
    SliceGrad {
        axis: usize,
        start: u64,
        axis_len: crate::shape::Dim,
    },
    /// `(dy[..., E], ids[...]) -> [rows, E]`: scatter-add of `dy`'s rows into
    /// the table rows the ids name.
    EmbeddingGrad {
        rows: u64,
    },
    /// `(logits[N, C], labels[N], dloss[]) -> dlogits`:
    /// `dloss · (softmax(logits) - onehot(label)) / count` on counted rows.
    CrossEntropyGrad {
        ignore_index: i64,
    },
    /// `(prediction[N], target[N], dloss[]) -> dloss · 2(prediction - target)/N`.
    MseGrad,

    // ── Optimizer (f32 scalars steer it) ──
    /// `Σ x²` in f32: the squared norm of one gradient.
    SquaredSum,
    /// `(completed_steps[]) -> lr[]`: linear warm-up from 0 over
    /// `warmup_steps`, then linear decay to 0 at `total_steps` (constant when
    /// `None`) — Hugging Face's `get_linear_schedule_with_warmup`.
    LrSchedule {
        peak: f64,
        warmup_steps: u64,
        total_steps: Option<u64>,
    },
    /// `(squared_norm[], loss_scale[]) -> (multiplier[], finite[])`: the raw
    /// gradients are summed over `micro_batches` and scaled by the loss
    /// scale; `multiplier` turns them into the mean gradient, clipped to
    /// global norm `max_norm`. `finite` is 1 when the norm is finite, else 0
    /// (and `multiplier` is 0).
    GradScale {
        max_norm: Option<f64>,
        micro_batches: u64,
    },
    /// `(param, grad, m, v, lr[], step[], multiplier[], finite[]) ->
    /// (param, m, v)`: one AdamW step (decoupled weight decay, bias
    /// correction at `step`, the 1-based count including this step) on
    /// `grad · multiplier`; the identity where `finite` is 0.
    AdamW {
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
    /// `(scale[], good_steps[], finite[]) -> (scale, good_steps)`: dynamic loss
    /// scaling. On overflow the scale is multiplied by `backoff` and the count
    /// reset; after `growth_interval` finite steps in a row it is multiplied by
    /// `growth`.
    LossScaleUpdate {
        growth_interval: u64,
        growth: f64,
        backoff: f64,
    },

    // ── Data parallel (written by the partition pass) ──
    /// Flattens each operand and concatenates them into one rank-1 tensor of
    /// `len` elements, zero-padded at the end: a gradient bucket.
    Flatten {
        len: u64,
    },
    /// Sum over the `ranks` data-parallel ranks; every rank gets the sum.
    AllReduce {
        ranks: u64,
    },
    /// Sum over the ranks of a rank-1 tensor; each rank keeps its `1/ranks`.
    ReduceScatter {
        ranks: u64,
    },
    /// Every rank's rank-1 tensor, concatenated in rank order.
    AllGather {
        ranks: u64,
    },
    /// Moves its operand to the memory of the node's [`crate::Place`]
    /// (host ↔ device over PCIe).
    Copy,

    // ── Tensor parallel (Megatron-LM; written by the graph builder) ──
    /// Megatron's `f`: the identity in the forward, where a replicated
    /// activation enters a column-parallel region; its adjoint sums the
    /// gradient over the `ranks` tensor-parallel ranks.
    TensorCopy {
        ranks: u64,
    },
    /// Megatron's `g`: the sum over the `ranks` tensor-parallel ranks (of a
    /// row-parallel projection's partial products, say); every rank gets the
    /// sum, and the adjoint is the identity.
    TensorAllReduce {
        ranks: u64,
    },
    /// `[B, S, …] -> [B, S/ranks, …]` (along `axis`): this tensor rank's
    /// consecutive `1/ranks` of the sequence, rank `r` holding positions
    /// `r·S/ranks …`. Sequence parallelism (Korthikanti et al., 2022) cuts
    /// the token ids and position ids with it where a replicated region
    /// becomes a sequence-parallel one; its adjoint is the gather of the
    /// slices ([`Op::SequenceAllGather`] with `partial_grad: false`).
    SequenceSlice {
        ranks: u64,
        axis: usize,
    },
    /// `[B, S/ranks, …] -> [B, S, …]`: every tensor rank's slice of the
    /// sequence (axis 1), concatenated in rank order: sequence parallelism's
    /// `f`, where a sequence-parallel region enters a column-parallel one.
    /// The adjoint depends on what reads the whole sequence: a
    /// tensor-parallel region gives each rank a partial gradient, which
    /// [`Op::SequenceReduceScatter`] sums (`partial_grad`); replicated
    /// consumers give every rank the same gradient, of which each keeps its
    /// slice ([`Op::SequenceSlice`]).
    SequenceAllGather {
        ranks: u64,
        partial_grad: bool,
    },
    /// `[B, S, …] -> [B, S/ranks, …]`: the sum over the tensor ranks, of
    /// which each keeps its slice of the sequence (axis 1): sequence
    /// parallelism's `g` after a row-parallel projection, the same volume
    /// as the all-reduce it replaces. Its adjoint is
    /// [`Op::SequenceAllGather`] (`partial_grad: true`).
    SequenceReduceScatter {
        ranks: u64,
    },
    /// `ids -> local ids` of a vocabulary-parallel table: tensor rank `r`
    /// holds rows `r·rows … (r+1)·rows − 1` of the whole table; an id there
    /// becomes its row in the shard, any other id −1, which an `embedding`
    /// reads as a zero row (and its gradient skips).
    VocabShard {
        ranks: u64,
        rows: u64,
    },
    /// `(logits[N, C], labels[N]) -> [ranks, N, 3]`: this tensor rank's
    /// share of a vocabulary-parallel cross-entropy. Its `C` columns are
    /// classes `r·C …` of which those below `vocab` are real (the rest pad
    /// the vocabulary to a multiple of `ranks`). Slot `r` holds per row the
    /// local maximum, `Σ exp(x − max)` and the label's logit where this rank
    /// holds the label (else 0); the other slots are 0, so the tensor
    /// all-reduce of the result gathers every rank's statistics.
    CrossEntropyStats {
        ranks: u64,
        vocab: u64,
    },
    /// `(stats[ranks, N, 3], labels[N], logits[N, C]) -> []`: the mean
    /// negative log-likelihood of the gathered statistics over the rows
    /// whose label is not `ignore_index`. The logits are not read: they are
    /// an operand so that the adjoint can reach them
    /// ([`Op::CrossEntropyShardGrad`]); the statistics get no gradient.
    CrossEntropyCombine {
        ignore_index: i64,
    },
    /// `(logits[N, C], labels[N], stats[ranks, N, 3], dloss[]) -> dlogits`:
    /// `dloss · (softmax(logits) − onehot(label)) / count` on this rank's
    /// columns, the softmax normalised by the gathered statistics.
    CrossEntropyShardGrad {
        ignore_index: i64,
        ranks: u64,
        vocab: u64,
    },

    // ── Fused (written by the fuse pass) ──
    /// One fused row kernel ([`crate::kernel`]): operands are the kernel's
    /// inputs, outputs its outputs. The text form shows its name; the body is
    /// printed by [`crate::kernel::Kernel::to_text`].
    Fused {
        kernel: Box<crate::kernel::Kernel>,
    },
}

/// How many operands an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exactly(usize),
    AtLeast(usize),
}

impl Arity {
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exactly(k) => n == k,
            Arity::AtLeast(k) => n >= k,
        }
    }
}

impl fmt::Display for Arity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arity::Exactly(k) => write!(f, "{k}"),
            Arity::AtLeast(k) => write!(f, "at least {k}"),
        }
    }
}

impl Op {
    /// The op's name in the text form.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "input",
            Op::Param { .. } => "param",
            Op::Arange => "arange",
            Op::Embedding => "embedding",
            Op::MatMul { .. } => "matmul",
            Op::Add => "add",
            Op::Sub => "sub",
            Op::Mul => "mul",
            Op::Scale { .. } => "scale",
            Op::Gelu { .. } => "gelu",
            Op::Silu => "silu",
            Op::Relu => "relu",
            Op::Tanh => "tanh",
            Op::Cast { .. } => "cast",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Softmax => "softmax",
            Op::Dropout { .. } => "dropout",
            Op::AttentionMask => "attention_mask",
            Op::AlibiBias { .. } => "alibi_bias",
            Op::FlashAttention { .. } => "flash_attention",
            Op::FlashAttentionGrad { .. } => "flash_attention_grad",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Split { .. } => "split",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::Mse => "mse",
            Op::State { .. } => "state",
            Op::Fill { .. } => "fill",
            Op::SumTo { .. } => "sum_to",
            Op::GeluGrad { .. } => "gelu_grad",
            Op::SiluGrad => "silu_grad",
            Op::ReluGrad => "relu_grad",
            Op::TanhGrad => "tanh_grad",
            Op::LayerNormGrad { .. } => "layer_norm_grad",
            Op::SoftmaxGrad => "softmax_grad",
            Op::AttentionMaskGrad => "attention_mask_grad",
            Op::SliceGrad { .. } => "slice_grad",
            Op::EmbeddingGrad { .. } => "embedding_grad",
            Op::CrossEntropyGrad { .. } => "cross_entropy_grad",
            Op::MseGrad => "mse_grad",
            Op::SquaredSum => "squared_sum",
            Op::LrSchedule { .. } => "lr_schedule",
            Op::GradScale { .. } => "grad_scale",
            Op::AdamW { .. } => "adamw",
            Op::LossScaleUpdate { .. } => "loss_scale_update",
            Op::Flatten { .. } => "flatten",
            Op::AllReduce { .. } => "all_reduce",
            Op::ReduceScatter { .. } => "reduce_scatter",
            Op::AllGather { .. } => "all_gather",
            Op::Copy => "copy",
            Op::TensorCopy { .. } => "tensor_copy",
            Op::TensorAllReduce { .. } => "tensor_all_reduce",
            Op::SequenceSlice { .. } => "sequence_slice",
            Op::SequenceAllGather { .. } => "sequence_all_gather",
            Op::SequenceReduceScatter { .. } => "sequence_reduce_scatter",
            Op::VocabShard { .. } => "vocab_shard",
            Op::CrossEntropyStats { .. } => "cross_entropy_stats",
            Op::CrossEntropyCombine { .. } => "cross_entropy_combine",
            Op::CrossEntropyShardGrad { .. } => "cross_entropy_shard_grad",
            Op::Fused { .. } => "fused",
        }
    }

    pub fn arity(&self) -> Arity {
        use Arity::*;
        match self {
            Op::Input | Op::Param { .. } | Op::Arange | Op::State { .. } | Op::Fill { .. } => Exactly(0),
            Op::Scale { .. }
            | Op::Gelu { .. }
            | Op::Silu
            | Op::Relu
            | Op::Tanh
            | Op::Cast { .. }
            | Op::Softmax
            | Op::Dropout { .. }
            | Op::AlibiBias { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Split { .. }
            | Op::Slice { .. }
            | Op::SumTo { .. }
            | Op::SliceGrad { .. }
            | Op::SquaredSum
            | Op::LrSchedule { .. }
            | Op::AllReduce { .. }
            | Op::ReduceScatter { .. }
            | Op::AllGather { .. }
            | Op::Copy
            | Op::TensorCopy { .. }
            | Op::TensorAllReduce { .. }
            | Op::SequenceSlice { .. }
            | Op::SequenceAllGather { .. }
            | Op::SequenceReduceScatter { .. }
            | Op::VocabShard { .. } => Exactly(1),
            Op::Embedding
            | Op::MatMul { .. }
            | Op::Add
            | Op::Sub
            | Op::Mul
            | Op::AttentionMask
            | Op::CrossEntropy { .. }
            | Op::Mse
            | Op::GeluGrad { .. }
            | Op::SiluGrad
            | Op::ReluGrad
            | Op::TanhGrad
            | Op::SoftmaxGrad
            | Op::AttentionMaskGrad
            | Op::EmbeddingGrad { .. }
            | Op::GradScale { .. }
            | Op::CrossEntropyStats { .. } => Exactly(2),
            Op::LayerNorm { .. }
            | Op::LayerNormGrad { .. }
            | Op::CrossEntropyGrad { .. }
            | Op::MseGrad
            | Op::LossScaleUpdate { .. }
            | Op::CrossEntropyCombine { .. } => Exactly(3),
            Op::CrossEntropyShardGrad { .. } | Op::FlashAttention { .. } => Exactly(4),
            Op::FlashAttentionGrad { .. } => Exactly(7),
            Op::AdamW { .. } => Exactly(8),
            Op::Concat { .. } | Op::Flatten { .. } => AtLeast(1),
            Op::Fused { kernel } => Exactly(kernel.inputs.len()),
        }
    }

    /// Collectives: the ops that communicate between ranks (the
    /// data-parallel group's and the tensor-parallel group's).
    pub fn is_collective(&self) -> bool {
        matches!(
            self,
            Op::AllReduce { .. }
                | Op::ReduceScatter { .. }
                | Op::AllGather { .. }
                | Op::TensorAllReduce { .. }
                | Op::SequenceAllGather { .. }
                | Op::SequenceReduceScatter { .. }
        )
    }

    /// Collectives of the tensor-parallel group (inside a node, over
    /// NVLink); the others are the data-parallel group's.
    pub fn is_tensor_collective(&self) -> bool {
        matches!(self, Op::TensorAllReduce { .. } | Op::SequenceAllGather { .. } | Op::SequenceReduceScatter { .. })
    }

    /// The tensor-parallel ranks an op of a tensor-parallel graph spans;
    /// `None` for ops that do not depend on the tensor rank.
    pub fn tensor_ranks(&self) -> Option<u64> {
        match *self {
            Op::TensorCopy { ranks }
            | Op::TensorAllReduce { ranks }
            | Op::SequenceSlice { ranks, .. }
            | Op::SequenceAllGather { ranks, .. }
            | Op::SequenceReduceScatter { ranks }
            | Op::VocabShard { ranks, .. }
            | Op::CrossEntropyStats { ranks, .. }
            | Op::CrossEntropyShardGrad { ranks, .. } => Some(ranks),
            Op::AlibiBias { ranks } if ranks > 1 => Some(ranks),
            Op::FlashAttention { alibi_ranks: Some(ranks), .. }
            | Op::FlashAttentionGrad { alibi_ranks: Some(ranks), .. }
                if ranks > 1 =>
            {
                Some(ranks)
            }
            _ => None,
        }
    }

    /// Ops whose result is a view of their first operand's buffer: no copy,
    /// no new memory (contiguous reshapes, leading-axis slices).
    pub fn is_view(&self) -> bool {
        matches!(self, Op::Reshape { .. } | Op::Slice { axis: 0, .. } | Op::TensorCopy { .. })
    }

    /// Ops with no operands, whose type is declared rather than inferred.
    pub fn is_source(&self) -> bool {
        matches!(self, Op::Input | Op::Param { .. } | Op::Arange | Op::State { .. } | Op::Fill { .. })
    }

    /// The op's attributes as `key=value` pairs, in a fixed order, for the text form.
    pub fn attributes(&self) -> Vec<(&'static str, String)> {
        fn list<T: fmt::Display>(items: &[T]) -> String {
            let parts: Vec<String> = items.iter().map(T::to_string).collect();
            format!("[{}]", parts.join(", "))
        }
        match self {
            Op::Param { init } | Op::State { init } => vec![("init", init.to_string())],
            Op::Fill { value } => vec![("value", format!("{value}"))],
            Op::SumTo { shape } => vec![("shape", shape.to_string())],
            Op::GeluGrad { approximation } => Op::Gelu { approximation: *approximation }.attributes(),
            Op::LayerNormGrad { eps } => Op::LayerNorm { eps: *eps }.attributes(),
            Op::SliceGrad { axis, start, axis_len } => {
                vec![("axis", axis.to_string()), ("start", start.to_string()), ("axis_len", axis_len.to_string())]
            }
            Op::EmbeddingGrad { rows } => vec![("rows", rows.to_string())],
            Op::CrossEntropyGrad { ignore_index } => vec![("ignore_index", ignore_index.to_string())],
            Op::LrSchedule { peak, warmup_steps, total_steps } => {
                let mut attrs = vec![("peak", format!("{peak:e}")), ("warmup_steps", warmup_steps.to_string())];
                if let Some(total) = total_steps {
                    attrs.push(("total_steps", total.to_string()));
                }
                attrs
            }
            Op::GradScale { max_norm, micro_batches } => {
                let mut attrs = vec![("micro_batches", micro_batches.to_string())];
                if let Some(norm) = max_norm {
                    attrs.push(("max_norm", format!("{norm}")));
                }
                attrs
            }
            Op::AdamW { beta1, beta2, eps, weight_decay } => vec![
                ("beta1", format!("{beta1}")),
                ("beta2", format!("{beta2}")),
                ("eps", format!("{eps:e}")),
                ("weight_decay", format!("{weight_decay:e}")),
            ],
            Op::LossScaleUpdate { growth_interval, growth, backoff } => vec![
                ("growth_interval", growth_interval.to_string()),
                ("growth", format!("{growth}")),
                ("backoff", format!("{backoff}")),
            ],
            Op::MatMul { transpose_a, transpose_b } => {
                let mut attrs = Vec::new();
                if *transpose_a {
                    attrs.push(("transpose_a", "true".into()));
                }
                if *transpose_b {
                    attrs.push(("transpose_b", "true".into()));
                }
                attrs
            }
            Op::Scale { factor } => vec![("factor", format!("{factor}"))],
            Op::Gelu { approximation } => {
                let a = match approximation {
                    GeluApproximation::Erf => "erf",
                    GeluApproximation::Tanh => "tanh",
                };
                vec![("approximation", a.into())]
            }
            Op::Cast { to } => vec![("to", to.to_string())],
            Op::LayerNorm { eps } => vec![("eps", format!("{eps:e}"))],
            Op::Dropout { p, stream } => vec![("p", format!("{p}")), ("stream", stream.to_string())],
            Op::Reshape { shape } => vec![("shape", shape.to_string())],
            Op::Transpose { perm } => vec![("perm", list(perm))],
            Op::Split { axis, sizes } => vec![("axis", axis.to_string()), ("sizes", list(sizes))],
            Op::Slice { axis, start, len } => {
                vec![("axis", axis.to_string()), ("start", start.to_string()), ("len", len.to_string())]
            }
            Op::Concat { axis } => vec![("axis", axis.to_string())],
            Op::CrossEntropy { ignore_index } => vec![("ignore_index", ignore_index.to_string())],
            Op::Fused { kernel } => vec![("kernel", kernel.name.clone())],
            Op::Flatten { len } => vec![("len", len.to_string())],
            Op::AllReduce { ranks } | Op::ReduceScatter { ranks } | Op::AllGather { ranks } => {
                vec![("ranks", ranks.to_string())]
            }
            Op::AlibiBias { ranks } if *ranks > 1 => vec![("ranks", ranks.to_string())],
            Op::AlibiBias { .. } => Vec::new(),
            Op::FlashAttention { scale, alibi_ranks, dropout, stream }
            | Op::FlashAttentionGrad { scale, alibi_ranks, dropout, stream } => {
                let mut attrs = vec![("scale", format!("{scale}"))];
                if let Some(ranks) = alibi_ranks {
                    attrs.push(("alibi_ranks", ranks.to_string()));
                }
                if *dropout > 0.0 {
                    attrs.push(("dropout", format!("{dropout}")));
                    attrs.push(("stream", stream.to_string()));
                }
                attrs
            }
            Op::TensorCopy { ranks } | Op::TensorAllReduce { ranks } | Op::SequenceReduceScatter { ranks } => {
                vec![("ranks", ranks.to_string())]
            }
            Op::SequenceSlice { ranks, axis } => vec![("ranks", ranks.to_string()), ("axis", axis.to_string())],
            Op::SequenceAllGather { ranks, partial_grad } => {
                vec![("ranks", ranks.to_string()), ("partial_grad", partial_grad.to_string())]
            }
            Op::VocabShard { ranks, rows } => vec![("ranks", ranks.to_string()), ("rows", rows.to_string())],
            Op::CrossEntropyStats { ranks, vocab } => vec![("ranks", ranks.to_string()), ("vocab", vocab.to_string())],
            Op::CrossEntropyCombine { ignore_index } => vec![("ignore_index", ignore_index.to_string())],
            Op::CrossEntropyShardGrad { ignore_index, ranks, vocab } => vec![
                ("ignore_index", ignore_index.to_string()),
                ("ranks", ranks.to_string()),
                ("vocab", vocab.to_string()),
            ],
            Op::Input
            | Op::Copy
            | Op::Arange
            | Op::Embedding
            | Op::Add
            | Op::Sub
            | Op::Mul
            | Op::Silu
            | Op::Relu
            | Op::Tanh
            | Op::Softmax
            | Op::AttentionMask
            | Op::Mse
            | Op::SiluGrad
            | Op::ReluGrad
            | Op::TanhGrad
            | Op::SoftmaxGrad
            | Op::AttentionMaskGrad
            | Op::MseGrad
            | Op::SquaredSum => Vec::new(),
        }
    }
}
