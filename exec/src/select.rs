//! Instruction selection: each scheduled node of a plan's program becomes
//! one [`Instr`] on the buffers the plan placed.
//!
//! Fused kernels, and every lone node a row kernel can express (elementwise
//! ops, LayerNorm, softmax and their gradients, AdamW, bias-gradient sums —
//! lowered exactly as the `fuse` pass would, by
//! [`zeroplan_ir::kernel::lower`]) become the device's compiled kernels
//! ([`KernelCompile`]); matmuls GEMMs; fused attention, embeddings, losses
//! and layout ops routines; views nothing at all. The same for every device:
//! a device then rewrites the steps it can run better (a GPU's GEMM
//! epilogues) with its own [`crate::StepPass`]es.

use std::collections::HashMap;

use zeroplan_ir::kernel::{Kernel, lower};
use zeroplan_ir::{Bindings, DType, Graph, NodeIndex, Op, Phase, Value};

use crate::buffers::{Buf, Rank, SelectError, concrete, constant_update, of_offset};
use crate::device::{Step, Written};
use crate::instr::{Arith, Attention, Instr, MatMulShape};
use crate::validate;

/// What compiles a row kernel for a device: the host's Cranelift compiler,
/// or a GPU's. Selection is the same for every device; only the kernels differ.
pub trait KernelCompile {
    /// The device's compiled kernel, carried by [`Instr::Kernel`].
    type Kernel: Named;
    /// `kernel` at `dims`; `buffers` are its inputs then its outputs as the
    /// plan placed them (a device may run a kernel differently by place).
    fn compile(&mut self, kernel: &Kernel, dims: &[usize], buffers: &[Buf]) -> Result<Self::Kernel, String>;
}

/// A compiled kernel's name, as profiles count it.
pub trait Named {
    /// The kernel's name, which carries its node's, as profiles count it.
    fn name(&self) -> &str;
    /// Floating-point operations of one run, where counted (a device's
    /// GEMM standing as a kernel); 0 for row kernels.
    fn flops(&self) -> f64 {
        0.0
    }
}

/// A shared kernel is named as the kernel (a device keeps its compiled
/// kernels behind `Arc`s, one per distinct kernel, shared by the steps).
impl<K: Named + ?Sized> Named for std::sync::Arc<K> {
    fn name(&self) -> &str {
        K::name(self)
    }

    fn flops(&self) -> f64 {
        K::flops(self)
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
        let fail = |message: String| SelectError::Node { node: node.name.to_string(), op: node.op.name(), message };
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
            let from = of_offset(&x[0], op, g, n, bindings).ok_or("the view's start overflows")?;
            let from = Buf { offset: from, ..to };
            let from = Buf { place: x[0].place, ..from };
            return Ok((from != to).then_some(Instr::Copy { from, to }));
        }
        // Written into the target it updates when its phase ends (see `constant_update`).
        Op::Fill { .. } if constant_update(g, n).is_some() => return Ok(None),
        Op::Input => Instr::Input { name: node.name.to_string(), shape: out_shape, out: out(0) },
        Op::Fill { value } => Instr::Fill { value: *value, out: out(0) },
        Op::Arange => Instr::Arange { out: out(0) },
        // Refused before a collective over one rank becomes a copy: on a
        // group of more, the peers would wait for the call this rank skips.
        Op::AllReduce { ranks } | Op::ReduceScatter { ranks } | Op::AllGather { ranks }
            if *ranks as usize != rank.ranks =>
        {
            return Err(format!(
                "the plan runs on {ranks} data-parallel ranks, this group has {}: load it once per rank of a \
                 group of {ranks}",
                rank.ranks
            ));
        }
        Op::Copy | Op::AllReduce { ranks: 1 } | Op::ReduceScatter { ranks: 1 } | Op::AllGather { ranks: 1 } => {
            Instr::Copy { from: x[0], to: out(0) }
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
            validate::kernel_launch(kernel, &dims, &x, &outputs)?;
            let compiled = compiler.compile(kernel, &dims, &[x.as_slice(), &outputs].concat())?;
            Instr::Kernel { kernel: compiled, inputs: x, outputs }
        }
        Op::MatMul { transpose_a, transpose_b } => {
            let (a, b) = (operand_shape(0)?, operand_shape(1)?);
            let shape = MatMulShape::new(&a, &b, *transpose_a, *transpose_b)
                .ok_or_else(|| format!("{a:?} and {b:?} do not multiply"))?;
            validate::matmul(&shape, &x[0], &x[1], &out(0))?;
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
    validate::kernel_launch(&kernel, &dims, &inputs, &outputs)?;
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
