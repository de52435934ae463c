//! Splitting a kernel's row into several shorter rows, for parallelism.
//!
//! Backends hand out work by rows (a CUDA block, a CPU chunk), so a kernel
//! over one long row runs on one block: an optimizer step over a flat
//! `[7077888]` parameter group, or `Σ g²` over it, moves 184 MB at tens of
//! GB/s instead of terabytes. A kernel whose body never looks at the row as
//! a whole (no row reduction, no `row_len`, no position-dependent term such
//! as ALiBi's) computes the same function over `[…, W/c, c]` as over
//! `[…, W]`: every operand that runs along the row is contiguous there, so
//! its last axis splits into two with strides `c` and `1`, and the
//! row-major index of each element (what dropout hashes) is unchanged.
//! Cross-row outputs still sum over the axes they omit; only the order of
//! that sum's partials changes, as it does with any launch shape.

use super::{Expr, Kernel, KernelArg};
use crate::shape::{Dim, Shape, TensorType};

/// The longest row a split produces: a 256-thread block covers 4096 `f32`s
/// in four 16-byte steps per thread.
pub const MAX_SPLIT_ROW: usize = 4096;
/// The shortest: below this a block's threads mostly idle.
pub const MIN_SPLIT_ROW: usize = 256;

impl Kernel {
    /// Whether every expression is independent of where the row starts and
    /// ends, so the row can be split ([`Kernel::split_row`]).
    pub fn row_splittable(&self) -> bool {
        !self
            .body
            .iter()
            .any(|e| matches!(e, Expr::ReduceSum(_) | Expr::ReduceMax(_) | Expr::RowLen | Expr::AlibiPenalty))
    }

    /// This kernel over `dims` with its last axis `W` split into `[W/chunk,
    /// chunk]`, and the new dims; `None` when the body depends on the row
    /// ([`Kernel::row_splittable`]) or `chunk` does not divide `W`.
    pub fn split_row(&self, dims: &[usize], chunk: usize) -> Option<(Kernel, Vec<usize>)> {
        let rank = self.shape.rank();
        let width = *dims.last()?;
        if !self.row_splittable() || chunk == 0 || width % chunk != 0 || dims.len() != rank {
            return None;
        }
        let split = [Dim::constant((width / chunk) as u64), Dim::constant(chunk as u64)];
        let split_arg = |arg: &KernelArg| {
            if arg.axes.last() != Some(&(rank - 1)) {
                return arg.clone();
            }
            let own = arg.ty.shape.dims();
            let shape = Shape::new(own[..own.len() - 1].iter().cloned().chain(split.iter().cloned()));
            let axes = arg.axes.iter().copied().chain([rank]).collect();
            KernelArg { name: arg.name.clone(), ty: TensorType::new(shape, arg.ty.dtype), axes }
        };
        let kernel = Kernel {
            shape: Shape::new(self.shape.dims()[..rank - 1].iter().cloned().chain(split.iter().cloned())),
            inputs: self.inputs.iter().map(split_arg).collect(),
            outputs: self.outputs.iter().map(split_arg).collect(),
            ..self.clone()
        };
        let dims = dims[..rank - 1].iter().copied().chain([width / chunk, chunk]).collect();
        Some((kernel, dims))
    }
}

/// The row length to split a row of `width` elements into: the longest
/// divisor of `width` in [`MIN_SPLIT_ROW`, `max`] that is a multiple of 8
/// (whole 16-byte vectors of 16-bit values), else any divisor in that range;
/// `None` when `width` has none or is not over twice `max`.
pub fn split_row_length(width: usize, max: usize) -> Option<usize> {
    if width < 2 * max {
        return None;
    }
    let candidates = || (MIN_SPLIT_ROW..=max).rev().filter(|c| width.is_multiple_of(*c));
    candidates().find(|c| c % 8 == 0).or_else(|| candidates().next())
}
