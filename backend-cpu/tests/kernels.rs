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
use zeroplan_ir::kernel::{Binary, Expr, Kernel, KernelBuilder, Unary};
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
                if !(e <= tolerance) {
                    failures.push(format!("{}: {} out{k}: error {e:e}\n{}", model.display(), kernel.name, kernel.to_text()));
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
