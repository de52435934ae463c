//! Which part of an epilogue kernel cuBLASLt can take, read off the
//! kernel IR alone (no buffers, no schedule): see [`fit`].

use crate::Epilogue;
use zeroplan_ir::GeluApproximation;
use zeroplan_ir::kernel::{Binary, Expr, ExprId, Kernel, Unary};

/// What of a kernel that reads a matmul's product (input `mm`) cuBLASLt
/// can run as the GEMM's epilogue.
#[derive(Clone, Debug, PartialEq)]
pub enum Fit {
    /// All of it: the kernel is `mm + bias` (stored), optionally followed
    /// by the tanh GELU cuBLASLt implements (stored; the biased product
    /// too, as the epilogue's aux matrix, when the kernel keeps it for the
    /// backward). The GEMM writes output `out` (and `aux`); the kernel goes.
    Whole {
        /// The kernel input that is the bias.
        bias: usize,
        /// The bias add's expression.
        add: ExprId,
        /// The cuBLASLt epilogue that computes the kernel.
        epilogue: Epilogue,
        /// The kernel output the GEMM writes (the bias add's or the GELU's).
        out: usize,
        /// The kernel output storing the biased product, when the kernel
        /// keeps it for the backward.
        aux: Option<usize>,
    },
    /// Only the bias add: the GEMM writes `mm + bias` into the product's
    /// buffer, and the rest of the kernel (an erf GELU, dropout, a residual,
    /// LayerNorm…) reads it there, rewritten without the add
    /// ([`super::rewrite::drop_bias`]). `add` is the add's expression (in
    /// both forms: a whole fit can fall back to this one).
    BiasOnly {
        /// The kernel input that is the bias.
        bias: usize,
        /// The bias add's expression.
        add: ExprId,
    },
}

/// Whether input `i` is a bias of `kernel`: one value per column.
fn is_bias(kernel: &Kernel, i: usize) -> bool {
    let rank = kernel.shape.rank();
    let arg = &kernel.inputs[i];
    rank >= 1 && arg.ty.shape.rank() == 1 && arg.axes == [rank - 1]
}

/// Whether `arg` is read (or stored) per element: every kernel axis.
fn full(kernel: &Kernel, axes: &[usize]) -> bool {
    axes.iter().copied().eq(0..kernel.shape.rank())
}

/// How the kernel's IR uses each expression: the expressions reading it,
/// and the outputs storing it.
fn users(kernel: &Kernel) -> (Vec<Vec<ExprId>>, Vec<Vec<usize>>) {
    let mut by_expr = vec![Vec::new(); kernel.body.len()];
    for (e, expr) in kernel.body.iter().enumerate() {
        let operands: Vec<ExprId> = match expr {
            Expr::Unary(_, a) | Expr::ReduceSum(a) | Expr::ReduceMax(a) => vec![*a],
            Expr::Binary(_, a, b) => vec![*a, *b],
            Expr::Select(c, a, b) => vec![*c, *a, *b],
            Expr::Load(_) | Expr::Const(_) | Expr::RowLen | Expr::Keep { .. } | Expr::AlibiPenalty => vec![],
        };
        for o in operands {
            by_expr[o as usize].push(e as ExprId);
        }
    }
    let mut stored = vec![Vec::new(); kernel.body.len()];
    for (out, &e) in kernel.stores.iter().enumerate() {
        stored[e as usize].push(out);
    }
    (by_expr, stored)
}

/// What cuBLASLt can take of `kernel`, whose input `mm` is the matmul's
/// product; `Err` says why nothing (the pair then runs as before: the plain
/// GEMM, then the generated kernel).
///
/// The bias add must be the only use of the product and of the bias: the
/// product is then never needed without its bias, so the GEMM may write the
/// biased product in its place. Dtypes, alignment and cuBLASLt's own limits
/// are the caller's (they depend on the buffers).
pub fn fit(kernel: &Kernel, mm: usize) -> Result<Fit, String> {
    let loads = |input: usize| -> Vec<ExprId> {
        (0..kernel.body.len() as ExprId).filter(|&e| kernel.body[e as usize] == Expr::Load(input as u32)).collect()
    };
    if !full(kernel, &kernel.inputs[mm].axes) {
        return Err("the kernel does not read the product per element".into());
    }
    let (users, stored) = users(kernel);
    let mm_loads = loads(mm);
    let mut adds = Vec::new();
    for (e, expr) in kernel.body.iter().enumerate() {
        let Expr::Binary(Binary::Add, x, y) = *expr else { continue };
        for (p, q) in [(x, y), (y, x)] {
            if let Expr::Load(j) = kernel.body[q as usize]
                && mm_loads.contains(&p)
                && j as usize != mm
                && is_bias(kernel, j as usize)
            {
                adds.push((e as ExprId, j as usize));
            }
        }
    }
    let [(add, bias)] = adds[..] else {
        return Err(format!("the kernel has {} adds of the product and a bias, not one", adds.len()));
    };
    let only_add = |e: ExprId| users[e as usize] == [add] && stored[e as usize].is_empty();
    if !mm_loads.iter().all(|&e| only_add(e)) {
        return Err("the kernel reads the product without its bias too".into());
    }
    if !loads(bias).iter().all(|&e| only_add(e)) {
        return Err("the kernel reads the bias elsewhere too".into());
    }
    Ok(whole(kernel, mm, bias, add, &users, &stored).unwrap_or(Fit::BiasOnly { bias, add }))
}

/// The whole kernel as an epilogue, when it is nothing but the bias add and
/// an optional tanh GELU, every output stored per element.
fn whole(
    kernel: &Kernel,
    mm: usize,
    bias: usize,
    add: ExprId,
    users: &[Vec<ExprId>],
    stored: &[Vec<usize>],
) -> Option<Fit> {
    if kernel.inputs.len() != 2 || !kernel.outputs.iter().all(|o| full(kernel, &o.axes)) {
        return None;
    }
    let mut gelu = None;
    for (e, expr) in kernel.body.iter().enumerate() {
        match expr {
            Expr::Load(i) if *i as usize == mm || *i as usize == bias => {}
            _ if e as ExprId == add => {}
            Expr::Unary(Unary::Gelu(GeluApproximation::Tanh), a) if *a == add && gelu.is_none() => {
                gelu = Some(e as ExprId);
            }
            _ => return None,
        }
    }
    let add_out = &stored[add as usize];
    match gelu {
        None if add_out.len() == 1 && kernel.stores.len() == 1 => {
            Some(Fit::Whole { bias, add, epilogue: Epilogue::Bias, out: add_out[0], aux: None })
        }
        Some(g) if stored[g as usize].len() == 1 && users[g as usize].is_empty() && add_out.len() <= 1 => {
            let aux = add_out.first().copied();
            if kernel.stores.len() != 1 + aux.is_some() as usize {
                return None;
            }
            let epilogue = Epilogue::Gelu { bias: true, aux: aux.is_some(), approximation: GeluApproximation::Tanh };
            Some(Fit::Whole { bias, add, epilogue, out: stored[g as usize][0], aux })
        }
        _ => None,
    }
}
