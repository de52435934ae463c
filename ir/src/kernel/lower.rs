//! From graph nodes to kernel expressions: which ops a row kernel can hold,
//! and the exact expression of each (the same `f64` operations, in the same
//! order, as the reference interpreter's op, so fused graphs agree exactly).
//!
//! A node's result is either per element ([`Lowered::Elem`]) or a sum over
//! rows ([`Lowered::Sum`]: `layer_norm_grad`'s dγ and dβ, `sum_to`,
//! `squared_sum`), which becomes a cross-row output and is never read
//! inside the kernel.

use super::{Binary, Expr, ExprId, Kernel, KernelBuilder, Unary};
use crate::{Graph, NodeIndex, Op, Shape, Value};
use rustc_hash::FxHashMap;

/// The kernel axes an operand of `op` (operand `i`) of type `v` runs along
/// in a kernel over `kshape`: all of them for the kernel's shape, the
/// trailing ones for a right-aligned broadcast (a bias, γ, position
/// embeddings), `[0, 3]` for the attention mask.
fn axes_for(g: &Graph, op: &Op, i: usize, v: Value, kshape: &Shape) -> Option<Vec<usize>> {
    let ty = g.value_type(v);
    let (k, r) = (kshape.dims(), kshape.rank());
    if matches!(op, Op::AttentionMask | Op::AttentionMaskGrad) && i == 1 {
        let ok = r == 4 && ty.dtype.is_int() && ty.shape.dims() == [k[0].clone(), k[3].clone()];
        return ok.then(|| vec![0, 3]);
    }
    if !ty.dtype.is_float() {
        return None;
    }
    let n = ty.shape.rank();
    (n <= r && ty.shape.dims() == &k[r - n..]).then(|| (r - n..r).collect())
}

/// A node output inside a kernel: a per-element expression, or an
/// expression summed over the kernel axes not in `axes`.
#[derive(Clone, Debug)]
enum Lowered {
    Elem(ExprId),
    Sum(ExprId, Vec<usize>),
}

/// Whether `v` is a cross-row result (`layer_norm_grad`'s dγ or dβ), which
/// no kernel node may read.
fn cross_row_value(g: &Graph, v: Value) -> bool {
    v.output != 0 && matches!(g.node(v.node).op, Op::LayerNormGrad { .. })
}

/// The kernel axes of `sum_to` node `n`'s result in a kernel over `kshape`,
/// when it sums an operand of the kernel's shape down to a trailing suffix
/// of it (a bias gradient `[H]`, position embeddings' `[S, H]`, or `[]`).
pub fn sum_to_axes(g: &Graph, n: NodeIndex, kshape: &Shape) -> Option<Vec<usize>> {
    let node = g.node(n);
    let Op::SumTo { shape } = &node.op else { return None };
    let x = g.operands(n)[0];
    let (k, r, m) = (kshape.dims(), kshape.rank(), shape.rank());
    let fits = g.value_type(x).shape == *kshape
        && g.value_type(x).dtype.is_float()
        && !cross_row_value(g, x)
        && m <= r
        && shape.dims() == &k[r - m..]
        && node.outputs[0].shape == *shape;
    fits.then(|| (r - m..r).collect())
}

/// Whether optimizer node `n` (`adamw`, `squared_sum`) can be a kernel of
/// its own, over its first operand's shape (rank ≥ 1).
pub fn optimizer_fusible(g: &Graph, n: NodeIndex) -> bool {
    let node = g.node(n);
    if !matches!(node.op, Op::AdamW { .. } | Op::SquaredSum) {
        return false;
    }
    let operands = g.operands(n);
    let kshape = &g.value_type(operands[0]).shape;
    kshape.rank() >= 1
        && node.outputs.iter().all(|t| t.dtype.is_float())
        && operands.iter().enumerate().all(|(i, v)| axes_for(g, &node.op, i, *v, kshape).is_some())
        && match node.op {
            // p, g, m, v of the parameter's shape; lr, step, multiplier, finite scalars.
            Op::AdamW { .. } => operands.iter().enumerate().all(|(i, v)| {
                let rank = g.value_type(*v).shape.rank();
                if i < 4 { g.value_type(*v).shape == *kshape } else { rank == 0 }
            }),
            _ => true,
        }
}

/// Whether node `n` can be part of a row kernel over `kshape`.
pub fn fusible(g: &Graph, n: NodeIndex, kshape: &Shape) -> bool {
    let node = g.node(n);
    if let Op::LayerNormGrad { .. } = node.op {
        let ops = g.operands(n);
        return kshape.rank() >= 1
            && node.outputs.len() == 3
            && node.outputs.iter().all(|t| t.dtype.is_float())
            && node.outputs[0].shape == *kshape
            && g.value_type(ops[0]).shape == *kshape
            && g.value_type(ops[2]).shape == *kshape
            && g.value_type(ops[1]).shape.rank() == 1
            && !ops.iter().any(|v| cross_row_value(g, *v))
            && ops.iter().enumerate().all(|(i, v)| axes_for(g, &node.op, i, *v, kshape).is_some());
    }
    let supported = match &node.op {
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Scale { .. }
        | Op::Gelu { .. }
        | Op::Silu
        | Op::Relu
        | Op::Tanh
        | Op::GeluGrad { .. }
        | Op::SiluGrad
        | Op::ReluGrad
        | Op::TanhGrad
        | Op::Dropout { .. }
        | Op::AttentionMask
        | Op::AttentionMaskGrad
        | Op::LayerNorm { .. }
        | Op::Softmax
        | Op::SoftmaxGrad => true,
        // A tensor rank's heads take slopes by the rank, which a kernel does not know.
        Op::AlibiBias { ranks: 1 } => kshape.rank() == 4 && kshape.dims()[1].as_constant().is_some(),
        _ => false,
    };
    supported
        && node.outputs.len() == 1
        && node.outputs[0].shape == *kshape
        && node.outputs[0].dtype.is_float()
        && kshape.rank() >= 1
        && !g.operands(n).iter().any(|v| cross_row_value(g, *v))
        && g.operands(n).iter().enumerate().all(|(i, v)| axes_for(g, &node.op, i, *v, kshape).is_some())
}

/// One kernel over `kshape` computing `nodes` (in topological order, all
/// fusible over it) and storing `outputs`; with the graph values that feed
/// its inputs, in order.
pub fn lower(
    g: &Graph,
    nodes: &[NodeIndex],
    outputs: &[Value],
    name: &str,
    kshape: &Shape,
) -> Result<(Kernel, Vec<Value>), String> {
    let kshape = kshape.clone();
    let mut k = KernelBuilder::new(name, kshape.clone());
    let mut vals: FxHashMap<Value, Lowered> = FxHashMap::default();
    let mut feeds: FxHashMap<String, Value> = FxHashMap::default();
    for &n in nodes {
        let node = g.node(n);
        let mut x = Vec::new();
        for (i, v) in g.operands(n).iter().copied().enumerate() {
            let e = match vals.get(&v) {
                Some(Lowered::Elem(e)) => *e,
                Some(Lowered::Sum(..)) => {
                    return Err(format!("`{}` reads a cross-row result inside its kernel", node.name));
                }
                None if nodes.contains(&v.node) => {
                    return Err(format!("`{}` reads a value its kernel does not compute", node.name));
                }
                None => {
                    let axes = axes_for(g, &node.op, i, v, &kshape)
                        .ok_or_else(|| format!("operand {i} of `{}` does not fit the kernel", node.name))?;
                    let r = g.value_ref(v);
                    feeds.insert(r.clone(), v);
                    k.load(r, g.value_type(v).clone(), axes)
                }
            };
            x.push(e);
        }
        let ys = match &node.op {
            Op::SumTo { .. } => {
                let axes = sum_to_axes(g, n, &kshape).ok_or_else(|| format!("`{}` does not fit", node.name))?;
                vec![Lowered::Sum(x[0], axes)]
            }
            Op::SquaredSum => vec![Lowered::Sum(k.binary(Binary::Mul, x[0], x[0]), Vec::new())],
            Op::LayerNormGrad { eps } => layer_norm_grad(&mut k, *eps, &x),
            Op::AdamW { beta1, beta2, eps, weight_decay } => {
                adamw(&mut k, [*beta1, *beta2, *eps, *weight_decay], &x).into_iter().map(Lowered::Elem).collect()
            }
            op => vec![Lowered::Elem(
                expr(&mut k, op, &x).ok_or_else(|| format!("`{}` ({}) cannot be fused", node.name, node.op.name()))?,
            )],
        };
        for (i, y) in ys.into_iter().enumerate() {
            vals.insert(Value { node: n, output: i as u32 }, y);
        }
    }
    for v in outputs {
        let (name, ty) = (g.value_ref(*v), g.value_type(*v).clone());
        match vals.get(v).ok_or_else(|| format!("the kernel does not compute {name}"))? {
            Lowered::Elem(e) => k.store(name, ty, *e),
            Lowered::Sum(e, axes) => k.store_sum(name, ty, axes.clone(), *e),
        }
    }
    let kernel = k.finish()?;
    let operands = kernel.inputs.iter().map(|a| feeds[&a.name]).collect();
    Ok((kernel, operands))
}

/// A row's LayerNorm statistics, as `rows::layer_norm` computes them: the
/// mean, the biased variance by a second pass, `rstd = 1/√(var + eps)`.
struct RowStatistics {
    /// The row length `H`.
    n: ExprId,
    rstd: ExprId,
    /// `(x − mean)·rstd`.
    xhat: ExprId,
}

fn row_statistics(k: &mut KernelBuilder, x: ExprId, eps: f64) -> RowStatistics {
    use Binary::*;
    let n = k.push(Expr::RowLen);
    let sum = k.push(Expr::ReduceSum(x));
    let mean = k.binary(Div, sum, n);
    let d = k.binary(Sub, x, mean);
    let d2 = k.binary(Mul, d, d);
    let ss = k.push(Expr::ReduceSum(d2));
    let var = k.binary(Div, ss, n);
    let eps = k.constant(eps);
    let ve = k.binary(Add, var, eps);
    let rstd = k.unary(Unary::Rsqrt, ve);
    let xhat = k.binary(Mul, d, rstd);
    RowStatistics { n, rstd, xhat }
}

/// `layer_norm_grad (x, γ, dy) → (dx, dγ, dβ)` as `rows::layer_norm_grad`
/// computes it: the row statistics as in `layer_norm`, `g = dy·γ`,
/// `dx = rstd·((g − Σg/H) − x̂·(Σ g·x̂)/H)`; `dγ = Σ_rows dy·x̂` and
/// `dβ = Σ_rows dy` as cross-row outputs along the last axis.
fn layer_norm_grad(k: &mut KernelBuilder, eps: f64, x: &[ExprId]) -> Vec<Lowered> {
    use Binary::*;
    let last = vec![k.shape().rank() - 1];
    let RowStatistics { n, rstd, xhat } = row_statistics(k, x[0], eps);
    let g = k.binary(Mul, x[2], x[1]);
    let sum_g = k.push(Expr::ReduceSum(g));
    let mean_g = k.binary(Div, sum_g, n);
    let gx = k.binary(Mul, g, xhat);
    let sum_gx = k.push(Expr::ReduceSum(gx));
    let mean_gx = k.binary(Div, sum_gx, n);
    let centred = k.binary(Sub, g, mean_g);
    let proj = k.binary(Mul, xhat, mean_gx);
    let inner = k.binary(Sub, centred, proj);
    let dx = k.binary(Mul, rstd, inner);
    let dgamma = k.binary(Mul, x[2], xhat);
    vec![Lowered::Elem(dx), Lowered::Sum(dgamma, last.clone()), Lowered::Sum(x[2], last)]
}

/// `adamw (p, g, m, v, lr, t, multiplier, finite) → (p, m, v)` as
/// `optimizer::adamw` computes it, the identity where `finite == 0`.
fn adamw(k: &mut KernelBuilder, [beta1, beta2, eps, wd]: [f64; 4], x: &[ExprId]) -> [ExprId; 3] {
    use Binary::*;
    let [p, grad, m, v, lr, t, multiplier, finite] = x[..8].try_into().expect("adamw has 8 operands");
    let one = k.constant(1.0);
    let b1 = k.constant(beta1);
    let b2 = k.constant(beta2);
    let b1t = k.binary(Pow, b1, t);
    let bc1 = k.binary(Sub, one, b1t);
    let b2t = k.binary(Pow, b2, t);
    let bc2 = k.binary(Sub, one, b2t);
    let gm = k.binary(Mul, grad, multiplier);
    let wd = k.constant(wd);
    let lr_wd = k.binary(Mul, lr, wd);
    let keep = k.binary(Sub, one, lr_wd);
    let decayed = k.binary(Mul, p, keep);
    let c1 = k.constant(1.0 - beta1);
    let c2 = k.constant(1.0 - beta2);
    let m_old = k.binary(Mul, b1, m);
    let m_new = k.binary(Mul, c1, gm);
    let m1 = k.binary(Add, m_old, m_new);
    let v_old = k.binary(Mul, b2, v);
    let g1 = k.binary(Mul, c2, gm);
    let g2 = k.binary(Mul, g1, gm);
    let v1 = k.binary(Add, v_old, g2);
    let mhat = k.binary(Div, m1, bc1);
    let step = k.binary(Mul, lr, mhat);
    let vhat = k.binary(Div, v1, bc2);
    let root = k.unary(Unary::Sqrt, vhat);
    let eps = k.constant(eps);
    let denom = k.binary(Add, root, eps);
    let update = k.binary(Div, step, denom);
    let p1 = k.binary(Sub, decayed, update);
    let zero = k.constant(0.0);
    let skip = k.binary(Eq, finite, zero);
    [k.select(skip, p, p1), k.select(skip, m, m1), k.select(skip, v, v1)]
}

/// The expression of `op` on operand expressions `x`.
fn expr(k: &mut KernelBuilder, op: &Op, x: &[ExprId]) -> Option<ExprId> {
    use Binary::*;
    Some(match op {
        Op::Add => k.binary(Add, x[0], x[1]),
        Op::Sub => k.binary(Sub, x[0], x[1]),
        Op::Mul => k.binary(Mul, x[0], x[1]),
        Op::Scale { factor } => {
            let c = k.constant(*factor);
            k.binary(Mul, x[0], c)
        }
        Op::Gelu { approximation } => k.unary(Unary::Gelu(*approximation), x[0]),
        Op::Silu => k.unary(Unary::Silu, x[0]),
        Op::Relu => k.unary(Unary::Relu, x[0]),
        Op::Tanh => k.unary(Unary::Tanh, x[0]),
        Op::GeluGrad { approximation } => {
            let d = k.unary(Unary::GeluDeriv(*approximation), x[0]);
            k.binary(Mul, x[1], d)
        }
        Op::SiluGrad => {
            let d = k.unary(Unary::SiluDeriv, x[0]);
            k.binary(Mul, x[1], d)
        }
        Op::ReluGrad => {
            let zero = k.constant(0.0);
            let positive = k.binary(Gt, x[0], zero);
            k.select(positive, x[1], zero)
        }
        Op::TanhGrad => {
            let one = k.constant(1.0);
            let y2 = k.binary(Mul, x[0], x[0]);
            let d = k.binary(Sub, one, y2);
            k.binary(Mul, x[1], d)
        }
        Op::Dropout { p, stream } => {
            let keep = k.push(Expr::Keep { p: *p, stream: *stream });
            let scale = k.constant(1.0 / (1.0 - p));
            let scaled = k.binary(Mul, x[0], scale);
            let zero = k.constant(0.0);
            k.select(keep, scaled, zero)
        }
        Op::AttentionMask | Op::AttentionMaskGrad => {
            let zero = k.constant(0.0);
            let masked = k.binary(Eq, x[1], zero);
            let fill = if *op == Op::AttentionMask { k.constant(f64::NEG_INFINITY) } else { zero };
            k.select(masked, fill, x[0])
        }
        Op::AlibiBias { .. } => {
            let penalty = k.push(Expr::AlibiPenalty);
            k.binary(Sub, x[0], penalty)
        }
        Op::LayerNorm { eps } => {
            let xhat = row_statistics(k, x[0], *eps).xhat;
            let scaled = k.binary(Mul, xhat, x[1]);
            k.binary(Add, scaled, x[2])
        }
        Op::Softmax => {
            // exp(x − max)/Σ, zeros for an all −∞ row (max = −∞), NaNs for a
            // row holding a NaN (reduce_max propagates it).
            let max = k.push(Expr::ReduceMax(x[0]));
            let d = k.binary(Sub, x[0], max);
            let e = k.unary(Unary::Exp, d);
            let sum = k.push(Expr::ReduceSum(e));
            let y = k.binary(Div, e, sum);
            let ninf = k.constant(f64::NEG_INFINITY);
            let all_masked = k.binary(Eq, max, ninf);
            let zero = k.constant(0.0);
            k.select(all_masked, zero, y)
        }
        Op::SoftmaxGrad => {
            let prod = k.binary(Mul, x[0], x[1]);
            let dot = k.push(Expr::ReduceSum(prod));
            let d = k.binary(Sub, x[1], dot);
            k.binary(Mul, x[0], d)
        }
        _ => return None,
    })
}
