//! Broadcast arithmetic and its adjoint `sum_to` planned on the host: the
//! index spaces `broadcast.cu` and `sum_to.cu` walk, over merged axes.
//!
//! Both are NumPy broadcasting (shapes aligned to the right, a length-1 axis
//! repeated), so an operand's stride along a repeated axis is 0. Axes of
//! length 1 are dropped and neighbours contiguous in every operand merged
//! (`layout::merge`): a scalar added to a matrix is one axis, a bias over
//! `[B, S, H]` two. A broadcast whose innermost axis is a contiguous run of
//! fours (or repeats one value) with aligned pointers runs four outputs per
//! thread ([`Broadcast::vec4`]). A sum whose summed elements are x's
//! innermost, contiguous run takes a block per output; one that keeps that
//! axis a thread per output, so neighbouring threads read neighbouring
//! elements; either cuts long sums into chunks ([`SumTo::chunks`]) to fill
//! the GPU, added in a fixed order by a second kernel.

use super::layout::{Axis, MAX_DIMS, Strided, merge, strided, strides};

/// A broadcast's index space over the output (`src`: a's strides, `dst`:
/// b's), in elements, or in fours along the innermost axis when `vec4`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Broadcast {
    /// The index space.
    pub dims: Strided,
    /// Whether each index is four consecutive outputs.
    pub vec4: bool,
}

/// A sum's index spaces, in elements of x.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SumTo {
    /// Over the outputs, row-major: `src` each one's first summand in x.
    pub keep: Strided,
    /// Over one output's summands: `src` their strides in x.
    pub reduce: Strided,
    /// Whether x's innermost axis is summed (`rows`) or kept (`cols`).
    pub rows: bool,
    /// The runs each output's summands are cut into.
    pub chunks: u64,
    /// Summands per run (the last run may be shorter).
    pub per: u64,
}

fn too_many(what: &str, rank: usize) -> String {
    format!("a {what} of {rank} axes after merging, over the kernels' {MAX_DIMS}")
}

/// `shape`'s strides when broadcast to `out` rank: 0 along its length-1
/// axes and the axes it lacks.
fn broadcast_strides(shape: &[usize], rank: usize) -> Vec<usize> {
    let own = strides(shape);
    let pad = rank - shape.len();
    (0..rank).map(|d| if d < pad || shape[d - pad] == 1 { 0 } else { own[d - pad] }).collect()
}

/// `a ∘ b` into a `shape` output; `elems` the bytes of an element of a, b
/// and the output and `ptrs` their addresses. `None` when the output is empty.
pub fn broadcast(
    a_shape: &[usize],
    b_shape: &[usize],
    shape: &[usize],
    elems: [u64; 3],
    ptrs: [u64; 3],
) -> Result<Option<Broadcast>, String> {
    if shape.contains(&0) {
        return Ok(None);
    }
    let rank = shape.len();
    if a_shape.len() > rank || b_shape.len() > rank {
        return Err(format!("operands {a_shape:?} and {b_shape:?} of more axes than the output {shape:?}"));
    }
    let (sa, sb) = (broadcast_strides(a_shape, rank), broadcast_strides(b_shape, rank));
    let axes: Vec<Axis> = (0..rank).map(|d| Axis { size: shape[d], src: sa[d], dst: sb[d] }).collect();
    let mut axes = merge(&axes);
    if axes.is_empty() {
        axes.push(Axis { size: 1, src: 0, dst: 0 });
    }
    if axes.len() > MAX_DIMS {
        return Err(too_many("broadcast", axes.len()));
    }
    let (outer, last) = axes.split_at(axes.len() - 1);
    let last = last[0];
    let operand_fits = |inner: usize, at: u64, elem: u64, stride_of: fn(&Axis) -> usize| {
        inner == 0
            || (inner == 1 && at.is_multiple_of(4 * elem) && outer.iter().all(|a| stride_of(a).is_multiple_of(4)))
    };
    let vec4 = last.size.is_multiple_of(4)
        && ptrs[2].is_multiple_of(4 * elems[2])
        && operand_fits(last.src, ptrs[0], elems[0], |a| a.src)
        && operand_fits(last.dst, ptrs[1], elems[1], |a| a.dst);
    if vec4 {
        let n = axes.len() - 1;
        axes[n] = Axis { size: last.size / 4, src: last.src * 4, dst: last.dst * 4 };
    }
    Ok(Some(Broadcast { dims: strided(&axes), vec4 }))
}

/// Threads a sum aims to keep busy per multiprocessor (a Hopper SM's whole
/// occupancy); blocks of `rows` count as [`super::BLOCKS_PER_SM`].
const THREADS_PER_SM: u64 = 2048;
/// The fewest summands a chunk of `rows` takes: shorter runs would spend
/// more on the second kernel's partials than they save.
const MIN_ROW_CHUNK: u64 = 4096;
/// The fewest summands a chunk of `cols` takes (one thread sums a chunk).
const MIN_COL_CHUNK: u64 = 8;

/// x (`x_shape`) summed down to `shape` on a GPU of `multiprocessors`;
/// `None` when there is no output. An x with no element writes zeros, which
/// the caller fills.
pub fn sum_to(x_shape: &[usize], shape: &[usize], multiprocessors: u32) -> Result<Option<SumTo>, String> {
    let outputs: usize = shape.iter().product();
    if outputs == 0 || x_shape.contains(&0) {
        return Ok(None);
    }
    let rank = x_shape.len();
    if shape.len() > rank {
        return Err(format!("a sum from {x_shape:?} to {shape:?}, of more axes"));
    }
    let (xs, os) = (strides(x_shape), broadcast_strides(shape, rank));
    let (mut keep, mut reduce) = (Vec::new(), Vec::new());
    for d in 0..rank {
        if os[d] == 0 {
            reduce.push(Axis { size: x_shape[d], src: xs[d], dst: 0 });
        } else {
            keep.push(Axis { size: x_shape[d], src: xs[d], dst: os[d] });
        }
    }
    let rows = reduce.iter().any(|a| a.src == 1 && a.size > 1);
    let (mut keep, mut reduce) = (merge(&keep), merge(&reduce));
    for (what, axes) in [("sum's outputs", &mut keep), ("sum's summands", &mut reduce)] {
        if axes.is_empty() {
            axes.push(Axis { size: 1, src: 0, dst: 0 });
        }
        if axes.len() > MAX_DIMS {
            return Err(too_many(what, axes.len()));
        }
    }
    let (keep, reduce) = (strided(&keep), strided(&reduce));
    let (m, r) = (keep.count as u64, reduce.count as u64);
    let sms = u64::from(multiprocessors.max(1));
    let (workers, min) = if rows {
        (sms * u64::from(super::BLOCKS_PER_SM), MIN_ROW_CHUNK)
    } else {
        (sms * THREADS_PER_SM, MIN_COL_CHUNK)
    };
    let chunks = workers.div_ceil(m).clamp(1, r.div_ceil(min).max(1));
    let per = r.div_ceil(chunks);
    Ok(Some(SumTo { keep, reduce, rows, chunks: r.div_ceil(per), per }))
}
