//! Row-major index arithmetic and tensor plumbing shared by the kernels.
//!
//! Layout ops and broadcasting are all *gathers*: for each output element,
//! the flat index of the input element it reads. Computing that index list
//! once with [`gather_indices`] keeps every layout kernel a few lines and
//! makes it work for float and integer tensors alike.

use crate::dtype::DType;
use crate::tensor::{Tensor, TensorData};

/// Row-major strides of `shape`, in elements.
pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// NumPy broadcasting of two concrete shapes: aligned from the right, each
/// pair equal or one of them 1.
pub(super) fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| (i + s.len()).checked_sub(rank).map_or(1, |j| s[j]);
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Some(x),
            (1, y) => Some(y),
            _ => None,
        })
        .collect()
}

/// For each element of `shape` (row-major), `base + Σ index[d]·strides[d]`.
/// A zero stride repeats (broadcasts); a permuted stride list transposes.
pub(super) fn gather_indices(shape: &[usize], strides: &[usize], base: usize) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut index = vec![0usize; shape.len()];
    let mut flat = base;
    for _ in 0..n {
        out.push(flat);
        // Odometer increment, keeping `flat` in step.
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            flat += strides[d];
            if index[d] < shape[d] {
                break;
            }
            flat -= strides[d] * shape[d];
            index[d] = 0;
        }
    }
    out
}

/// For each element of `to`, the flat index of the element of `from` that
/// broadcasting `from` to `to` places there. `from` must broadcast to `to`.
pub(super) fn broadcast_indices(from: &[usize], to: &[usize]) -> Vec<usize> {
    let offset = to.len() - from.len();
    let from_strides = strides(from);
    let eff: Vec<usize> =
        (0..to.len()).map(|d| if d < offset || from[d - offset] == 1 { 0 } else { from_strides[d - offset] }).collect();
    gather_indices(to, &eff, 0)
}

/// The tensor of `shape` whose element `i` is `x`'s element `indices[i]`.
pub(super) fn take(x: &Tensor, shape: Vec<usize>, indices: &[usize]) -> Tensor {
    match x.data() {
        TensorData::Float(v) => float(shape, x.dtype(), indices.iter().map(|&i| v[i]).collect()),
        TensorData::Int(v) => int(shape, x.dtype(), indices.iter().map(|&i| v[i]).collect()),
    }
}

/// A float tensor holding `values` exactly, unrounded: the driver rounds
/// outputs in `Native` mode and never in `F64` mode.
pub(super) fn float(shape: Vec<usize>, dtype: DType, values: Vec<f64>) -> Tensor {
    debug_assert!(dtype.is_float() && shape.iter().product::<usize>() == values.len());
    let mut t = Tensor::full(shape, dtype, 0.0);
    t.floats_mut().expect("a float dtype").copy_from_slice(&values);
    t
}

/// An integer tensor; `shape` and `values` must agree.
pub(super) fn int(shape: Vec<usize>, dtype: DType, values: Vec<i64>) -> Tensor {
    Tensor::int(shape, dtype, values).expect("an integer tensor whose shape matches its data")
}

/// A tensor of one value, unrounded (truncated toward zero for integers).
pub(super) fn full(shape: Vec<usize>, dtype: DType, value: f64) -> Tensor {
    let n = shape.iter().product();
    if dtype.is_float() { float(shape, dtype, vec![value; n]) } else { int(shape, dtype, vec![value as i64; n]) }
}

/// An f32 scalar, unrounded.
pub(super) fn scalar(value: f64) -> Tensor {
    float(Vec::new(), DType::F32, vec![value])
}

/// `x`'s float elements, or an error naming `what`.
pub(super) fn floats<'t>(x: &'t Tensor, what: &str) -> Result<&'t [f64], String> {
    x.floats().ok_or_else(|| format!("{what} must be a float tensor, got {}{:?}", x.dtype(), x.shape()))
}

/// `x`'s integer elements, or an error naming `what`.
pub(super) fn ints<'t>(x: &'t Tensor, what: &str) -> Result<&'t [i64], String> {
    x.ints().ok_or_else(|| format!("{what} must be an integer tensor, got {}{:?}", x.dtype(), x.shape()))
}

/// The value of a one-element tensor, or an error naming `what`.
pub(super) fn item(x: &Tensor, what: &str) -> Result<f64, String> {
    x.item().ok_or_else(|| format!("{what} must hold one element, got shape {:?}", x.shape()))
}

/// The row width of a tensor seen as rows over its last axis (a scalar is
/// one row of width 1). Never 0, so it can size `chunks`: a tensor with an
/// empty last axis has no elements and so no chunks either.
pub(super) fn row_width(shape: &[usize]) -> usize {
    shape.last().copied().unwrap_or(1).max(1)
}

/// An error unless `a` and `b` have one shape.
pub(super) fn same_shape(a: &Tensor, b: &Tensor, what: &str) -> Result<(), String> {
    if a.shape() == b.shape() {
        Ok(())
    } else {
        Err(format!("{what}: shapes {:?} and {:?} differ", a.shape(), b.shape()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_gathers() {
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        // A [2, 3] matrix read transposed: shape [3, 2], strides [1, 3].
        assert_eq!(gather_indices(&[3, 2], &[1, 3], 0), vec![0, 3, 1, 4, 2, 5]);
        // [3] broadcast to [2, 3] and [2, 1] broadcast to [2, 3].
        assert_eq!(broadcast_indices(&[3], &[2, 3]), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_indices(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_shape(&[2, 1, 4], &[3, 1]), Some(vec![2, 3, 4]));
        assert_eq!(broadcast_shape(&[2, 3], &[4]), None);
        assert_eq!(broadcast_indices(&[], &[]), vec![0]);
    }
}
