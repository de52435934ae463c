//! Layout ops: reshape, transpose, split, slice (and its adjoint), concat.
//!
//! All row-major, all gathers ([`nd::gather_indices`]), so they serve float
//! and integer tensors alike (labels are reshaped too).

use super::nd;
use crate::tensor::{Tensor, TensorData};

/// The same elements in the same order under `shape`.
pub(super) fn reshape(x: &Tensor, shape: Vec<usize>) -> Result<Tensor, String> {
    if shape.iter().product::<usize>() != x.numel() {
        return Err(format!("cannot reshape {:?} ({} elements) to {shape:?}", x.shape(), x.numel()));
    }
    let all: Vec<usize> = (0..x.numel()).collect();
    Ok(nd::take(x, shape, &all))
}

/// Output axis `d` is input axis `perm[d]`.
pub(super) fn transpose(x: &Tensor, perm: &[usize]) -> Result<Tensor, String> {
    let rank = x.shape().len();
    let mut seen = vec![false; rank];
    if perm.len() != rank || !perm.iter().all(|&p| p < rank && !std::mem::replace(&mut seen[p], true)) {
        return Err(format!("{perm:?} is not a permutation of the axes of {:?}", x.shape()));
    }
    let strides = nd::strides(x.shape());
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    let out_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    Ok(nd::take(x, shape.clone(), &nd::gather_indices(&shape, &out_strides, 0)))
}

/// Elements `[start, start + len)` of `axis`; past the axis is an error.
pub(super) fn slice(x: &Tensor, axis: usize, start: usize, len: usize) -> Result<Tensor, String> {
    let size = *x.shape().get(axis).ok_or_else(|| format!("axis {axis} is out of range for {:?}", x.shape()))?;
    if start.checked_add(len).is_none_or(|end| end > size) {
        return Err(format!(
            "slice [{start}, {start}+{len}) is out of axis {axis} of length {size} in {:?}",
            x.shape()
        ));
    }
    let strides = nd::strides(x.shape());
    let mut shape = x.shape().to_vec();
    shape[axis] = len;
    Ok(nd::take(x, shape.clone(), &nd::gather_indices(&shape, &strides, start * strides[axis])))
}

/// Pieces of `axis` of the given sizes, in order.
pub(super) fn split(x: &Tensor, axis: usize, sizes: &[usize]) -> Result<Vec<Tensor>, String> {
    let size = *x.shape().get(axis).ok_or_else(|| format!("axis {axis} is out of range for {:?}", x.shape()))?;
    if sizes.iter().sum::<usize>() != size {
        return Err(format!("split sizes {sizes:?} do not sum to axis {axis} of {:?}", x.shape()));
    }
    let mut start = 0;
    sizes
        .iter()
        .map(|&len| {
            let piece = slice(x, axis, start, len);
            start += len;
            piece
        })
        .collect()
}

/// The operands joined along `axis`, in order; other axes must agree.
/// Each operand flattened, concatenated, zero-padded to `len` elements.
pub(super) fn flatten(xs: &[&Tensor], len: usize) -> Result<Tensor, String> {
    let mut flat = Vec::with_capacity(len);
    for x in xs {
        flat.extend_from_slice(nd::floats(x, "a flatten operand")?);
    }
    if flat.len() > len {
        return Err(format!("the operands hold {} elements, more than the bucket's {len}", flat.len()));
    }
    flat.resize(len, 0.0);
    Ok(nd::float(vec![len], xs[0].dtype(), flat))
}

pub(super) fn concat(xs: &[&Tensor], axis: usize) -> Result<Tensor, String> {
    let first = xs.first().ok_or("concat needs at least one operand")?;
    if axis >= first.shape().len() {
        return Err(format!("axis {axis} is out of range for {:?}", first.shape()));
    }
    let mut shape = first.shape().to_vec();
    shape[axis] = 0;
    for x in xs {
        let agree = x.shape().len() == shape.len()
            && x.dtype() == first.dtype()
            && (0..shape.len()).all(|d| d == axis || x.shape()[d] == shape[d]);
        if !agree {
            return Err(format!(
                "concat operands must agree except on axis {axis}: {:?} and {:?}",
                first.shape(),
                x.shape()
            ));
        }
        shape[axis] += x.shape()[axis];
    }
    // Row-major: each "outer" index contributes one run from every operand in turn.
    let outer: usize = shape[..axis].iter().product();
    let mut floats = Vec::new();
    let mut ints = Vec::new();
    for o in 0..outer {
        for x in xs {
            let run: usize = x.shape()[axis..].iter().product();
            match x.data() {
                TensorData::Float(v) => floats.extend_from_slice(&v[o * run..][..run]),
                TensorData::Int(v) => ints.extend_from_slice(&v[o * run..][..run]),
            }
        }
    }
    Ok(if first.dtype().is_float() {
        nd::float(shape, first.dtype(), floats)
    } else {
        nd::int(shape, first.dtype(), ints)
    })
}

/// `dy` placed at `[start, start + len)` of an axis of length `axis_len`,
/// zeros elsewhere: the adjoint of [`slice`].
pub(super) fn slice_grad(dy: &Tensor, axis: usize, start: usize, axis_len: usize) -> Result<Tensor, String> {
    let len = *dy.shape().get(axis).ok_or_else(|| format!("axis {axis} is out of range for {:?}", dy.shape()))?;
    if start.checked_add(len).is_none_or(|end| end > axis_len) {
        return Err(format!("[{start}, {start}+{len}) does not fit an axis of length {axis_len}"));
    }
    let mut shape = dy.shape().to_vec();
    shape[axis] = axis_len;
    let strides = nd::strides(&shape);
    // Where each element of dy lands in the output.
    let targets = nd::gather_indices(dy.shape(), &strides, start * strides[axis]);
    let n = shape.iter().product();
    Ok(match dy.data() {
        TensorData::Float(v) => {
            let mut out = vec![0.0; n];
            for (&t, &x) in targets.iter().zip(v) {
                out[t] = x;
            }
            nd::float(shape, dy.dtype(), out)
        }
        TensorData::Int(v) => {
            let mut out = vec![0; n];
            for (&t, &x) in targets.iter().zip(v) {
                out[t] = x;
            }
            nd::int(shape, dy.dtype(), out)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    /// [2, 3] holding 0..6.
    fn m() -> Tensor {
        nd::float(vec![2, 3], DType::F32, (0..6).map(f64::from).collect())
    }

    #[test]
    fn reshape_and_transpose() {
        let r = reshape(&m(), vec![3, 2]).unwrap();
        assert_eq!(r.shape(), &[3, 2]);
        assert_eq!(r.floats().unwrap(), m().floats().unwrap());
        assert!(reshape(&m(), vec![4]).is_err());
        let t = transpose(&m(), &[1, 0]).unwrap();
        assert_eq!(t.shape(), &[3, 2]);
        assert_eq!(t.floats().unwrap(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        // [1, 2, 3] with perm [2, 0, 1] → [3, 1, 2]: out[k, 0, i] = x[0, i, k].
        let x = reshape(&m(), vec![1, 2, 3]).unwrap();
        let p = transpose(&x, &[2, 0, 1]).unwrap();
        assert_eq!(p.shape(), &[3, 1, 2]);
        assert_eq!(p.floats().unwrap(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        let ids = Tensor::int(vec![2, 2], DType::I64, vec![1, 2, 3, 4]).unwrap();
        assert_eq!(transpose(&ids, &[1, 0]).unwrap().ints().unwrap(), &[1, 3, 2, 4]);
        assert!(transpose(&m(), &[0, 0]).is_err());
    }

    #[test]
    fn slice_split_concat_round_trip() {
        let s = slice(&m(), 1, 1, 2).unwrap();
        assert_eq!(s.shape(), &[2, 2]);
        assert_eq!(s.floats().unwrap(), &[1.0, 2.0, 4.0, 5.0]);
        assert_eq!(slice(&m(), 0, 1, 1).unwrap().floats().unwrap(), &[3.0, 4.0, 5.0]);
        assert!(slice(&m(), 1, 2, 2).unwrap_err().contains("out of axis 1 of length 3"));
        let pieces = split(&m(), 1, &[1, 2]).unwrap();
        assert_eq!(pieces[0].floats().unwrap(), &[0.0, 3.0]);
        assert_eq!(pieces[1].floats().unwrap(), &[1.0, 2.0, 4.0, 5.0]);
        let joined = concat(&[&pieces[0], &pieces[1]], 1).unwrap();
        assert_eq!(joined, m());
        let rows = concat(&[&m(), &m()], 0).unwrap();
        assert_eq!(rows.shape(), &[4, 3]);
        assert_eq!(&rows.floats().unwrap()[6..], m().floats().unwrap());
        assert!(split(&m(), 1, &[1, 1]).is_err());
    }

    #[test]
    fn slice_grad_places_the_window_in_zeros() {
        let dy = nd::float(vec![2, 1], DType::F32, vec![7.0, 8.0]);
        let g = slice_grad(&dy, 1, 1, 3).unwrap();
        assert_eq!(g.shape(), &[2, 3]);
        assert_eq!(g.floats().unwrap(), &[0.0, 7.0, 0.0, 0.0, 8.0, 0.0]);
        assert!(slice_grad(&dy, 1, 3, 3).is_err());
    }
}
