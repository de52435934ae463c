//! The hyper-parameters of a fused AdamW kernel.
//!
//! The `fuse` pass turns each `adamw` node into a kernel (pattern `adamw`)
//! whose β₁, β₂, ε and weight decay are constants of its IR. They are read
//! back where the lowering puts them (`β^t` powers, `lr·wd`, `√v̂ + ε`) and
//! trusted only if lowering an `adamw` node with them gives the kernel's
//! IR again, expression for expression: anything else (a different
//! lowering, a hand-made kernel) is no AdamW the multi-tensor kernel may
//! replace, and keeps its own launch.

use zeroplan_ir::kernel::{Binary, Expr, Kernel, Unary, lower};
use zeroplan_ir::{Graph, Op, Value};

/// `[β₁, β₂, ε, weight decay]`.
pub type Hyper = [f64; 4];

/// The constant `e` names, if it is one.
fn constant(k: &Kernel, e: u32) -> Option<f64> {
    match k.body.get(e as usize) {
        Some(Expr::Const(c)) => Some(*c),
        _ => None,
    }
}

/// The candidates read off the IR: the bases of the first two powers, the
/// factor of the first `lr·c` product, the constant added to a square root.
fn candidates(k: &Kernel) -> Option<Hyper> {
    let lr = k.body.iter().position(|e| *e == Expr::Load(4))? as u32;
    let mut powers = k.body.iter().filter_map(|e| match e {
        Expr::Binary(Binary::Pow, b, _) => constant(k, *b),
        _ => None,
    });
    let (beta1, beta2) = (powers.next()?, powers.next()?);
    let weight_decay = k.body.iter().find_map(|e| match e {
        Expr::Binary(Binary::Mul, x, c) if *x == lr => constant(k, *c),
        _ => None,
    })?;
    let eps = k.body.iter().find_map(|e| match e {
        Expr::Binary(Binary::Add, r, c) if matches!(k.body.get(*r as usize), Some(Expr::Unary(Unary::Sqrt, _))) => {
            constant(k, *c)
        }
        _ => None,
    })?;
    Some([beta1, beta2, eps, weight_decay])
}

/// `adamw` with `hyper` over operands of `k`'s input types, lowered as the
/// fuse pass lowers it.
fn relower(k: &Kernel, [beta1, beta2, eps, weight_decay]: Hyper) -> Option<Kernel> {
    let mut g = Graph::new("adamw");
    let operands: Vec<Value> = k
        .inputs
        .iter()
        .enumerate()
        .map(|(i, a)| g.input(format!("in{i}"), a.ty.clone()))
        .collect::<Result<_, _>>()
        .ok()?;
    let op = Op::AdamW { beta1, beta2, eps, weight_decay };
    let outputs = g.add_multi("adamw", op, &operands).ok()?;
    let (kernel, _) = lower::lower(&g, &[outputs[0].node], &outputs, "adamw", &k.shape).ok()?;
    Some(kernel)
}

/// The hyper-parameters of AdamW kernel `k`, if it is exactly the lowering
/// of an `adamw` node (8 inputs `p, g, m, v, lr, t, multiplier, finite`;
/// outputs `p, m, v`).
pub fn of_kernel(k: &Kernel) -> Option<Hyper> {
    if k.pattern.as_deref() != Some("adamw") || k.inputs.len() != 8 || k.outputs.len() != 3 {
        return None;
    }
    let hyper = candidates(k)?;
    let again = relower(k, hyper)?;
    (again.body == k.body && again.stores == k.stores).then_some(hyper)
}
