//! `matmul {transpose_a, transpose_b}` through the `gemm` crate: a batch of
//! GEMMs over the leading axes (NumPy broadcasting), each operand read in
//! place with its own strides, so a transpose flag costs nothing.
//!
//! f32 operands are read where they lie; 16-bit ones are widened to f32
//! first and the result rounded once (nearest even), like the reference's
//! single rounding per output.

use gemm::Parallelism;
use rayon::prelude::*;
use zeroplan_exec::MatMulShape;

/// A raw pointer that may cross threads: the batches write disjoint outputs.
#[derive(Clone, Copy)]
struct Ptr<T>(*mut T);
unsafe impl<T> Send for Ptr<T> {}
unsafe impl<T> Sync for Ptr<T> {}

/// `c = a·b` for every batch.
///
/// # Safety
/// `a`, `b` and `c` hold the elements the shape says; `c` overlaps neither.
pub unsafe fn matmul_f32(s: &MatMulShape, a: *const f32, b: *const f32, c: *mut f32) {
    let (m, n, k) = (s.m, s.n, s.k);
    // Row-major strides of the stored operands, then the flags swap them.
    let (a_rs, a_cs) = if s.transpose_a { (1, m as isize) } else { (k as isize, 1) };
    let (b_rs, b_cs) = if s.transpose_b { (1, k as isize) } else { (n as isize, 1) };
    let (a, b, c) = (Ptr(a.cast_mut()), Ptr(b.cast_mut()), Ptr(c));
    let one = |i: usize, ia: usize, ib: usize, parallelism: Parallelism| {
        let (a, b, c) = (a, b, c);
        // SAFETY: the caller's contract; batch `i` writes its own m×n block.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.0.add(i * m * n),
                1,
                n as isize,
                false,
                a.0.add(ia * m * k).cast_const(),
                a_cs,
                a_rs,
                b.0.add(ib * k * n).cast_const(),
                b_cs,
                b_rs,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            )
        }
    };
    if k == 0 {
        // SAFETY: `c` holds every batch's m×n outputs.
        unsafe { std::ptr::write_bytes(c.0, 0, s.batches.len() * m * n) };
        return;
    }
    let threads = rayon::current_num_threads();
    if s.batches.len() >= threads && s.batches.len() > 1 {
        // Many small products (attention's per-head GEMMs): one per task.
        s.batches.par_iter().enumerate().for_each(|(i, &(ia, ib))| one(i, ia, ib, Parallelism::None));
    } else {
        let parallelism =
            if s.flops() / s.batches.len() as f64 > 4e6 { Parallelism::Rayon(threads) } else { Parallelism::None };
        for (i, &(ia, ib)) in s.batches.iter().enumerate() {
            one(i, ia, ib, parallelism);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The product by definition, in f64.
    fn naive(a: &[f32], b: &[f32], s: &MatMulShape) -> Vec<f64> {
        let (m, n, k) = (s.m, s.n, s.k);
        let mut c = Vec::new();
        for &(ia, ib) in &s.batches {
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0;
                    for l in 0..k {
                        let x = if s.transpose_a { a[ia * m * k + l * m + i] } else { a[ia * m * k + i * k + l] };
                        let y = if s.transpose_b { b[ib * k * n + j * k + l] } else { b[ib * k * n + l * n + j] };
                        acc += f64::from(x) * f64::from(y);
                    }
                    c.push(acc);
                }
            }
        }
        c
    }

    #[test]
    fn every_flag_and_broadcast_matches_the_definition() {
        for (sa, sb) in [
            (vec![3, 5], vec![5, 4]),
            (vec![2, 3, 5], vec![5, 4]),
            (vec![2, 1, 3, 5], vec![3, 5, 4]),
            (vec![7, 3, 5], vec![7, 5, 4]),
        ] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let swap = |s: &[usize], t: bool| {
                    let mut s = s.to_vec();
                    let r = s.len();
                    if t {
                        s.swap(r - 1, r - 2);
                    }
                    s
                };
                let (a_shape, b_shape) = (swap(&sa, ta), swap(&sb, tb));
                let s = MatMulShape::new(&a_shape, &b_shape, ta, tb).unwrap();
                let a: Vec<f32> = (0..a_shape.iter().product::<usize>()).map(|i| (i % 7) as f32 - 3.0).collect();
                let b: Vec<f32> = (0..b_shape.iter().product::<usize>()).map(|i| (i % 5) as f32 * 0.5).collect();
                let mut c = vec![f32::NAN; s.batches.len() * s.m * s.n];
                unsafe { matmul_f32(&s, a.as_ptr(), b.as_ptr(), c.as_mut_ptr()) };
                let want = naive(&a, &b, &s);
                assert_eq!(c.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(), want, "{a_shape:?} {b_shape:?}");
            }
        }
    }

    #[test]
    fn products_with_one_weight_are_folded_into_one_tall_product() {
        let s = MatMulShape::new(&[32, 128, 384], &[384, 384], false, true).unwrap();
        assert_eq!((s.m, s.n, s.k, s.batches.as_slice()), (4096, 384, 384, &[(0, 0)][..]));
        // Transposed A blocks are not rows of one matrix; per-batch B is not shared.
        assert_eq!(MatMulShape::new(&[32, 384, 128], &[384, 384], true, true).unwrap().batches.len(), 32);
        assert_eq!(MatMulShape::new(&[32, 128, 384], &[32, 384, 384], false, false).unwrap().batches.len(), 32);
    }

    #[test]
    fn shapes_that_do_not_multiply_are_refused() {
        assert!(MatMulShape::new(&[3, 5], &[4, 4], false, false).is_none());
        assert!(MatMulShape::new(&[2, 3, 5], &[3, 5, 4], false, false).is_none());
        assert!(MatMulShape::new(&[5], &[5, 4], false, false).is_none());
    }
}
