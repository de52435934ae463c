//! Dropout's keep test, inline: Philox4x32-10 per element, bit-exact with
//! [`zeroplan_ir::interp::random::dropout_keeps`].
//!
//! Element `e` (its row-major index in the kernel shape) is kept when
//! `(w0 >> 8)·2⁻²⁴ ≥ p`, `w0` the first word of Philox4x32-10 with key
//! `(seed lo, seed hi)` and counter `(e lo, e hi, stream, offset as u32)`.
//! The comparison is done on integers: `(w0 >> 8)·2⁻²⁴ ≥ p` exactly when
//! `w0 >> 8 ≥ ⌈p·2²⁴⌉` (scaling by 2²⁴ is exact), so no float rounding can
//! flip a decision.
//!
//! Philox needs 32×32→64-bit products (`imul` and `umulhi` on `i32`);
//! Cranelift's x86 backend has no vector `umulhi`, so each lane runs the ten
//! rounds on scalar registers (about 100 integer instructions per element).

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::I32;
use cranelift_codegen::ir::{InstBuilder, Value};
use cranelift_frontend::FunctionBuilder;

use super::simd::splat;

/// Philox's multipliers and Weyl key increments (Random123).
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// The per-launch words of every counter and key.
#[derive(Clone, Copy)]
pub(crate) struct PhiloxKey {
    /// Key words: the seed's low and high halves (`i32`).
    pub k0: Value,
    pub k1: Value,
    /// The counter's last word: the dropout offset's low 32 bits (`i32`).
    pub offset: Value,
}

/// The integer threshold `⌈p·2²⁴⌉` with `keep ⇔ w0 >> 8 ≥ threshold`:
/// 0 for `p ≤ 0` (always kept), above `2²⁴ − 1` for `p > 1 − 2⁻²⁴` (never
/// kept); NaN never keeps, as `u ≥ NaN` is false.
pub(crate) fn threshold(p: f64) -> u32 {
    if p.is_nan() {
        u32::MAX
    } else {
        // Float → integer casts saturate: negative p gives 0.
        (p * 16_777_216.0).ceil() as u32
    }
}

/// Whether dropout keeps element `e` (`i64`): an `i8` boolean.
pub(crate) fn keeps(b: &mut FunctionBuilder, key: PhiloxKey, stream: u32, threshold: u32, e: Value) -> Value {
    let c0 = b.ins().ireduce(I32, e);
    let hi = b.ins().ushr_imm_s(e, 32);
    let c1 = b.ins().ireduce(I32, hi);
    let c2 = b.ins().iconst(I32, i64::from(stream as i32));
    let mut c = [c0, c1, c2, key.offset];
    let (m0, m1) = (b.ins().iconst(I32, i64::from(M0 as i32)), b.ins().iconst(I32, i64::from(M1 as i32)));
    for round in 0..10u32 {
        let k0 = b.ins().iadd_imm_s(key.k0, i64::from(W0.wrapping_mul(round) as i32));
        let k1 = b.ins().iadd_imm_s(key.k1, i64::from(W1.wrapping_mul(round) as i32));
        let hi0 = b.ins().umulhi(m0, c[0]);
        let lo0 = b.ins().imul(m0, c[0]);
        let hi1 = b.ins().umulhi(m1, c[2]);
        let lo1 = b.ins().imul(m1, c[2]);
        let x0 = b.ins().bxor(hi1, c[1]);
        let x0 = b.ins().bxor(x0, k0);
        let x2 = b.ins().bxor(hi0, c[3]);
        let x2 = b.ins().bxor(x2, k1);
        c = [x0, lo1, x2, lo0];
    }
    let w = b.ins().ushr_imm_s(c[0], 8);
    b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, w, i64::from(threshold as i32))
}

/// An `f32x4` of `1.0`/`0.0`: whether elements `e0 + l` (`e0` an `i64`) are
/// kept, for the first `lanes` lanes (the others `0.0`).
pub(crate) fn keep_lanes(
    b: &mut FunctionBuilder,
    key: PhiloxKey,
    stream: u32,
    threshold: u32,
    e0: Value,
    lanes: usize,
) -> Value {
    let mut v = splat(b, 0.0);
    let (one, zero) = (b.ins().f32const(1.0), b.ins().f32const(0.0));
    for l in 0..lanes {
        let e = b.ins().iadd_imm_s(e0, l as i64);
        let k = keeps(b, key, stream, threshold, e);
        let x = b.ins().select(k, one, zero);
        v = b.ins().insertlane(v, x, l as u8);
    }
    v
}
