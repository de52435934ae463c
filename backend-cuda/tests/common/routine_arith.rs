//! The test cases of the broadcast, sum, cast, MSE, ALiBi and
//! optimizer-scalar routine kernels (shared like `routines.rs`'s): odd and broadcast shapes, axes of
//! length 1, misaligned and aligned buffers (the four-wide broadcast path),
//! sums cut into chunks, every dtype pair a cast converts, in-place outputs
//! where the step writes them so, and each scalar routine's branches.

use zeroplan_exec::{Arith, Buf, Instr};
use zeroplan_ir::DType;

use super::routines::{Builder, Case, Check, Random, mutated};

/// A broadcast case: the op, the shapes of a, b and the output, their
/// dtypes and skews.
type BroadcastCase = (Arith, [&'static [usize]; 3], [DType; 3], [usize; 3]);

/// `a ∘ b` over `a_shape`, `b_shape` into `shape`; `skews` of a, b, out.
fn broadcast(r: &mut Random, op: Arith, shapes: [&[usize]; 3], dtypes: [DType; 3], skews: [usize; 3]) -> Case {
    let count = |s: &[usize]| s.iter().product::<usize>();
    let mut b = Builder::default();
    let x = b.floats(r, dtypes[0], count(shapes[0]), 3.0, skews[0]);
    let y = b.floats(r, dtypes[1], count(shapes[1]), 3.0, skews[1]);
    let o = b.output(dtypes[2], count(shapes[2]), skews[2]);
    let name = format!("broadcast {op:?} {:?} {:?} → {:?} {dtypes:?} skew {skews:?}", shapes[0], shapes[1], shapes[2]);
    let instr = Instr::Broadcast {
        op,
        a: x,
        a_shape: shapes[0].to_vec(),
        b: y,
        b_shape: shapes[1].to_vec(),
        shape: shapes[2].to_vec(),
        out: o,
    };
    b.case(name, instr, Check::Exact)
}

pub fn broadcast_cases(r: &mut Random, out: &mut Vec<Case>) {
    let (f32, bf16, f16) = (DType::F32, DType::BF16, DType::F16);
    let cases: [BroadcastCase; 10] = [
        (Arith::Add, [&[], &[], &[]], [f32; 3], [0, 0, 0]),
        (Arith::Mul, [&[3, 1, 5], &[4, 1], &[3, 4, 5]], [bf16, f32, bf16], [1, 0, 1]),
        (Arith::Add, [&[2, 3, 8], &[8], &[2, 3, 8]], [f32; 3], [0, 0, 0]),
        (Arith::Sub, [&[6, 16], &[6, 1], &[6, 16]], [f16; 3], [0, 0, 0]),
        (Arith::Sub, [&[1], &[9, 12], &[9, 12]], [f32, bf16, f32], [0, 0, 0]),
        (Arith::Add, [&[5, 7], &[1], &[5, 7]], [f32, f32, bf16], [1, 0, 0]),
        (
            Arith::Mul,
            [&[2, 1, 3, 1, 5, 1, 2, 1, 2], &[5, 1, 1, 1, 2], &[2, 4, 3, 3, 5, 1, 2, 1, 2]],
            [f32; 3],
            [0, 0, 1],
        ),
        (Arith::Sub, [&[4, 40], &[4, 40], &[4, 40]], [f16, f32, f16], [1, 1, 1]),
        (Arith::Mul, [&[33, 4], &[33, 1], &[33, 4]], [bf16, f16, f32], [0, 0, 0]),
        (Arith::Add, [&[7, 1, 9], &[1, 11, 1], &[7, 11, 9]], [f16, bf16, bf16], [0, 1, 0]),
    ];
    for (op, shapes, dtypes, skews) in cases {
        out.push(broadcast(r, op, shapes, dtypes, skews));
    }
    // In place, as a step's counter is updated: the output is a itself.
    for (shape, dtype) in [(vec![], DType::F32), (vec![5, 12], DType::BF16)] {
        let n = shape.iter().product::<usize>();
        let mut b = Builder::default();
        let x = b.floats(r, dtype, n, 3.0, 0);
        let y = b.floats(r, DType::F32, 12.min(n), 3.0, 0);
        let b_shape = if shape.is_empty() { vec![] } else { vec![12] };
        let instr = Instr::Broadcast {
            op: Arith::Add,
            a: x,
            a_shape: shape.clone(),
            b: y,
            b_shape,
            shape: shape.clone(),
            out: x,
        };
        out.push(b.case(format!("broadcast in place {shape:?} {dtype:?}"), instr, Check::Exact));
    }
}

fn sum_to(r: &mut Random, x_shape: &[usize], shape: &[usize], x_dtype: DType, out_dtype: DType, skew: usize) -> Case {
    let mut b = Builder::default();
    let x = b.floats(r, x_dtype, x_shape.iter().product(), 2.0, skew);
    let o = b.output(out_dtype, shape.iter().product(), skew);
    let name = format!("sum_to {x_shape:?} → {shape:?} {x_dtype:?} → {out_dtype:?}");
    let instr = Instr::SumTo { x, x_shape: x_shape.to_vec(), shape: shape.to_vec(), out: o };
    b.case(name, instr, Check::Exact)
}

pub fn sum_to_cases(r: &mut Random, out: &mut Vec<Case>) {
    let cases: [(&[usize], &[usize], DType, DType); 9] = [
        (&[40, 33], &[33], DType::F32, DType::F32),
        (&[33, 40], &[33, 1], DType::BF16, DType::BF16),
        (&[3, 9000], &[3, 1], DType::F32, DType::F32),
        (&[4, 5, 6], &[5, 1], DType::F16, DType::F32),
        (&[2, 3, 4, 5], &[3, 1, 5], DType::F32, DType::BF16),
        (&[7, 5], &[], DType::F32, DType::F16),
        (&[6, 7], &[6, 7], DType::BF16, DType::F32),
        (&[300, 2, 3], &[2, 3], DType::BF16, DType::BF16),
        (&[2, 1, 3, 1, 4], &[1, 3, 1, 1], DType::F16, DType::F16),
    ];
    for (i, (x_shape, shape, x_dtype, out_dtype)) in cases.into_iter().enumerate() {
        out.push(sum_to(r, x_shape, shape, x_dtype, out_dtype, i % 2));
    }
}

pub fn cast_cases(r: &mut Random, out: &mut Vec<Case>) {
    for x_dtype in DType::ALL {
        for out_dtype in DType::ALL {
            // Beyond i32's range where the input holds it: an i32 output wraps.
            let scale = match (x_dtype, out_dtype) {
                (DType::F16, _) | (_, DType::F16) => 1000.0,
                (DType::I32, _) => 1e6,
                _ => 3e10,
            };
            let n = 37;
            let mut b = Builder::default();
            let v: Vec<f64> = (0..n).map(|_| r.value(scale)).collect();
            let x = b.input(x_dtype, &v, 1);
            let o = b.output(out_dtype, n, 0);
            out.push(b.case(format!("cast {x_dtype:?} → {out_dtype:?}"), Instr::Cast { x, out: o }, Check::Exact));
        }
    }
}

pub fn mse_cases(r: &mut Random, out: &mut Vec<Case>) {
    for (n, p_dtype, t_dtype, out_dtype) in [
        (1, DType::F32, DType::F32, DType::F32),
        (333, DType::BF16, DType::F32, DType::F32),
        (5000, DType::F32, DType::F16, DType::BF16),
    ] {
        let mut b = Builder::default();
        let p = b.floats(r, p_dtype, n, 2.0, 1);
        let t = b.floats(r, t_dtype, n, 2.0, 0);
        let o = b.output(out_dtype, 1, 0);
        let name = format!("mse {p_dtype:?} {t_dtype:?} × {n} → {out_dtype:?}");
        // The f64 sums' order differs from the host's: 1e-6 of the f32 mean.
        out.push(b.case(name, Instr::Mse { p, t, out: o }, Check::Within(1e-6)));
        let mut b = Builder::default();
        let p = b.floats(r, p_dtype, n, 2.0, 1);
        let t = b.floats(r, t_dtype, n, 2.0, 0);
        let dloss = scalar(&mut b, t_dtype, 0.7);
        let o = b.output(p_dtype, n, 1);
        let name = format!("mse_grad {p_dtype:?} {t_dtype:?} × {n}");
        out.push(b.case(name, Instr::MseGrad { p, t, dloss, out: o }, Check::Exact));
    }
}

pub fn alibi_cases(r: &mut Random, out: &mut Vec<Case>) {
    for (shape, dtype, in_place) in
        [([2, 3, 5, 7], DType::F32, false), ([1, 2, 9, 4], DType::BF16, false), ([2, 4, 3, 3], DType::F16, true)]
    {
        let mut b = Builder::default();
        let n = shape.iter().product();
        let x = b.floats(r, dtype, n, 4.0, 1);
        let o = if in_place { x } else { b.output(dtype, n, 0) };
        let slopes = (0..shape[1]).map(|h| 0.5f32.powi(h as i32 + 1) * 1.37).collect();
        let instr = Instr::AlibiBias { x, shape, slopes, out: o };
        out.push(b.case(format!("alibi_bias {shape:?} {dtype:?} in place {in_place}"), instr, Check::Exact));
    }
}

/// A scalar operand holding `v`.
fn scalar(b: &mut Builder, dtype: DType, v: f64) -> Buf {
    b.input(dtype, &[v], 0)
}

pub fn scalar_cases(out: &mut Vec<Case>) {
    let lr = [(3.0, 10, Some(110)), (57.0, 10, Some(110)), (500.0, 10, Some(110)), (57.0, 10, None), (4.0, 0, Some(9))];
    for (i, (step, warmup_steps, total_steps)) in lr.into_iter().enumerate() {
        let (step_dtype, out_dtype) = [(DType::F32, DType::F32), (DType::I64, DType::BF16)][i % 2];
        let mut b = Builder::default();
        let s = scalar(&mut b, step_dtype, step);
        let o = b.output(out_dtype, 1, 0);
        let instr = Instr::LrSchedule { step: s, peak: 3e-4, warmup_steps, total_steps, out: o };
        out.push(b.case(format!("lr_schedule at {step} of {warmup_steps}, {total_steps:?}"), instr, Check::Exact));
    }
    let grads = [
        (2.5e13, 65536.0, Some(1.0), 4),
        (0.3, 1.0, Some(1.0), 1),
        (7.0, 8.0, None, 3),
        (f64::INFINITY, 1.0, Some(1.0), 1),
    ];
    for (i, (sq, loss_scale, max_norm, micro_batches)) in grads.into_iter().enumerate() {
        let out_dtype = [DType::F32, DType::F16][i % 2];
        let mut b = Builder::default();
        let (q, s) = (scalar(&mut b, DType::F32, sq), scalar(&mut b, DType::F32, loss_scale));
        let (m, f) = (b.output(out_dtype, 1, 0), b.output(DType::F32, 1, 0));
        let instr = Instr::GradScale { sq: q, scale: s, max_norm, micro_batches, multiplier: m, finite: f };
        out.push(b.case(format!("grad_scale of {sq} at {loss_scale}, {max_norm:?}"), instr, Check::Exact));
    }
    for (good, finite) in [(3.0, 1.0), (1999.0, 1.0), (500.0, 0.0)] {
        let mut b = Builder::default();
        let instr = loss_scale_update(&mut b, 65536.0, good, finite);
        out.push(b.case(format!("loss_scale_update after {good}, finite {finite}"), instr, Check::Exact));
    }
}

/// fp16's dynamic loss-scale update (interval 2000, ×2 growth, ×½ backoff)
/// of f32 scalars, in place.
fn loss_scale_update(b: &mut Builder, scale: f64, good: f64, finite: f64) -> Instr<()> {
    let (scale, good, finite) =
        (scalar(b, DType::F32, scale), scalar(b, DType::F32, good), scalar(b, DType::F32, finite));
    Instr::LossScaleUpdate { scale, good, finite, interval: 2000, growth: 2.0, backoff: 0.5, outs: [scale, good] }
}

/// The new families' cases the comparison must catch.
pub fn mutations(r: &mut Random) -> Vec<Case> {
    let sub = broadcast(r, Arith::Sub, [&[5, 7], &[7], &[5, 7]], [DType::F32; 3], [1, 0, 0]);
    let vec4 = broadcast(r, Arith::Add, [&[3, 8], &[3, 8], &[3, 8]], [DType::F32; 3], [0, 0, 0]);
    let chunked = sum_to(r, &[40, 33], &[33], DType::F32, DType::F32, 0);
    let mut b = Builder::default();
    let v: Vec<f64> = (0..9).map(|_| r.value(3e10)).collect();
    let x = b.input(DType::F32, &v, 0);
    let o = b.output(DType::I32, 9, 0);
    let cast = b.case("cast F32 → I32 beyond i32".into(), Instr::Cast { x, out: o }, Check::Exact);
    let mut b = Builder::default();
    let instr = loss_scale_update(&mut b, 1024.0, 1999.0, 1.0);
    let grow = b.case("loss_scale_update reaching the interval".into(), instr, Check::Exact);
    let mut b = Builder::default();
    let (p, t) = (b.floats(r, DType::F32, 700, 2.0, 0), b.floats(r, DType::F32, 700, 2.0, 0));
    let o = b.output(DType::F32, 1, 0);
    let mse = b.case("mse × 700".into(), Instr::Mse { p, t, out: o }, Check::Within(1e-6));
    let mut b = Builder::default();
    let x = b.floats(r, DType::F32, 2 * 3 * 4 * 5, 4.0, 0);
    let o = b.output(DType::F32, 2 * 3 * 4 * 5, 0);
    let instr = Instr::AlibiBias { x, shape: [2, 3, 4, 5], slopes: vec![0.5, 0.25, 0.125], out: o };
    let alibi = b.case("alibi_bias [2, 3, 4, 5]".into(), instr, Check::Exact);
    vec![
        mutated(sub, "operands swapped", "op == 1 ? u - v", "op == 1 ? v - u"),
        mutated(vec4, "a vector's first element four times", "v[k] = zp_ld(&q.e[k]);", "v[k] = zp_ld(&q.e[0]);"),
        mutated(
            chunked,
            "each warp's first chunk dropped",
            "for (long long c = warp; c < chunks; c += warps)",
            "for (long long c = warp + warps; c < chunks; c += warps)",
        ),
        mutated(cast, "saturated into i32", "*out = (int)zp_as_i64(x);", "*out = zp_sat_i32(zp_ld(x));"),
        mutated(grow, "the count not advanced", "g + 1.0 >= (double)interval", "g >= (double)interval"),
        mutated(alibi, "the batch taken for the head", "head = (row / sq) % heads", "head = (row / sq) / heads"),
        mutated(
            mse,
            "the last block's partial dropped",
            "b < blocks; b += blockDim.x",
            "b < blocks - 1; b += blockDim.x",
        ),
    ]
}
