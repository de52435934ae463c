//! Throughput of JIT-compiled row kernels at all-MiniLM-L6-v2's sizes:
//! batch 32 × seq 128, hidden 384, 12 heads. Reports GB/s of operand bytes
//! read and written (each byte once), on rayon's global pool and on one
//! thread.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use zeroplan_backend_cpu::KernelCompiler;
use zeroplan_ir::kernel::{Binary, Expr, Kernel, KernelBuilder, Unary};
use zeroplan_ir::{DType, Shape, TensorType};

const BATCH: u64 = 32;
const SEQ: u64 = 128;
const HIDDEN: u64 = 384;
const HEADS: u64 = 12;

fn ty(dims: &[u64], dtype: DType) -> TensorType {
    TensorType::new(Shape::new(dims.iter().map(|&d| d.into())), dtype)
}

/// `y = (x − mean)·rsqrt(var + eps)·γ + β` over rows of 384.
fn layer_norm() -> Kernel {
    let dims = [BATCH, SEQ, HIDDEN];
    let mut k = KernelBuilder::new("layer_norm", Shape::new(dims.iter().map(|&d| d.into())));
    let x = k.load("x", ty(&dims, DType::F32), vec![0, 1, 2]);
    let gamma = k.load("gamma", ty(&[HIDDEN], DType::F32), vec![2]);
    let beta = k.load("beta", ty(&[HIDDEN], DType::F32), vec![2]);
    let n = k.push(Expr::RowLen);
    let sum = k.push(Expr::ReduceSum(x));
    let mean = k.binary(Binary::Div, sum, n);
    let d = k.binary(Binary::Sub, x, mean);
    let d2 = k.binary(Binary::Mul, d, d);
    let ss = k.push(Expr::ReduceSum(d2));
    let var = k.binary(Binary::Div, ss, n);
    let eps = k.constant(1e-12);
    let ve = k.binary(Binary::Add, var, eps);
    let r = k.unary(Unary::Rsqrt, ve);
    let xh = k.binary(Binary::Mul, d, r);
    let y = k.binary(Binary::Mul, xh, gamma);
    let y = k.binary(Binary::Add, y, beta);
    k.store("y", ty(&dims, DType::F32), y);
    k.finish().unwrap()
}

/// The fused attention softmax: scale, padding mask, softmax (all-masked
/// rows give 0), and optionally dropout.
fn softmax(dropout: bool) -> Kernel {
    let dims = [BATCH, HEADS, SEQ, SEQ];
    let name = if dropout { "softmax_dropout" } else { "softmax" };
    let mut k = KernelBuilder::new(name, Shape::new(dims.iter().map(|&d| d.into())));
    let s = k.load("scores", ty(&dims, DType::F32), vec![0, 1, 2, 3]);
    let scale = k.constant(0.125);
    let s = k.binary(Binary::Mul, s, scale);
    let m = k.load("mask", ty(&[BATCH, SEQ], DType::I64), vec![0, 3]);
    let zero = k.constant(0.0);
    let masked = k.binary(Binary::Eq, m, zero);
    let ninf = k.constant(f64::NEG_INFINITY);
    let s = k.select(masked, ninf, s);
    let max = k.push(Expr::ReduceMax(s));
    let d = k.binary(Binary::Sub, s, max);
    let e = k.unary(Unary::Exp, d);
    let sum = k.push(Expr::ReduceSum(e));
    let p = k.binary(Binary::Div, e, sum);
    let empty = k.binary(Binary::Eq, max, ninf);
    let p = k.select(empty, zero, p);
    k.store("probs", ty(&dims, DType::F32), p);
    if dropout {
        let keep = k.push(Expr::Keep { p: 0.1, stream: 1 });
        let scale = k.constant(1.0 / 0.9);
        let kept = k.binary(Binary::Mul, p, scale);
        let y = k.select(keep, kept, zero);
        k.store("probs_dropout", ty(&dims, DType::F32), y);
    }
    k.finish().unwrap()
}

fn bench(c: &mut Criterion) {
    let mut compiler = KernelCompiler::new().unwrap();
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for kernel in [layer_norm(), softmax(false), softmax(true)] {
        let dims: Vec<usize> = kernel.shape.dims().iter().map(|d| d.as_constant().unwrap() as usize).collect();
        let compiled = compiler.compile(&kernel, &dims).unwrap();
        let bytes = |args: &[zeroplan_ir::kernel::KernelArg], lens: Vec<usize>| -> Vec<Vec<u8>> {
            args.iter().zip(lens).map(|(a, n)| vec![0u8; n * a.ty.dtype.size_bytes() as usize]).collect()
        };
        let mut inputs = bytes(&kernel.inputs, compiled.input_lens());
        // Scores and activations of 0.5 (as f32 bits); a mask of ones.
        for (a, buf) in kernel.inputs.iter().zip(&mut inputs) {
            let pattern: Vec<u8> = match a.ty.dtype {
                DType::I64 => 1i64.to_le_bytes().to_vec(),
                _ => 0.5f32.to_le_bytes().to_vec(),
            };
            for (i, b) in buf.iter_mut().enumerate() {
                *b = pattern[i % pattern.len()];
            }
        }
        let mut outputs = bytes(&kernel.outputs, compiled.output_lens());
        let total: usize = inputs.iter().chain(&outputs).map(Vec::len).sum();
        let in_ptrs: Vec<usize> = inputs.iter().map(|b| b.as_ptr() as usize).collect();
        let out_ptrs: Vec<usize> = outputs.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
        let launch = || {
            let ins: Vec<*const u8> = in_ptrs.iter().map(|&p| p as *const u8).collect();
            let outs: Vec<*mut u8> = out_ptrs.iter().map(|&p| p as *mut u8).collect();
            // SAFETY: every buffer has its operand's size.
            unsafe { compiled.launch(&ins, &outs, 7, 0) };
        };
        let mut group = c.benchmark_group(kernel.name.clone());
        group.throughput(Throughput::Bytes(total as u64));
        group.sample_size(20);
        group.bench_function(format!("{dims:?} all threads"), |b| b.iter(launch));
        group.bench_function(format!("{dims:?} 1 thread"), |b| b.iter(|| one_thread.install(launch)));
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
