//! Running a compiled kernel: rows longer than a chunk split into shorter
//! ones where the body allows, rows grouped into fixed chunks, chunks on rayon's
//! threads when the kernel is big enough, cross-row outputs summed from
//! per-chunk partials.
//!
//! **Determinism.** The chunk size is a function of the kernel's shape only
//! ([`chunk_rows`]), never of the thread count. Each chunk adds its rows'
//! contributions to a cross-row output into its own zeroed `f64` partial, in
//! row order; the partials are then added in chunk order. So the sums are
//! bitwise identical whatever the number of threads, and from run to run.

use rayon::prelude::*;
use zeroplan_ir::DType;
use zeroplan_ir::kernel::layout::Layout;
use zeroplan_ir::kernel::{Kernel, MAX_SPLIT_ROW, split_row_length};

use super::codegen::Entry;

/// Below this many bytes read and written a launch stays on the caller's
/// thread: handing work to rayon costs a few microseconds.
pub(crate) const PARALLEL_BYTES: usize = 64 << 10;

/// About how many elements one chunk covers.
const CHUNK_ELEMENTS: usize = 16 << 10;

/// At most this many chunks for a kernel with cross-row outputs: each chunk
/// keeps a full-length partial of every such output, so for a long one (a
/// vocabulary-wide bias gradient) more chunks only add memory traffic.
/// Enough chunks to keep 16 threads busy.
const MAX_CROSS_ROW_CHUNKS: usize = 32;

/// Rows per chunk: about [`CHUNK_ELEMENTS`] elements, and enough that the
/// partials of the cross-row outputs (`cross_len` elements each) take at most
/// a quarter of the elements each chunk covers and number at most
/// [`MAX_CROSS_ROW_CHUNKS`]. A function of the shape alone, never of the
/// thread count, so the sums are the same on every machine.
pub(crate) fn chunk_rows(layout: &Layout) -> usize {
    let cross_len: usize = layout.outputs.iter().filter(|o| o.cross_row).map(|o| o.len).sum();
    let elements = CHUNK_ELEMENTS.max(cross_len.saturating_mul(4));
    let rows = elements.div_ceil(layout.width.max(1)).max(1);
    if cross_len > 0 { rows.max(layout.rows.div_ceil(MAX_CROSS_ROW_CHUNKS)) } else { rows }
}

/// `kernel` over `dims` with its rows split into rows of at most
/// [`MAX_SPLIT_ROW`] elements, and the split dims, when a row is longer than
/// a chunk and the body allows ([`Kernel::split_row`]): one row is one
/// chunk, so an optimizer step over a flat parameter group would run on one
/// thread.
pub(crate) fn split_long_rows(kernel: &Kernel, dims: &[usize]) -> Option<(Kernel, Vec<usize>)> {
    let &width = dims.last()?;
    if width <= CHUNK_ELEMENTS {
        return None;
    }
    kernel.split_row(dims, split_row_length(width, MAX_SPLIT_ROW)?)
}

/// Raw pointers for the worker threads.
#[derive(Clone, Copy)]
struct Args<'a> {
    inputs: &'a [*const u8],
    outputs: &'a [*mut u8],
}
// SAFETY: the pointers are only dereferenced by the kernel, which writes
// disjoint rows from each chunk (see `run`'s contract).
unsafe impl Send for Args<'_> {}
unsafe impl Sync for Args<'_> {}

/// Runs `entry` over every row of `layout`.
///
/// # Safety
/// As [`super::CompiledKernel::launch`].
pub(crate) unsafe fn run(
    entry: Entry,
    layout: &Layout,
    chunk_rows: usize,
    inputs: &[*const u8],
    outputs: &[*mut u8],
    seed: u64,
    offset: u64,
) {
    let chunks = layout.rows.div_ceil(chunk_rows);
    // Per cross-row output, every chunk's partial sums, chunk after chunk.
    let mut partials: Vec<Vec<f64>> =
        layout.outputs.iter().map(|o| if o.cross_row { vec![0.0; o.len * chunks] } else { Vec::new() }).collect();
    let bases: Vec<usize> = partials.iter_mut().map(|p| p.as_mut_ptr() as usize).collect();
    let args = Args { inputs, outputs };
    let chunk = |c: usize| {
        let begin = c * chunk_rows;
        let end = (begin + chunk_rows).min(layout.rows);
        let mine: Vec<*mut f64> = layout
            .outputs
            .iter()
            .zip(&bases)
            .map(
                |(o, &base)| {
                    if o.cross_row { (base as *mut f64).wrapping_add(c * o.len) } else { std::ptr::null_mut() }
                },
            )
            .collect();
        let a = args;
        // SAFETY: the caller's pointers are valid for the kernel's sizes; chunk
        // `c` writes only its own rows and its own partials.
        unsafe { entry(a.inputs.as_ptr(), a.outputs.as_ptr(), mine.as_ptr(), begin as i64, end as i64, seed, offset) };
    };
    let bytes: usize = layout.inputs.iter().chain(&layout.outputs).map(|a| a.len * a.dtype.size_bytes() as usize).sum();
    if chunks > 1 && bytes >= PARALLEL_BYTES {
        (0..chunks).into_par_iter().for_each(chunk);
    } else {
        (0..chunks).for_each(chunk);
    }
    for ((o, p), &out) in layout.outputs.iter().zip(&mut partials).zip(outputs) {
        if !o.cross_row {
            continue;
        }
        // Chunk after chunk, each a sequential sweep (the same order per
        // element as a fold over chunks, without striding across them).
        let mut total = vec![0.0f64; o.len];
        for partial in p.chunks_exact(o.len.max(1)) {
            total.iter_mut().zip(partial).for_each(|(t, x)| *t += x);
        }
        for (i, &x) in total.iter().enumerate() {
            // SAFETY: `out` holds `o.len` elements of `o.dtype`.
            unsafe { write(out, o.dtype, i, x) };
        }
    }
}

/// Writes `x` rounded to nearest even into element `i` of a float buffer.
unsafe fn write(out: *mut u8, dtype: DType, i: usize, x: f64) {
    // SAFETY: the caller guarantees element `i` exists; outputs may be unaligned.
    unsafe {
        match dtype {
            DType::BF16 => out.cast::<u16>().add(i).write_unaligned(zeroplan_ir::to_bf16(x).to_bits()),
            DType::F16 => out.cast::<u16>().add(i).write_unaligned(zeroplan_ir::to_f16(x).to_bits()),
            // `Kernel::check` makes every output a float; f32 otherwise.
            _ => out.cast::<f32>().add(i).write_unaligned(x as f32),
        }
    }
}
