//! Reading every storage dtype as `f32x4` and writing `f32x4` as every float
//! dtype.
//!
//! - Loads widen exactly: bf16 is the top half of an f32; f16 is rebuilt
//!   from its bits (normals, subnormals, ±∞, NaN); i32/i64 (the attention
//!   mask) convert to the nearest `f32`.
//! - Stores round to nearest, ties to even (bf16, f16), with overflow to ±∞
//!   and NaN kept NaN — what `half::bf16::from_f32` / `f16::from_f32` give.
//!
//! [`Lanes::Four`] moves four consecutive elements; [`Lanes::One`] one
//! element in lane 0 (a row's tail, or a per-row operand), never touching
//! memory past it.

use cranelift_codegen::ir::types::{F32, F32X4, I32, I32X4, I64, I64X2};
use cranelift_codegen::ir::{InstBuilder, Value};
use cranelift_frontend::FunctionBuilder;
use zeroplan_ir::DType;

use super::simd::{self, mem, select, splat, splat_i};

/// How many elements one load or store moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lanes {
    Four,
    One,
}

/// The element(s) of `dtype` at `ptr` as an `f32x4`.
pub(crate) fn load(b: &mut FunctionBuilder, dtype: DType, ptr: Value, lanes: Lanes) -> Value {
    match (dtype, lanes) {
        (DType::F32, Lanes::Four) => b.ins().load(F32X4, mem(), ptr, 0),
        (DType::F32, Lanes::One) => {
            let x = b.ins().load(F32, mem(), ptr, 0);
            simd::lane0(b, x)
        }
        (DType::BF16 | DType::F16, _) => {
            let h = match lanes {
                Lanes::Four => b.ins().uload16x4(mem(), ptr, 0),
                Lanes::One => {
                    let h = b.ins().uload16(I32, mem(), ptr, 0);
                    b.ins().scalar_to_vector(I32X4, h)
                }
            };
            if dtype == DType::BF16 {
                let w = b.ins().ishl_imm_s(h, 16);
                simd::float(b, w)
            } else {
                f16_to_f32(b, h)
            }
        }
        (DType::I32, Lanes::Four) => {
            let v = b.ins().load(I32X4, mem(), ptr, 0);
            b.ins().fcvt_from_sint(F32X4, v)
        }
        (DType::I32, Lanes::One) => {
            let v = b.ins().load(I32, mem(), ptr, 0);
            let x = b.ins().fcvt_from_sint(F32, v);
            simd::lane0(b, x)
        }
        (DType::I64, _) => {
            let n = if lanes == Lanes::Four { simd::LANES } else { 1 };
            let mut v = splat(b, 0.0);
            for l in 0..n {
                let i = b.ins().load(I64, mem(), ptr, 8 * l as i32);
                let x = b.ins().fcvt_from_sint(F32, i);
                v = b.ins().insertlane(v, x, l as u8);
            }
            v
        }
    }
}

/// Stores `x` (four lanes, or lane 0) as `dtype` at `ptr`. `dtype` is a
/// float type (`Kernel::check` guarantees it for outputs).
pub(crate) fn store(b: &mut FunctionBuilder, dtype: DType, x: Value, ptr: Value, lanes: Lanes) {
    match dtype {
        DType::F32 => {
            if lanes == Lanes::Four {
                b.ins().store(mem(), x, ptr, 0);
            } else {
                let s = simd::lane(b, x, 0);
                b.ins().store(mem(), s, ptr, 0);
            }
        }
        _ => {
            let h = if dtype == DType::BF16 { f32_to_bf16(b, x) } else { f32_to_f16(b, x) };
            if lanes == Lanes::Four {
                // Every lane is in [0, 0xFFFF]: the saturating narrow is exact.
                let n = b.ins().unarrow(h, h);
                let n = simd::cast(b, I64X2, n);
                debug_assert_eq!(b.func.dfg.value_type(h), I32X4);
                let q = b.ins().extractlane(n, 0);
                b.ins().store(mem(), q, ptr, 0);
            } else {
                let s = b.ins().extractlane(h, 0);
                b.ins().istore16(mem(), s, ptr, 0);
            }
        }
    }
}

/// bf16 bits (in the low half of each `i32` lane) of `x`, rounded to
/// nearest even; NaN stays a (quiet) NaN.
fn f32_to_bf16(b: &mut FunctionBuilder, x: Value) -> Value {
    let u = simd::bits(b, x);
    let hi = b.ins().ushr_imm_s(u, 16);
    let one = splat_i(b, 1);
    let lsb = b.ins().band(hi, one);
    let half = splat_i(b, 0x7FFF);
    let bias = b.ins().iadd(half, lsb);
    let r = b.ins().iadd(u, bias);
    let rounded = b.ins().ushr_imm_s(r, 16);
    let quiet_bit = splat_i(b, 0x40);
    let quiet = b.ins().bor(hi, quiet_bit);
    let nan = b.ins().fcmp(cranelift_codegen::ir::condcodes::FloatCC::Unordered, x, x);
    select(b, nan, quiet, rounded)
}

/// f16 bits of `x`, rounded to nearest even (F. Giesen's
/// `float_to_half_fast3_rtne`): overflow gives ±∞, NaN gives a quiet NaN,
/// results below the f16 normals are rounded onto the subnormal grid by one
/// float addition.
fn f32_to_f16(b: &mut FunctionBuilder, x: Value) -> Value {
    use cranelift_codegen::ir::condcodes::IntCC;
    let u = simd::bits(b, x);
    let sign_mask = splat_i(b, i32::MIN);
    let sign = b.ins().band(u, sign_mask);
    let a = b.ins().bxor(u, sign); // |x|'s bits; ≤ 0x7FFF_FFFF so signed compares work
    // ∞ or NaN (or ≥ 65536, which rounds to ∞).
    let f32_inf = splat_i(b, 0x7F80_0000);
    let is_nan = b.ins().icmp(IntCC::SignedGreaterThan, a, f32_inf);
    let (qnan, inf) = (splat_i(b, 0x7E00), splat_i(b, 0x7C00));
    let inf_nan = select(b, is_nan, qnan, inf);
    // Subnormal or zero: align by adding 0.5 (exponent 126 = 127 − 15 + 23 − 10 + 1).
    let magic_bits = splat_i(b, 0x3F00_0000);
    let af = simd::float(b, a);
    let magic = simd::float(b, magic_bits);
    let s = b.ins().fadd(af, magic);
    let s = simd::bits(b, s);
    let sub = b.ins().isub(s, magic_bits);
    // Normal: rebias the exponent, round to nearest even on bit 13.
    let m = b.ins().ushr_imm_s(a, 13);
    let one = splat_i(b, 1);
    let odd = b.ins().band(m, one);
    let rebias = splat_i(b, ((15 - 127) << 23) + 0xFFF);
    let n = b.ins().iadd(a, rebias);
    let n = b.ins().iadd(n, odd);
    let normal = b.ins().ushr_imm_s(n, 13);
    let min_normal = splat_i(b, 0x3880_0000);
    let is_sub = b.ins().icmp(IntCC::SignedLessThan, a, min_normal);
    let h = select(b, is_sub, sub, normal);
    let overflow = splat_i(b, 0x4780_0000);
    let is_big = b.ins().icmp(IntCC::SignedGreaterThanOrEqual, a, overflow);
    let h = select(b, is_big, inf_nan, h);
    let sign16 = b.ins().ushr_imm_s(sign, 16);
    b.ins().bor(h, sign16)
}

/// The `f32x4` of f16 bits `h` (low half of each `i32` lane): shift the
/// exponent and mantissa into place and scale by 2¹¹² (exact for normals and
/// subnormals); ∞/NaN get the f32 all-ones exponent.
fn f16_to_f32(b: &mut FunctionBuilder, h: Value) -> Value {
    use cranelift_codegen::ir::condcodes::IntCC;
    let sign_bit = splat_i(b, 0x8000);
    let sign = b.ins().band(h, sign_bit);
    let sign = b.ins().ishl_imm_s(sign, 16);
    let magnitude = splat_i(b, 0x7FFF);
    let em = b.ins().band(h, magnitude);
    let shifted = b.ins().ishl_imm_s(em, 13);
    let f = simd::float(b, shifted);
    let scale = splat(b, f32::from_bits((254 - 15) << 23));
    let f = b.ins().fmul(f, scale);
    let f = simd::bits(b, f);
    let f16_inf = splat_i(b, 0x7C00);
    let is_inf_nan = b.ins().icmp(IntCC::SignedGreaterThanOrEqual, em, f16_inf);
    let exp_ones = splat_i(b, 0x7F80_0000);
    let special = b.ins().bor(f, exp_ones);
    let f = select(b, is_inf_nan, special, f);
    let f = b.ins().bor(f, sign);
    simd::float(b, f)
}

/// The scalar `f64` of the element of `dtype` at `ptr` (uniform operands).
pub(crate) fn load_f64(b: &mut FunctionBuilder, dtype: DType, ptr: Value) -> Value {
    use cranelift_codegen::ir::types::F64;
    match dtype {
        DType::I32 => {
            let v = b.ins().load(I32, mem(), ptr, 0);
            b.ins().fcvt_from_sint(F64, v)
        }
        DType::I64 => {
            let v = b.ins().load(I64, mem(), ptr, 0);
            b.ins().fcvt_from_sint(F64, v)
        }
        _ => {
            let v = load(b, dtype, ptr, Lanes::One);
            let s = simd::lane(b, v, 0);
            b.ins().fpromote(F64, s)
        }
    }
}
