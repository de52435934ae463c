//! JIT-compiled kernels against the reference interpreter.
//!
//! **Metric**: per output tensor, `max |jit − ref| / max(1, max |ref|)`
//! ([`common::error`]), `ref` the interpreter's exact `f64` result (it
//! computes the kernel in `f64` and never rounds), NaN matching NaN and an
//! infinity only itself. f32 storage must be within [`F32_TOLERANCE`], bf16
//! storage within [`BF16_TOLERANCE`].

mod common;

use common::{dims, error, fused_kernels, interpret, random_inputs, run, tiny_models};
use zeroplan_backend_cpu::{CodegenError, KernelCompiler};
use zeroplan_ir::interp::random::dropout_keeps;
use zeroplan_ir::kernel::{Expr, Kernel, KernelBuilder, Unary};
use zeroplan_ir::spec::Precision;
use zeroplan_ir::{DType, GeluApproximation, Shape, Tensor, TensorType};

const F32_TOLERANCE: f64 = 1e-5;
const BF16_TOLERANCE: f64 = 1e-2;

/// Runs every kernel of every tiny model's fused training graph at
/// `batch × seq` and returns `(worst error, description)` per kernel that
/// exceeds `tolerance`.
fn check_models(precision: Precision, batch: u64, seq: u64, tolerance: f64) -> usize {
    let mut compiler = KernelCompiler::new().unwrap();
    let (mut failures, mut count) = (Vec::new(), 0);
    for model in tiny_models() {
        for (i, kernel) in fused_kernels(&model, precision).iter().enumerate() {
            let d = dims(kernel, batch, seq);
            let compiled = compiler.compile(kernel, &d).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
            let inputs = random_inputs(kernel, &d, i as u64 + 1);
            let (seed, offset) = (0x1234_5678_9ABC_DEF0, 3);
            let want = interpret(kernel, &inputs, seed, offset);
            let got = run(kernel, &compiled, &inputs, seed, offset);
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let e = error(g, w.floats().unwrap());
                if e > tolerance {
                    failures.push(format!(
                        "{}: {} out{k}: error {e:e}\n{}",
                        model.display(),
                        kernel.name,
                        kernel.to_text()
                    ));
                }
            }
            count += 1;
        }
    }
    assert!(failures.is_empty(), "{} of {count} kernels differ:\n{}", failures.len(), failures.join("\n"));
    count
}

#[test]
fn every_tiny_model_kernel_matches_the_interpreter() {
    // seq 5: rows of 5 keys run one vector and a tail column.
    let n = check_models(Precision::F32, 2, 5, F32_TOLERANCE);
    assert!(n > 50, "only {n} kernels");
    // seq 8: attention rows are whole vectors.
    check_models(Precision::F32, 3, 8, F32_TOLERANCE);
}

#[test]
fn bf16_training_kernels_match_the_interpreter() {
    check_models(Precision::Bf16, 2, 6, BF16_TOLERANCE);
}

/// The kernels of tiny-bert's fused training graph.
fn tiny_bert() -> Vec<Kernel> {
    let model = tiny_models().into_iter().find(|p| p.ends_with("tiny-bert.ron")).expect("tiny-bert exists");
    fused_kernels(&model, Precision::F32)
}

fn f32_type(dims: &[u64]) -> TensorType {
    TensorType::new(Shape::new(dims.iter().map(|&d| d.into())), DType::F32)
}

/// `out0 = keep {p, stream}` over `dims`.
fn keep_kernel(dims: &[u64], p: f64, stream: u32) -> Kernel {
    let mut k = KernelBuilder::new("keep", Shape::new(dims.iter().map(|&d| d.into())));
    let keep = k.push(Expr::Keep { p, stream });
    k.store("mask", f32_type(dims), keep);
    k.finish().unwrap()
}

#[test]
fn dropout_masks_are_bit_exact() {
    let mut compiler = KernelCompiler::new().unwrap();
    let dims = [3u64, 5, 37];
    let ds: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    for (p, stream, seed, offset) in
        [(0.1, 0, 0, 0), (0.5, 7, 0xDEAD_BEEF_0123_4567, 99), (0.9999, 3, 42, 1 << 40), (0.0, 1, 5, 5), (1.0, 1, 5, 5)]
    {
        let kernel = keep_kernel(&dims, p, stream);
        let compiled = compiler.compile(&kernel, &ds).unwrap();
        let got = run(&kernel, &compiled, &[], seed, offset);
        for (e, &g) in got[0].iter().enumerate() {
            let want = dropout_keeps(seed, stream, offset, e as u64, p);
            assert_eq!(g, if want { 1.0 } else { 0.0 }, "p {p} stream {stream} seed {seed:#x} element {e}");
        }
    }
    // The decision at the boundary: element 0 under key 0 draws
    // w0 = 0x6627e8d5, so u = 0x6627e8·2⁻²⁴ exactly; p = u keeps, the next
    // double above u drops.
    let u = f64::from(0x6627_e8d5u32 >> 8) / 16_777_216.0;
    for p in [u, f64::from_bits(u.to_bits() + 1)] {
        let kernel = keep_kernel(&[1, 4], p, 0);
        let got = run(&kernel, &compiler.compile(&kernel, &[1, 4]).unwrap(), &[], 0, 0);
        assert_eq!(got[0][0] == 1.0, dropout_keeps(0, 0, 0, 0, p), "p = {p}");
    }
}

/// Runs `kernel` at `dims` in a pool of `threads` threads; the raw output bytes.
fn run_in_pool(kernel: &Kernel, dims: &[usize], inputs: &[Tensor], threads: usize) -> Vec<Vec<u8>> {
    let mut compiler = KernelCompiler::new().unwrap();
    let compiled = compiler.compile(kernel, dims).unwrap();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let in_bytes: Vec<Vec<u8>> = inputs.iter().map(common::to_bytes).collect();
    let mut outs = common::output_buffers(kernel, &compiled);
    let in_ptrs: Vec<*const u8> = in_bytes.iter().map(|b| b.as_ptr()).collect();
    let out_ptrs: Vec<*mut u8> = outs.iter_mut().map(|b| b.as_mut_ptr()).collect();
    // Raw pointers are not `Send`; their addresses are.
    let (ins, outs_at): (Vec<usize>, Vec<usize>) =
        (in_ptrs.iter().map(|&p| p as usize).collect(), out_ptrs.iter().map(|&p| p as usize).collect());
    pool.install(|| {
        let in_ptrs: Vec<*const u8> = ins.iter().map(|&a| a as *const u8).collect();
        let out_ptrs: Vec<*mut u8> = outs_at.iter().map(|&a| a as *mut u8).collect();
        // SAFETY: every buffer has its operand's size.
        unsafe { compiled.launch(&in_ptrs, &out_ptrs, 9, 4) }
    });
    outs
}

#[test]
fn cross_row_sums_are_deterministic_across_thread_counts() {
    let (batch, seq) = (16, 64);
    let kernels: Vec<Kernel> = tiny_bert()
        .into_iter()
        .filter(|k| k.outputs.iter().any(|o| o.is_cross_row(k.shape.rank())) && k.shape.rank() == 3)
        .collect();
    assert!(kernels.len() >= 3, "LayerNorm and bias gradients");
    for kernel in &kernels {
        let d = dims(kernel, batch, seq);
        let inputs = random_inputs(kernel, &d, 17);
        let one = run_in_pool(kernel, &d, &inputs, 1);
        for threads in [2, 3, 8] {
            assert_eq!(one, run_in_pool(kernel, &d, &inputs, threads), "{}: {threads} threads", kernel.name);
        }
        assert_eq!(one, run_in_pool(kernel, &d, &inputs, 2), "{}: run to run", kernel.name);
        // And they are right.
        let want = interpret(kernel, &inputs, 9, 4);
        for (k, (bytes, w)) in one.iter().zip(&want).enumerate() {
            let got = common::from_bytes(bytes, kernel.outputs[k].ty.dtype);
            let e = error(&got, w.floats().unwrap());
            assert!(e <= F32_TOLERANCE, "{} out{k}: {e:e}", kernel.name);
        }
    }
}

#[test]
fn outputs_may_overwrite_their_inputs() {
    let (batch, seq) = (8, 40);
    let mut compiler = KernelCompiler::new().unwrap();
    let mut checked = 0;
    for kernel in tiny_bert() {
        let d = dims(&kernel, batch, seq);
        let compiled = compiler.compile(&kernel, &d).unwrap();
        let inputs = random_inputs(&kernel, &d, 5);
        let want: Vec<Vec<u8>> = {
            let in_bytes: Vec<Vec<u8>> = inputs.iter().map(common::to_bytes).collect();
            let mut outs = common::output_buffers(&kernel, &compiled);
            let in_ptrs: Vec<*const u8> = in_bytes.iter().map(|b| b.as_ptr()).collect();
            let out_ptrs: Vec<*mut u8> = outs.iter_mut().map(|b| b.as_mut_ptr()).collect();
            // SAFETY: every buffer has its operand's size.
            unsafe { compiled.launch(&in_ptrs, &out_ptrs, 1, 2) };
            outs
        };
        for (k, out) in kernel.outputs.iter().enumerate() {
            let Some(i) = kernel.inputs.iter().position(|a| a.ty == out.ty && a.axes == out.axes) else { continue };
            let mut in_bytes: Vec<Vec<u8>> = inputs.iter().map(common::to_bytes).collect();
            let mut outs = common::output_buffers(&kernel, &compiled);
            let shared = in_bytes[i].as_mut_ptr();
            let in_ptrs: Vec<*const u8> = in_bytes
                .iter()
                .enumerate()
                .map(|(j, b)| if j == i { shared.cast_const() } else { b.as_ptr() })
                .collect();
            let out_ptrs: Vec<*mut u8> =
                outs.iter_mut().enumerate().map(|(j, b)| if j == k { shared } else { b.as_mut_ptr() }).collect();
            // SAFETY: output k aliases input i, of the same shape and dtype.
            unsafe { compiled.launch(&in_ptrs, &out_ptrs, 1, 2) };
            assert_eq!(in_bytes[i], want[k], "{}: out{k} written over in{i}", kernel.name);
            checked += 1;
        }
    }
    assert!(checked > 10, "only {checked} in-place pairs");
}

/// `out0 = f(in0)` over a `[1, n]` row.
fn unary_kernel(u: Unary, n: u64) -> Kernel {
    let mut k = KernelBuilder::new(format!("{}_sweep", u.name()), Shape::new([1u64.into(), n.into()]));
    let x = k.load("x", f32_type(&[1, n]), vec![0, 1]);
    let y = k.unary(u, x);
    k.store("y", f32_type(&[1, n]), y);
    k.finish().unwrap()
}

/// Runs `f` JIT-compiled over `xs`.
fn sweep(u: Unary, xs: &[f32]) -> Vec<f64> {
    let kernel = unary_kernel(u, xs.len() as u64);
    let compiled = KernelCompiler::new().unwrap().compile(&kernel, &[1, xs.len()]).unwrap();
    let x = Tensor::float(vec![1, xs.len()], DType::F32, xs.iter().map(|&v| v as f64).collect()).unwrap();
    run(&kernel, &compiled, &[x], 0, 0).remove(0)
}

#[test]
fn math_approximations_are_accurate() {
    use zeroplan_ir::interp as f;
    // A dense sweep: 400 001 points over [−20, 20] (every f32 step near 0 is
    // not covered, but the polynomials' worst cases are smooth).
    let xs: Vec<f32> = (0..=400_000).map(|i| (i as f64 * 1e-4 - 20.0) as f32).collect();
    let rel = |got: &[f64], reference: fn(f64) -> f64, floor: f64| {
        got.iter()
            .zip(&xs)
            .map(|(&g, &x)| {
                let r = reference(x as f64);
                if r.abs() < floor { 0.0 } else { ((g - r) / r).abs() }
            })
            .fold(0.0, f64::max)
    };
    let abs = |got: &[f64], reference: fn(f64) -> f64| {
        got.iter()
            .zip(&xs)
            .map(|(&g, &x)| (g - reference(x as f64)).abs() / reference(x as f64).abs().max(1.0))
            .fold(0.0, f64::max)
    };
    let exp = rel(&sweep(Unary::Exp, &xs), f64::exp, 0.0);
    let tanh_rel = rel(&sweep(Unary::Tanh, &xs), f64::tanh, 1e-30);
    let tanh_abs = abs(&sweep(Unary::Tanh, &xs), f64::tanh);
    let erf = abs(&sweep(Unary::Erf, &xs), libm::erf);
    let gelu = abs(&sweep(Unary::Gelu(GeluApproximation::Erf), &xs), f::gelu_erf);
    let gelu_tanh = abs(&sweep(Unary::Gelu(GeluApproximation::Tanh), &xs), f::gelu_tanh);
    let gelu_grad = abs(&sweep(Unary::GeluDeriv(GeluApproximation::Erf), &xs), f::gelu_erf_grad);
    let gelu_tanh_grad = abs(&sweep(Unary::GeluDeriv(GeluApproximation::Tanh), &xs), f::gelu_tanh_grad);
    let silu = abs(&sweep(Unary::Silu, &xs), f::silu);
    let silu_grad = abs(&sweep(Unary::SiluDeriv, &xs), f::silu_grad);
    eprintln!(
        "exp rel {exp:.2e}; tanh rel {tanh_rel:.2e} abs {tanh_abs:.2e}; erf abs {erf:.2e}; gelu {gelu:.2e}; \
         gelu_tanh {gelu_tanh:.2e}; gelu' {gelu_grad:.2e}; gelu_tanh' {gelu_tanh_grad:.2e}; silu {silu:.2e}; silu' {silu_grad:.2e}"
    );
    assert!(exp <= 1.5e-7, "exp: {exp:e}");
    assert!(tanh_rel <= 5e-7 && tanh_abs <= 1.5e-7, "tanh: {tanh_rel:e} {tanh_abs:e}");
    assert!(erf <= 2.5e-7, "erf: {erf:e}");
    for (name, e) in [
        ("gelu", gelu),
        ("gelu_tanh", gelu_tanh),
        ("gelu'", gelu_grad),
        ("gelu_tanh'", gelu_tanh_grad),
        ("silu", silu),
        ("silu'", silu_grad),
    ] {
        assert!(e <= 1e-6, "{name}: {e:e}");
    }
    // Special values.
    let special = [f32::NEG_INFINITY, -1000.0, -88.0, 0.0, -0.0, 88.0, 89.0, 1000.0, f32::INFINITY, f32::NAN];
    let e = sweep(Unary::Exp, &special);
    assert_eq!((e[0], e[1]), (0.0, 0.0));
    assert_eq!(e[2], 0.0, "exp(−88) is subnormal: flushed");
    assert_eq!((e[3], e[4]), (1.0, 1.0));
    assert!(((e[5] - 88f64.exp()) / 88f64.exp()).abs() < 1e-6);
    assert_eq!(&e[6..9], &[f64::INFINITY; 3]);
    assert!(e[9].is_nan());
    let t = sweep(Unary::Tanh, &special);
    assert_eq!((t[0], t[1], t[7], t[8]), (-1.0, -1.0, 1.0, 1.0));
    assert!(t[9].is_nan());
    let r = sweep(Unary::Erf, &special);
    assert_eq!((r[0], r[8]), (-1.0, 1.0));
    assert!(r[9].is_nan());
}

/// `out0 = in0` with the given dtypes, over `n` elements.
fn convert_kernel(from: DType, to: DType, n: u64) -> Kernel {
    let ty = |d| TensorType::new(Shape::new([n.into()]), d);
    let mut k = KernelBuilder::new("convert", Shape::new([n.into()]));
    let x = k.load("x", ty(from), vec![0]);
    k.store("y", ty(to), x);
    k.finish().unwrap()
}

/// Runs a conversion kernel on raw bytes.
fn convert(from: DType, to: DType, bytes: &[u8]) -> Vec<u8> {
    let n = bytes.len() / from.size_bytes() as usize;
    let kernel = convert_kernel(from, to, n as u64);
    let compiled = KernelCompiler::new().unwrap().compile(&kernel, &[n]).unwrap();
    let mut out = vec![0u8; n * to.size_bytes() as usize];
    // SAFETY: both buffers hold n elements.
    unsafe { compiled.launch(&[bytes.as_ptr()], &[out.as_mut_ptr()], 0, 0) };
    out
}

#[test]
fn half_precision_storage_round_trips_like_the_half_crate() {
    // Every f16 and bf16 bit pattern widens exactly.
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let bytes: Vec<u8> = all.iter().flat_map(|h| h.to_le_bytes()).collect();
    for (dtype, widen) in [
        (DType::F16, (|h: u16| half::f16::from_bits(h).to_f32()) as fn(u16) -> f32),
        (DType::BF16, |h: u16| half::bf16::from_bits(h).to_f32()),
    ] {
        let got = common::from_bytes(&convert(dtype, DType::F32, &bytes), DType::F32);
        for (&h, &g) in all.iter().zip(&got) {
            let want = widen(h) as f64;
            assert!(g == want || g.is_nan() && want.is_nan(), "{dtype} {h:#06x}: {g} vs {want}");
        }
    }
    // f32 → f16/bf16 rounds to nearest even, like `half`: ties, overflow,
    // subnormals, NaN, and a sweep of bit patterns.
    let mut values: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        65504.0,
        65519.99,
        65520.0,
        1e6,
        -1e6,
        6.1e-5,
        5.96e-8,
        2.98e-8,
        1e-9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        1.0 + 1.0 / 256.0,
        3.0e38,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-40,
    ];
    let mut rng = common::Rng::new(3);
    values.extend((0..100_000).map(|_| f32::from_bits(rng.next() as u32)));
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    for dtype in [DType::F16, DType::BF16] {
        let out = convert(DType::F32, dtype, &bytes);
        for (x, h) in values.iter().zip(out.chunks_exact(2)) {
            let h = u16::from_le_bytes([h[0], h[1]]);
            let (want, is_nan) = match dtype {
                DType::F16 => (half::f16::from_f32(*x).to_bits(), half::f16::from_bits(h).is_nan()),
                _ => (half::bf16::from_f32(*x).to_bits(), half::bf16::from_bits(h).is_nan()),
            };
            if x.is_nan() {
                assert!(is_nan, "{dtype} of NaN gave {h:#06x}");
            } else {
                assert_eq!(h, want, "{dtype} of {x:e} ({:#010x})", x.to_bits());
            }
        }
    }
}

#[test]
fn f16_storage_matches_the_interpreter() {
    // tiny-bert's LayerNorm and softmax kernels with every float operand f16.
    let mut compiler = KernelCompiler::new().unwrap();
    let mut checked = 0;
    for mut kernel in tiny_bert() {
        if !kernel.name.contains("norm") && !kernel.name.contains("probs") {
            continue;
        }
        for arg in kernel.inputs.iter_mut().chain(kernel.outputs.iter_mut()) {
            if arg.ty.dtype == DType::F32 {
                arg.ty.dtype = DType::F16;
            }
        }
        let d = dims(&kernel, 2, 7);
        let compiled = compiler.compile(&kernel, &d).unwrap();
        let inputs = random_inputs(&kernel, &d, 8);
        let want = interpret(&kernel, &inputs, 1, 1);
        let got = run(&kernel, &compiled, &inputs, 1, 1);
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            let e = error(g, w.floats().unwrap());
            assert!(e <= 2e-3, "{} out{k}: {e:e}", kernel.name);
        }
        checked += 1;
    }
    assert!(checked >= 4, "{checked}");
}

#[test]
fn bad_kernels_and_dims_are_errors() {
    let mut compiler = KernelCompiler::new().unwrap();
    let good = unary_kernel(Unary::Exp, 8);
    let mut bad = good.clone();
    bad.stores[0] = 99;
    let e = compiler.compile(&bad, &[1, 8]).unwrap_err();
    assert!(matches!(e, CodegenError::Invalid { .. }) && e.to_string().contains("exp_sweep"), "{e}");
    for dims in [&[1usize][..], &[1, 8, 1], &[2, 8], &[1, 9], &[1, 7]] {
        let e = compiler.compile(&good, dims).unwrap_err();
        assert!(matches!(e, CodegenError::Dims { .. }) && e.to_string().contains("exp_sweep"), "{dims:?}: {e}");
    }
    let symbolic = tiny_bert().into_iter().find(|k| k.shape.rank() == 3).unwrap();
    let e = compiler.compile(&symbolic, &[usize::MAX, 2, symbolic.shape.dims()[2].as_constant().unwrap() as usize]);
    assert!(matches!(e, Err(CodegenError::Dims { .. })), "{e:?}");
}

#[test]
fn compiled_kernels_are_cached_by_text_and_dims() {
    let mut compiler = KernelCompiler::new().unwrap();
    let kernel = tiny_bert().into_iter().find(|k| k.shape.rank() == 3).unwrap();
    let a = compiler.compile(&kernel, &dims(&kernel, 2, 5)).unwrap();
    let b = compiler.compile(&kernel, &dims(&kernel, 2, 5)).unwrap();
    let c = compiler.compile(&kernel, &dims(&kernel, 2, 6)).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    assert!(!std::sync::Arc::ptr_eq(&a, &c));
    assert_eq!(compiler.len(), 2);
    assert_eq!(a.name(), kernel.name);
    // Another compiler of the process reuses a kernel while it is held, and
    // compiles it again once nobody holds it (dims no other test binds).
    let mut other = KernelCompiler::new().unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &other.compile(&kernel, &dims(&kernel, 2, 5)).unwrap()));
    let lone = compiler.compile(&kernel, &dims(&kernel, 3, 11)).unwrap();
    let held = std::sync::Arc::downgrade(&lone);
    drop((lone, compiler));
    assert!(held.upgrade().is_none(), "a dropped compiler's kernel lives on");
    let again = other.compile(&kernel, &dims(&kernel, 3, 11)).unwrap();
    assert!(!std::sync::Weak::ptr_eq(&held, &std::sync::Arc::downgrade(&again)));
    fn send_sync<T: Send + Sync>() {}
    send_sync::<zeroplan_backend_cpu::CompiledKernel>();
    send_sync::<KernelCompiler>();
}

#[test]
fn alibi_and_reduce_max_match_the_interpreter_on_wide_rows() {
    // MosaicBERT's attention softmax (ALiBi) at a row of 131 keys: 32
    // vectors and a tail of 3.
    let model = tiny_models().into_iter().find(|p| p.ends_with("tiny-mosaicbert.ron")).unwrap();
    let kernels = fused_kernels(&model, Precision::F32);
    let alibi: Vec<&Kernel> = kernels.iter().filter(|k| k.body.contains(&Expr::AlibiPenalty)).collect();
    assert!(!alibi.is_empty());
    let mut compiler = KernelCompiler::new().unwrap();
    for kernel in alibi {
        let d = dims(kernel, 2, 131);
        let inputs = random_inputs(kernel, &d, 4);
        let got = run(kernel, &compiler.compile(kernel, &d).unwrap(), &inputs, 3, 3);
        for (k, (g, w)) in got.iter().zip(interpret(kernel, &inputs, 3, 3)).enumerate() {
            let e = error(g, w.floats().unwrap());
            assert!(e <= F32_TOLERANCE, "{} out{k}: {e:e}", kernel.name);
        }
    }
}

#[test]
fn empty_kernels_write_zero_sums() {
    let mut compiler = KernelCompiler::new().unwrap();
    for dims in [[0u64, 5], [3, 0]] {
        let mut k = KernelBuilder::new("sum_sq", Shape::new(dims.iter().map(|&d| d.into())));
        let x = k.load("x", f32_type(&dims), vec![0, 1]);
        let sq = k.binary(zeroplan_ir::kernel::Binary::Mul, x, x);
        k.store_sum("sum", f32_type(&[]), vec![], sq);
        k.store("sq", f32_type(&dims), sq);
        let kernel = k.finish().unwrap();
        let d: Vec<usize> = dims.iter().map(|&n| n as usize).collect();
        let compiled = compiler.compile(&kernel, &d).unwrap();
        let x = Tensor::float(d.clone(), DType::F32, Vec::new()).unwrap();
        let got = run(&kernel, &compiled, &[x], 0, 0);
        assert_eq!(got[0], vec![0.0], "{dims:?}");
        assert!(got[1].is_empty());
    }
}

#[test]
fn reduce_max_propagates_nan_and_reduce_sum_infinities() {
    // Rows of 9: two vectors and a tail column. NaN in a vector lane, in the
    // tail, nowhere; an all −∞ row; a row with +∞.
    let (rows, width) = (5u64, 9u64);
    let mut k = KernelBuilder::new("max_sum", Shape::new([rows.into(), width.into()]));
    let x = k.load("x", f32_type(&[rows, width]), vec![0, 1]);
    let max = k.push(Expr::ReduceMax(x));
    let sum = k.push(Expr::ReduceSum(x));
    k.store("max", f32_type(&[rows, width]), max);
    k.store("sum", f32_type(&[rows, width]), sum);
    let kernel = k.finish().unwrap();
    let mut v: Vec<f64> = (0..rows * width).map(|i| (i % 7) as f64 - 3.0).collect();
    v[5] = f64::NAN; // row 0, vector lane
    v[9 + 8] = f64::NAN; // row 1, tail
    for e in &mut v[27..36] {
        *e = f64::NEG_INFINITY; // row 3
    }
    v[36 + 2] = f64::INFINITY; // row 4
    let x = Tensor::float(vec![rows as usize, width as usize], DType::F32, v).unwrap();
    let compiled = KernelCompiler::new().unwrap().compile(&kernel, &[rows as usize, width as usize]).unwrap();
    let got = run(&kernel, &compiled, std::slice::from_ref(&x), 0, 0);
    let want = interpret(&kernel, &[x], 0, 0);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(error(g, w.floats().unwrap()), 0.0, "out{k}: {g:?} vs {:?}", w.floats().unwrap());
    }
    assert!(got[0][0].is_nan() && got[0][9].is_nan() && got[0][18] == 3.0 && got[0][27] == f64::NEG_INFINITY);
}
