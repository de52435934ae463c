//! Building a [`Kernel`] one expression at a time.

use super::{Binary, Expr, ExprId, Kernel, KernelArg, Unary};
use crate::shape::{Shape, TensorType};

/// Accumulates inputs, expressions and stores; identical expressions are
/// shared (so loading one input twice gives one `load`).
#[derive(Clone, Debug)]
pub struct KernelBuilder {
    kernel: Kernel,
}

impl KernelBuilder {
    /// An empty kernel over `shape` (its last axis the row).
    pub fn new(name: impl Into<String>, shape: Shape) -> KernelBuilder {
        KernelBuilder {
            kernel: Kernel {
                name: name.into(),
                shape,
                inputs: Vec::new(),
                outputs: Vec::new(),
                body: Vec::new(),
                stores: Vec::new(),
                epilogue_of: None,
                pattern: None,
            },
        }
    }

    pub fn shape(&self) -> &Shape {
        &self.kernel.shape
    }

    /// Adds `e` (or finds an identical earlier expression) and returns its id.
    pub fn push(&mut self, e: Expr) -> ExprId {
        let same = |x: &Expr| match (x, &e) {
            (Expr::Const(a), Expr::Const(b)) => a.to_bits() == b.to_bits(),
            _ => *x == e,
        };
        if let Some(i) = self.kernel.body.iter().position(same) {
            return i as ExprId;
        }
        self.kernel.body.push(e);
        (self.kernel.body.len() - 1) as ExprId
    }

    /// Declares an input (or reuses one of the same name and axes) and loads it.
    pub fn load(&mut self, name: impl Into<String>, ty: TensorType, axes: Vec<usize>) -> ExprId {
        let name = name.into();
        let index = match self.kernel.inputs.iter().position(|a| a.name == name && a.axes == axes) {
            Some(i) => i,
            None => {
                self.kernel.inputs.push(KernelArg { name, ty, axes });
                self.kernel.inputs.len() - 1
            }
        };
        self.push(Expr::Load(index as u32))
    }

    pub fn constant(&mut self, c: f64) -> ExprId {
        self.push(Expr::Const(c))
    }

    pub fn unary(&mut self, u: Unary, a: ExprId) -> ExprId {
        self.push(Expr::Unary(u, a))
    }

    pub fn binary(&mut self, b: Binary, x: ExprId, y: ExprId) -> ExprId {
        self.push(Expr::Binary(b, x, y))
    }

    pub fn select(&mut self, c: ExprId, a: ExprId, b: ExprId) -> ExprId {
        self.push(Expr::Select(c, a, b))
    }

    /// Declares an output of the kernel's shape storing `value`.
    pub fn store(&mut self, name: impl Into<String>, ty: TensorType, value: ExprId) {
        let axes = (0..ty.shape.rank()).collect();
        self.kernel.outputs.push(KernelArg { name: name.into(), ty, axes });
        self.kernel.stores.push(value);
    }

    /// Declares a cross-row output along kernel `axes` (strictly increasing;
    /// `ty`'s dimensions are those axes' sizes): the sum of `value` over the
    /// other axes.
    pub fn store_sum(&mut self, name: impl Into<String>, ty: TensorType, axes: Vec<usize>, value: ExprId) {
        self.kernel.outputs.push(KernelArg { name: name.into(), ty, axes });
        self.kernel.stores.push(value);
    }

    /// Marks the kernel as the epilogue of matmul node `matmul`.
    pub fn set_epilogue_of(&mut self, matmul: impl Into<String>) {
        self.kernel.epilogue_of = Some(matmul.into());
    }

    /// The kernel, checked.
    pub fn finish(self) -> Result<Kernel, String> {
        self.kernel.check()?;
        Ok(self.kernel)
    }
}
