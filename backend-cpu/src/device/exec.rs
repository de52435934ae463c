//! Running instructions on a rank's memory.

use std::sync::Arc;

use zeroplan_exec::select::elem;
use zeroplan_exec::{Buf, Ctx, Instr};
use zeroplan_ir::Tensor;
use zeroplan_ir::interp;
use zeroplan_ir::interp::sequence_parallel;

use super::arena::Memory;
use crate::kernel::CompiledKernel;
use crate::routines::attention::{Draw, Operands, Routine};
use crate::routines::{broadcast, embedding, layout, loss, matmul, tensor_parallel as tp};

/// `b`'s bytes. Safety: nothing writes `b` meanwhile.
unsafe fn bytes(mem: &Memory, b: Buf) -> &[u8] {
    unsafe { std::slice::from_raw_parts(mem.ptr(b), b.bytes()) }
}

/// `b`'s bytes, to write. Safety: nothing else touches `b` meanwhile.
#[allow(clippy::mut_from_ref)]
unsafe fn bytes_mut(mem: &Memory, b: Buf) -> &mut [u8] {
    unsafe { std::slice::from_raw_parts_mut(mem.ptr(b), b.bytes()) }
}

/// A float operand as f32: read where it lies when it is f32 and `out` does
/// not overlap it, else converted (or copied) out first.
fn floats<'m>(mem: &'m Memory, b: Buf, out: &Buf) -> std::borrow::Cow<'m, [f32]> {
    if b.dtype == zeroplan_ir::DType::F32 && !b.overlaps(out) {
        // SAFETY: f32, and the instruction writes only `out`, which is elsewhere.
        std::borrow::Cow::Borrowed(unsafe { mem.f32s(b) })
    } else {
        std::borrow::Cow::Owned(mem.read_f32(b))
    }
}

/// A float operand as f32, read where it lies only when no output overlaps it.
fn floats_apart<'m>(mem: &'m Memory, b: Buf, outs: &[Buf]) -> std::borrow::Cow<'m, [f32]> {
    if b.dtype == zeroplan_ir::DType::F32 && !outs.iter().any(|o| b.overlaps(o)) {
        // SAFETY: f32, and the instruction writes only `outs`, which lie elsewhere.
        std::borrow::Cow::Borrowed(unsafe { mem.f32s(b) })
    } else {
        std::borrow::Cow::Owned(mem.read_f32(b))
    }
}

/// Runs `f` on an f32 view of `out` (converted on the way out for 16-bit outputs).
fn write_floats<T>(mem: &Memory, out: Buf, f: impl FnOnce(&mut [f32]) -> T) -> T {
    if out.dtype == zeroplan_ir::DType::F32 {
        // SAFETY: the instruction is the only writer of `out`; its inputs were
        // borrowed only where they do not overlap it.
        f(unsafe { mem.f32s_mut(out) })
    } else {
        let mut tmp = vec![0.0f32; out.len];
        let r = f(&mut tmp);
        mem.write_f32(out, &tmp);
        r
    }
}

fn scalar(mem: &Memory, b: Buf) -> f64 {
    f64::from(mem.read_f32(b).first().copied().unwrap_or(f32::NAN))
}

fn set_scalar(mem: &Memory, b: Buf, v: f64) {
    mem.write_f32(b, &[v as f32]);
}

/// Executes one host instruction.
pub fn run(instr: &Instr<Arc<CompiledKernel>>, mem: &Memory, cx: &Ctx) -> Result<(), String> {
    match instr {
        Instr::Kernel { kernel, inputs, outputs } => {
            let ins: Vec<*const u8> = inputs.iter().map(|b| mem.ptr(*b).cast_const()).collect();
            let outs: Vec<*mut u8> = outputs.iter().map(|b| mem.ptr(*b)).collect();
            // SAFETY: the plan placed each buffer at the kernel's operand sizes;
            // outputs overlap inputs only as in-place updates of one shape.
            unsafe { kernel.launch(&ins, &outs, cx.seed, cx.offset) };
            Ok(())
        }
        other => run_routine(other, mem, cx),
    }
}

/// Executes any instruction but a compiled kernel (whose code belongs to a
/// device): the host routines, which a device without its own version of
/// one runs on a staging copy of the buffers.
pub fn run_routine<K>(instr: &Instr<K>, mem: &Memory, cx: &Ctx) -> Result<(), String> {
    match instr {
        Instr::Input { name, shape, out } => {
            let t = cx.feeds.get(name).ok_or_else(|| format!("no tensor is fed for input `{name}`"))?;
            if t.shape() != shape.as_slice() {
                return Err(format!("input `{name}` must be {shape:?} for this plan, got {:?}", t.shape()));
            }
            write_tensor(mem, *out, t);
        }
        Instr::Fill { value, out } => fill(mem, *out, *value),
        Instr::Arange { out } => mem.write_i64(*out, &(0..out.len as i64).collect::<Vec<_>>()),
        Instr::Copy { from, to } => mem.copy(*from, *to),
        // Payloads travel as f32 (16-bit buffers widened, then rounded once).
        Instr::AllReduce { x, out } => {
            let mut v = mem.read_f32(*x);
            cx.comm.all_reduce(&mut v).map_err(|e| e.to_string())?;
            mem.write_f32(*out, &v);
        }
        Instr::ReduceScatter { x, out } => {
            let mut part = vec![0.0; out.len];
            cx.comm.reduce_scatter(&mem.read_f32(*x), &mut part).map_err(|e| e.to_string())?;
            mem.write_f32(*out, &part);
        }
        Instr::AllGather { x, out } => {
            let mut all = vec![0.0; out.len];
            cx.comm.all_gather(&mem.read_f32(*x), &mut all).map_err(|e| e.to_string())?;
            mem.write_f32(*out, &all);
        }
        Instr::TensorAllReduce { x, out } => {
            let mut v = mem.read_f32(*x);
            cx.tensor.all_reduce(&mut v).map_err(|e| e.to_string())?;
            mem.write_f32(*out, &v);
        }
        Instr::SequenceAllGather { x, outer, out } => {
            let mut all = vec![0.0; out.len];
            cx.tensor.all_gather(&mem.read_f32(*x), &mut all).map_err(|e| e.to_string())?;
            mem.write_f32(*out, &sequence_parallel::from_rank_major(&all, *outer, cx.tensor.ranks()));
        }
        Instr::SequenceReduceScatter { x, outer, out } => {
            let whole = sequence_parallel::to_rank_major(&mem.read_f32(*x), *outer, cx.tensor.ranks());
            let mut part = vec![0.0; out.len];
            cx.tensor.reduce_scatter(&whole, &mut part).map_err(|e| e.to_string())?;
            mem.write_f32(*out, &part);
        }
        Instr::SequenceSlice { x, shape, axis, rank, ranks, out } => {
            if x.dtype.is_int() {
                mem.write_i64(*out, &sequence_parallel::slice(&mem.read_i64(*x), shape, *axis, *rank, *ranks));
            } else {
                mem.write_f32(*out, &sequence_parallel::slice(&mem.read_f32(*x), shape, *axis, *rank, *ranks));
            }
        }
        Instr::VocabShard { ids, rank, ranks, rows, out } => {
            let local = interp::tensor_parallel::vocab_shard(&mem.read_i64(*ids), *rank, *ranks, *rows)?;
            mem.write_i64(*out, &local);
        }
        Instr::CrossEntropyStats { logits, labels, classes, rank, ranks, vocab, out } => {
            let (l, y) = (floats(mem, *logits, out), mem.read_i64(*labels));
            mem.write_f32(*out, &tp::cross_entropy_stats(&l, &y, *classes, *rank, *ranks, *vocab));
        }
        Instr::CrossEntropyCombine { stats, labels, vocab, ignore_index, out } => {
            let (s, y) = (floats(mem, *stats, out), mem.read_i64(*labels));
            set_scalar(mem, *out, tp::cross_entropy_combine(&s, &y, *vocab, *ignore_index)?);
        }
        Instr::CrossEntropyShardGrad { logits, labels, stats, dloss, classes, rank, vocab, ignore_index, out } => {
            let (l, y, s) = (floats(mem, *logits, out), mem.read_i64(*labels), floats(mem, *stats, out));
            let d = scalar(mem, *dloss);
            write_floats(mem, *out, |o| {
                tp::cross_entropy_shard_grad(&l, &y, &s, d, *ignore_index, *classes, *rank, *vocab, o)
            });
        }
        Instr::AlibiBias { x, shape, slopes, out } => {
            let x = floats(mem, *x, out);
            write_floats(mem, *out, |o| tp::alibi_bias(&x, *shape, slopes, o));
        }
        Instr::FlashAttention { attention, inputs, outputs } => {
            let [q, k, v] = [0, 1, 2].map(|i| floats_apart(mem, inputs[i], outputs));
            let mask = mem.read_i64(inputs[3]);
            let draw = Draw { seed: cx.seed, offset: cx.offset };
            write_floats(mem, outputs[0], |out| {
                let x = Operands { q: &q, k: &k, v: &v, mask: &mask };
                write_floats(mem, outputs[1], |lse| Routine(attention).forward(x, draw, out, lse))
            });
        }
        Instr::FlashAttentionGrad { attention, inputs, outputs } => {
            // The forward's outputs (inputs 4 and 5) are not needed on the host.
            let [q, k, v, dout] = [0, 1, 2, 6].map(|i| floats_apart(mem, inputs[i], outputs));
            let mask = mem.read_i64(inputs[3]);
            let draw = Draw { seed: cx.seed, offset: cx.offset };
            let x = Operands { q: &q, k: &k, v: &v, mask: &mask };
            write_floats(mem, outputs[0], |dq| {
                write_floats(mem, outputs[1], |dk| {
                    write_floats(mem, outputs[2], |dv| Routine(attention).backward(x, &dout, draw, [dq, dk, dv]))
                })
            });
        }
        Instr::Kernel { kernel: _, .. } => return Err("a compiled kernel is no host routine".into()),
        Instr::MatMul { shape, a, b, out } => {
            let (x, y) = (floats(mem, *a, out), floats(mem, *b, out));
            // SAFETY: `x`, `y` and the output hold the shape's elements; the
            // output overlaps neither (they were copied out if it did).
            write_floats(mem, *out, |c| unsafe { matmul::matmul_f32(shape, x.as_ptr(), y.as_ptr(), c.as_mut_ptr()) });
        }
        Instr::Embedding { table, ids, width, out } => {
            let (t, ids) = (floats(mem, *table, out), mem.read_i64(*ids));
            write_floats(mem, *out, |o| embedding::embedding(&t, &ids, *width, o))?;
        }
        Instr::EmbeddingGrad { dy, ids, width, out } => {
            let (d, ids) = (floats(mem, *dy, out), mem.read_i64(*ids));
            write_floats(mem, *out, |o| embedding::embedding_grad(&d, &ids, *width, o))?;
        }
        Instr::CrossEntropy { logits, labels, classes, ignore_index, out } => {
            let (l, y) = (floats(mem, *logits, out), mem.read_i64(*labels));
            set_scalar(mem, *out, f64::from(loss::cross_entropy(&l, &y, *classes, *ignore_index)?));
        }
        Instr::CrossEntropyGrad { logits, labels, dloss, classes, ignore_index, out } => {
            let (l, y, d) = (floats(mem, *logits, out), mem.read_i64(*labels), scalar(mem, *dloss) as f32);
            write_floats(mem, *out, |o| loss::cross_entropy_grad(&l, &y, d, *classes, *ignore_index, o))?;
        }
        Instr::Mse { p, t, out } => {
            let (p, t) = (floats(mem, *p, out), floats(mem, *t, out));
            set_scalar(mem, *out, f64::from(loss::mse(&p, &t)));
        }
        Instr::MseGrad { p, t, dloss, out } => {
            let (p, t, d) = (floats(mem, *p, out), floats(mem, *t, out), scalar(mem, *dloss) as f32);
            write_floats(mem, *out, |o| loss::mse_grad(&p, &t, d, o));
        }
        Instr::Transpose { x, shape, perm, out } => {
            let src = copy_if_overlapping(mem, *x, &[*out]);
            // SAFETY: the output is written by this instruction alone.
            layout::transpose(&src, shape, perm, elem(x.dtype), unsafe { bytes_mut(mem, *out) });
        }
        Instr::Slice { x, shape, axis, start, len, out } => {
            let src = copy_if_overlapping(mem, *x, &[*out]);
            layout::slice(&src, shape, *axis, *start, *len, elem(x.dtype), unsafe { bytes_mut(mem, *out) });
        }
        Instr::SliceGrad { dy, shape, axis, start, axis_len, out } => {
            let src = copy_if_overlapping(mem, *dy, &[*out]);
            layout::slice_grad(&src, shape, *axis, *start, *axis_len, elem(dy.dtype), unsafe { bytes_mut(mem, *out) });
        }
        Instr::Split { x, shape, axis, sizes, outs } => {
            let src = copy_if_overlapping(mem, *x, outs);
            // SAFETY: the outputs are distinct buffers written by this instruction alone.
            let mut views: Vec<&mut [u8]> = outs.iter().map(|b| unsafe { bytes_mut(mem, *b) }).collect();
            layout::split(&src, shape, *axis, sizes, elem(x.dtype), &mut views);
        }
        Instr::Concat { parts, shapes, axis, out } => {
            let srcs: Vec<Vec<u8>> = parts.iter().map(|p| copy_if_overlapping(mem, *p, &[*out]).into_owned()).collect();
            let refs: Vec<&[u8]> = srcs.iter().map(Vec::as_slice).collect();
            layout::concat(&refs, shapes, *axis, elem(out.dtype), unsafe { bytes_mut(mem, *out) });
        }
        Instr::Flatten { parts, out } => {
            let mut values = Vec::with_capacity(out.len);
            for p in parts {
                values.extend(mem.read_f32(*p));
            }
            values.resize(out.len, 0.0);
            mem.write_f32(*out, &values);
        }
        Instr::Broadcast { op, a, a_shape, b, b_shape, shape, out } => {
            let (x, y) = (floats(mem, *a, out), floats(mem, *b, out));
            write_floats(mem, *out, |o| broadcast::binary(*op, &x, a_shape, &y, b_shape, shape, o));
        }
        Instr::Scale { x, factor, out } => {
            let x = floats(mem, *x, out);
            write_floats(mem, *out, |o| broadcast::scale(&x, *factor, o));
        }
        Instr::SumTo { x, x_shape, shape, out } => {
            let x = floats(mem, *x, out);
            write_floats(mem, *out, |o| broadcast::sum_to(&x, x_shape, shape, o));
        }
        Instr::Cast { x, out } => match (x.dtype.is_float(), out.dtype.is_float()) {
            (_, true) => mem.write_f32(*out, &mem.read_f32(*x)),
            (false, false) => mem.write_i64(*out, &mem.read_i64(*x)),
            (true, false) => {
                let v = mem.read_f32(*x);
                if let Some(bad) = v.iter().find(|v| !v.is_finite()) {
                    return Err(format!("cannot cast {bad} to an integer"));
                }
                mem.write_i64(*out, &v.iter().map(|&v| v as i64).collect::<Vec<_>>());
            }
        },
        Instr::LrSchedule { step, peak, warmup_steps, total_steps, out } => {
            set_scalar(mem, *out, interp::lr_schedule(scalar(mem, *step), *peak, *warmup_steps, *total_steps));
        }
        Instr::GradScale { sq, scale, max_norm, micro_batches, multiplier, finite } => {
            let (m, f) = interp::grad_scale(scalar(mem, *sq), scalar(mem, *scale), *max_norm, *micro_batches);
            set_scalar(mem, *multiplier, m);
            set_scalar(mem, *finite, f);
        }
        Instr::LossScaleUpdate { scale, good, finite, interval, growth, backoff, outs } => {
            let (s, g) = interp::loss_scale_update(
                scalar(mem, *scale),
                scalar(mem, *good),
                scalar(mem, *finite),
                *interval,
                *growth,
                *backoff,
            );
            set_scalar(mem, outs[0], s);
            set_scalar(mem, outs[1], g);
        }
    }
    Ok(())
}

/// Every element of `b` set to `value` (truncated for an integer buffer).
pub fn fill(mem: &Memory, b: Buf, value: f64) {
    if b.dtype.is_float() {
        mem.write_f32(b, &vec![value as f32; b.len])
    } else {
        mem.write_i64(b, &vec![value as i64; b.len])
    }
}

/// `b`'s bytes, copied out when an output overlaps them.
fn copy_if_overlapping<'m>(mem: &'m Memory, b: Buf, outs: &[Buf]) -> std::borrow::Cow<'m, [u8]> {
    // SAFETY: borrowed only when no output of the instruction overlaps it.
    let src = unsafe { bytes(mem, b) };
    if outs.iter().any(|o| o.overlaps(&b)) {
        std::borrow::Cow::Owned(src.to_vec())
    } else {
        std::borrow::Cow::Borrowed(src)
    }
}

/// Writes a tensor (f64 or i64 values) into `b`, converting to its dtype.
pub fn write_tensor(mem: &Memory, b: Buf, t: &Tensor) {
    match t.data() {
        zeroplan_ir::TensorData::Float(v) if b.dtype.is_float() => {
            mem.write_f32(b, &v.iter().map(|&x| x as f32).collect::<Vec<_>>())
        }
        zeroplan_ir::TensorData::Float(v) => mem.write_i64(b, &v.iter().map(|&x| x as i64).collect::<Vec<_>>()),
        zeroplan_ir::TensorData::Int(v) => mem.write_i64(b, v),
    }
}

/// Reads `b` as a tensor of `shape`.
pub fn read_tensor(mem: &Memory, b: Buf, shape: Vec<usize>) -> Tensor {
    if b.dtype.is_float() {
        let v = mem.read_f32(b).into_iter().map(f64::from).collect();
        Tensor::float(shape, b.dtype, v).expect("a buffer holds its shape's elements")
    } else {
        Tensor::int(shape, b.dtype, mem.read_i64(b)).expect("a buffer holds its shape's elements")
    }
}
