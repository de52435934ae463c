//! Inline `f32x4` approximations of the functions Cranelift has no
//! instruction for: `exp`, `tanh`, `erf`, and the activations built on them.
//! Inline polynomials instead of calls keep the column loop vectorised and
//! call-free.
//!
//! Measured against the `f64` functions over a dense sweep (the test
//! `math_approximations_are_accurate` in `tests/kernels.rs` asserts these
//! bounds):
//!
//! - `exp`: Cephes' `expf` — range reduction `x = n·ln 2 + r`, `|r| ≤ ln2/2`,
//!   a degree-7 polynomial, and `2ⁿ` built in the exponent bits (as two
//!   factors, so `n = 128` and `n = −126` both work). Relative error
//!   ≤ 2.5e-7 (≈ 2 ulp). Below `ln(2⁻¹²⁶)` it flushes to `0` (subnormal
//!   results, < 1.2e-38, are not produced); `−∞ → 0`, `+∞ → +∞`, NaN → NaN.
//! - `tanh`: the odd Taylor series to `x⁹` for `|x| < 0.25` (error below
//!   half an ulp), else `1 − 2/(e^{2|x|} + 1)` with the sign of `x`.
//!   Relative error ≤ 1e-6, absolute ≤ 2e-7.
//! - `erf`: Eigen's rational approximation `x·P(x²)/Q(x²)` for `|x| < 0.5`,
//!   else `±(1 − erfc|x|)` with Numerical Recipes' `erfcc`
//!   (`t·exp(−z² + P(t))`, fractional error < 1.2e-7). GELU's `Φ(x)` uses
//!   `½·erfc(−x/√2)` for `x < 0`, so `x·Φ(x)` stays accurate in the tail.
//!
//! GELU, SiLU and their derivatives are composed from these with the
//! interpreter's formulas (`zeroplan_ir::interp::elementwise`).

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI, LN_2, LOG2_E};

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Value};
use cranelift_frontend::FunctionBuilder;
use zeroplan_ir::GeluApproximation;

use super::simd::{self, select, splat, splat_i};

/// Below this `exp` is below the smallest normal `f32`, `2⁻¹²⁶`.
const EXP_MIN: f32 = -87.336_55;
/// Above this `exp` overflows: `ln(f32::MAX)`.
const EXP_MAX: f32 = 88.722_84;
/// `ln 2` split so that `n·LN2_HI` is exact for `|n| ≤ 2⁹` (Cephes).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = (LN_2 - 0.693_359_375) as f32;
/// `1.5·2²³`: adding it rounds an `f32` below 2²² to an integer.
const ROUND_SHIFTER: f32 = 12_582_912.0;
/// Cephes `expf`: `exp(r) ≈ 1 + r + r²·P(r)`, `P` highest degree first.
#[allow(clippy::excessive_precision)] // as published
const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1];

/// Eigen's `erf` numerator `x·P(x²)` and denominator `Q(x²)`, highest degree first.
#[allow(clippy::excessive_precision)] // as published
const ERF_P: [f32; 7] =
    [-2.726_142_3e-10, 2.770_681_4e-8, -2.101_024e-6, -5.692_506_4e-5, -7.349_906_3e-4, -2.954_600e-3, -1.609_603_3e-2];
const ERF_Q: [f32; 5] = [-1.456_607_2e-5, -2.133_740_6e-4, -1.682_827e-3, -7.373_329e-3, -1.426_473_9e-2];
/// Below this `|x|`, `erf` uses the rational function.
const ERF_SMALL: f32 = 0.5;
/// Numerical Recipes' `erfcc` exponent polynomial in `t`, highest degree first.
#[allow(clippy::excessive_precision)] // as published
const ERFC_P: [f32; 10] = [
    0.170_872_77,
    -0.822_152_23,
    1.488_515_87,
    -1.135_203_98,
    0.278_868_07,
    -0.186_288_06,
    0.096_784_18,
    0.374_091_96,
    1.000_023_68,
    -1.265_512_23,
];

/// `tanh`'s Taylor coefficients of `x³, x⁵, x⁷, x⁹`.
const TANH_TAYLOR: [f32; 4] = [-1.0 / 3.0, 2.0 / 15.0, -17.0 / 315.0, 62.0 / 2835.0];
/// Below this `|x|`, `tanh` uses its Taylor series.
const TANH_SMALL: f32 = 0.25;

/// `√(2/π)` and the cubic coefficient of the tanh-GELU.
const SQRT_2_OVER_PI: f32 = (FRAC_2_SQRT_PI * FRAC_1_SQRT_2) as f32;
const GELU_CUBIC: f32 = 0.044715;
/// `1/√(2π)`, the normal density's factor.
const INV_SQRT_2PI: f32 = (FRAC_2_SQRT_PI * FRAC_1_SQRT_2 * 0.5) as f32;

/// Vector arithmetic with constants, for writing the formulas.
struct F<'a, 'b> {
    b: &'a mut FunctionBuilder<'b>,
}

impl F<'_, '_> {
    fn c(&mut self, x: f32) -> Value {
        splat(self.b, x)
    }
    fn add(&mut self, x: Value, y: Value) -> Value {
        self.b.ins().fadd(x, y)
    }
    fn sub(&mut self, x: Value, y: Value) -> Value {
        self.b.ins().fsub(x, y)
    }
    fn mul(&mut self, x: Value, y: Value) -> Value {
        self.b.ins().fmul(x, y)
    }
    fn div(&mut self, x: Value, y: Value) -> Value {
        self.b.ins().fdiv(x, y)
    }
    fn mulc(&mut self, x: Value, c: f32) -> Value {
        let c = self.c(c);
        self.mul(x, c)
    }
    fn addc(&mut self, x: Value, c: f32) -> Value {
        let c = self.c(c);
        self.add(x, c)
    }
    /// `x·y + z`: one fused instruction (one rounding) where the CPU has
    /// FMA, else a multiply and an add. Cranelift lowers a vector `fma`
    /// without the feature to four scalar library calls, so the choice is
    /// made here, by the same detection Cranelift's native ISA uses.
    fn mul_add(&mut self, x: Value, y: Value, z: Value) -> Value {
        if has_fma() {
            self.b.ins().fma(x, y, z)
        } else {
            let xy = self.mul(x, y);
            self.add(xy, z)
        }
    }
    /// `c − x`.
    fn csub(&mut self, c: f32, x: Value) -> Value {
        let c = self.c(c);
        self.sub(c, x)
    }
    /// A polynomial in `x`, `coeffs` highest degree first, by Estrin's
    /// scheme: pairs `c₀ + c₁x`, then pairs of pairs with `x²`, `x⁴`…
    /// Horner's rule is one long chain of dependent multiply-adds (degree 9:
    /// 18 operations back to back, ~54 cycles of latency per vector), which
    /// left the column loops waiting on latency; Estrin's tree has depth
    /// ~2·log₂(degree) for a few more multiplies, and the same accuracy
    /// here (the bounds in the module docs are measured with it).
    fn poly(&mut self, x: Value, coeffs: &[f32]) -> Value {
        // Lowest degree first, as the tree pairs them.
        let mut terms: Vec<Value> = coeffs.iter().rev().map(|&k| self.c(k)).collect();
        let mut power = x;
        while terms.len() > 1 {
            let pairs: Vec<Value> = terms
                .chunks(2)
                .map(|pair| match *pair {
                    [lo, hi] => self.mul_add(hi, power, lo),
                    [lo] => lo,
                    _ => unreachable!("chunks of two"),
                })
                .collect();
            terms = pairs;
            if terms.len() > 1 {
                power = self.mul(power, power);
            }
        }
        terms[0]
    }
}

/// Whether the host has fused multiply-add (and Cranelift, enabling its
/// native features, emits it).
fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("fma")
    }
    #[cfg(target_arch = "aarch64")]
    {
        true
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// `eˣ` lane-wise.
pub(crate) fn exp(b: &mut FunctionBuilder, x: Value) -> Value {
    let mut f = F { b };
    let (lo, hi) = (f.c(EXP_MIN), f.c(EXP_MAX));
    // Clamp with compare-and-select (two instructions each, where Cranelift's
    // NaN-propagating `fmin`/`fmax` take eight); a NaN compares false and
    // flows through to the result.
    let under = simd::fcmp(f.b, FloatCC::LessThan, x, lo);
    let over = simd::fcmp(f.b, FloatCC::GreaterThan, x, hi);
    let xc = select(f.b, under, lo, x);
    let xc = select(f.b, over, hi, xc);
    // n = round(x·log2 e) by adding 1.5·2²³: the sum's low mantissa bits
    // are n (|n| ≤ 128), as an integer and, after subtracting, as a float.
    let t = f.mulc(xc, LOG2_E as f32);
    let shifter = f.c(ROUND_SHIFTER);
    let shifted = f.add(t, shifter);
    let n = f.sub(shifted, shifter);
    let a = f.mulc(n, LN2_HI);
    let r = f.sub(xc, a);
    let a = f.mulc(n, LN2_LO);
    let r = f.sub(r, a);
    let p = f.poly(r, &EXP_P);
    let r2 = f.mul(r, r);
    let p = f.mul(p, r2);
    let p = f.add(p, r);
    let p = f.addc(p, 1.0);
    let shifted_bits = simd::bits(f.b, shifted);
    let shifter_bits = simd::splat_i(f.b, ROUND_SHIFTER.to_bits() as i32);
    let ni = f.b.ins().isub(shifted_bits, shifter_bits);
    // 2ⁿ = 2^⌊n/2⌋ · 2^(n − ⌊n/2⌋): each factor's exponent stays normal.
    let n1 = f.b.ins().sshr_imm_s(ni, 1);
    let n2 = f.b.ins().isub(ni, n1);
    let mut y = p;
    for k in [n1, n2] {
        let bias = splat_i(f.b, 127);
        let e = f.b.ins().iadd(k, bias);
        let e = f.b.ins().ishl_imm_s(e, 23);
        let scale = simd::float(f.b, e);
        y = f.mul(y, scale);
    }
    let zero = f.c(0.0);
    let y = select(f.b, under, zero, y);
    let inf = f.c(f32::INFINITY);
    select(f.b, over, inf, y)
}

/// `tanh x` lane-wise.
pub(crate) fn tanh(b: &mut FunctionBuilder, x: Value) -> Value {
    let ax = b.ins().fabs(x);
    // Large |x|: 1 − 2/(e^{2|x|} + 1), then x's sign.
    let mut f = F { b };
    let two_ax = f.add(ax, ax);
    let e = exp(f.b, two_ax);
    let e1 = f.addc(e, 1.0);
    let two = f.c(2.0);
    let q = f.div(two, e1);
    let big = f.csub(1.0, q);
    // `big ≥ 0`: OR in x's sign bit.
    let minus_zero = f.c(-0.0);
    let sign = f.b.ins().band(x, minus_zero);
    let big = f.b.ins().bor(big, sign);
    // Small |x|: x + x³·(c3 + x²·(c5 + x²·(c7 + x²·c9))).
    let x2 = f.mul(x, x);
    let p = f.poly(x2, &[TANH_TAYLOR[3], TANH_TAYLOR[2], TANH_TAYLOR[1], TANH_TAYLOR[0]]);
    let x3 = f.mul(x2, x);
    let p = f.mul(p, x3);
    let small = f.add(x, p);
    let limit = f.c(TANH_SMALL);
    let is_small = simd::fcmp(f.b, FloatCC::LessThan, ax, limit);
    select(f.b, is_small, small, big)
}

/// `erf x` lane-wise: Eigen's rational function for `|x| < 0.5`, where it
/// keeps relative accuracy, else `±(1 − erfc |x|)`.
pub(crate) fn erf(b: &mut FunctionBuilder, x: Value) -> Value {
    let mut f = F { b };
    let x2 = f.mul(x, x);
    let p = f.poly(x2, &ERF_P);
    let p = f.mul(p, x);
    let q = f.poly(x2, &ERF_Q);
    let small = f.div(p, q);
    let ax = f.b.ins().fabs(x);
    let c = erfc(f.b, ax);
    let mut f = F { b };
    let big = f.csub(1.0, c);
    // `big ≥ 0`: OR in x's sign bit.
    let minus_zero = f.c(-0.0);
    let sign = f.b.ins().band(x, minus_zero);
    let big = f.b.ins().bor(big, sign);
    let half = f.c(ERF_SMALL);
    let is_small = simd::fcmp(f.b, FloatCC::LessThan, ax, half);
    select(f.b, is_small, small, big)
}

/// `erfc z` for `z ≥ 0` (or NaN), with small *relative* error in the tail
/// (Numerical Recipes' `erfcc`, a Chebyshev fit with fractional error below
/// 1.2e-7): `t·exp(−z² + P(t))`, `t = 1/(1 + z/2)`. `+∞ → 0`.
fn erfc(b: &mut FunctionBuilder, z: Value) -> Value {
    let mut f = F { b };
    let h = f.mulc(z, 0.5);
    let d = f.addc(h, 1.0);
    let one = f.c(1.0);
    let t = f.div(one, d);
    let p = f.poly(t, &ERFC_P);
    let z2 = f.mul(z, z);
    let a = f.sub(p, z2);
    let e = exp(f.b, a);
    f.b.ins().fmul(t, e)
}

/// `(σ(x), e^{−x})` with `σ(x) = 1/(1 + e^{−x})`: `e^{−x}` overflows to
/// `+∞` for very negative `x`, giving `σ = 0`, as it should.
fn sigmoid(b: &mut FunctionBuilder, x: Value) -> (Value, Value) {
    let nx = b.ins().fneg(x);
    let e = exp(b, nx);
    let mut f = F { b };
    let d = f.addc(e, 1.0);
    let one = f.c(1.0);
    (f.div(one, d), e)
}

/// `x·σ(x)`.
pub(crate) fn silu(b: &mut FunctionBuilder, x: Value) -> Value {
    let (s, _) = sigmoid(b, x);
    b.ins().fmul(x, s)
}

/// `σ(x)·(1 + x·(1 − σ(x)))`, with `1 − σ(x) = e^{−x}·σ(x)` for `x > 0`,
/// where `1 − σ` would cancel (and `x` multiplies the error).
pub(crate) fn silu_deriv(b: &mut FunctionBuilder, x: Value) -> Value {
    let (s, e) = sigmoid(b, x);
    let mut f = F { b };
    let direct = f.csub(1.0, s);
    let tail = f.mul(e, s);
    let zero = f.c(0.0);
    let positive = simd::fcmp(f.b, FloatCC::GreaterThan, x, zero);
    let t = select(f.b, positive, tail, direct);
    let mut f = F { b };
    let t = f.mul(x, t);
    let t = f.addc(t, 1.0);
    f.mul(s, t)
}

/// `Φ(x) = 0.5·(1 + erf(x/√2))`, as `½·erfc(|x|/√2)` for `x < 0` so the
/// tail keeps its relative accuracy (GELU multiplies it by `x`).
fn normal_cdf(b: &mut FunctionBuilder, x: Value) -> Value {
    let ax = b.ins().fabs(x);
    let mut f = F { b };
    let z = f.mulc(ax, FRAC_1_SQRT_2 as f32);
    let c = erfc(f.b, z);
    let mut f = F { b };
    let tail = f.mulc(c, 0.5);
    let upper = f.csub(1.0, tail);
    let zero = f.c(0.0);
    let negative = simd::fcmp(f.b, FloatCC::LessThan, x, zero);
    select(f.b, negative, tail, upper)
}

/// `t = tanh(√(2/π)·(x + 0.044715·x³))`.
fn gelu_tanh_inner(b: &mut FunctionBuilder, x: Value) -> Value {
    let mut f = F { b };
    let x2 = f.mul(x, x);
    let x3 = f.mul(x2, x);
    let u = f.mulc(x3, GELU_CUBIC);
    let u = f.add(x, u);
    let u = f.mulc(u, SQRT_2_OVER_PI);
    tanh(f.b, u)
}

/// GELU of the given form.
pub(crate) fn gelu(b: &mut FunctionBuilder, form: GeluApproximation, x: Value) -> Value {
    match form {
        // x·Φ(x)
        GeluApproximation::Erf => {
            let cdf = normal_cdf(b, x);
            b.ins().fmul(x, cdf)
        }
        // 0.5·x·(1 + t)
        GeluApproximation::Tanh => {
            let t = gelu_tanh_inner(b, x);
            let mut f = F { b };
            let t = f.addc(t, 1.0);
            let h = f.mulc(x, 0.5);
            f.mul(h, t)
        }
    }
}

/// `d/dx` GELU of the given form.
pub(crate) fn gelu_deriv(b: &mut FunctionBuilder, form: GeluApproximation, x: Value) -> Value {
    match form {
        // Φ(x) + x·φ(x), φ(x) = e^{−x²/2}/√(2π)
        GeluApproximation::Erf => {
            let cdf = normal_cdf(b, x);
            let mut f = F { b };
            let x2 = f.mul(x, x);
            let a = f.mulc(x2, -0.5);
            let e = exp(f.b, a);
            let mut f = F { b };
            let pdf = f.mulc(e, INV_SQRT_2PI);
            let t = f.mul(x, pdf);
            f.add(cdf, t)
        }
        // 0.5·(1 + t) + 0.5·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²)
        GeluApproximation::Tanh => {
            let t = gelu_tanh_inner(b, x);
            let mut f = F { b };
            let first = f.addc(t, 1.0);
            let first = f.mulc(first, 0.5);
            let t2 = f.mul(t, t);
            let sech2 = f.csub(1.0, t2);
            let x2 = f.mul(x, x);
            let inner = f.mulc(x2, 3.0 * GELU_CUBIC);
            let inner = f.addc(inner, 1.0);
            let inner = f.mulc(inner, SQRT_2_OVER_PI);
            let second = f.mulc(x, 0.5);
            let second = f.mul(second, sech2);
            let second = f.mul(second, inner);
            f.add(first, second)
        }
    }
}
