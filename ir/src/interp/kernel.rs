//! `fused` nodes: a [`Kernel`] evaluated row by row, every expression in
//! `f64` on every column of the row (a reduction's result repeated), with
//! no rounding inside the kernel; the driver rounds the outputs in `Native`
//! mode like any other op's. A cross-row output (one omitting kernel axes)
//! accumulates its stored value from `0.0` in element order.

use super::{attention, bind, nd, random};
use crate::kernel::{Binary, Expr, Kernel, Unary};
use crate::shape::Bindings;
use crate::tensor::{Tensor, TensorData};

use super::elementwise as ew;

fn unary(u: Unary, x: f64) -> f64 {
    match u {
        Unary::Neg => -x,
        Unary::Exp => x.exp(),
        Unary::Erf => libm::erf(x),
        Unary::Tanh => x.tanh(),
        Unary::Sqrt => x.sqrt(),
        Unary::Rsqrt => 1.0 / x.sqrt(),
        Unary::Recip => 1.0 / x,
        Unary::Relu => ew::relu(x),
        Unary::Silu => ew::silu(x),
        Unary::SiluDeriv => ew::silu_grad(x),
        Unary::Gelu(a) => ew::gelu(a)(x),
        Unary::GeluDeriv(a) => ew::gelu_grad(a)(x),
    }
}

fn binary(b: Binary, x: f64, y: f64) -> f64 {
    let flag = |c: bool| if c { 1.0 } else { 0.0 };
    match b {
        Binary::Add => x + y,
        Binary::Sub => x - y,
        Binary::Mul => x * y,
        Binary::Div => x / y,
        Binary::Max => x.max(y),
        Binary::Min => x.min(y),
        Binary::Lt => flag(x < y),
        Binary::Gt => flag(x > y),
        Binary::Eq => flag(x == y),
        Binary::Pow => x.powf(y),
    }
}

/// The outputs of `kernel` on `x` (one tensor per kernel input).
pub(super) fn run(
    kernel: &Kernel,
    x: &[&Tensor],
    bindings: &Bindings,
    seed: u64,
    offset: u64,
) -> Result<Vec<Tensor>, String> {
    kernel.check()?;
    if x.len() != kernel.inputs.len() {
        return Err(format!("kernel `{}` takes {} inputs, got {}", kernel.name, kernel.inputs.len(), x.len()));
    }
    let shape = bind::concrete_shape(&kernel.shape, bindings)?;
    let rank = shape.len();
    let width = shape[rank - 1];
    let numel: usize = shape.iter().product();
    let rows = numel.checked_div(width).unwrap_or(0);
    let kstrides = nd::strides(&shape);
    // Per input: its values as f64 and, per kernel axis, its stride (0 where it broadcasts).
    let mut data: Vec<Vec<f64>> = Vec::with_capacity(x.len());
    let mut strides: Vec<Vec<usize>> = Vec::with_capacity(x.len());
    for (arg, t) in kernel.inputs.iter().zip(x) {
        let want: Vec<usize> = arg.axes.iter().map(|&a| shape[a]).collect();
        if t.shape() != want.as_slice() {
            return Err(format!("input `{}` must be {want:?}, got {:?}", arg.name, t.shape()));
        }
        data.push(match t.data() {
            TensorData::Float(v) => v.clone(),
            TensorData::Int(v) => v.iter().map(|&i| i as f64).collect(),
        });
        let own = nd::strides(&want);
        let mut s = vec![0; rank];
        for (k, &a) in arg.axes.iter().enumerate() {
            s[a] = own[k];
        }
        strides.push(s);
    }
    let slopes = if rank == 4 { attention::alibi_slopes(shape[1]) } else { Vec::new() };
    // Per output: its values and, per kernel axis, its stride (0 where it sums).
    let mut outs: Vec<Vec<f64>> = Vec::with_capacity(kernel.outputs.len());
    let mut out_strides: Vec<Option<Vec<usize>>> = Vec::with_capacity(kernel.outputs.len());
    for arg in &kernel.outputs {
        if arg.is_cross_row(rank) {
            let dims: Vec<usize> = arg.axes.iter().map(|&a| shape[a]).collect();
            let own = nd::strides(&dims);
            let mut s = vec![0; rank];
            for (k, &a) in arg.axes.iter().enumerate() {
                s[a] = own[k];
            }
            outs.push(vec![0.0; dims.iter().product()]);
            out_strides.push(Some(s));
        } else {
            outs.push(Vec::with_capacity(numel));
            out_strides.push(None);
        }
    }
    let mut vals: Vec<Vec<f64>> = vec![vec![0.0; width]; kernel.body.len()];
    let mut index = vec![0usize; rank];
    for row in 0..rows {
        for (i, e) in kernel.body.iter().enumerate() {
            let (done, rest) = vals.split_at_mut(i);
            let out = &mut rest[0];
            match *e {
                Expr::Load(k) => {
                    let (d, s) = (&data[k as usize], &strides[k as usize]);
                    for (j, o) in out.iter_mut().enumerate() {
                        let flat = row * width + j;
                        let mut at = 0;
                        for a in 0..rank {
                            index[a] = (flat / kstrides[a]) % shape[a];
                            at += index[a] * s[a];
                        }
                        *o = d[at];
                    }
                }
                Expr::Const(c) => out.fill(c),
                Expr::RowLen => out.fill(width as f64),
                Expr::Unary(u, a) => {
                    for (o, &v) in out.iter_mut().zip(&done[a as usize]) {
                        *o = unary(u, v);
                    }
                }
                Expr::Binary(b, p, q) => {
                    for ((o, &v), &w) in out.iter_mut().zip(&done[p as usize]).zip(&done[q as usize]) {
                        *o = binary(b, v, w);
                    }
                }
                Expr::Select(c, p, q) => {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = if done[c as usize][j] != 0.0 { done[p as usize][j] } else { done[q as usize][j] };
                    }
                }
                Expr::Keep { p, stream } => {
                    for (j, o) in out.iter_mut().enumerate() {
                        let e = (row * width + j) as u64;
                        *o = if random::dropout_keeps(seed, stream, offset, e, p) { 1.0 } else { 0.0 };
                    }
                }
                Expr::AlibiPenalty => {
                    let (h, sq) = (shape[1], shape[2]);
                    let (i, head) = (row % sq, (row / sq) % h);
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = slopes[head] * i.abs_diff(j) as f64;
                    }
                }
                Expr::ReduceSum(a) => {
                    let sum: f64 = done[a as usize].iter().sum();
                    out.fill(sum);
                }
                Expr::ReduceMax(a) => {
                    let nan_max = |m: f64, v: f64| if m.is_nan() || v.is_nan() { f64::NAN } else { m.max(v) };
                    let max = done[a as usize].iter().copied().fold(f64::NEG_INFINITY, nan_max);
                    out.fill(max);
                }
            }
        }
        for ((o, &s), os) in outs.iter_mut().zip(&kernel.stores).zip(&out_strides) {
            match os {
                None => o.extend_from_slice(&vals[s as usize]),
                Some(os) => {
                    for (j, &v) in vals[s as usize].iter().enumerate() {
                        let flat = row * width + j;
                        let at: usize = (0..rank).map(|a| (flat / kstrides[a]) % shape[a] * os[a]).sum();
                        o[at] += v;
                    }
                }
            }
        }
    }
    Ok(kernel
        .outputs
        .iter()
        .zip(outs)
        .map(|(arg, v)| {
            let dims = arg.axes.iter().map(|&a| shape[a]).collect();
            nd::float(dims, arg.ty.dtype, v)
        })
        .collect())
}
