//! What code generation needs to know about a kernel once its shape is
//! concrete: every operand's strides, which expressions vary per element,
//! per row or not at all, in which sweep over the row each reduction is
//! computed, and how many columns one 16-byte vector access covers.

use zeroplan_ir::DType;
use zeroplan_ir::kernel::{Expr, Kernel, KernelArg};

/// How often an expression's value changes. Ordered: an expression varies as
/// often as its most varying operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Class {
    /// The same for the whole launch: constants, `row_len`, scalar inputs and
    /// arithmetic on them (AdamW's `1 − β^t`). Computed once per thread in
    /// `double`, like the interpreter, so `1 − β^t` does not cancel in `float`.
    Uniform,
    /// The same for every column of a row: per-row inputs, reductions.
    Row,
    /// Differs per element.
    Element,
}

/// One operand or result over the concrete kernel shape.
#[derive(Clone, Debug)]
pub(crate) struct ArgLayout {
    pub dtype: DType,
    /// Elements in its own shape.
    pub len: usize,
    /// Per kernel axis, its element stride along that axis (0 where it
    /// broadcasts, or for a cross-row output, where it sums).
    pub strides: Vec<usize>,
    /// Whether it runs along the row (has the kernel's last axis).
    pub along_row: bool,
    /// A cross-row output: the sum over the kernel axes it omits.
    pub cross_row: bool,
    /// A scalar (no axes): a launch-uniform value.
    pub scalar: bool,
}

/// The kernel with its shape bound.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub shape: Vec<usize>,
    /// The row length (the last axis).
    pub width: usize,
    pub rows: usize,
    pub inputs: Vec<ArgLayout>,
    pub outputs: Vec<ArgLayout>,
    /// Per expression.
    pub class: Vec<Class>,
    /// Per expression: 0 when it reads no reduction, else `1 +` the sweep
    /// that computes the last reduction it reads (a reduction is computed in
    /// sweep `level` of its operand).
    pub level: Vec<usize>,
    /// How many sweeps compute reductions; the stores are one more sweep.
    pub reduction_sweeps: usize,
    /// Columns per vector step: 16 bytes of the widest float operand that
    /// runs along the row (4 for f32, 8 for bf16/f16 only), 1 when no vector
    /// access is possible.
    pub vector: usize,
    /// Columns covered by vector steps (a multiple of `vector`); the rest of
    /// the row, `main..width`, is the scalar tail.
    pub main: usize,
}

impl ArgLayout {
    fn new(arg: &KernelArg, shape: &[usize], cross_row: bool) -> ArgLayout {
        let rank = shape.len();
        let mut strides = vec![0; rank];
        let mut stride = 1;
        for &a in arg.axes.iter().rev() {
            strides[a] = stride;
            stride *= shape[a];
        }
        ArgLayout {
            dtype: arg.ty.dtype,
            len: arg.axes.iter().map(|&a| shape[a]).product(),
            strides,
            along_row: arg.axes.last() == Some(&(rank - 1)),
            cross_row,
            scalar: arg.axes.is_empty(),
        }
    }

    /// Whether vector steps load or store it: a float operand along the row
    /// (integer masks are read one element at a time; cross-row partials are
    /// `double`s updated one column at a time).
    pub fn vectorised(&self) -> bool {
        self.along_row && self.dtype.is_float() && !self.cross_row
    }
}

/// Binds `kernel`'s shape to `dims`, or says why they do not fit.
pub(crate) fn layout(kernel: &Kernel, dims: &[usize]) -> Result<Layout, String> {
    let rank = kernel.shape.rank();
    if dims.len() != rank {
        return Err(format!(
            "dims {dims:?} have rank {} but the kernel's shape {} has rank {rank}",
            dims.len(),
            kernel.shape
        ));
    }
    for (a, (d, &n)) in kernel.shape.dims().iter().zip(dims).enumerate() {
        if let Some(c) = d.as_constant()
            && c != n as u64
        {
            return Err(format!("axis {a} is the constant {c} but dims give {n}"));
        }
    }
    // Offsets are `long long` in the generated code: every byte offset must fit.
    let numel = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n.checked_mul(8).is_some_and(|bytes| bytes <= i64::MAX as usize))
        .ok_or_else(|| format!("dims {dims:?} hold more elements than fit in memory"))?;
    let width = dims[rank - 1];
    let rows = numel.checked_div(width).unwrap_or(0);
    let inputs: Vec<ArgLayout> = kernel.inputs.iter().map(|a| ArgLayout::new(a, dims, false)).collect();
    let outputs: Vec<ArgLayout> =
        kernel.outputs.iter().map(|a| ArgLayout::new(a, dims, a.is_cross_row(rank))).collect();

    let mut class = Vec::with_capacity(kernel.body.len());
    let mut level = Vec::with_capacity(kernel.body.len());
    let mut reduction_sweeps = 0;
    for e in &kernel.body {
        let operands = e.operands();
        let (c, l) = match *e {
            Expr::Load(k) => {
                let arg = &kernel.inputs[k as usize];
                let c = if arg.axes.is_empty() {
                    Class::Uniform
                } else if arg.axes.last() == Some(&(rank - 1)) {
                    Class::Element
                } else {
                    Class::Row
                };
                (c, 0)
            }
            Expr::Const(_) | Expr::RowLen => (Class::Uniform, 0),
            Expr::Keep { .. } | Expr::AlibiPenalty => (Class::Element, 0),
            Expr::ReduceSum(a) | Expr::ReduceMax(a) => {
                let sweep = level[a as usize];
                reduction_sweeps = reduction_sweeps.max(sweep + 1);
                (Class::Row, sweep + 1)
            }
            Expr::Unary(..) | Expr::Binary(..) | Expr::Select(..) => (
                operands.iter().map(|&o| class[o as usize]).max().unwrap_or(Class::Uniform),
                operands.iter().map(|&o| level[o as usize]).max().unwrap_or(0),
            ),
        };
        class.push(c);
        level.push(l);
    }

    let widest = inputs.iter().chain(&outputs).filter(|a| a.vectorised()).map(|a| a.dtype.size_bytes()).max();
    let vector = widest.map_or(1, |bytes| (16 / bytes) as usize);
    // Every row starts on a vector boundary when the width is a multiple of
    // the vector (or there is one row); then vector steps cover the row up
    // to the last whole vector and the tail is scalar.
    let aligned_rows = width.is_multiple_of(vector) || rows <= 1;
    let (vector, main) =
        if vector > 1 && aligned_rows && width >= vector { (vector, width / vector * vector) } else { (1, 0) };
    Ok(Layout { shape: dims.to_vec(), width, rows, inputs, outputs, class, level, reduction_sweeps, vector, main })
}
