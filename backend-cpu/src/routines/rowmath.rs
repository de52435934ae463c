//! Row arithmetic the compiler can vectorise: `exp` without a libm call,
//! and reductions over independent lanes.
//!
//! A softmax row is an `exp` per element and two reductions. `f32::exp` is
//! a call per element, and a sum or max folded left to right is one long
//! dependency chain; neither vectorises. Here `exp` is Cephes' `expf`
//! (range reduction by `ln 2`, a degree-6 polynomial, the exponent set by
//! bits) written branch-free, and the reductions run over [`LANES`]
//! independent accumulators — which also makes the f64 sums more accurate
//! than one running total.

/// Independent accumulators per reduction.
pub const LANES: usize = 8;

/// Below this `exp` underflows f32's normal range: the result is 0.
const EXP_MIN: f32 = -87.336_54;
/// Above this `exp` overflows: the result is +∞.
const EXP_MAX: f32 = 88.722_83;

/// `eˣ` in f32, within 2 ulp of the exact value on the normal range
/// (checked against f64 in the tests); 0 below `−87.34` (where the exact
/// value is subnormal or 0), +∞ above `88.72`, NaN for NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that n·LN2_HI is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2²³: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let clamped = x.clamp(EXP_MIN, EXP_MAX);
    let n = (clamped * LOG2E + ROUND) - ROUND;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes: 5.0000001201e-1, which rounds to 0.5 in f32
    let e_r = p * r * r + r + 1.0;
    // 2ⁿ from its exponent bits; n ∈ [−126, 128] after the clamp, and
    // n = 128 (x near 88.72) takes its last factor 2 apart to stay finite.
    let low = n.min(127.0);
    let pow = f32::from_bits((((low as i32) + 127) << 23) as u32);
    let y = e_r * pow * if n > low { 2.0 } else { 1.0 };
    if x.is_nan() {
        x
    } else if x < EXP_MIN {
        0.0
    } else if x > EXP_MAX {
        f32::INFINITY
    } else {
        y
    }
}

/// The largest element (−∞ for an empty row); NaNs are skipped, as `f32::max` does.
#[inline(always)]
pub fn max(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.max(x);
        }
    }
    let tail = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    acc.into_iter().fold(tail, f32::max)
}

/// `Σ a·b` in f64.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f64; LANES];
    let (mut ca, mut cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
            *s += f64::from(p) * f64::from(q);
        }
    }
    let tail: f64 = ca.remainder().iter().zip(cb.remainder()).map(|(&p, &q)| f64::from(p) * f64::from(q)).sum();
    acc.iter().sum::<f64>() + tail
}

/// `Σ x` in f64.
#[inline(always)]
pub fn sum(row: &[f32]) -> f64 {
    let mut acc = [0.0f64; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (s, &x) in acc.iter_mut().zip(c) {
            *s += f64::from(x);
        }
    }
    acc.iter().sum::<f64>() + chunks.remainder().iter().map(|&x| f64::from(x)).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place of `want` (f32).
    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        let ulp = f64::from(f32::from_bits(w.to_bits() + 1)) - f64::from(w);
        (f64::from(got) - want).abs() / ulp
    }

    #[test]
    fn exp_is_within_two_ulps_over_the_normal_range() {
        let mut worst: f64 = 0.0;
        let steps = 2_000_000;
        for i in 0..=steps {
            let x = EXP_MIN + (EXP_MAX - EXP_MIN) * (i as f32 / steps as f32);
            let want = f64::from(x).exp();
            if want < f64::from(f32::MIN_POSITIVE) || want > f64::from(f32::MAX) {
                continue;
            }
            worst = worst.max(ulps(exp(x), want));
        }
        assert!(worst <= 2.0, "worst {worst} ulp");
        // Softmax's range: exactly 1 at 0, and small arguments.
        assert_eq!(exp(0.0), 1.0);
        assert!(ulps(exp(-1e-3), (-1e-3f64).exp()) <= 1.0);
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(EXP_MAX).is_finite() && exp(EXP_MIN) > 0.0);
    }

    #[test]
    fn reductions_match_the_plain_folds() {
        let v: Vec<f32> = (0..37).map(|i| ((i * 7919) % 101) as f32 * 0.37 - 11.0).collect();
        assert_eq!(max(&v), v.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        let exact: f64 = v.iter().map(|&x| f64::from(x)).sum();
        assert!((sum(&v) - exact).abs() < 1e-12);
        let dot_exact: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        assert!((dot(&v, &v) - dot_exact).abs() < 1e-9);
    }
}
