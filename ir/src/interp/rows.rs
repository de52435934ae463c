//! Row ops over the last axis: `layer_norm`, `softmax` and their gradients.
//!
//! Statistics are two-pass in `f64` (mean first, then `Σ(x−μ)²`), the
//! numerically careful form. A softmax row that is entirely −∞ (a query
//! whose every key is masked) gives zeros rather than NaN, so a fully padded
//! row contributes nothing downstream.

use super::nd;
use crate::tensor::Tensor;

/// `(μ, 1/√(σ²+eps))` of one row, with the biased variance `σ² = Σ(x−μ)²/H`.
fn moments(row: &[f64], eps: f64) -> (f64, f64) {
    let h = row.len() as f64;
    let mean = row.iter().sum::<f64>() / h;
    let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / h;
    (mean, 1.0 / (var + eps).sqrt())
}

/// The row width of `x`, checked against `[H]`-shaped `gamma`.
fn width_of(x: &Tensor, gamma: &Tensor) -> Result<usize, String> {
    let width = *x.shape().last().ok_or("layer_norm needs rank ≥ 1")?;
    if gamma.shape() != [width] {
        return Err(format!("gamma {:?} must be [{width}] for rows of {:?}", gamma.shape(), x.shape()));
    }
    Ok(width)
}

/// `(x − μ)/√(σ² + eps)·γ + β` per row.
pub(super) fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor, String> {
    let width = width_of(x, gamma)?;
    nd::same_shape(gamma, beta, "gamma and beta")?;
    let (v, g, b) = (nd::floats(x, "x")?, nd::floats(gamma, "gamma")?, nd::floats(beta, "beta")?);
    let mut out = Vec::with_capacity(v.len());
    for row in v.chunks(width.max(1)) {
        let (mean, rstd) = moments(row, eps);
        out.extend(row.iter().zip(g).zip(b).map(|((&x, &g), &b)| (x - mean) * rstd * g + b));
    }
    Ok(nd::float(x.shape().to_vec(), x.dtype(), out))
}

/// `(x, γ, dy) → (dx, dγ, dβ)`, the statistics recomputed from `x`:
/// with `g = dy·γ`, `dx = r·(g − mean(g) − x̂·mean(g·x̂))`;
/// `dγ = Σ_rows dy·x̂`; `dβ = Σ_rows dy`.
pub(super) fn layer_norm_grad(x: &Tensor, gamma: &Tensor, dy: &Tensor, eps: f64) -> Result<Vec<Tensor>, String> {
    let width = width_of(x, gamma)?;
    nd::same_shape(x, dy, "x and its gradient")?;
    let (v, gm, d) = (nd::floats(x, "x")?, nd::floats(gamma, "gamma")?, nd::floats(dy, "dy")?);
    let mut dx = Vec::with_capacity(v.len());
    let (mut dgamma, mut dbeta) = (vec![0.0; width], vec![0.0; width]);
    let h = width as f64;
    for (row, drow) in v.chunks(width.max(1)).zip(d.chunks(width.max(1))) {
        let (mean, rstd) = moments(row, eps);
        let xhat: Vec<f64> = row.iter().map(|x| (x - mean) * rstd).collect();
        let g: Vec<f64> = drow.iter().zip(gm).map(|(d, gm)| d * gm).collect();
        let mean_g = g.iter().sum::<f64>() / h;
        let mean_gx = g.iter().zip(&xhat).map(|(g, x)| g * x).sum::<f64>() / h;
        dx.extend(g.iter().zip(&xhat).map(|(g, x)| rstd * (g - mean_g - x * mean_gx)));
        for j in 0..width {
            dgamma[j] += drow[j] * xhat[j];
            dbeta[j] += drow[j];
        }
    }
    Ok(vec![
        nd::float(x.shape().to_vec(), dy.dtype(), dx),
        nd::float(vec![width], gamma.dtype(), dgamma),
        nd::float(vec![width], gamma.dtype(), dbeta),
    ])
}

/// Softmax of one row into `out`: max-subtracted; an all −∞ row gives zeros
/// and a row holding a NaN gives NaNs.
pub(super) fn softmax_row(row: &[f64], out: &mut Vec<f64>) {
    if row.iter().any(|x| x.is_nan()) {
        out.extend(row.iter().map(|_| f64::NAN));
        return;
    }
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        out.extend(row.iter().map(|_| 0.0));
        return;
    }
    let start = out.len();
    out.extend(row.iter().map(|x| (x - max).exp()));
    let sum: f64 = out[start..].iter().sum();
    for e in &mut out[start..] {
        *e /= sum;
    }
}

/// Softmax over the last axis.
pub(super) fn softmax(x: &Tensor) -> Result<Tensor, String> {
    let v = nd::floats(x, "the operand")?;
    let width = nd::row_width(x.shape());
    let mut out = Vec::with_capacity(v.len());
    for row in v.chunks(width) {
        softmax_row(row, &mut out);
    }
    Ok(nd::float(x.shape().to_vec(), x.dtype(), out))
}

/// `(y, dy) → y·(dy − Σ dy·y)` per row.
pub(super) fn softmax_grad(y: &Tensor, dy: &Tensor) -> Result<Tensor, String> {
    nd::same_shape(y, dy, "the softmax output and its gradient")?;
    let (yv, dv) = (nd::floats(y, "y")?, nd::floats(dy, "dy")?);
    let width = nd::row_width(y.shape());
    let mut out = Vec::with_capacity(yv.len());
    for (yr, dr) in yv.chunks(width).zip(dv.chunks(width)) {
        let dot: f64 = yr.iter().zip(dr).map(|(y, d)| y * d).sum();
        out.extend(yr.iter().zip(dr).map(|(y, d)| y * (d - dot)));
    }
    Ok(nd::float(y.shape().to_vec(), dy.dtype(), out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn t(shape: Vec<usize>, v: &[f64]) -> Tensor {
        nd::float(shape, DType::F32, v.to_vec())
    }

    fn close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn layer_norm_by_hand() {
        // Row [1, 2, 3, 4]: μ = 2.5, σ² = (2.25+0.25+0.25+2.25)/4 = 1.25.
        // x̂ = (x − 2.5)/√1.25 = [−1.3416408, −0.4472136, 0.4472136, 1.3416408].
        let x = t(vec![1, 4], &[1.0, 2.0, 3.0, 4.0]);
        let gamma = t(vec![4], &[1.0, 2.0, 1.0, 1.0]);
        let beta = t(vec![4], &[0.0, 0.0, 0.0, 10.0]);
        let y = layer_norm(&x, &gamma, &beta, 1e-300).unwrap();
        let s = 1.25f64.sqrt();
        close(y.floats().unwrap(), &[-1.5 / s, 2.0 * -0.5 / s, 0.5 / s, 1.5 / s + 10.0], 1e-15);
        // A constant row normalises to 0 (then β): (x − μ) = 0 whatever eps.
        let c = layer_norm(&t(vec![4], &[3.0; 4]), &gamma, &beta, 1e-5).unwrap();
        assert_eq!(c.floats().unwrap(), &[0.0, 0.0, 0.0, 10.0]);
    }

    #[test]
    fn layer_norm_grad_by_hand_and_by_differences() {
        // dβ = Σ_rows dy, dγ = Σ_rows dy·x̂. Two rows [1,3] and [0,4]: x̂ = [−1, 1] for both (eps → 0).
        let x = t(vec![2, 2], &[1.0, 3.0, 0.0, 4.0]);
        let gamma = t(vec![2], &[1.0, 1.0]);
        let dy = t(vec![2, 2], &[1.0, 2.0, 3.0, 5.0]);
        let grads = layer_norm_grad(&x, &gamma, &dy, 1e-300).unwrap();
        close(grads[2].floats().unwrap(), &[4.0, 7.0], 0.0);
        close(grads[1].floats().unwrap(), &[-4.0, 7.0], 1e-15);
        // Width 2 with x̂ = ±1: y = ±1 whatever x, so dx = 0.
        close(grads[0].floats().unwrap(), &[0.0; 4], 1e-15);

        // dx against central differences of L = Σ dy·layer_norm(x).
        let x = t(vec![2, 3], &[0.3, -1.2, 2.0, 0.5, 0.1, -0.7]);
        let gamma = t(vec![3], &[1.5, -0.5, 2.0]);
        let beta = t(vec![3], &[0.1, 0.2, 0.3]);
        let dy = t(vec![2, 3], &[1.0, -2.0, 0.5, 0.25, 3.0, -1.0]);
        let eps = 1e-5;
        let dx = layer_norm_grad(&x, &gamma, &dy, eps).unwrap().remove(0);
        let loss = |xs: &[f64]| -> f64 {
            let y = layer_norm(&t(vec![2, 3], xs), &gamma, &beta, eps).unwrap();
            y.floats().unwrap().iter().zip(dy.floats().unwrap()).map(|(a, b)| a * b).sum()
        };
        let base = x.floats().unwrap().to_vec();
        for i in 0..6 {
            let (mut plus, mut minus) = (base.clone(), base.clone());
            plus[i] += 1e-6;
            minus[i] -= 1e-6;
            let numeric = (loss(&plus) - loss(&minus)) / 2e-6;
            assert!((dx.floats().unwrap()[i] - numeric).abs() < 1e-7, "element {i}");
        }
    }

    #[test]
    fn softmax_rows_and_masked_rows() {
        // [0, ln 2, ln 5] → [1, 2, 5]/8.
        let x = t(vec![2, 3], &[0.0, 2f64.ln(), 5f64.ln(), f64::NEG_INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY]);
        let y = softmax(&x).unwrap();
        close(&y.floats().unwrap()[..3], &[0.125, 0.25, 0.625], 1e-15);
        assert_eq!(&y.floats().unwrap()[3..], &[0.0, 0.0, 0.0]);
        // One masked key: [0, −∞] → [1, 0]; huge values do not overflow.
        let y = softmax(&t(vec![2, 2], &[0.0, f64::NEG_INFINITY, 1000.0, 1000.0])).unwrap();
        assert_eq!(y.floats().unwrap(), &[1.0, 0.0, 0.5, 0.5]);
        assert!(softmax(&t(vec![2], &[f64::NAN, 0.0])).unwrap().floats().unwrap().iter().all(|v| v.is_nan()));
    }

    #[test]
    fn softmax_grad_by_hand() {
        // y = [0.25, 0.75], dy = [1, 3]: Σ dy·y = 2.5, dx = [0.25·(−1.5), 0.75·0.5].
        let g = softmax_grad(&t(vec![2], &[0.25, 0.75]), &t(vec![2], &[1.0, 3.0])).unwrap();
        assert_eq!(g.floats().unwrap(), &[-0.375, 0.375]);
    }
}
