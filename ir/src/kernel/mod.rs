//! The kernel IR: the body of one fused row kernel.
//!
//! A [`Kernel`] iterates over the elements of its `shape`; the last axis is
//! the **row**. One CUDA block (or one Cranelift loop iteration) handles one
//! row; row reductions ([`Expr::ReduceSum`], [`Expr::ReduceMax`]) combine the
//! row's columns (a warp/block reduction on a GPU).
//!
//! - Every operand is a [`KernelArg`]: its type and `axes`, the kernel axis
//!   each of its own axes runs along (strictly increasing). An operand with
//!   all axes is read per element; `[rank−1]` per column (a bias, a
//!   LayerNorm γ); `[0, rank−1]` of a rank-4 kernel is the attention mask
//!   `[B, Sk]`; axes without the last are per row; `[]` a scalar. The
//!   element read is the row-major offset of those coordinates.
//! - An output with all the kernel's axes stores one value per element. An
//!   output whose `axes` omit some kernel axes (a **cross-row output**) is
//!   the *sum* over the omitted axes of its stored expression: `axes=[r−1]`
//!   of a `[rows…, H]` kernel is a per-column sum over every row (LayerNorm's
//!   `dγ = Σ_rows dy·x̂`, a bias gradient `Σ_rows dy`), `axes=[]` a scalar
//!   (`Σ x²`). The interpreter accumulates each output element from `0.0` in
//!   the kernel's element (row-major) order, exactly like `sum_to` and
//!   `layer_norm_grad`. A GPU backend writes per-block partial sums (one
//!   block's rows) to a scratch buffer and adds them up in a second, small
//!   pass (deterministic), or adds them into a zeroed output with atomics
//!   (faster, not bit-reproducible); either way the result is only
//!   available once the whole kernel has run, so no expression of the same
//!   kernel can read it. The text form marks such an output with `sum`.
//! - The body is a scalar expression DAG in SSA form: expression `i` may use
//!   only expressions `< i`. A reduction's operand is evaluated on every
//!   column of the row; its result is the same for every column.
//! - `stores[k]` is the expression written to output `k`.
//!
//! - `epilogue_of`, when set, names a matmul node whose output this kernel
//!   reads only through a leading bias add (maybe followed by an
//!   activation): a cuBLASLt backend can run that add (and GELU) as the
//!   GEMM's epilogue. The text form shows it as `epilogue of %NAME`.
//!
//! Integer operands (the attention mask) are read as their `f64` value.
//! Comparisons give `1.0` or `0.0`; [`Expr::Select`] takes its second
//! operand where the first is nonzero.
//!
//! [`layout`] binds a kernel's shape to concrete dims for code generators:
//! operand strides, expression classes, reduction sweeps.
//!
//! The text form ([`Kernel::to_text`]) is stable and read by snapshot tests:
//!
//! ```text
//! kernel layer0.ffn.act.fused over [batch, seq, 64] {
//!   in0 = %layer0.ffn.up.mm: f32[batch, seq, 64]
//!   in1 = %layer0.ffn.up.bias: f32[64] axes=[2]
//!   out0 = %layer0.ffn.up: f32[batch, seq, 64]
//!   out1 = %layer0.ffn.act: f32[batch, seq, 64]
//!   v0 = load in0
//!   v1 = load in1
//!   v2 = add v0, v1
//!   v3 = gelu_erf v2
//!   store out0 = v2
//!   store out1 = v3
//! }
//! ```

use serde::{Deserialize, Serialize};
use std::fmt::{self, Write};

mod adamw;
mod builder;
pub mod layout;
pub mod lower;
mod split;
pub use adamw::adamw_operands;
pub use builder::KernelBuilder;
pub use split::{MAX_SPLIT_ROW, MIN_SPLIT_ROW, split_row_length};

use crate::op::GeluApproximation;
use crate::shape::{Shape, TensorType};

/// An index into [`Kernel::body`].
pub type ExprId = u32;

/// One operand or result of a kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelArg {
    /// The graph value it was made from (for reading the text form).
    pub name: String,
    pub ty: TensorType,
    /// For each axis of `ty`, the kernel axis it runs along.
    pub axes: Vec<usize>,
}

/// Elementwise functions of one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unary {
    Neg,
    Exp,
    Erf,
    Tanh,
    Sqrt,
    /// `1/√x`.
    Rsqrt,
    /// `1/x`.
    Recip,
    /// `max(0, x)`, NaN stays NaN.
    Relu,
    /// `x·σ(x)`.
    Silu,
    /// `d/dx silu`.
    SiluDeriv,
    Gelu(GeluApproximation),
    /// `d/dx gelu` of that form.
    GeluDeriv(GeluApproximation),
}

/// Elementwise functions of two values. Comparisons give 1.0 or 0.0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Lt,
    Gt,
    Eq,
    /// `x^y` (`f64::powf`; AdamW's bias corrections `β^t`).
    Pow,
}

/// One node of the scalar expression DAG.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Expr {
    /// The current element of input `i` (through its axes).
    Load(u32),
    Const(f64),
    /// The row length as a float.
    RowLen,
    Unary(Unary, ExprId),
    Binary(Binary, ExprId, ExprId),
    /// `if c != 0 { a } else { b }`.
    Select(ExprId, ExprId, ExprId),
    /// 1.0 if dropout `{p, stream}` keeps the current element (its row-major
    /// index in the kernel shape, at the pass's dropout offset), else 0.0:
    /// exactly [`crate::interp::random::dropout_keeps`].
    Keep {
        p: f64,
        stream: u32,
    },
    /// ALiBi's penalty `m_h·|i − j|` of the current element of a rank-4
    /// `[B, H, Sq, Sk]` kernel ([`crate::interp::alibi_slopes`]).
    AlibiPenalty,
    /// The sum of the operand over the row, in column order.
    ReduceSum(ExprId),
    /// The maximum of the operand over the row: NaN if any element is NaN,
    /// −∞ for an empty row.
    ReduceMax(ExprId),
}

/// A fused row kernel; see the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    pub name: String,
    /// The iteration space; the last axis is the row.
    pub shape: Shape,
    pub inputs: Vec<KernelArg>,
    pub outputs: Vec<KernelArg>,
    pub body: Vec<Expr>,
    /// The expression stored to each output (summed over the axes a
    /// cross-row output omits).
    pub stores: Vec<ExprId>,
    /// The matmul node whose bias add (and activation) this kernel starts
    /// with, for a GEMM-epilogue backend; see the module docs.
    #[serde(default)]
    pub epilogue_of: Option<String>,
    /// The fusion pattern that made the kernel (`adamw`, `layer_norm_grad`,
    /// …), so analyses can recognise a fused op without parsing its name.
    #[serde(default)]
    pub pattern: Option<String>,
}

impl Unary {
    pub fn name(self) -> &'static str {
        match self {
            Unary::Neg => "neg",
            Unary::Exp => "exp",
            Unary::Erf => "erf",
            Unary::Tanh => "tanh",
            Unary::Sqrt => "sqrt",
            Unary::Rsqrt => "rsqrt",
            Unary::Recip => "recip",
            Unary::Relu => "relu",
            Unary::Silu => "silu",
            Unary::SiluDeriv => "silu_deriv",
            Unary::Gelu(GeluApproximation::Erf) => "gelu_erf",
            Unary::Gelu(GeluApproximation::Tanh) => "gelu_tanh",
            Unary::GeluDeriv(GeluApproximation::Erf) => "gelu_erf_deriv",
            Unary::GeluDeriv(GeluApproximation::Tanh) => "gelu_tanh_deriv",
        }
    }
}

impl Binary {
    pub fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::Max => "max",
            Binary::Min => "min",
            Binary::Lt => "lt",
            Binary::Gt => "gt",
            Binary::Eq => "eq",
            Binary::Pow => "pow",
        }
    }
}

impl Expr {
    /// The expressions this one reads.
    pub fn operands(&self) -> Vec<ExprId> {
        match *self {
            Expr::Load(_) | Expr::Const(_) | Expr::RowLen | Expr::Keep { .. } | Expr::AlibiPenalty => Vec::new(),
            Expr::Unary(_, a) | Expr::ReduceSum(a) | Expr::ReduceMax(a) => vec![a],
            Expr::Binary(_, a, b) => vec![a, b],
            Expr::Select(c, a, b) => vec![c, a, b],
        }
    }
}

impl KernelArg {
    /// Whether this output omits kernel axes, so it sums over them.
    pub fn is_cross_row(&self, rank: usize) -> bool {
        self.axes.len() != rank
    }
}

impl Kernel {
    /// Checks the kernel's structure: SSA order, loads and stores in range,
    /// argument axes and shapes against the kernel shape, at least one
    /// output, float outputs.
    pub fn check(&self) -> Result<(), String> {
        let rank = self.shape.rank();
        if rank == 0 {
            return Err(format!("kernel `{}` needs a shape of rank ≥ 1", self.name));
        }
        for (what, args) in [("input", &self.inputs), ("output", &self.outputs)] {
            for (i, arg) in args.iter().enumerate() {
                let ok_axes = arg.axes.len() == arg.ty.shape.rank()
                    && arg.axes.windows(2).all(|w| w[0] < w[1])
                    && arg.axes.iter().all(|&a| a < rank);
                if !ok_axes {
                    return Err(format!(
                        "{what} {i} ({}) has axes {:?} that do not fit {}",
                        arg.name, arg.axes, arg.ty
                    ));
                }
                for (d, &a) in arg.ty.shape.dims().iter().zip(&arg.axes) {
                    if *d != self.shape.dims()[a] {
                        return Err(format!(
                            "{what} {i} ({}): dimension `{d}` runs along kernel axis {a} of size `{}`",
                            arg.name,
                            self.shape.dims()[a]
                        ));
                    }
                }
            }
        }
        // A kernel that stores nothing computes nothing: a node with no
        // output, which no runtime can place or run.
        if self.outputs.is_empty() {
            return Err(format!("kernel `{}` has no output", self.name));
        }
        for (i, out) in self.outputs.iter().enumerate() {
            if !out.ty.dtype.is_float() {
                return Err(format!("output {i} ({}) must be a float tensor, got {}", out.name, out.ty));
            }
        }
        for (i, e) in self.body.iter().enumerate() {
            if let Expr::Load(k) = e
                && *k as usize >= self.inputs.len()
            {
                return Err(format!("v{i} loads input {k} of {}", self.inputs.len()));
            }
            if let Some(bad) = e.operands().into_iter().find(|&o| o as usize >= i) {
                return Err(format!("v{i} reads v{bad}, which is not defined before it"));
            }
            if *e == Expr::AlibiPenalty && (rank != 4 || self.shape.dims()[1].as_constant().is_none()) {
                return Err(format!("v{i}: alibi needs a [B, H, Sq, Sk] kernel with constant H, not {}", self.shape));
            }
        }
        if self.stores.len() != self.outputs.len() {
            return Err(format!("{} stores for {} outputs", self.stores.len(), self.outputs.len()));
        }
        if let Some(bad) = self.stores.iter().find(|&&s| s as usize >= self.body.len()) {
            return Err(format!("a store reads v{bad}, which does not exist"));
        }
        Ok(())
    }

    /// The stable text form (see the module docs).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        self.write_text(&mut out).expect("writing to a String cannot fail");
        out
    }

    fn write_text(&self, out: &mut String) -> fmt::Result {
        write!(out, "kernel {} over {}", self.name, self.shape)?;
        if let Some(mm) = &self.epilogue_of {
            write!(out, " epilogue of %{mm}")?;
        }
        writeln!(out, " {{")?;
        let rank = self.shape.rank();
        for (prefix, args) in [("in", &self.inputs), ("out", &self.outputs)] {
            for (i, arg) in args.iter().enumerate() {
                write!(out, "  {prefix}{i} = %{}: {}", arg.name, arg.ty)?;
                let full = arg.axes.len() == rank && arg.axes.iter().enumerate().all(|(k, &a)| k == a);
                if !full {
                    let axes: Vec<String> = arg.axes.iter().map(usize::to_string).collect();
                    write!(out, " axes=[{}]", axes.join(", "))?;
                    if prefix == "out" {
                        out.push_str(" sum");
                    }
                }
                out.push('\n');
            }
        }
        for (i, e) in self.body.iter().enumerate() {
            write!(out, "  v{i} = ")?;
            match e {
                Expr::Load(k) => write!(out, "load in{k}")?,
                Expr::Const(c) => write!(out, "const {c:?}")?,
                Expr::RowLen => write!(out, "row_len")?,
                Expr::Unary(u, a) => write!(out, "{} v{a}", u.name())?,
                Expr::Binary(b, x, y) => write!(out, "{} v{x}, v{y}", b.name())?,
                Expr::Select(c, a, b) => write!(out, "select v{c}, v{a}, v{b}")?,
                Expr::Keep { p, stream } => write!(out, "keep p={p} stream={stream}")?,
                Expr::AlibiPenalty => write!(out, "alibi_penalty")?,
                Expr::ReduceSum(a) => write!(out, "reduce_sum v{a}")?,
                Expr::ReduceMax(a) => write!(out, "reduce_max v{a}")?,
            }
            out.push('\n');
        }
        for (k, s) in self.stores.iter().enumerate() {
            writeln!(out, "  store out{k} = v{s}")?;
        }
        writeln!(out, "}}")
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

#[cfg(test)]
mod tests;
