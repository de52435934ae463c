//! One kernel-IR expression as a CUDA C expression, and literals.
//!
//! Arithmetic is written on named SSA values (`v7` in `float`, `d7` for a
//! launch-uniform value in `double`); loads, dropout and ALiBi depend on
//! where the code runs, so the caller supplies them.

use zeroplan_ir::DType;
use zeroplan_ir::GeluApproximation;
use zeroplan_ir::kernel::{Binary, Unary};

/// The C type expressions are computed in (cuBLAS calls it the compute type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ComputeType {
    /// Per-element and per-row values.
    Float,
    /// Launch-uniform values, as the interpreter computes them.
    Double,
}

impl ComputeType {
    /// The name of SSA value `id` computed in this type.
    pub fn name(self, id: u32) -> String {
        match self {
            ComputeType::Float => format!("v{id}"),
            ComputeType::Double => format!("d{id}"),
        }
    }

    /// `x` as a literal of this type (infinities and NaN by their bits).
    pub fn literal(self, x: f64) -> String {
        match self {
            ComputeType::Float => {
                let f = x as f32;
                if f.is_nan() {
                    "__int_as_float(0x7fc00000)".into()
                } else if f.is_infinite() {
                    format!("{}__int_as_float(0x7f800000)", if f < 0.0 { "-" } else { "" })
                } else {
                    signed(format!("{f:?}f"))
                }
            }
            ComputeType::Double => {
                if x.is_nan() {
                    "__longlong_as_double(0x7ff8000000000000LL)".into()
                } else if x.is_infinite() {
                    format!("{}__longlong_as_double(0x7ff0000000000000LL)", if x < 0.0 { "-" } else { "" })
                } else {
                    signed(format!("{x:?}"))
                }
            }
        }
    }

    fn one(self) -> &'static str {
        match self {
            ComputeType::Float => "1.0f",
            ComputeType::Double => "1.0",
        }
    }

    fn zero(self) -> &'static str {
        match self {
            ComputeType::Float => "0.0f",
            ComputeType::Double => "0.0",
        }
    }
}

/// Negative literals in parentheses, so `a - -1.0f` never reads as `a --1.0f`.
fn signed(s: String) -> String {
    if s.starts_with('-') { format!("({s})") } else { s }
}

/// The helper (from the prelude) computing `u`.
fn unary_helper(u: Unary) -> &'static str {
    match u {
        Unary::Neg => "-",
        Unary::Exp => "zp_exp",
        Unary::Erf => "zp_erf",
        Unary::Tanh => "zp_tanh",
        Unary::Sqrt => "zp_sqrt",
        Unary::Rsqrt => "zp_rsqrt",
        Unary::Recip => "zp_recip",
        Unary::Relu => "zp_relu",
        Unary::Silu => "zp_silu",
        Unary::SiluDeriv => "zp_silu_deriv",
        Unary::Gelu(GeluApproximation::Erf) => "zp_gelu_erf",
        Unary::Gelu(GeluApproximation::Tanh) => "zp_gelu_tanh",
        Unary::GeluDeriv(GeluApproximation::Erf) => "zp_gelu_erf_deriv",
        Unary::GeluDeriv(GeluApproximation::Tanh) => "zp_gelu_tanh_deriv",
    }
}

pub(crate) fn unary(u: Unary, x: &str) -> String {
    match u {
        Unary::Neg => format!("(-{x})"),
        _ => format!("{}({x})", unary_helper(u)),
    }
}

pub(crate) fn binary(p: ComputeType, op: Binary, x: &str, y: &str) -> String {
    let flag = |cmp: &str| format!("(({x} {cmp} {y}) ? {} : {})", p.one(), p.zero());
    match op {
        Binary::Add => format!("({x} + {y})"),
        Binary::Sub => format!("({x} - {y})"),
        Binary::Mul => format!("({x} * {y})"),
        Binary::Div => format!("({x} / {y})"),
        Binary::Max => format!("zp_max({x}, {y})"),
        Binary::Min => format!("zp_min({x}, {y})"),
        Binary::Lt => flag("<"),
        Binary::Gt => flag(">"),
        Binary::Eq => flag("=="),
        Binary::Pow => format!("zp_pow({x}, {y})"),
    }
}

/// `c ? a : b` on `c != 0` (a NaN condition takes `a`, as `NaN != 0.0` is true).
pub(crate) fn select(p: ComputeType, c: &str, a: &str, b: &str) -> String {
    format!("(({c} != {}) ? {a} : {b})", p.zero())
}

/// The C element type of a storage dtype.
pub(crate) fn c_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::BF16 => "__nv_bfloat16",
        DType::F16 => "__half",
        DType::I32 => "int",
        DType::I64 => "long long",
    }
}

/// Dropout's integer threshold `⌈p·2²⁴⌉` (see the prelude's `zp_keep`): 0
/// for `p ≤ 0` (always kept), above `2²⁴ − 1` for `p > 1 − 2⁻²⁴` (never
/// kept); NaN never keeps, as `u ≥ NaN` is false.
pub(crate) fn keep_threshold(p: f64) -> u32 {
    if p.is_nan() {
        u32::MAX
    } else {
        // Float → integer casts saturate: a negative p gives 0.
        (p * 16_777_216.0).ceil() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_valid_c() {
        assert_eq!(ComputeType::Float.literal(0.5), "0.5f");
        assert_eq!(ComputeType::Float.literal(-2.0), "(-2.0f)");
        assert_eq!(ComputeType::Float.literal(1e-12), "1e-12f");
        assert_eq!(ComputeType::Float.literal(f64::NEG_INFINITY), "-__int_as_float(0x7f800000)");
        assert_eq!(ComputeType::Double.literal(0.1), "0.1");
        assert_eq!(ComputeType::Double.literal(f64::INFINITY), "__longlong_as_double(0x7ff0000000000000LL)");
        assert!(ComputeType::Double.literal(f64::NAN).contains("7ff8"));
    }

    #[test]
    fn thresholds_decide_exactly() {
        assert_eq!(keep_threshold(0.0), 0);
        assert_eq!(keep_threshold(-1.0), 0);
        assert_eq!(keep_threshold(0.5), 1 << 23);
        assert_eq!(keep_threshold(1.0), 1 << 24);
        assert_eq!(keep_threshold(f64::NAN), u32::MAX);
        // u = k·2⁻²⁴ exactly: kept at p = u, dropped just above.
        let u = 1234.0 / 16_777_216.0;
        assert_eq!(keep_threshold(u), 1234);
        assert_eq!(keep_threshold(f64::from_bits(u.to_bits() + 1)), 1235);
    }
}
