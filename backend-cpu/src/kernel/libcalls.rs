//! The Rust functions generated code calls, registered with the JIT by name.
//!
//! Cranelift has instructions for `+ − × ÷ √ min max` but none for `exp`,
//! `erf`, `tanh` or `pow`. Per-element code uses the inline `f32`
//! approximations of [`super::math`] instead; these libcalls serve the two
//! cases where a call is right:
//!
//! - **Uniform** expressions (computed once per call, in `f64`; see
//!   [`super::layout::Class::Uniform`]): the interpreter's own functions, so
//!   AdamW's `1 − β^t` is exactly the reference's before it is rounded to `f32`.
//! - `pow` of a per-element value, one call per lane (no kernel the fuse
//!   pass makes does this; it is there for completeness).

use zeroplan_ir::GeluApproximation;
use zeroplan_ir::interp as ir_math;
use zeroplan_ir::kernel::Unary;

/// One library function the JIT links generated code against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LibCall {
    /// `f64 → f64`: a unary function of the interpreter.
    Unary(Unary),
    /// `(f64, f64) → f64`: `powf`.
    PowF64,
    /// `(f32, f32) → f32`: `powf`, computed in `f64`.
    PowF32,
}

extern "C" fn zp_exp(x: f64) -> f64 {
    x.exp()
}
extern "C" fn zp_erf(x: f64) -> f64 {
    libm::erf(x)
}
extern "C" fn zp_tanh(x: f64) -> f64 {
    x.tanh()
}
extern "C" fn zp_relu(x: f64) -> f64 {
    ir_math::relu(x)
}
extern "C" fn zp_silu(x: f64) -> f64 {
    ir_math::silu(x)
}
extern "C" fn zp_silu_deriv(x: f64) -> f64 {
    ir_math::silu_grad(x)
}
extern "C" fn zp_gelu_erf(x: f64) -> f64 {
    ir_math::gelu_erf(x)
}
extern "C" fn zp_gelu_tanh(x: f64) -> f64 {
    ir_math::gelu_tanh(x)
}
extern "C" fn zp_gelu_erf_deriv(x: f64) -> f64 {
    ir_math::gelu_erf_grad(x)
}
extern "C" fn zp_gelu_tanh_deriv(x: f64) -> f64 {
    ir_math::gelu_tanh_grad(x)
}
extern "C" fn zp_pow(x: f64, y: f64) -> f64 {
    x.powf(y)
}
extern "C" fn zp_pow_f32(x: f32, y: f32) -> f32 {
    f64::from(x).powf(f64::from(y)) as f32
}

impl LibCall {
    /// Every libcall, for registering with the JIT.
    pub fn all() -> Vec<LibCall> {
        let unary = [
            Unary::Exp,
            Unary::Erf,
            Unary::Tanh,
            Unary::Relu,
            Unary::Silu,
            Unary::SiluDeriv,
            Unary::Gelu(GeluApproximation::Erf),
            Unary::Gelu(GeluApproximation::Tanh),
            Unary::GeluDeriv(GeluApproximation::Erf),
            Unary::GeluDeriv(GeluApproximation::Tanh),
        ];
        let mut all: Vec<LibCall> = unary.into_iter().map(LibCall::Unary).collect();
        all.extend([LibCall::PowF64, LibCall::PowF32]);
        all
    }

    /// The `f64` libcall of a unary function, or `None` where an instruction
    /// sequence computes it exactly (`neg`, `sqrt`, `rsqrt`, `recip`).
    pub fn for_unary(u: Unary) -> Option<LibCall> {
        match u {
            Unary::Neg | Unary::Sqrt | Unary::Rsqrt | Unary::Recip => None,
            _ => Some(LibCall::Unary(u)),
        }
    }

    /// `(argument count, whether f32)`.
    pub fn signature(self) -> (usize, bool) {
        match self {
            LibCall::Unary(_) => (1, false),
            LibCall::PowF64 => (2, false),
            LibCall::PowF32 => (2, true),
        }
    }

    /// The name generated code imports it by.
    pub fn symbol(self) -> String {
        match self {
            LibCall::Unary(u) => format!("zeroplan_{}", u.name()),
            LibCall::PowF64 => "zeroplan_pow".to_string(),
            LibCall::PowF32 => "zeroplan_pow_f32".to_string(),
        }
    }

    /// Its address (`None` for the unary functions [`LibCall::for_unary`]
    /// gives no libcall, which [`LibCall::all`] does not list).
    pub fn address(self) -> Option<*const u8> {
        let f1 = |f: extern "C" fn(f64) -> f64| Some(f as *const u8);
        match self {
            LibCall::PowF64 => Some(zp_pow as extern "C" fn(f64, f64) -> f64 as *const u8),
            LibCall::PowF32 => Some(zp_pow_f32 as extern "C" fn(f32, f32) -> f32 as *const u8),
            LibCall::Unary(u) => match u {
                Unary::Exp => f1(zp_exp),
                Unary::Erf => f1(zp_erf),
                Unary::Tanh => f1(zp_tanh),
                Unary::Relu => f1(zp_relu),
                Unary::Silu => f1(zp_silu),
                Unary::SiluDeriv => f1(zp_silu_deriv),
                Unary::Gelu(GeluApproximation::Erf) => f1(zp_gelu_erf),
                Unary::Gelu(GeluApproximation::Tanh) => f1(zp_gelu_tanh),
                Unary::GeluDeriv(GeluApproximation::Erf) => f1(zp_gelu_erf_deriv),
                Unary::GeluDeriv(GeluApproximation::Tanh) => f1(zp_gelu_tanh_deriv),
                Unary::Neg | Unary::Sqrt | Unary::Rsqrt | Unary::Recip => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LibCall;

    #[test]
    fn every_libcall_has_a_distinct_symbol() {
        let all = LibCall::all();
        let mut names: Vec<String> = all.iter().map(|f| f.symbol()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(all.iter().all(|f| f.address().is_some()));
    }
}
