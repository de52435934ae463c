//! Elementwise ops: broadcasting arithmetic and its adjoint `sum_to`,
//! activations and their exact derivatives, and casts.
//!
//! The scalar functions are public (`gelu_erf`, `silu_grad`, …) so backend
//! tests can compare against the exact formula without building a graph.

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI, SQRT_2};

use super::nd;
use crate::dtype::DType;
use crate::op::GeluApproximation;
use crate::tensor::{Tensor, TensorData};

/// The three broadcasting binary ops.
#[derive(Clone, Copy, Debug)]
pub(super) enum Binary {
    Add,
    Sub,
    Mul,
}

/// `a (op) b` with NumPy broadcasting; the result has `a`'s dtype. Integer
/// operands use checked integer arithmetic.
pub(super) fn binary(op: Binary, a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let shape = nd::broadcast_shape(a.shape(), b.shape())
        .ok_or_else(|| format!("shapes {:?} and {:?} do not broadcast", a.shape(), b.shape()))?;
    let (ia, ib) = (nd::broadcast_indices(a.shape(), &shape), nd::broadcast_indices(b.shape(), &shape));
    match (a.data(), b.data()) {
        (TensorData::Float(x), TensorData::Float(y)) => {
            let f = |p: f64, q: f64| match op {
                Binary::Add => p + q,
                Binary::Sub => p - q,
                Binary::Mul => p * q,
            };
            let values = ia.iter().zip(&ib).map(|(&i, &j)| f(x[i], y[j])).collect();
            Ok(nd::float(shape, a.dtype(), values))
        }
        (TensorData::Int(x), TensorData::Int(y)) => {
            let f = |p: i64, q: i64| match op {
                Binary::Add => p.checked_add(q),
                Binary::Sub => p.checked_sub(q),
                Binary::Mul => p.checked_mul(q),
            };
            let values = ia
                .iter()
                .zip(&ib)
                .map(|(&i, &j)| f(x[i], y[j]).ok_or_else(|| format!("integer overflow in {op:?}({}, {})", x[i], y[j])))
                .collect::<Result<_, _>>()?;
            Ok(nd::int(shape, a.dtype(), values))
        }
        _ => Err(format!("operands are {} and {}: one float and one integer", a.dtype(), b.dtype())),
    }
}

/// Sums `x` down to `shape`: the adjoint of broadcasting `shape` to `x`'s
/// shape. Each output element adds its inputs in row-major order.
pub(super) fn sum_to(x: &Tensor, shape: &[usize]) -> Result<Tensor, String> {
    if nd::broadcast_shape(shape, x.shape()).as_deref() != Some(x.shape()) {
        return Err(format!("{shape:?} does not broadcast to {:?}, so it cannot be summed to", x.shape()));
    }
    let targets = nd::broadcast_indices(shape, x.shape());
    let n = shape.iter().product();
    match x.data() {
        TensorData::Float(v) => {
            let mut out = vec![0.0; n];
            for (&t, &value) in targets.iter().zip(v) {
                out[t] += value;
            }
            Ok(nd::float(shape.to_vec(), x.dtype(), out))
        }
        TensorData::Int(v) => {
            let mut out = vec![0i64; n];
            for (&t, &value) in targets.iter().zip(v) {
                out[t] = out[t].checked_add(value).ok_or("integer overflow in sum_to")?;
            }
            Ok(nd::int(shape.to_vec(), x.dtype(), out))
        }
    }
}

/// `f` applied to every element of the float tensor `x`.
pub(super) fn map(x: &Tensor, f: impl Fn(f64) -> f64) -> Result<Tensor, String> {
    let v = nd::floats(x, "the operand")?;
    Ok(nd::float(x.shape().to_vec(), x.dtype(), v.iter().map(|&e| f(e)).collect()))
}

/// `f(x, dy)` elementwise over two float tensors of one shape (the `*_grad` ops).
pub(super) fn map2(x: &Tensor, dy: &Tensor, f: impl Fn(f64, f64) -> f64) -> Result<Tensor, String> {
    nd::same_shape(x, dy, "the forward value and its gradient")?;
    let (a, b) = (nd::floats(x, "the forward value")?, nd::floats(dy, "the gradient")?);
    Ok(nd::float(x.shape().to_vec(), dy.dtype(), a.iter().zip(b).map(|(&p, &q)| f(p, q)).collect()))
}

/// `√(2/π)`, the tanh-GELU's inner factor.
const SQRT_2_OVER_PI: f64 = FRAC_2_SQRT_PI * FRAC_1_SQRT_2;
/// The tanh-GELU's cubic coefficient.
const GELU_CUBIC: f64 = 0.044715;

/// `0.5·x·(1 + erf(x/√2))`: exact GELU.
pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / SQRT_2))
}

/// `d/dx gelu_erf = Φ(x) + x·φ(x)`, with `φ(x) = exp(−x²/2)/√(2π)`.
pub fn gelu_erf_grad(x: f64) -> f64 {
    let cdf = 0.5 * (1.0 + libm::erf(x / SQRT_2));
    let pdf = (-0.5 * x * x).exp() * (FRAC_2_SQRT_PI * FRAC_1_SQRT_2 * 0.5);
    cdf + x * pdf
}

/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
pub fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)).tanh())
}

/// The derivative of [`gelu_tanh`]:
/// `0.5·(1 + t) + 0.5·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²)`, `t = tanh(u)`.
pub fn gelu_tanh_grad(x: f64) -> f64 {
    let t = (SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
}

/// The logistic function, without overflow for large `|x|`.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `x·σ(x)`.
pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// `σ(x)·(1 + x·(1 − σ(x)))`.
pub fn silu_grad(x: f64) -> f64 {
    let s = sigmoid(x);
    s * (1.0 + x * (1.0 - s))
}

/// `max(0, x)`, NaN propagating (as PyTorch's `relu`).
pub fn relu(x: f64) -> f64 {
    if x > 0.0 || x.is_nan() { x } else { 0.0 }
}

pub(super) fn gelu(approximation: GeluApproximation) -> fn(f64) -> f64 {
    match approximation {
        GeluApproximation::Erf => gelu_erf,
        GeluApproximation::Tanh => gelu_tanh,
    }
}

pub(super) fn gelu_grad(approximation: GeluApproximation) -> fn(f64) -> f64 {
    match approximation {
        GeluApproximation::Erf => gelu_erf_grad,
        GeluApproximation::Tanh => gelu_tanh_grad,
    }
}

/// `x` as dtype `to`. Float → float relabels (the driver rounds in `Native`);
/// float → integer truncates toward zero and rejects NaN, ±∞ and values the
/// target cannot hold; integer → integer checks the range.
pub(super) fn cast(x: &Tensor, to: DType) -> Result<Tensor, String> {
    let shape = x.shape().to_vec();
    let (lo, hi) = match to {
        DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        _ => (i64::MIN, i64::MAX),
    };
    match (x.data(), to.is_float()) {
        (TensorData::Float(v), true) => Ok(nd::float(shape, to, v.clone())),
        (TensorData::Int(v), true) => Ok(nd::float(shape, to, v.iter().map(|&i| i as f64).collect())),
        (TensorData::Float(v), false) => {
            let values = v
                .iter()
                .map(|&f| {
                    let t = f.trunc();
                    // i64::MAX as f64 is 2^63, itself out of range: compare strictly.
                    if t.is_finite() && t >= lo as f64 && t < (hi as f64) + 1.0 {
                        Ok(t as i64)
                    } else {
                        Err(format!("cannot cast {f} to {to}"))
                    }
                })
                .collect::<Result<_, _>>()?;
            Ok(nd::int(shape, to, values))
        }
        (TensorData::Int(v), false) => {
            if let Some(bad) = v.iter().find(|&&i| i < lo || i > hi) {
                return Err(format!("cannot cast {bad} to {to}"));
            }
            Ok(nd::int(shape, to, v.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32t(shape: Vec<usize>, v: &[f64]) -> Tensor {
        Tensor::float(shape, DType::F32, v.to_vec()).unwrap()
    }

    #[test]
    fn broadcasting_add_sub_mul() {
        let a = f32t(vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let row = f32t(vec![3], &[10.0, 20.0, 30.0]);
        let col = f32t(vec![2, 1], &[100.0, 200.0]);
        assert_eq!(binary(Binary::Add, &a, &row).unwrap().floats().unwrap(), &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
        assert_eq!(
            binary(Binary::Sub, &a, &col).unwrap().floats().unwrap(),
            &[-99.0, -98.0, -97.0, -196.0, -195.0, -194.0]
        );
        // [2, 1] × [3] → [2, 3]: an outer product.
        let outer = binary(Binary::Mul, &col, &row).unwrap();
        assert_eq!(outer.shape(), &[2, 3]);
        assert_eq!(outer.floats().unwrap(), &[1000.0, 2000.0, 3000.0, 2000.0, 4000.0, 6000.0]);
        assert!(binary(Binary::Add, &a, &f32t(vec![2], &[1.0, 2.0])).is_err());
        let i = Tensor::int(vec![2], DType::I64, vec![3, -4]).unwrap();
        assert_eq!(binary(Binary::Mul, &i, &i).unwrap().ints().unwrap(), &[9, 16]);
        let big = Tensor::int(vec![1], DType::I64, vec![i64::MAX]).unwrap();
        assert!(binary(Binary::Add, &big, &big).unwrap_err().contains("overflow"));
    }

    #[test]
    fn sum_to_is_the_adjoint_of_broadcasting() {
        let x = f32t(vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(sum_to(&x, &[3]).unwrap().floats().unwrap(), &[5.0, 7.0, 9.0]);
        assert_eq!(sum_to(&x, &[2, 1]).unwrap().floats().unwrap(), &[6.0, 15.0]);
        assert_eq!(sum_to(&x, &[]).unwrap().floats().unwrap(), &[21.0]);
        assert_eq!(sum_to(&x, &[2, 3]).unwrap(), x);
        assert!(sum_to(&x, &[2]).is_err());
    }

    #[test]
    fn activations_at_hand_computed_points() {
        // Φ(1) = 0.841344746068543 (tables), so gelu(1) = 0.841344746…
        assert!((gelu_erf(1.0) - 0.841_344_746_068_543).abs() < 1e-15);
        assert!((gelu_erf(-1.0) - (-1.0 + 0.841_344_746_068_543)).abs() < 1e-15);
        // gelu'(1) = Φ(1) + φ(1) = 0.841344746 + 0.241970725 = 1.083315471 (mpmath)
        assert!((gelu_erf_grad(1.0) - 1.083_315_470_587_686_4).abs() < 1e-14);
        // tanh form at 1: u = √(2/π)·1.044715 = 0.833562…, 0.5·(1 + tanh u) = 0.841191…
        let u: f64 = 0.797_884_560_802_865_4 * 1.044_715;
        assert!((gelu_tanh(1.0) - 0.5 * (1.0 + u.tanh())).abs() < 1e-15);
        assert!((gelu_tanh(1.0) - 0.841_191_990_608_276_8).abs() < 1e-14);
        // σ(0) = 1/2: silu(0) = 0, silu'(0) = 1/2; σ(2) = 0.8807970779778823.
        assert_eq!(silu(0.0), 0.0);
        assert_eq!(silu_grad(0.0), 0.5);
        assert!((silu(2.0) - 1.761_594_155_955_764_6).abs() < 1e-15);
        assert!((silu_grad(2.0) - 0.880_797_077_977_882_3 * (1.0 + 2.0 * 0.119_202_922_022_117_7)).abs() < 1e-15);
        assert_eq!(sigmoid(-1000.0), 0.0);
        assert_eq!(sigmoid(1000.0), 1.0);
        assert_eq!(relu(-2.0), 0.0);
        assert_eq!(relu(3.0), 3.0);
        assert!(relu(f64::NAN).is_nan());
    }

    #[test]
    fn derivatives_match_central_differences() {
        let h = 1e-6;
        for &x in &[-3.0, -1.2, -0.3, 0.0, 0.4, 1.7, 4.0] {
            let numeric = |f: fn(f64) -> f64| (f(x + h) - f(x - h)) / (2.0 * h);
            assert!((gelu_erf_grad(x) - numeric(gelu_erf)).abs() < 1e-8, "gelu erf at {x}");
            assert!((gelu_tanh_grad(x) - numeric(gelu_tanh)).abs() < 1e-8, "gelu tanh at {x}");
            assert!((silu_grad(x) - numeric(silu)).abs() < 1e-8, "silu at {x}");
        }
    }

    #[test]
    fn casts_round_truncate_and_refuse() {
        let x = f32t(vec![4], &[1.7, -1.7, 2.5, -0.2]);
        assert_eq!(cast(&x, DType::I64).unwrap().ints().unwrap(), &[1, -1, 2, 0]);
        let big = f32t(vec![1], &[3e9]);
        assert!(cast(&big, DType::I32).is_err());
        assert_eq!(cast(&big, DType::I64).unwrap().ints().unwrap(), &[3_000_000_000]);
        assert!(cast(&f32t(vec![1], &[f64::NAN]), DType::I64).is_err());
        // Float → float relabels here; the driver rounds in Native mode.
        let relabelled = cast(&Tensor::float(vec![1], DType::F32, vec![1.00390625]).unwrap(), DType::BF16).unwrap();
        assert_eq!(relabelled.dtype(), DType::BF16);
        assert_eq!(relabelled.floats().unwrap(), &[1.00390625]);
        let i = Tensor::int(vec![2], DType::I64, vec![7, -3]).unwrap();
        assert_eq!(cast(&i, DType::F32).unwrap().floats().unwrap(), &[7.0, -3.0]);
        assert!(cast(&Tensor::int(vec![1], DType::I64, vec![1 << 40]).unwrap(), DType::I32).is_err());
    }
}
