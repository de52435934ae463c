//! The 16-byte vector accesses of a generated kernel's column loops: which
//! operands they load or store, how many columns one covers, and how much of
//! the row they cover. This is the CUDA target's part of the layout; the
//! shape binding, expression classes and sweeps are
//! [`zeroplan_ir::kernel::layout`].

use zeroplan_ir::kernel::layout::{ArgLayout, Layout};

/// Whether vector steps load or store `arg`: a float operand along the row
/// (integer masks are read one element at a time; cross-row partials are
/// `double`s updated one column at a time).
pub(crate) fn vectorised(arg: &ArgLayout) -> bool {
    arg.along_row && arg.dtype.is_float() && !arg.cross_row
}

/// How a row's columns split into vector steps and a scalar tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct VectorSteps {
    /// Columns per vector step: 16 bytes of the widest float operand that
    /// runs along the row (4 for f32, 8 for bf16/f16 only), 1 when no vector
    /// access is possible.
    pub columns: usize,
    /// Columns covered by vector steps (a multiple of `columns`); the rest of
    /// the row, `main..width`, is the scalar tail.
    pub main: usize,
}

impl VectorSteps {
    /// The vector steps of `layout`'s rows.
    pub(crate) fn of(layout: &Layout) -> VectorSteps {
        let widest =
            layout.inputs.iter().chain(&layout.outputs).filter(|a| vectorised(a)).map(|a| a.dtype.size_bytes()).max();
        let columns = widest.map_or(1, |bytes| (16 / bytes) as usize);
        let width = layout.width;
        // Every row starts on a vector boundary when the width is a multiple of
        // the vector (or there is one row); then vector steps cover the row up
        // to the last whole vector and the tail is scalar.
        let aligned_rows = width.is_multiple_of(columns) || layout.rows <= 1;
        if columns > 1 && aligned_rows && width >= columns {
            VectorSteps { columns, main: width / columns * columns }
        } else {
            VectorSteps { columns: 1, main: 0 }
        }
    }
}
