//! NumPy-broadcast `add`, `sub`, `mul` and their adjoint `sum_to`, for the
//! operands no row kernel takes (scalars, and broadcasts that are not a
//! trailing suffix). In f64, rounded once per output like the reference.

use zeroplan_exec::Arith;

/// For each element of `out_shape` (row-major), the index of the element of
/// `shape` that broadcasting reads (`shape` aligned to the right).
pub fn indices(shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let rank = out_shape.len();
    let pad = rank - shape.len();
    let mut strides = vec![0usize; rank];
    let mut s = 1;
    for d in (0..shape.len()).rev() {
        strides[pad + d] = if shape[d] == 1 { 0 } else { s };
        s *= shape[d];
    }
    let count: usize = out_shape.iter().product();
    let mut out = Vec::with_capacity(count);
    let mut index = vec![0usize; rank];
    for _ in 0..count {
        out.push(index.iter().zip(&strides).map(|(i, s)| i * s).sum());
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < out_shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// `out = a ∘ b` with broadcasting.
pub fn binary(
    op: Arith,
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    out_shape: &[usize],
    out: &mut [f32],
) {
    let (ia, ib) = (indices(a_shape, out_shape), indices(b_shape, out_shape));
    for ((o, &i), &j) in out.iter_mut().zip(&ia).zip(&ib) {
        let (x, y) = (f64::from(a[i]), f64::from(b[j]));
        *o = match op {
            Arith::Add => x + y,
            Arith::Sub => x - y,
            Arith::Mul => x * y,
        } as f32;
    }
}

/// `out = x·factor`.
pub fn scale(x: &[f32], factor: f64, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (f64::from(v) * factor) as f32;
    }
}

/// `x` summed down to `shape` (the axes broadcasting would repeat), in element order.
pub fn sum_to(x: &[f32], x_shape: &[usize], shape: &[usize], out: &mut [f32]) {
    let mut acc = vec![0.0f64; out.len()];
    for (&t, &v) in indices(shape, x_shape).iter().zip(x) {
        acc[t] += f64::from(v);
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasts_and_sums_by_hand() {
        let mut out = [0.0; 6];
        binary(Arith::Add, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &[10.0, 20.0], &[2, 1], &[2, 3], &mut out);
        assert_eq!(out, [11.0, 12.0, 13.0, 24.0, 25.0, 26.0]);
        let mut s = [0.0; 1];
        binary(Arith::Mul, &[3.0], &[], &[4.0], &[], &[], &mut s);
        assert_eq!(s, [12.0]);
        let mut rows = [0.0; 2];
        sum_to(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &[2, 1], &mut rows);
        assert_eq!(rows, [6.0, 15.0]);
    }
}
