//! Small builders over Cranelift's 128-bit vectors: constants, bit casts and
//! lane selects, so the math and storage code reads like the formulas.
//!
//! Every per-element value is an `f32x4`: four consecutive columns of a row.
//! A comparison gives an `i32x4` mask (all ones where true); [`select`]
//! picks lanes by such a mask.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::types::{F32, F32X4, I8X16, I32X4};
use cranelift_codegen::ir::{ConstantData, Endianness, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;

/// Lanes of an `f32x4`.
pub(crate) const LANES: usize = 4;

/// Flags for bit casts between vector types (which need a byte order).
fn little() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

/// Flags for operand loads and stores: never trapping, but **not**
/// `aligned` — rows start anywhere, and an aligned vector load may be
/// folded into an SSE instruction that faults on unaligned addresses.
pub(crate) fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// `x` in every lane: a constant-pool vector, one load (or a memory operand)
/// rather than a scalar move and a shuffle.
pub(crate) fn splat(b: &mut FunctionBuilder, x: f32) -> Value {
    vector(b, F32X4, x.to_bits())
}

/// The integer `x` in every lane.
pub(crate) fn splat_i(b: &mut FunctionBuilder, x: i32) -> Value {
    vector(b, I32X4, x as u32)
}

fn vector(b: &mut FunctionBuilder, ty: Type, bits: u32) -> Value {
    let bytes: Vec<u8> = (0..LANES).flat_map(|_| bits.to_le_bytes()).collect();
    let handle = b.func.dfg.constants.insert(ConstantData::from(bytes));
    b.ins().vconst(ty, handle)
}

/// The lanes `[0, 1, 2, 3]`.
pub(crate) fn iota(b: &mut FunctionBuilder) -> Value {
    let bytes: Vec<u8> = (0..LANES as u32).flat_map(u32::to_le_bytes).collect();
    let handle = b.func.dfg.constants.insert(ConstantData::from(bytes));
    b.ins().vconst(I32X4, handle)
}

/// Reinterprets `x` as `ty` (same width).
pub(crate) fn cast(b: &mut FunctionBuilder, ty: Type, x: Value) -> Value {
    if b.func.dfg.value_type(x) == ty { x } else { b.ins().bitcast(ty, little(), x) }
}

/// The bits of an `f32x4` as `i32x4`.
pub(crate) fn bits(b: &mut FunctionBuilder, x: Value) -> Value {
    cast(b, I32X4, x)
}

/// The `f32x4` whose bits are the `i32x4` `x`.
pub(crate) fn float(b: &mut FunctionBuilder, x: Value) -> Value {
    cast(b, F32X4, x)
}

/// `mask ? x : y` lane by lane; `mask` is an `i32x4` of all-ones or zero
/// lanes, `x`/`y` any 128-bit vectors of one type.
pub(crate) fn select(b: &mut FunctionBuilder, mask: Value, x: Value, y: Value) -> Value {
    let ty = b.func.dfg.value_type(x);
    let m = cast(b, ty, mask);
    b.ins().bitselect(m, x, y)
}

/// The `i32x4` mask of `x cc y`.
pub(crate) fn fcmp(b: &mut FunctionBuilder, cc: FloatCC, x: Value, y: Value) -> Value {
    b.ins().fcmp(cc, x, y)
}

/// `1.0` where `mask`, else `0.0`.
pub(crate) fn flag(b: &mut FunctionBuilder, mask: Value) -> Value {
    let one = splat(b, 1.0);
    let m = float(b, mask);
    b.ins().band(m, one)
}

/// `f32x4` lane `i` as an `f32`.
pub(crate) fn lane(b: &mut FunctionBuilder, x: Value, i: usize) -> Value {
    b.ins().extractlane(x, i as u8)
}

/// An `f32` in lane 0 of an `f32x4` (the other lanes unspecified).
pub(crate) fn lane0(b: &mut FunctionBuilder, x: Value) -> Value {
    debug_assert_eq!(b.func.dfg.value_type(x), F32);
    b.ins().scalar_to_vector(F32X4, x)
}

/// The upper two lanes of an `f32x4` moved to the lower two (for widening
/// them to `f64x2`).
pub(crate) fn high_half(b: &mut FunctionBuilder, x: Value) -> Value {
    debug_assert_eq!(b.func.dfg.value_type(x), F32X4);
    let v = cast(b, I8X16, x);
    let mask: Vec<u8> = (8..16).chain(8..16).collect();
    let imm = b.func.dfg.immediates.push(ConstantData::from(mask));
    let s = b.ins().shuffle(v, v, imm);
    cast(b, F32X4, s)
}

/// Word `which` (0 low, 1 high) of each `i64` lane of two `i64x2`s, as the
/// `i32x4` `[a₀, a₁, b₀, b₁]`.
pub(crate) fn gather_words(b: &mut FunctionBuilder, a: Value, c: Value, which: u8) -> Value {
    let (a, c) = (cast(b, I8X16, a), cast(b, I8X16, c));
    let mask: Vec<u8> = [0u8, 8, 16, 24].iter().flat_map(|&q| (0..4).map(move |k| q + 4 * which + k)).collect();
    let imm = b.func.dfg.immediates.push(ConstantData::from(mask));
    let s = b.ins().shuffle(a, c, imm);
    cast(b, I32X4, s)
}

/// `((x0 ⊕ x1) ⊕ (x2 ⊕ x3))` of an `f32x4`'s lanes.
pub(crate) fn horizontal(
    b: &mut FunctionBuilder,
    x: Value,
    op: impl Fn(&mut FunctionBuilder, Value, Value) -> Value,
) -> Value {
    let l: Vec<Value> = (0..LANES).map(|i| lane(b, x, i)).collect();
    let lo = op(b, l[0], l[1]);
    let hi = op(b, l[2], l[3]);
    op(b, lo, hi)
}
