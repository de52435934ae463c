//! Instruction selection: each scheduled node of a plan's program becomes
//! one host instruction on the buffers the plan placed.
//!
//! Fused kernels, and every lone node a row kernel can express (elementwise
//! ops, LayerNorm, softmax and their gradients, AdamW, bias-gradient sums —
//! lowered exactly as the `fuse` pass would, by
//! [`zeroplan_ir::kernel::lower`]) run as Cranelift-compiled kernels;
//! matmuls as GEMMs; fused attention, embeddings, losses and layout ops as
//! host routines; views as nothing at all.

use std::collections::HashMap;
use std::sync::Arc;

use zeroplan_backend_cpu::{CompiledKernel, KernelCompiler};
use zeroplan_ir::kernel::{Kernel, lower};
use zeroplan_ir::{Bindings, DType, Graph, NodeIndex, Op, Phase, Value};

use super::ops::attention::Attention;
use super::ops::broadcast::Arith;
use super::ops::matmul::MatMulShape;
use crate::runner::buffers::{Buf, Rank, SelectError, concrete, constant_update, of_offset};
use crate::runner::{Instruction, Step, Written};

/// What compiles a row kernel for a device: the host's Cranelift compiler,
/// or a GPU's. Selection is the same for every device; only the kernels differ.
pub trait KernelCompile {
    type Kernel: Named;
    /// `kernel` at `dims`; `buffers` are its inputs then its outputs as the
    /// plan placed them (a device may run a kernel differently by place).
    fn compile(&mut self, kernel: &Kernel, dims: &[usize], buffers: &[Buf]) -> Result<Self::Kernel, String>;
}

/// A compiled kernel's name, as profiles count it.
pub trait Named {
    fn name(&self) -> &str;
    /// Floating-point operations of one run, where counted (a device's
    /// GEMM standing as a kernel); 0 for row kernels.
    fn flops(&self) -> f64 {
        0.0
    }
}

impl Named for Arc<CompiledKernel> {
    fn name(&self) -> &str {
        CompiledKernel::name(self)
    }
}

impl KernelCompile for KernelCompiler {
    type Kernel = Arc<CompiledKernel>;

    fn compile(&mut self, kernel: &Kernel, dims: &[usize], _: &[Buf]) -> Result<Self::Kernel, String> {
        KernelCompiler::compile(self, kernel, dims).map_err(|e| e.to_string())
    }
}

/// One instruction and the buffers it reads and writes; `K` is the
/// device's compiled kernel (the host's by default).
#[derive(Clone)]
pub enum Instr<K = Arc<CompiledKernel>> {
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
    /// Fused attention: `(q, k, v, mask) -> (out, lse)` ([`super::ops::attention`]).
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

/// Selects the instruction of every node of `order`.
pub fn select<C: KernelCompile>(
    g: &Graph,
    order: &[NodeIndex],
    bufs: &HashMap<Value, Buf>,
    bindings: &Bindings,
    rank: Rank,
    compiler: &mut C,
) -> Result<Vec<Step<Instr<C::Kernel>>>, SelectError> {
    let mut steps = Vec::with_capacity(order.len());
    for &n in order {
        let node = g.node(n);
        let fail = |message: String| SelectError::Node { node: node.name.clone(), op: node.op.name(), message };
        let instr = instruction(g, n, bufs, bindings, rank, compiler).map_err(fail)?;
        let optimizer = node.phase == Phase::Optimizer && node.op != Op::Input;
        steps.push(Step { node: n, optimizer, instr, written: Written::Here });
    }
    Ok(steps)
}

fn instruction<C: KernelCompile>(
    g: &Graph,
    n: NodeIndex,
    bufs: &HashMap<Value, Buf>,
    bindings: &Bindings,
    rank: Rank,
    compiler: &mut C,
) -> Result<Option<Instr<C::Kernel>>, String> {
    let node = g.node(n);
    let x: Vec<Buf> = g.operands(n).iter().map(|v| bufs[v]).collect();
    let out = |i: u32| bufs[&Value { node: n, output: i }];
    let shape = |v: Value| concrete(&g.value_type(v).shape, bindings).ok_or("a shape is unbound".to_string());
    let operand_shape = |i: usize| shape(g.operands(n)[i]);
    let out_shape = shape(Value { node: n, output: 0 })?;
    let usize_of = |v: u64| usize::try_from(v).map_err(|_| format!("{v} does not fit this host"));
    let dims_last = |i: usize| -> Result<usize, String> { Ok(*operand_shape(i)?.last().unwrap_or(&1)) };
    if let Some(ranks) = node.op.tensor_ranks().filter(|&t| t as usize != rank.tensor_ranks) {
        return Err(format!(
            "the plan runs on {ranks} tensor-parallel ranks, this rank's tensor group has {}: load it once per \
             rank of a group of {ranks}",
            rank.tensor_ranks
        ));
    }
    let tensor_rank = rank.tensor as u64;
    Ok(Some(match &node.op {
        Op::Param { .. } | Op::State { .. } => return Ok(None),
        op if op.is_view() => {
            // The viewed elements; a view on another place has a buffer of its own.
            let to = out(0);
            let from = Buf { offset: of_offset(&x[0], op, g, n, bindings, rank), ..to };
            let from = Buf { place: x[0].place, ..from };
            return Ok((from != to).then_some(Instr::Copy { from, to }));
        }
        // Written into the target it updates when its phase ends (see `constant_update`).
        Op::Fill { .. } if constant_update(g, n).is_some() => return Ok(None),
        Op::Input => Instr::Input { name: node.name.clone(), shape: out_shape, out: out(0) },
        Op::Fill { value } => Instr::Fill { value: *value, out: out(0) },
        Op::Arange => Instr::Arange { out: out(0) },
        Op::Copy | Op::AllReduce { ranks: 1 } | Op::ReduceScatter { ranks: 1 } | Op::AllGather { ranks: 1 } => {
            Instr::Copy { from: x[0], to: out(0) }
        }
        Op::AllReduce { ranks } | Op::ReduceScatter { ranks } | Op::AllGather { ranks }
            if *ranks as usize != rank.ranks =>
        {
            return Err(format!(
                "the plan runs on {ranks} data-parallel ranks, this group has {}: load it once per rank of a \
                 group of {ranks}",
                rank.ranks
            ));
        }
        Op::AllReduce { .. } => Instr::AllReduce { x: x[0], out: out(0) },
        Op::ReduceScatter { .. } => Instr::ReduceScatter { x: x[0], out: out(0) },
        Op::AllGather { .. } => Instr::AllGather { x: x[0], out: out(0) },
        Op::TensorAllReduce { ranks: 1 } => Instr::Copy { from: x[0], to: out(0) },
        Op::TensorAllReduce { .. } => Instr::TensorAllReduce { x: x[0], out: out(0) },
        Op::SequenceAllGather { ranks: 1, .. } | Op::SequenceReduceScatter { ranks: 1 } => {
            Instr::Copy { from: x[0], to: out(0) }
        }
        Op::SequenceAllGather { .. } => Instr::SequenceAllGather { x: x[0], outer: out_shape[0], out: out(0) },
        Op::SequenceReduceScatter { .. } => Instr::SequenceReduceScatter { x: x[0], outer: out_shape[0], out: out(0) },
        Op::SequenceSlice { ranks, axis } => Instr::SequenceSlice {
            x: x[0],
            shape: operand_shape(0)?,
            axis: *axis,
            rank: tensor_rank as usize,
            ranks: usize_of(*ranks)?,
            out: out(0),
        },
        Op::VocabShard { ranks, rows } => {
            Instr::VocabShard { ids: x[0], rank: tensor_rank, ranks: *ranks, rows: *rows, out: out(0) }
        }
        Op::CrossEntropyStats { ranks, vocab } => Instr::CrossEntropyStats {
            logits: x[0],
            labels: x[1],
            classes: dims_last(0)?,
            rank: tensor_rank,
            ranks: *ranks,
            vocab: *vocab,
            out: out(0),
        },
        Op::CrossEntropyCombine { ignore_index } => Instr::CrossEntropyCombine {
            stats: x[0],
            labels: x[1],
            vocab: operand_shape(0)?.first().copied().unwrap_or(1) * dims_last(2)?,
            ignore_index: *ignore_index,
            out: out(0),
        },
        Op::CrossEntropyShardGrad { ignore_index, vocab, .. } => Instr::CrossEntropyShardGrad {
            logits: x[0],
            labels: x[1],
            stats: x[2],
            dloss: x[3],
            classes: dims_last(0)?,
            rank: tensor_rank,
            vocab: *vocab,
            ignore_index: *ignore_index,
            out: out(0),
        },
        Op::AlibiBias { ranks } if *ranks > 1 => {
            let shape: [usize; 4] =
                operand_shape(0)?.try_into().map_err(|s| format!("ALiBi takes [B, H, Sq, Sk] scores, not {s:?}"))?;
            let slopes = zeroplan_ir::interp::alibi_slopes_of_rank(shape[1], tensor_rank, *ranks);
            Instr::AlibiBias { x: x[0], shape, slopes: slopes.into_iter().map(|m| m as f32).collect(), out: out(0) }
        }
        Op::FlashAttention { scale, alibi_ranks, dropout, stream }
        | Op::FlashAttentionGrad { scale, alibi_ranks, dropout, stream } => {
            let dims: [usize; 4] = operand_shape(0)?
                .try_into()
                .map_err(|s| format!("fused attention takes [B, H, S, D] operands, not {s:?}"))?;
            let slopes = alibi_ranks.map(|ranks| {
                let slopes = zeroplan_ir::interp::alibi_slopes_of_rank(dims[1], tensor_rank, ranks);
                slopes.into_iter().map(|m| m as f32).collect()
            });
            let attention =
                Box::new(Attention { dims, scale: *scale as f32, slopes, dropout: *dropout, stream: *stream });
            if matches!(node.op, Op::FlashAttention { .. }) {
                Instr::FlashAttention { attention, inputs: [x[0], x[1], x[2], x[3]], outputs: [out(0), out(1)] }
            } else {
                let inputs = [x[0], x[1], x[2], x[3], x[4], x[5], x[6]];
                Instr::FlashAttentionGrad { attention, inputs, outputs: [out(0), out(1), out(2)] }
            }
        }
        Op::Fused { kernel } => {
            let dims = concrete(&kernel.shape, bindings).ok_or("the kernel's shape is unbound")?;
            let outputs: Vec<Buf> = (0..node.outputs.len() as u32).map(out).collect();
            let compiled = compiler.compile(kernel, &dims, &[x.as_slice(), &outputs].concat())?;
            Instr::Kernel { kernel: compiled, inputs: x, outputs }
        }
        Op::MatMul { transpose_a, transpose_b } => {
            let (a, b) = (operand_shape(0)?, operand_shape(1)?);
            let shape = MatMulShape::new(&a, &b, *transpose_a, *transpose_b)
                .ok_or_else(|| format!("{a:?} and {b:?} do not multiply"))?;
            Instr::MatMul { shape, a: x[0], b: x[1], out: out(0) }
        }
        Op::Embedding => Instr::Embedding { table: x[0], ids: x[1], width: dims_last(0)?, out: out(0) },
        Op::EmbeddingGrad { .. } => Instr::EmbeddingGrad { dy: x[0], ids: x[1], width: dims_last(0)?, out: out(0) },
        Op::CrossEntropy { ignore_index } => Instr::CrossEntropy {
            logits: x[0],
            labels: x[1],
            classes: dims_last(0)?,
            ignore_index: *ignore_index,
            out: out(0),
        },
        Op::CrossEntropyGrad { ignore_index } => Instr::CrossEntropyGrad {
            logits: x[0],
            labels: x[1],
            dloss: x[2],
            classes: dims_last(0)?,
            ignore_index: *ignore_index,
            out: out(0),
        },
        Op::Mse => Instr::Mse { p: x[0], t: x[1], out: out(0) },
        Op::MseGrad => Instr::MseGrad { p: x[0], t: x[1], dloss: x[2], out: out(0) },
        Op::Transpose { perm } => {
            Instr::Transpose { x: x[0], shape: operand_shape(0)?, perm: perm.clone(), out: out(0) }
        }
        Op::Slice { axis, start, len } => Instr::Slice {
            x: x[0],
            shape: operand_shape(0)?,
            axis: *axis,
            start: usize_of(*start)?,
            len: usize_of(*len)?,
            out: out(0),
        },
        Op::SliceGrad { axis, start, .. } => Instr::SliceGrad {
            dy: x[0],
            shape: operand_shape(0)?,
            axis: *axis,
            start: usize_of(*start)?,
            axis_len: out_shape[*axis],
            out: out(0),
        },
        Op::Split { axis, sizes } => Instr::Split {
            x: x[0],
            shape: operand_shape(0)?,
            axis: *axis,
            sizes: sizes.iter().map(|&s| usize_of(s)).collect::<Result<_, _>>()?,
            outs: (0..node.outputs.len() as u32).map(out).collect(),
        },
        Op::Concat { axis } => Instr::Concat {
            parts: x.clone(),
            shapes: (0..x.len()).map(operand_shape).collect::<Result<_, _>>()?,
            axis: *axis,
            out: out(0),
        },
        Op::Flatten { .. } => Instr::Flatten { parts: x, out: out(0) },
        Op::Cast { .. } => Instr::Cast { x: x[0], out: out(0) },
        Op::LrSchedule { peak, warmup_steps, total_steps } => Instr::LrSchedule {
            step: x[0],
            peak: *peak,
            warmup_steps: *warmup_steps,
            total_steps: *total_steps,
            out: out(0),
        },
        Op::GradScale { max_norm, micro_batches } => Instr::GradScale {
            sq: x[0],
            scale: x[1],
            max_norm: *max_norm,
            micro_batches: *micro_batches,
            multiplier: out(0),
            finite: out(1),
        },
        Op::LossScaleUpdate { growth_interval, growth, backoff } => Instr::LossScaleUpdate {
            scale: x[0],
            good: x[1],
            finite: x[2],
            interval: *growth_interval,
            growth: *growth,
            backoff: *backoff,
            outs: [out(0), out(1)],
        },
        _ => lone_kernel(g, n, bufs, bindings, compiler)?,
    }))
}

/// A node a row kernel can express, as a kernel of its own.
fn lone_kernel<C: KernelCompile>(
    g: &Graph,
    n: NodeIndex,
    bufs: &HashMap<Value, Buf>,
    bindings: &Bindings,
    compiler: &mut C,
) -> Result<Instr<C::Kernel>, String> {
    let node = g.node(n);
    let kshape = match &node.op {
        Op::AdamW { .. } | Op::SquaredSum if lower::optimizer_fusible(g, n) => {
            g.value_type(g.operands(n)[0]).shape.clone()
        }
        Op::SumTo { .. } => g.value_type(g.operands(n)[0]).shape.clone(),
        _ => node.outputs[0].shape.clone(),
    };
    let ok = match node.op {
        Op::AdamW { .. } | Op::SquaredSum => lower::optimizer_fusible(g, n),
        Op::SumTo { .. } => lower::sum_to_axes(g, n, &kshape).is_some(),
        _ => lower::fusible(g, n, &kshape),
    };
    if !ok {
        return broadcast_routine(g, n, bufs, bindings);
    }
    let outputs: Vec<Value> = (0..node.outputs.len() as u32).map(|i| Value { node: n, output: i }).collect();
    let (kernel, operands) = lower::lower(g, &[n], &outputs, &node.name, &kshape)?;
    let dims = concrete(&kernel.shape, bindings).ok_or("the kernel's shape is unbound")?;
    let inputs: Vec<Buf> = operands.iter().map(|v| bufs[v]).collect();
    let outputs: Vec<Buf> = outputs.iter().map(|v| bufs[v]).collect();
    let compiled = compiler.compile(&kernel, &dims, &[inputs.as_slice(), &outputs].concat())?;
    Ok(Instr::Kernel { kernel: compiled, inputs, outputs })
}

/// The host routine of an elementwise node no row kernel fits.
fn broadcast_routine<K>(
    g: &Graph,
    n: NodeIndex,
    bufs: &HashMap<Value, Buf>,
    bindings: &Bindings,
) -> Result<Instr<K>, String> {
    let node = g.node(n);
    let ops = g.operands(n);
    let shape = |v: Value| concrete(&g.value_type(v).shape, bindings).ok_or("a shape is unbound".to_string());
    let out = Value { node: n, output: 0 };
    let float =
        node.outputs.iter().all(|t| t.dtype.is_float()) && ops.iter().all(|v| g.value_type(*v).dtype.is_float());
    if !float {
        return Err("integer arithmetic has no host routine".into());
    }
    let arith = |op: Arith| -> Result<Instr<K>, String> {
        Ok(Instr::Broadcast {
            op,
            a: bufs[&ops[0]],
            a_shape: shape(ops[0])?,
            b: bufs[&ops[1]],
            b_shape: shape(ops[1])?,
            shape: shape(out)?,
            out: bufs[&out],
        })
    };
    match &node.op {
        Op::Add => arith(Arith::Add),
        Op::Sub => arith(Arith::Sub),
        Op::Mul => arith(Arith::Mul),
        Op::Scale { factor } => Ok(Instr::Scale { x: bufs[&ops[0]], factor: *factor, out: bufs[&out] }),
        Op::SumTo { .. } => {
            Ok(Instr::SumTo { x: bufs[&ops[0]], x_shape: shape(ops[0])?, shape: shape(out)?, out: bufs[&out] })
        }
        _ => Err("no host routine, and no row kernel fits its operands".into()),
    }
}

/// The element size of `dtype`, in bytes.
pub fn elem(dtype: DType) -> usize {
    dtype.size_bytes() as usize
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
        self.clone().for_each_buf(|b, access| touched.push((*b, access == super::Access::Write)));
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
