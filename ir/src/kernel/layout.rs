//! A kernel with its shape bound to concrete dims: what every code generator
//! needs before it writes a line. Every operand's strides, which expressions
//! vary per element, per row or not at all, and in which sweep over the row
//! each reduction is computed. The CPU and CUDA backends both generate code
//! from this one analysis; what depends on the target (vector widths,
//! launch shapes) stays in the backend.

use super::{Expr, Kernel, KernelArg};
use crate::dtype::DType;

/// How often an expression's value changes. Ordered: an expression varies as
/// often as its most varying operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// The same for the whole launch: constants, `row_len`, scalar inputs and
    /// arithmetic on them (AdamW's bias corrections `1 − β^t`). Backends
    /// compute it in `f64`, like the interpreter, so `1 − β^t` does not
    /// cancel in `f32`.
    Uniform,
    /// The same for every column of a row: per-row inputs, reductions.
    Row,
    /// Differs per element.
    Element,
}

/// One operand or result, laid out over the concrete kernel shape.
#[derive(Clone, Debug)]
pub struct ArgLayout {
    /// Its element type in memory.
    pub dtype: DType,
    /// Elements in its own shape.
    pub len: usize,
    /// Per kernel axis, its element stride along that axis (0 where it
    /// broadcasts, or for a cross-row output, where it sums).
    pub strides: Vec<usize>,
    /// Whether it runs along the row (has the kernel's last axis), so it is
    /// read or written at consecutive columns.
    pub along_row: bool,
    /// A cross-row output: the sum over the kernel axes it omits.
    pub cross_row: bool,
    /// A scalar (no axes): a launch-uniform value.
    pub scalar: bool,
}

/// The kernel with its shape bound.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The concrete kernel shape.
    pub shape: Vec<usize>,
    /// The row length (the last axis).
    pub width: usize,
    /// How many rows: the product of every axis but the last.
    pub rows: usize,
    /// Per kernel input, in order.
    pub inputs: Vec<ArgLayout>,
    /// Per kernel output, in order.
    pub outputs: Vec<ArgLayout>,
    /// Per expression, how often its value changes.
    pub class: Vec<Class>,
    /// Per expression: the sweep whose results it needs — 0 when it reads no
    /// reduction, else `1 +` the sweep that computes the last reduction it
    /// reads (a reduction itself is computed in sweep `level` of its operand).
    pub level: Vec<usize>,
    /// How many sweeps compute reductions; the stores are one more sweep.
    pub reduction_sweeps: usize,
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
}

impl Layout {
    /// Binds `kernel`'s shape to `dims`, or says why they do not fit.
    pub fn bind(kernel: &Kernel, dims: &[usize]) -> Result<Layout, String> {
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
        // Generated code computes offsets as signed 64-bit integers, each
        // below numel · 8 bytes: that product must fit.
        let numel = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n.checked_mul(8).is_some_and(|bytes| bytes <= i64::MAX as usize))
            .ok_or_else(|| format!("dims {dims:?} hold more elements than fit in memory"))?;
        let width = dims[rank - 1];
        let rows = numel.checked_div(width).unwrap_or(0);
        let inputs = kernel.inputs.iter().map(|a| ArgLayout::new(a, dims, false)).collect();
        let outputs = kernel.outputs.iter().map(|a| ArgLayout::new(a, dims, a.is_cross_row(rank))).collect();

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
                    // Computed in sweep `level[a]`; what reads it waits for that sweep.
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
        Ok(Layout { shape: dims.to_vec(), width, rows, inputs, outputs, class, level, reduction_sweeps })
    }
}
