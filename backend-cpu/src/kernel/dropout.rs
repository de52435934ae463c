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
//! Philox needs 32×32→64-bit products; four counters run at once in `i32x4`
//! lanes (see [`keep_lanes`]).

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I32X4};
use cranelift_codegen::ir::{InstBuilder, Value};
use cranelift_frontend::FunctionBuilder;

use super::simd;

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

/// The `i32x4` lane mask (all ones where kept) of elements `e0 + l`,
/// `l = 0..4` (`e0` an `i64`). All four lanes are computed; a row's tail uses
/// lane 0.
///
/// Philox on four counters at once: each 32×32→64-bit product is an
/// `imul` of `uwiden_low`/`uwiden_high` halves (x86 `pmuludq`), whose high
/// and low words are then gathered back into `i32x4`s.
pub(crate) fn keep_lanes(b: &mut FunctionBuilder, key: PhiloxKey, stream: u32, threshold: u32, e0: Value) -> Value {
    let lo0 = b.ins().ireduce(I32, e0);
    let hi0 = b.ins().ushr_imm_s(e0, 32);
    let hi0 = b.ins().ireduce(I32, hi0);
    let lo0 = b.ins().splat(I32X4, lo0);
    let iota = simd::iota(b);
    let c0 = b.ins().iadd(lo0, iota);
    // A lane whose low word wrapped carries into the high word (the mask is −1 there).
    let wrapped = b.ins().icmp(IntCC::UnsignedLessThan, c0, lo0);
    let hi0 = b.ins().splat(I32X4, hi0);
    let c1 = b.ins().isub(hi0, wrapped);
    let c2 = simd::splat_i(b, stream as i32);
    let c3 = b.ins().splat(I32X4, key.offset);
    let mut c = [c0, c1, c2, c3];
    let (m0, m1) = (simd::splat_i(b, M0 as i32), simd::splat_i(b, M1 as i32));
    let (k0, k1) = (b.ins().splat(I32X4, key.k0), b.ins().splat(I32X4, key.k1));
    for round in 0..10u32 {
        let k0 = bump(b, k0, W0.wrapping_mul(round));
        let k1 = bump(b, k1, W1.wrapping_mul(round));
        let (hi0, lo0) = mulhilo(b, m0, c[0]);
        let (hi1, lo1) = mulhilo(b, m1, c[2]);
        let x0 = b.ins().bxor(hi1, c[1]);
        let x0 = b.ins().bxor(x0, k0);
        let x2 = b.ins().bxor(hi0, c[3]);
        let x2 = b.ins().bxor(x2, k1);
        c = [x0, lo1, x2, lo0];
    }
    let w = b.ins().ushr_imm_s(c[0], 8);
    // `w < 2²⁴`: a threshold above that never keeps; clamped so the signed
    // lane compare is exact.
    let t = simd::splat_i(b, threshold.min(1 << 24) as i32);
    b.ins().icmp(IntCC::SignedGreaterThanOrEqual, w, t)
}

/// `k + w` lane-wise (`w = 0` adds nothing).
fn bump(b: &mut FunctionBuilder, k: Value, w: u32) -> Value {
    if w == 0 {
        return k;
    }
    let w = simd::splat_i(b, w as i32);
    b.ins().iadd(k, w)
}

/// The high and low 32-bit words of `a·c` per lane (`i32x4`s).
fn mulhilo(b: &mut FunctionBuilder, a: Value, c: Value) -> (Value, Value) {
    let (al, cl) = (b.ins().uwiden_low(a), b.ins().uwiden_low(c));
    let low_pair = b.ins().imul(al, cl);
    let (ah, ch) = (b.ins().uwiden_high(a), b.ins().uwiden_high(c));
    let high_pair = b.ins().imul(ah, ch);
    let hi = simd::gather_words(b, low_pair, high_pair, 1);
    let lo = simd::gather_words(b, low_pair, high_pair, 0);
    (hi, lo)
}
