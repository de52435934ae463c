//! Each routine instruction planned as launches of this module's kernels
//! over its buffers' addresses, without a GPU: which instructions the
//! kernels cover ([`supported`]), and the launches, their grids and
//! arguments ([`plan`]). The device loads each launch's kernel; the host
//! emulation tests run the same plan under g++.

use zeroplan_backend_cpu::device::{Arena, Memory, exec as host};
use zeroplan_exec::{Access, Arith, Buf, Instr};
use zeroplan_ir::{DType, Place};

use super::alibi::{MAX_HEADS, Slopes};
use super::arith;
use super::layout::{self, Piece, Strided, Tiled, Transpose};
use super::{Routine, grid, grid_for};
use crate::codegen::DeviceProperties;

/// One argument of a launch, in the kernel's parameter order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A buffer's address.
    Ptr(u64),
    /// An unsigned 64-bit value (a fill's pattern).
    U64(u64),
    /// A length, index or label (`long long`).
    I64(i64),
    /// A constant (`double`).
    F64(f64),
    /// An address this many bytes into the device's cross-row partials
    /// (allocated once every kernel's need is known).
    Scratch(u64),
    /// A copy's index space, by value.
    Strided(Strided),
    /// A tiled transpose's shape, by value.
    Tiled(Tiled),
    /// ALiBi's slopes of a rank's heads, by value.
    Slopes(Slopes),
}

/// One launch of [`THREADS`](super::THREADS)-thread blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The source it is a kernel of.
    pub routine: Routine,
    /// Which of its kernels ([`Routine::kernels`]).
    pub kernel: usize,
    /// Blocks (which loop over the work).
    pub grid: u32,
    /// The kernel's arguments, in order.
    pub args: Vec<Arg>,
}

/// What a routine queues on the compute stream, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A kernel launch.
    Launch(Launch),
    /// A copy between ranges that do not overlap (DMA).
    Memcpy {
        /// The source address.
        from: u64,
        /// The destination address.
        to: u64,
        /// Bytes copied.
        bytes: usize,
    },
}

/// A routine instruction's launches and the partials bytes they use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// What to queue, in order.
    pub ops: Vec<Op>,
    /// The partials bytes the launches use.
    pub scratch_bytes: usize,
}

/// Whether `instr` is a routine a kernel here may take.
pub fn is_routine<K>(instr: &Instr<K>) -> bool {
    matches!(
        instr,
        Instr::Fill { .. }
            | Instr::Arange { .. }
            | Instr::Transpose { .. }
            | Instr::Slice { .. }
            | Instr::SliceGrad { .. }
            | Instr::Split { .. }
            | Instr::Concat { .. }
            | Instr::Flatten { .. }
            | Instr::Embedding { .. }
            | Instr::EmbeddingGrad { .. }
            | Instr::CrossEntropy { .. }
            | Instr::CrossEntropyGrad { .. }
            | Instr::Scale { .. }
            | Instr::Broadcast { .. }
            | Instr::SumTo { .. }
            | Instr::Cast { .. }
            | Instr::Mse { .. }
            | Instr::MseGrad { .. }
            | Instr::AlibiBias { .. }
            | Instr::LrSchedule { .. }
            | Instr::GradScale { .. }
            | Instr::LossScaleUpdate { .. }
    )
}

/// Whether an output of `instr` may overlap an operand: the scalar kernels
/// read every operand before writing (one thread), and an elementwise
/// kernel's output may be an operand itself, element for element (the
/// same buffer, not broadcast), each element read before it is written.
fn may_overlap<K>(instr: &Instr<K>, read: &Buf, written: &Buf) -> bool {
    match instr {
        Instr::LrSchedule { .. } | Instr::GradScale { .. } | Instr::LossScaleUpdate { .. } => true,
        Instr::Broadcast { .. } | Instr::Cast { .. } | Instr::AlibiBias { .. } => read == written,
        _ => false,
    }
}

/// Why the kernels cannot run `instr` as the host routine would, if they
/// cannot: a buffer off the device (offloaded), an output overlapping an
/// operand, or dtypes the kernels do not take.
pub fn supported<K: Clone>(instr: &Instr<K>) -> Result<(), String> {
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    instr.clone().for_each_buf(|b, access| if access == Access::Write { writes.push(*b) } else { reads.push(*b) });
    if reads.iter().chain(&writes).any(|b| b.place != Place::Device) {
        return Err("a buffer on the host (offloaded)".into());
    }
    if reads.iter().any(|r| writes.iter().any(|w| w.overlaps(r) && !may_overlap(instr, r, w))) {
        return Err("an output overlapping an operand".into());
    }
    let float = |b: &Buf| b.dtype.is_float();
    let int = |b: &Buf| b.dtype.is_int();
    let ok = match instr {
        Instr::Fill { .. } | Instr::Arange { .. } => true,
        Instr::Transpose { x, out, .. } | Instr::Slice { x, out, .. } => x.dtype == out.dtype,
        Instr::SliceGrad { dy, out, .. } => dy.dtype == out.dtype,
        Instr::Split { x, outs, .. } => outs.iter().all(|o| o.dtype == x.dtype),
        Instr::Concat { parts, out, .. } => parts.iter().all(|p| p.dtype == out.dtype),
        Instr::Flatten { parts, out } => {
            float(out)
                && parts.iter().all(|p| p.dtype == out.dtype)
                && parts.iter().map(|p| p.len).sum::<usize>() <= out.len
        }
        Instr::Embedding { table, ids, out, .. } => float(table) && table.dtype == out.dtype && int(ids),
        Instr::EmbeddingGrad { dy, ids, out, .. } => {
            float(dy) && float(out) && int(ids) && i32::try_from(ids.len).is_ok()
        }
        Instr::CrossEntropy { logits, labels, out, .. } => {
            float(logits) && int(labels) && out.dtype == DType::F32 && out.len == 1
        }
        Instr::CrossEntropyGrad { logits, labels, dloss, out, .. } => {
            float(logits) && int(labels) && float(dloss) && float(out)
        }
        Instr::Scale { x, out, .. } => float(x) && float(out),
        Instr::Broadcast { a, a_shape, b, b_shape, shape, out, .. } => {
            let count = |s: &[usize]| s.iter().product::<usize>();
            [a, b, out].into_iter().all(float)
                && (a.len, b.len, out.len) == (count(a_shape), count(b_shape), count(shape))
        }
        Instr::SumTo { x, x_shape, shape, out } => {
            float(x)
                && float(out)
                && x.len == x_shape.iter().product::<usize>()
                && out.len == shape.iter().product::<usize>()
        }
        Instr::Cast { x, out } => x.len == out.len,
        Instr::Mse { p, t, out } => float(p) && float(t) && float(out) && p.len == t.len && out.len == 1,
        Instr::MseGrad { p, t, dloss, out } => {
            [p, t, dloss, out].into_iter().all(float) && p.len == t.len && p.len == out.len && dloss.len >= 1
        }
        Instr::AlibiBias { x, shape, slopes, out } => {
            float(x)
                && float(out)
                && x.len == shape.iter().product::<usize>()
                && out.len == x.len
                && slopes.len() == shape[1]
                && slopes.len() <= MAX_HEADS
        }
        Instr::LrSchedule { step, out, .. } => step.len >= 1 && out.len == 1,
        Instr::GradScale { sq, scale, multiplier, finite, .. } => {
            sq.len >= 1 && scale.len >= 1 && multiplier.len == 1 && finite.len == 1
        }
        Instr::LossScaleUpdate { scale, good, finite, outs, .. } => {
            scale.len >= 1 && good.len >= 1 && finite.len >= 1 && outs.iter().all(|o| o.len == 1)
        }
        _ => false,
    };
    if ok { Ok(()) } else { Err("dtypes the kernels do not take".into()) }
}

/// Plans one instruction for a device: `ptr` gives each buffer's address.
struct Planner<'p> {
    ptr: &'p dyn Fn(&Buf) -> u64,
    device: &'p DeviceProperties,
    plan: Plan,
}

/// The launches that run `instr` ([`supported`]) with its buffers at the
/// addresses `ptr` gives, on `device`; `Err` says why it stays staged.
pub fn plan<K>(instr: &Instr<K>, ptr: &dyn Fn(&Buf) -> u64, device: &DeviceProperties) -> Result<Plan, String> {
    let mut p = Planner { ptr, device, plan: Plan::default() };
    p.instr(instr)?;
    Ok(p.plan)
}

impl Planner<'_> {
    fn ptr(&self, b: &Buf) -> u64 {
        (self.ptr)(b)
    }

    fn launch(&mut self, routine: Routine, kernel: usize, grid: u32, args: Vec<Arg>) {
        self.plan.ops.push(Op::Launch(Launch { routine, kernel, grid, args }));
    }

    fn scratch(&mut self, bytes: usize) {
        self.plan.scratch_bytes = self.plan.scratch_bytes.max(bytes);
    }

    /// `bytes` at `at` set to `pattern` (one element's bytes), in the widest
    /// unit of whole elements the address and length allow.
    fn fill(&mut self, at: u64, bytes: usize, pattern: &[u8]) -> Result<(), String> {
        if bytes == 0 {
            return Ok(());
        }
        let unit = [16usize, 8, 4, 2, 1]
            .into_iter()
            .find(|&u| u >= pattern.len() && bytes.is_multiple_of(u) && at.is_multiple_of(u as u64))
            .ok_or_else(|| format!("a fill at {at:#x} of {bytes} bytes, not aligned to its elements"))?;
        let mut words = [0u8; 16];
        for (i, w) in words.iter_mut().enumerate() {
            *w = pattern[i % pattern.len()];
        }
        let word = |half: &[u8]| u64::from_le_bytes(half.try_into().expect("8 bytes"));
        let n = (bytes / unit) as u64;
        let args = vec![Arg::Ptr(at), Arg::I64(n as i64), Arg::U64(word(&words[..8])), Arg::U64(word(&words[8..]))];
        self.launch(Routine::Fill { unit: unit as u32 }, 0, grid_for(n, self.device), args);
        Ok(())
    }

    /// `piece` copied from the buffer at `src` to the one at `dst`.
    fn piece(&mut self, piece: &Piece, elem: u32, src: u64, dst: u64) -> Result<(), String> {
        let (from, to) = (src + piece.src as u64, dst + piece.dst as u64);
        if let Some(c) = layout::copy(&piece.axes, elem, from, to)? {
            let grid = grid_for(c.dims.count as u64, self.device);
            self.launch(
                Routine::Layout { unit: c.unit },
                0,
                grid,
                vec![Arg::Ptr(from), Arg::Ptr(to), Arg::Strided(c.dims)],
            );
        }
        Ok(())
    }

    fn instr<K>(&mut self, instr: &Instr<K>) -> Result<(), String> {
        let elem = |b: &Buf| b.dtype.size_bytes() as u32;
        match instr {
            Instr::Fill { value, out } => {
                let bytes = host_fill(*out, *value)?;
                self.fill(self.ptr(out), out.bytes(), &bytes)?;
            }
            Instr::Arange { out } => {
                let args = vec![Arg::Ptr(self.ptr(out)), Arg::I64(out.len as i64)];
                self.launch(Routine::Arange { out: out.dtype }, 0, grid_for(out.len as u64, self.device), args);
            }
            Instr::Transpose { x, shape, perm, out } => {
                let (src, dst) = (self.ptr(x), self.ptr(out));
                match layout::transpose(shape, perm, elem(x), src, dst)? {
                    None => {}
                    Some(Transpose::Copy(c)) => {
                        let grid = grid_for(c.dims.count as u64, self.device);
                        let args = vec![Arg::Ptr(src), Arg::Ptr(dst), Arg::Strided(c.dims)];
                        self.launch(Routine::Layout { unit: c.unit }, 0, grid, args);
                    }
                    Some(Transpose::Tiled(t)) => {
                        let tiles = t.batches as u64 * (t.rows as u64).div_ceil(32) * (t.cols as u64).div_ceil(32);
                        let args = vec![Arg::Ptr(src), Arg::Ptr(dst), Arg::Tiled(t)];
                        self.launch(Routine::Layout { unit: elem(x) }, 1, grid(tiles, self.device), args);
                    }
                }
            }
            Instr::Slice { x, shape, axis, start, len, out } => {
                let piece = layout::slice(shape, *axis, *start, *len, elem(x));
                self.piece(&piece, elem(x), self.ptr(x), self.ptr(out))?;
            }
            Instr::SliceGrad { dy, shape, axis, start, axis_len, out } => {
                self.fill(self.ptr(out), out.bytes(), &[0])?;
                let piece = layout::slice_grad(shape, *axis, *start, *axis_len, elem(dy));
                self.piece(&piece, elem(dy), self.ptr(dy), self.ptr(out))?;
            }
            Instr::Split { x, shape, axis, sizes, outs } => {
                for (piece, out) in layout::split(shape, *axis, sizes, elem(x)).iter().zip(outs) {
                    self.piece(piece, elem(x), self.ptr(x), self.ptr(out))?;
                }
            }
            Instr::Concat { parts, shapes, axis, out } => {
                for (piece, part) in layout::concat(shapes, *axis, elem(out)).iter().zip(parts) {
                    self.piece(piece, elem(out), self.ptr(part), self.ptr(out))?;
                }
            }
            Instr::Flatten { parts, out } => {
                let start = self.ptr(out);
                let mut at = start;
                for p in parts.iter().filter(|p| p.len > 0) {
                    self.plan.ops.push(Op::Memcpy { from: self.ptr(p), to: at, bytes: p.bytes() });
                    at += p.bytes() as u64;
                }
                self.fill(at, out.bytes() - (at - start) as usize, &[0])?;
            }
            Instr::Embedding { table, ids, width, out } => self.embedding(*table, *ids, *width, *out),
            Instr::EmbeddingGrad { dy, ids, width, out } => self.embedding_grad(*dy, *ids, *width, *out)?,
            Instr::CrossEntropy { logits, labels, classes, ignore_index, out } => {
                let rows = labels.len as u64;
                self.scratch(labels.len * 8);
                let r = Routine::CrossEntropy { logits: logits.dtype, labels: labels.dtype };
                let shape = [Arg::I64(rows as i64), Arg::I64(*classes as i64), Arg::I64(*ignore_index)];
                let mut args = vec![Arg::Ptr(self.ptr(logits)), Arg::Ptr(self.ptr(labels))];
                args.extend(shape);
                args.push(Arg::Scratch(0));
                self.launch(r, 0, grid(rows, self.device), args);
                let mut args = vec![Arg::Scratch(0), Arg::Ptr(self.ptr(labels))];
                args.extend(shape);
                args.push(Arg::Ptr(self.ptr(out)));
                self.launch(r, 1, 1, args);
            }
            Instr::CrossEntropyGrad { logits, labels, dloss, classes, ignore_index, out } => {
                let rows = labels.len as u64;
                self.scratch(8);
                let r = Routine::CrossEntropyGrad {
                    logits: logits.dtype,
                    labels: labels.dtype,
                    dloss: dloss.dtype,
                    out: out.dtype,
                };
                let shape = [Arg::I64(rows as i64), Arg::I64(*classes as i64), Arg::I64(*ignore_index)];
                let mut args = vec![Arg::Ptr(self.ptr(labels))];
                args.extend(shape);
                args.push(Arg::Scratch(0));
                self.launch(r, 0, 1, args);
                let mut args = vec![Arg::Ptr(self.ptr(logits)), Arg::Ptr(self.ptr(labels)), Arg::Ptr(self.ptr(dloss))];
                args.push(Arg::Scratch(0));
                args.extend(shape);
                args.push(Arg::Ptr(self.ptr(out)));
                self.launch(r, 1, grid(rows, self.device), args);
            }
            Instr::Scale { x, factor, out } => {
                let args =
                    vec![Arg::Ptr(self.ptr(x)), Arg::I64(x.len as i64), Arg::F64(*factor), Arg::Ptr(self.ptr(out))];
                let r = Routine::Scale { x: x.dtype, out: out.dtype };
                self.launch(r, 0, grid_for(x.len as u64, self.device), args);
            }
            Instr::Broadcast { op, a, a_shape, b, b_shape, shape, out } => {
                let elems = [a, b, out].map(|x| u64::from(elem(x)));
                let ptrs = [a, b, out].map(|x| self.ptr(x));
                if let Some(p) = arith::broadcast(a_shape, b_shape, shape, elems, ptrs)? {
                    let r = Routine::Broadcast { a: a.dtype, b: b.dtype, out: out.dtype };
                    let op = match op {
                        Arith::Add => 0,
                        Arith::Sub => 1,
                        Arith::Mul => 2,
                    };
                    let args = vec![
                        Arg::Ptr(ptrs[0]),
                        Arg::Ptr(ptrs[1]),
                        Arg::Ptr(ptrs[2]),
                        Arg::Strided(p.dims),
                        Arg::I64(op),
                    ];
                    self.launch(r, usize::from(p.vec4), grid_for(p.dims.count as u64, self.device), args);
                }
            }
            Instr::SumTo { x, x_shape, shape, out } => self.sum_to(*x, x_shape, shape, *out)?,
            Instr::Cast { x, out } => {
                let args = vec![Arg::Ptr(self.ptr(x)), Arg::I64(x.len as i64), Arg::Ptr(self.ptr(out))];
                let r = Routine::Cast { x: x.dtype, out: out.dtype };
                self.launch(r, 0, grid_for(x.len as u64, self.device), args);
            }
            Instr::Mse { p, t, out } => {
                let r = Routine::Mse { p: p.dtype, t: t.dtype, out: out.dtype };
                let blocks = grid_for(p.len as u64, self.device);
                self.scratch(blocks as usize * 8);
                let args = vec![Arg::Ptr(self.ptr(p)), Arg::Ptr(self.ptr(t)), Arg::I64(p.len as i64), Arg::Scratch(0)];
                self.launch(r, 0, blocks, args);
                let args =
                    vec![Arg::Scratch(0), Arg::I64(i64::from(blocks)), Arg::I64(p.len as i64), Arg::Ptr(self.ptr(out))];
                self.launch(r, 1, 1, args);
            }
            Instr::MseGrad { p, t, dloss, out } => {
                let r = Routine::MseGrad { p: p.dtype, t: t.dtype, dloss: dloss.dtype, out: out.dtype };
                let args = vec![
                    Arg::Ptr(self.ptr(p)),
                    Arg::Ptr(self.ptr(t)),
                    Arg::Ptr(self.ptr(dloss)),
                    Arg::I64(p.len as i64),
                    Arg::Ptr(self.ptr(out)),
                ];
                self.launch(r, 0, grid_for(p.len as u64, self.device), args);
            }
            Instr::AlibiBias { x, shape, slopes, out } => {
                let m = Slopes::new(slopes).ok_or_else(|| format!("{} heads, over {MAX_HEADS}", slopes.len()))?;
                let [_, heads, sq, sk] = shape.map(|d| d as i64);
                let args = vec![
                    Arg::Ptr(self.ptr(x)),
                    Arg::I64(heads),
                    Arg::I64(sq),
                    Arg::I64(sk),
                    Arg::I64(x.len as i64),
                    Arg::Slopes(m),
                    Arg::Ptr(self.ptr(out)),
                ];
                let r = Routine::AlibiBias { x: x.dtype, out: out.dtype };
                self.launch(r, 0, grid_for(x.len as u64, self.device), args);
            }
            Instr::LrSchedule { step, peak, warmup_steps, total_steps, out } => {
                let mut args = self.scalar(step).to_vec();
                args.extend([Arg::F64(*peak), Arg::U64(*warmup_steps)]);
                args.extend([Arg::I64(i64::from(total_steps.is_some())), Arg::U64(total_steps.unwrap_or(0))]);
                args.extend(self.scalar(out));
                self.launch(Routine::Scalars, 0, 1, args);
            }
            Instr::GradScale { sq, scale, max_norm, micro_batches, multiplier, finite } => {
                let mut args = self.scalar(sq).to_vec();
                args.extend(self.scalar(scale));
                args.extend([Arg::I64(i64::from(max_norm.is_some())), Arg::F64(max_norm.unwrap_or(0.0))]);
                args.push(Arg::U64(*micro_batches));
                args.extend(self.scalar(multiplier));
                args.extend(self.scalar(finite));
                self.launch(Routine::Scalars, 1, 1, args);
            }
            Instr::LossScaleUpdate { scale, good, finite, interval, growth, backoff, outs } => {
                let mut args = self.scalar(scale).to_vec();
                args.extend(self.scalar(good));
                args.extend(self.scalar(finite));
                args.extend([Arg::U64(*interval), Arg::F64(*growth), Arg::F64(*backoff)]);
                args.extend(self.scalar(&outs[0]));
                args.extend(self.scalar(&outs[1]));
                self.launch(Routine::Scalars, 2, 1, args);
            }
            other => return Err(format!("{} has no kernel", other.name())),
        }
        Ok(())
    }

    /// A scalar operand of `Routine::Scalars`: its address and dtype's code.
    fn scalar(&self, b: &Buf) -> [Arg; 2] {
        [Arg::Ptr(self.ptr(b)), Arg::I64(dtype_code(b.dtype))]
    }

    /// The sums, from one kernel or, cut into chunks, two; zeros for an empty x.
    fn sum_to(&mut self, x: Buf, x_shape: &[usize], shape: &[usize], out: Buf) -> Result<(), String> {
        let Some(p) = arith::sum_to(x_shape, shape, self.device.multiprocessors)? else {
            return self.fill(self.ptr(&out), out.bytes(), &[0]);
        };
        let r = Routine::SumTo { x: x.dtype, out: out.dtype };
        let (outputs, o) = (p.keep.count, self.ptr(&out));
        if p.chunks > 1 {
            self.scratch(p.chunks as usize * outputs as usize * 8);
        }
        let args = vec![
            Arg::Ptr(self.ptr(&x)),
            Arg::Strided(p.keep),
            Arg::Strided(p.reduce),
            Arg::I64(p.chunks as i64),
            Arg::I64(p.per as i64),
            Arg::Scratch(0),
            Arg::Ptr(o),
        ];
        let work = outputs as u64 * p.chunks;
        if p.rows {
            self.launch(r, 0, grid(work, self.device), args);
        } else {
            self.launch(r, 1, grid_for(work, self.device), args);
        }
        if p.chunks > 1 {
            let args = vec![Arg::Scratch(0), Arg::I64(outputs), Arg::I64(p.chunks as i64), Arg::Ptr(o)];
            self.launch(r, 2, grid((outputs as u64).div_ceil(32), self.device), args);
        }
        Ok(())
    }

    /// The gather, in the widest unit the row width and pointers allow.
    fn embedding(&mut self, table: Buf, ids: Buf, width: usize, out: Buf) {
        let e = table.dtype.size_bytes() as usize;
        if width == 0 || ids.len == 0 {
            return;
        }
        let (t, o) = (self.ptr(&table), self.ptr(&out));
        let row = width * e;
        let unit = [16usize, 8, 4, 2]
            .into_iter()
            .find(|&u| u > e && row.is_multiple_of(u) && t.is_multiple_of(u as u64) && o.is_multiple_of(u as u64))
            .unwrap_or(e);
        let units = (row / unit) as i64;
        let args = vec![
            Arg::Ptr(t),
            Arg::Ptr(self.ptr(&ids)),
            Arg::I64(ids.len as i64),
            Arg::I64((table.len / width) as i64),
            Arg::I64(units),
            Arg::Ptr(o),
        ];
        let grid = grid_for(ids.len as u64 * units as u64, self.device);
        self.launch(Routine::Embedding { unit: unit as u32, ids: ids.dtype }, 0, grid, args);
    }

    /// The table zeroed, then the positions sorted by id (`rank`, `count`,
    /// `head`, `offset` and `order`, `n` ints each, in the partials) and
    /// each named row summed over its list of positions.
    fn embedding_grad(&mut self, dy: Buf, ids: Buf, width: usize, out: Buf) -> Result<(), String> {
        self.fill(self.ptr(&out), out.bytes(), &[0])?;
        if width == 0 || ids.len == 0 {
            return Ok(());
        }
        let n = ids.len as u64;
        let ints = (n * 4).next_multiple_of(8);
        let [rank, count, head, offset, order] = [0, 1, 2, 3, 4].map(|k| Arg::Scratch(k * ints));
        self.scratch((5 * ints) as usize);
        let r = Routine::EmbeddingGrad { dy: dy.dtype, ids: ids.dtype, out: out.dtype };
        let pids = self.ptr(&ids);
        let (len, rows) = (Arg::I64(n as i64), Arg::I64((out.len / width) as i64));
        let args = vec![Arg::Ptr(pids), len, rows, rank, count, head];
        self.launch(r, 0, grid_for(n, self.device), args);
        self.launch(r, 1, 1, vec![rank, count, len, offset]);
        let args = vec![rank, head, offset, len, order];
        self.launch(r, 2, grid_for(n, self.device), args);
        let groups = width.div_ceil(32) as u64;
        let args = vec![
            Arg::Ptr(self.ptr(&dy)),
            Arg::Ptr(pids),
            rank,
            count,
            offset,
            order,
            len,
            Arg::I64(width as i64),
            Arg::Ptr(self.ptr(&out)),
        ];
        self.launch(r, 3, grid(n * groups, self.device), args);
        Ok(())
    }
}

/// A dtype as `scalars.cu` names it at run time.
pub fn dtype_code(dtype: DType) -> i64 {
    match dtype {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
        DType::I32 => 3,
        DType::I64 => 4,
    }
}

/// One element of `out`'s dtype holding `value`, as the host routine writes it.
pub fn host_fill(out: Buf, value: f64) -> Result<Vec<u8>, String> {
    let one = Buf { place: Place::Host, offset: 0, len: 1, ..out };
    let scratch = Memory { device: Arena::new(0)?, host: Arena::new(one.bytes())?, nvme: None };
    host::fill(&scratch, one, value);
    // SAFETY: `one` lies at the start of the scratch arena, `bytes()` long.
    Ok(unsafe { std::slice::from_raw_parts(scratch.ptr(one), one.bytes()) }.to_vec())
}
