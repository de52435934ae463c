//! The layout routines planned on the host: each becomes launches of
//! `layout.cu`'s two kernels over a few merged axes.
//!
//! A transpose, slice, slice gradient, split or concat is a copy over an
//! index space whose axes have a stride in the source and one in the
//! destination ([`Axis`]). Axes of length 1 are dropped and neighbours that
//! are contiguous on both sides merged, so a slice of the middle axis is two
//! axes and a head split is three, and the innermost run, where contiguous
//! on both sides, is copied in units of up to 16 bytes (every stride and both
//! addresses divisible by the unit). A transpose that moves the input's last
//! axis cannot be a run copy: it is tiled through shared memory instead
//! ([`Transpose::Tiled`]).

use cudarc::driver::DeviceRepr;

/// The most axes a copy may keep after merging (`ZP_MAX_DIMS`).
pub const MAX_DIMS: usize = 8;

/// A copy's index space as the kernels take it (`ZpStrided`): strides in units.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    /// Each axis's length, outermost first.
    pub size: [i64; MAX_DIMS],
    /// Each axis's stride in the source.
    pub src: [i64; MAX_DIMS],
    /// Each axis's stride in the destination.
    pub dst: [i64; MAX_DIMS],
    /// Units copied: the lengths' product.
    pub count: i64,
    /// Axes used.
    pub rank: i32,
    /// Keeps the C layout's size a multiple of 8.
    pub pad: i32,
}

// SAFETY: plain integers, laid out as the kernels' `ZpStrided`.
unsafe impl DeviceRepr for Strided {}

/// A tiled transpose as the kernel takes it (`ZpTiled`): strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiled {
    /// The length of the input axis that is the output's last.
    pub rows: i64,
    /// The length of the input's last axis.
    pub cols: i64,
    /// The input stride of a row.
    pub src_row: i64,
    /// The output stride of a column.
    pub dst_col: i64,
    /// The other axes' lengths' product.
    pub batches: i64,
    /// The other axes' lengths, outermost first.
    pub size: [i64; MAX_DIMS],
    /// Their strides in the input.
    pub src: [i64; MAX_DIMS],
    /// Their strides in the output.
    pub dst: [i64; MAX_DIMS],
    /// Other axes used.
    pub rank: i32,
    /// Keeps the C layout's size a multiple of 8.
    pub pad: i32,
}

// SAFETY: plain integers, laid out as the kernels' `ZpTiled`.
unsafe impl DeviceRepr for Tiled {}

/// One axis of a copy: its length, and its strides in elements in the
/// source and the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Axis {
    /// Its length.
    pub size: usize,
    /// Its stride in the source.
    pub src: usize,
    /// Its stride in the destination.
    pub dst: usize,
}

/// One launch of the copy kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy {
    /// Bytes per unit.
    pub unit: u32,
    /// The index space, in units.
    pub dims: Strided,
}

/// How a transpose runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transpose {
    /// The input's last axis stays last: a copy of runs.
    Copy(Copy),
    /// It moves: tiles through shared memory, of one element per unit.
    Tiled(Tiled),
}

/// One part of a cut or a join: where it starts in the source and in the
/// destination (bytes from each buffer's start), and its axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Its first byte in the source buffer.
    pub src: usize,
    /// Its first byte in the destination buffer.
    pub dst: usize,
    /// Its axes, strides in elements.
    pub axes: Vec<Axis>,
}

/// `axes` without length-1 axes, neighbours contiguous on both sides merged.
pub(super) fn merge(axes: &[Axis]) -> Vec<Axis> {
    let mut out: Vec<Axis> = Vec::new();
    for a in axes.iter().filter(|a| a.size != 1) {
        match out.last_mut() {
            Some(p) if p.src == a.size * a.src && p.dst == a.size * a.dst => {
                *p = Axis { size: p.size * a.size, src: a.src, dst: a.dst };
            }
            _ => out.push(*a),
        }
    }
    out
}

fn too_many(rank: usize) -> String {
    format!("a layout copy of {rank} axes after merging, over the kernels' {MAX_DIMS}")
}

/// Up to [`MAX_DIMS`] values, the rest 0.
/// The kernels' index space over merged `axes`.
pub(super) fn strided(axes: &[Axis]) -> Strided {
    Strided {
        size: padded(axes.iter().map(|a| a.size)),
        src: padded(axes.iter().map(|a| a.src)),
        dst: padded(axes.iter().map(|a| a.dst)),
        count: axes.iter().map(|a| a.size as i64).product(),
        rank: axes.len() as i32,
        pad: 0,
    }
}

pub(super) fn padded(values: impl Iterator<Item = usize>) -> [i64; MAX_DIMS] {
    let mut out = [0; MAX_DIMS];
    for (o, v) in out.iter_mut().zip(values) {
        *o = v as i64;
    }
    out
}

/// The copy of `axes` (elements of `elem` bytes) from address `src` to
/// `dst`; `None` when there is nothing to copy.
pub fn copy(axes: &[Axis], elem: u32, src: u64, dst: u64) -> Result<Option<Copy>, String> {
    if axes.iter().any(|a| a.size == 0) {
        return Ok(None);
    }
    let mut axes = merge(axes);
    if axes.is_empty() {
        axes.push(Axis { size: 1, src: 1, dst: 1 });
    }
    if axes.len() > MAX_DIMS {
        return Err(too_many(axes.len()));
    }
    let e = elem as usize;
    let inner = axes.len() - 1;
    let (outer, last) = axes.split_at_mut(inner);
    let last = &mut last[0];
    let mut unit = e;
    if last.src == 1 && last.dst == 1 {
        let fits = |u: usize| {
            let divides = |bytes: usize| bytes.is_multiple_of(u);
            divides(last.size * e)
                && src.is_multiple_of(u as u64)
                && dst.is_multiple_of(u as u64)
                && outer.iter().all(|a| divides(a.src * e) && divides(a.dst * e))
        };
        unit = [16, 8, 4, 2].into_iter().find(|&u| u > e && fits(u)).unwrap_or(e);
        let f = unit / e;
        last.size /= f;
        for a in outer.iter_mut() {
            a.src /= f;
            a.dst /= f;
        }
    }
    let dims = strided(&axes);
    Ok(Some(Copy { unit: unit as u32, dims }))
}

/// Row-major strides of `shape`, in elements.
pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// The transpose of a `shape` tensor by `perm` (output axis `d` is input
/// axis `perm[d]`) from address `src` to `dst`; `None` when empty.
pub fn transpose(shape: &[usize], perm: &[usize], elem: u32, src: u64, dst: u64) -> Result<Option<Transpose>, String> {
    let (ins, outs) = (strides(shape), strides(&perm.iter().map(|&p| shape[p]).collect::<Vec<_>>()));
    let axes: Vec<Axis> = perm.iter().zip(&outs).map(|(&p, &o)| Axis { size: shape[p], src: ins[p], dst: o }).collect();
    if axes.iter().any(|a| a.size == 0) {
        return Ok(None);
    }
    let merged = merge(&axes);
    // The output is contiguous: its last merged axis has destination stride 1.
    let Some(last) = merged.last().filter(|a| a.src != 1) else {
        return Ok(copy(&merged, elem, src, dst)?.map(Transpose::Copy));
    };
    let col = merged.iter().position(|a| a.src == 1).expect("the input's innermost axis has stride 1");
    let batch: Vec<Axis> =
        merged[..merged.len() - 1].iter().enumerate().filter(|&(d, _)| d != col).map(|(_, a)| *a).collect();
    if batch.len() > MAX_DIMS {
        return Err(too_many(batch.len() + 2));
    }
    Ok(Some(Transpose::Tiled(Tiled {
        rows: last.size as i64,
        cols: merged[col].size as i64,
        src_row: last.src as i64,
        dst_col: merged[col].dst as i64,
        batches: batch.iter().map(|a| a.size as i64).product(),
        size: padded(batch.iter().map(|a| a.size)),
        src: padded(batch.iter().map(|a| a.src)),
        dst: padded(batch.iter().map(|a| a.dst)),
        rank: batch.len() as i32,
        pad: 0,
    })))
}

/// `[outer, axis, inner]` of `shape` around `axis`.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

/// `[start, start + len)` of `axis` of a `shape` tensor.
pub fn slice(shape: &[usize], axis: usize, start: usize, len: usize, elem: u32) -> Piece {
    let (outer, n, inner) = around(shape, axis);
    let axes = vec![Axis { size: outer, src: n * inner, dst: len * inner }, Axis { size: len * inner, src: 1, dst: 1 }];
    Piece { src: start * inner * elem as usize, dst: 0, axes }
}

/// A `shape` gradient placed at `start` of `axis` (of `axis_len`) in the
/// output; the rest of the output is zeroed apart.
pub fn slice_grad(shape: &[usize], axis: usize, start: usize, axis_len: usize, elem: u32) -> Piece {
    let (outer, len, inner) = around(shape, axis);
    let axes =
        vec![Axis { size: outer, src: len * inner, dst: axis_len * inner }, Axis { size: len * inner, src: 1, dst: 1 }];
    Piece { src: 0, dst: start * inner * elem as usize, axes }
}

/// The pieces of a `shape` tensor cut along `axis` into `sizes`, one per output.
pub fn split(shape: &[usize], axis: usize, sizes: &[usize], elem: u32) -> Vec<Piece> {
    let (outer, n, inner) = around(shape, axis);
    let mut at = 0;
    sizes
        .iter()
        .map(|&k| {
            let axes =
                vec![Axis { size: outer, src: n * inner, dst: k * inner }, Axis { size: k * inner, src: 1, dst: 1 }];
            let piece = Piece { src: at * inner * elem as usize, dst: 0, axes };
            at += k;
            piece
        })
        .collect()
}

/// The pieces of parts of `shapes` joined along `axis`, one per part.
pub fn concat(shapes: &[Vec<usize>], axis: usize, elem: u32) -> Vec<Piece> {
    let total: usize = shapes.iter().map(|s| s[axis]).sum();
    let mut at = 0;
    shapes
        .iter()
        .map(|s| {
            let (outer, k, inner) = around(s, axis);
            let axes = vec![
                Axis { size: outer, src: k * inner, dst: total * inner },
                Axis { size: k * inner, src: 1, dst: 1 },
            ];
            let piece = Piece { src: 0, dst: at * inner * elem as usize, axes };
            at += k;
            piece
        })
        .collect()
}
