//! `matmul`: batched matrix products over the last two axes.
//!
//! Each batch's operands are first copied into contiguous `[M, K]` and
//! `[K, N]` matrices (applying the transpose flags), then multiplied in
//! i-k-j order so the inner loop streams rows: a tiny model trains in
//! milliseconds. Every output element is `Σ_k a[i,k]·b[k,j]` accumulated
//! in increasing `k` in `f64`; no zero is skipped, so `0·∞` gives NaN.

use super::nd;
use crate::tensor::Tensor;

/// `a @ b` over the last two axes, leading axes broadcast; `transpose_a`
/// (`transpose_b`) swaps the last two axes of `a` (`b`) first.
pub(super) fn matmul(a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor, String> {
    let (x, y) = (nd::floats(a, "the left operand")?, nd::floats(b, "the right operand")?);
    let (ra, rb) = (a.shape().len(), b.shape().len());
    if ra < 2 || rb < 2 {
        return Err(format!("matmul operands need rank ≥ 2, got {:?} and {:?}", a.shape(), b.shape()));
    }
    let (a_rows, a_cols) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (b_rows, b_cols) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    let (m, k) = if transpose_a { (a_cols, a_rows) } else { (a_rows, a_cols) };
    let (k2, n) = if transpose_b { (b_cols, b_rows) } else { (b_rows, b_cols) };
    if k != k2 {
        return Err(format!("inner dimensions differ: {k} and {k2} ({:?} @ {:?})", a.shape(), b.shape()));
    }
    let (batch_a, batch_b) = (&a.shape()[..ra - 2], &b.shape()[..rb - 2]);
    let batch = nd::broadcast_shape(batch_a, batch_b)
        .ok_or_else(|| format!("batch axes {batch_a:?} and {batch_b:?} do not broadcast"))?;
    let (which_a, which_b) = (nd::broadcast_indices(batch_a, &batch), nd::broadcast_indices(batch_b, &batch));
    let mut out = vec![0.0; which_a.len() * m * n];
    for (bi, (&ia, &ib)) in which_a.iter().zip(&which_b).enumerate() {
        let lhs = contiguous(&x[ia * a_rows * a_cols..][..a_rows * a_cols], a_rows, a_cols, transpose_a);
        let rhs = contiguous(&y[ib * b_rows * b_cols..][..b_rows * b_cols], b_rows, b_cols, transpose_b);
        let block = &mut out[bi * m * n..][..m * n];
        for i in 0..m {
            let row = &mut block[i * n..][..n];
            for p in 0..k {
                let aip = lhs[i * k + p];
                for (o, &bpj) in row.iter_mut().zip(&rhs[p * n..][..n]) {
                    *o += aip * bpj;
                }
            }
        }
    }
    let mut shape = batch;
    shape.extend([m, n]);
    Ok(nd::float(shape, a.dtype(), out))
}

/// The `rows × cols` row-major matrix `m`, transposed when `transpose` is set.
fn contiguous(m: &[f64], rows: usize, cols: usize, transpose: bool) -> Vec<f64> {
    if !transpose {
        return m.to_vec();
    }
    (0..cols).flat_map(|c| (0..rows).map(move |r| m[r * cols + c])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn t(shape: Vec<usize>, v: &[f64]) -> Tensor {
        Tensor::float(shape, DType::F32, v.to_vec()).unwrap()
    }

    #[test]
    fn plain_and_transposed_products() {
        // [[1,2,3],[4,5,6]] @ [[1,0],[0,1],[1,1]] = [[4,5],[10,11]]
        let a = t(vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = t(vec![3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let ab = matmul(&a, &b, false, false).unwrap();
        assert_eq!(ab.shape(), &[2, 2]);
        assert_eq!(ab.floats().unwrap(), &[4.0, 5.0, 10.0, 11.0]);
        // b stored transposed ([2, 3]) with transpose_b gives the same product.
        let bt = t(vec![2, 3], &[1.0, 0.0, 1.0, 0.0, 1.0, 1.0]);
        assert_eq!(matmul(&a, &bt, false, true).unwrap(), ab);
        // aᵀ @ a: [[17,22,27],[22,29,36],[27,36,45]]
        let ata = matmul(&a, &a, true, false).unwrap();
        assert_eq!(ata.floats().unwrap(), &[17.0, 22.0, 27.0, 22.0, 29.0, 36.0, 27.0, 36.0, 45.0]);
        // a @ aᵀ: [[14,32],[32,77]]
        assert_eq!(matmul(&a, &a, false, true).unwrap().floats().unwrap(), &[14.0, 32.0, 32.0, 77.0]);
        // Both transposed: aᵀ is [3, 2] and bᵀ [2, 3], so aᵀ @ bᵀ = (b @ a)ᵀ.
        // b @ a = [[1,2,3],[4,5,6],[5,7,9]], so (b a)ᵀ = [[1,4,5],[2,5,7],[3,6,9]].
        let both = matmul(&a, &b, true, true).unwrap();
        assert_eq!(both.floats().unwrap(), &[1.0, 4.0, 5.0, 2.0, 5.0, 7.0, 3.0, 6.0, 9.0]);
        assert!(matmul(&a, &a, false, false).is_err());
    }

    #[test]
    fn leading_axes_broadcast() {
        // Two batches of [1, 2] against one shared [2, 2].
        let a = t(vec![2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
        let w = t(vec![2, 2], &[1.0, 10.0, 100.0, 1000.0]);
        let out = matmul(&a, &w, false, false).unwrap();
        assert_eq!(out.shape(), &[2, 1, 2]);
        assert_eq!(out.floats().unwrap(), &[201.0, 2010.0, 403.0, 4030.0]);
        // [2, 1, 1, 2] @ [3, 2, 1]: batch [2, 3].
        let a = t(vec![2, 1, 1, 2], &[1.0, 1.0, 2.0, 2.0]);
        let b = t(vec![3, 2, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let out = matmul(&a, &b, false, false).unwrap();
        assert_eq!(out.shape(), &[2, 3, 1, 1]);
        assert_eq!(out.floats().unwrap(), &[3.0, 7.0, 11.0, 6.0, 14.0, 22.0]);
    }

    #[test]
    fn infinities_are_not_skipped() {
        let a = t(vec![1, 2], &[0.0, 1.0]);
        let b = t(vec![2, 1], &[f64::INFINITY, 1.0]);
        assert!(matmul(&a, &b, false, false).unwrap().floats().unwrap()[0].is_nan());
    }
}
