//! From graph nodes to kernel expressions: which ops a row kernel can hold,
//! and the exact expression of each (the same `f64` operations, in the same
//! order, as the reference interpreter's op, so fused graphs agree exactly).

use std::collections::HashMap;

use zeroplan_ir::kernel::{Binary, Expr, ExprId, Kernel, KernelBuilder, Unary};
use zeroplan_ir::{Graph, NodeIndex, Op, Shape, Value};

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

/// Whether node `n` can be part of a row kernel over `kshape`.
pub(super) fn fusible(g: &Graph, n: NodeIndex, kshape: &Shape) -> bool {
    let node = g.node(n);
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
        Op::AlibiBias => kshape.rank() == 4 && kshape.dims()[1].as_constant().is_some(),
        _ => false,
    };
    supported
        && node.outputs.len() == 1
        && node.outputs[0].shape == *kshape
        && node.outputs[0].dtype.is_float()
        && kshape.rank() >= 1
        && g.operands(n).iter().enumerate().all(|(i, v)| axes_for(g, &node.op, i, *v, kshape).is_some())
}

/// One kernel computing `nodes` (in topological order, all fusible over the
/// shape of the last one) and storing `outputs`; with the graph values that
/// feed its inputs, in order.
pub(super) fn lower(
    g: &Graph,
    nodes: &[NodeIndex],
    outputs: &[Value],
    name: &str,
) -> Result<(Kernel, Vec<Value>), String> {
    let kshape = g.node(*nodes.last().ok_or("an empty group")?).outputs[0].shape.clone();
    let mut k = KernelBuilder::new(name, kshape.clone());
    let mut vals: HashMap<Value, ExprId> = HashMap::new();
    let mut feeds: HashMap<String, Value> = HashMap::new();
    for &n in nodes {
        let node = g.node(n);
        let mut x = Vec::new();
        for (i, v) in g.operands(n).into_iter().enumerate() {
            let e = match vals.get(&v) {
                Some(&e) => e,
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
        let y = expr(&mut k, &node.op, &x)
            .ok_or_else(|| format!("`{}` ({}) cannot be fused", node.name, node.op.name()))?;
        vals.insert(Value { node: n, output: 0 }, y);
    }
    for v in outputs {
        k.store(g.value_ref(*v), g.value_type(*v).clone(), vals[v]);
    }
    let kernel = k.finish()?;
    let operands = kernel.inputs.iter().map(|a| feeds[&a.name]).collect();
    Ok((kernel, operands))
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
        Op::AlibiBias => {
            let penalty = k.push(Expr::AlibiPenalty);
            k.binary(Sub, x[0], penalty)
        }
        Op::LayerNorm { eps } => {
            let n = k.push(Expr::RowLen);
            let sum = k.push(Expr::ReduceSum(x[0]));
            let mean = k.binary(Div, sum, n);
            let d = k.binary(Sub, x[0], mean);
            let d2 = k.binary(Mul, d, d);
            let ss = k.push(Expr::ReduceSum(d2));
            let var = k.binary(Div, ss, n);
            let eps = k.constant(*eps);
            let ve = k.binary(Add, var, eps);
            let rstd = k.unary(Unary::Rsqrt, ve);
            let xhat = k.binary(Mul, d, rstd);
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
