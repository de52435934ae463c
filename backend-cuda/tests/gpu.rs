//! On a GPU: every kernel of every tiny model compiled, loaded and run, its
//! outputs checked against the reference interpreter on fresh random inputs
//! (the exact `f64` answer the CPU backend is measured against, with the
//! same metric and tolerances: fp32 1e-5, bf16 1e-2 relative to the output's
//! largest magnitude), dropout masks bit for bit; the fused attention
//! kernels and multi-tensor AdamW against the `f64` references of
//! `tests/common/attention.rs` and `tests/common/adamw.rs`; cuBLASLt's
//! epilogues against an f64 product with the IR's tanh GELU; the routine
//! kernels against the host routines (`tests/common/routines.rs`).
//!
//! Ignored by default (no GPU in CI):
//! `cargo test -p zeroplan-backend-cuda --test gpu -- --ignored --nocapture`
//! on a machine with a CUDA 13 driver and NVRTC (`scripts/fetch-nvrtc.sh`
//! or the toolkit's). They fail, rather than skip, when there is no GPU.

mod common;

use common::adamw::{AdamWCase, reference as adamw_reference};
use common::attention::{AttentionCase, AttentionData, reference};
use common::{dims, error, from_bytes, fused_kernels, interpret, random_inputs, tiny_models, to_bytes};
use zeroplan_backend_cuda::attention::{AttentionKernel, BackwardTensors, ForwardTensors, LoadedAttention, Pass};
use zeroplan_backend_cuda::gemm::{BlasLt, Epilogue, Gemm, LtGemm, LtPointers};
use zeroplan_backend_cuda::{CudaDevice, CudaKernelCompiler};
use zeroplan_ir::interp::random::dropout_keeps;
use zeroplan_ir::kernel::{Expr, KernelBuilder};
use zeroplan_ir::spec::Precision;
use zeroplan_ir::{DType, Shape, TensorType};

const F32_TOLERANCE: f64 = 1e-5;
const BF16_TOLERANCE: f64 = 1e-2;

fn gpu() -> (CudaDevice, CudaKernelCompiler) {
    let device = CudaDevice::open(0).unwrap_or_else(|e| panic!("these tests need a GPU: {e}"));
    let nvrtc = common::nvrtc().expect("NVRTC (scripts/fetch-nvrtc.sh or the CUDA toolkit)");
    let compiler = CudaKernelCompiler::new(*device.properties(), nvrtc, None);
    (device, compiler)
}

/// Runs every kernel of every tiny model at `batch × seq`; the number checked.
fn check_models(precision: Precision, batch: u64, seq: u64, tolerance: f64) -> usize {
    let (device, mut compiler) = gpu();
    let (mut failures, mut count, mut worst) = (Vec::new(), 0, 0.0f64);
    for model in tiny_models() {
        for (i, kernel) in fused_kernels(&model, precision).iter().enumerate() {
            let d = dims(kernel, batch, seq);
            let compiled = compiler.compile(kernel, &d).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
            let loaded = device.load(&compiled).unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
            let inputs = random_inputs(kernel, &d, 1000 + i as u64);
            let (seed, offset) = (0x1234_5678_9ABC_DEF0, 3);
            let want = interpret(kernel, &inputs, seed, offset);
            let bytes: Vec<Vec<u8>> = inputs.iter().map(to_bytes).collect();
            let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
            let got = loaded.run_host(&device, &slices, seed, offset).unwrap_or_else(|e| panic!("{e}"));
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let e = error(&from_bytes(g, kernel.outputs[k].ty.dtype), w.floats().unwrap());
                worst = worst.max(e);
                if e > tolerance {
                    failures.push(format!("{}: {} out{k}: error {e:e}", model.display(), kernel.name));
                }
            }
            count += 1;
        }
    }
    println!("{precision:?} {batch}×{seq}: {count} kernels, worst error {worst:e}");
    assert!(failures.is_empty(), "{} of {count} kernels differ:\n{}", failures.len(), failures.join("\n"));
    count
}

#[test]
#[ignore = "needs a GPU"]
fn every_tiny_model_kernel_matches_the_interpreter_on_the_gpu() {
    // seq 5: rows of 5 keys run scalar; seq 8: whole vectors.
    assert!(check_models(Precision::F32, 2, 5, F32_TOLERANCE) > 50);
    check_models(Precision::F32, 3, 8, F32_TOLERANCE);
    // Many rows per block for the cross-row partials.
    check_models(Precision::F32, 64, 128, F32_TOLERANCE);
}

#[test]
#[ignore = "needs a GPU"]
fn bf16_and_f16_kernels_match_the_interpreter_on_the_gpu() {
    check_models(Precision::Bf16, 2, 6, BF16_TOLERANCE);
    check_models(Precision::F16(Default::default()), 2, 6, BF16_TOLERANCE);
}

#[test]
#[ignore = "needs a GPU"]
fn dropout_masks_are_bit_exact_on_the_gpu() {
    let (device, mut compiler) = gpu();
    let dims = [3u64, 5, 37];
    let shape = || Shape::new(dims.iter().map(|&d| d.into()));
    for (p, stream, seed, offset) in
        [(0.1, 0, 0u64, 0u64), (0.5, 7, 0xDEAD_BEEF_0123_4567, 99), (0.9999, 3, 42, 1 << 40)]
    {
        let mut k = KernelBuilder::new("keep", shape());
        let keep = k.push(Expr::Keep { p, stream });
        k.store("mask", TensorType::new(shape(), DType::F32), keep);
        let kernel = k.finish().unwrap();
        let compiled = compiler.compile(&kernel, &[3, 5, 37]).unwrap();
        let got = device.load(&compiled).unwrap().run_host(&device, &[], seed, offset).unwrap();
        for (e, g) in from_bytes(&got[0], DType::F32).into_iter().enumerate() {
            let want = dropout_keeps(seed, stream, offset, e as u64, p);
            assert_eq!(g, if want { 1.0 } else { 0.0 }, "p {p} stream {stream} element {e}");
        }
    }
}

/// `case`'s operands on the device and its output buffers, zeroed.
struct AttentionBuffers {
    inputs: [cudarc::driver::CudaSlice<u8>; 5],
    outputs: [cudarc::driver::CudaSlice<u8>; 5],
    /// Dropout's seed and counter word, which the kernels read.
    rng: cudarc::driver::CudaSlice<u64>,
}

impl AttentionBuffers {
    /// q, k, v, dout in the case's storage type, and the mask; out, lse,
    /// dq, dk, dv zeroed.
    fn new(stream: &std::sync::Arc<cudarc::driver::CudaStream>, case: &AttentionCase, x: &AttentionData) -> Self {
        let dtype = case.kernel.dtype;
        let storage = |values: &[f64]| -> Vec<u8> {
            values
                .iter()
                .flat_map(|&v| match dtype {
                    DType::BF16 => zeroplan_ir::to_bf16(v).to_le_bytes().to_vec(),
                    DType::F16 => zeroplan_ir::to_f16(v).to_le_bytes().to_vec(),
                    _ => (v as f32).to_le_bytes().to_vec(),
                })
                .collect()
        };
        let upload = |bytes: &[u8]| stream.clone_htod(bytes).unwrap();
        let inputs = [&x.q, &x.k, &x.v, &x.dout].map(|t| upload(&storage(t)));
        let [q, k, v, dout] = inputs;
        let n = case.elements() * dtype.size_bytes() as usize;
        let zeros = |bytes: usize| stream.alloc_zeros::<u8>(bytes).unwrap();
        let outputs = [zeros(n), zeros(case.batch * case.heads * case.seq * 4), zeros(n), zeros(n), zeros(n)];
        let rng = stream.clone_htod(&[case.seed, case.offset]).unwrap();
        AttentionBuffers { inputs: [q, k, v, dout, upload(&case.mask_bytes(&x.mask))], outputs, rng }
    }

    fn tensors(&self, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> BackwardTensors {
        use cudarc::driver::DevicePtr;
        let ptr = |s: &cudarc::driver::CudaSlice<u8>| s.device_ptr(stream).0;
        let [q, k, v, dout, mask] = &self.inputs;
        let [out, lse, dq, dk, dv] = &self.outputs;
        let rng = self.rng.device_ptr(stream).0;
        let (out, lse) = (ptr(out), ptr(lse));
        let forward = ForwardTensors { q: ptr(q), k: ptr(k), v: ptr(v), mask: ptr(mask), out, lse, rng };
        BackwardTensors { forward, dout: ptr(dout), dq: ptr(dq), dk: ptr(dk), dv: ptr(dv) }
    }
}

/// `case`'s forward and backward compiled and loaded on `device`.
fn load_attention(
    device: &CudaDevice,
    compiler: &mut CudaKernelCompiler,
    case: &AttentionCase,
) -> [LoadedAttention; 2] {
    [Pass::Forward, Pass::Backward].map(|pass| {
        let compiled = compiler.compile_attention(&case.kernel, pass).unwrap();
        LoadedAttention::load(device, &compiled.rendered, &compiled.ptx).unwrap()
    })
}

/// Queues the forward, then the backward on the forward's `out` and `lse`.
fn queue_attention(
    device: &CudaDevice,
    stream: &cudarc::driver::CudaStream,
    loaded: &[LoadedAttention; 2],
    t: &BackwardTensors,
    case: &AttentionCase,
) {
    let args = case.args();
    // SAFETY: every buffer was allocated at its tensor's size (AttentionBuffers).
    unsafe {
        loaded[0].forward(device, stream, &t.forward, case.batch, &args).unwrap();
        loaded[1].backward(device, stream, t, case.batch, &args).unwrap();
    }
}

/// Runs `case` forward then backward on the GPU (the backward on the
/// forward's own `out` and `lse`); every output against the `f64` reference.
fn check_attention(device: &CudaDevice, compiler: &mut CudaKernelCompiler, case: &AttentionCase, tolerance: f64) {
    let x = case.data(7);
    let want = reference(case, &x);
    let stream = device.context().default_stream();
    let buffers = AttentionBuffers::new(&stream, case, &x);
    let loaded = load_attention(device, compiler, case);
    queue_attention(device, &stream, &loaded, &buffers.tensors(&stream), case);
    let dtype = case.kernel.dtype;
    let dtypes = [dtype, DType::F32, dtype, dtype, dtype];
    let got: Vec<Vec<f64>> =
        buffers.outputs.iter().zip(dtypes).map(|(s, dt)| from_bytes(&stream.clone_dtoh(s).unwrap(), dt)).collect();
    let errors: Vec<(&str, f64)> = want.named().iter().zip(&got).map(|((t, w), g)| (*t, error(g, w))).collect();
    println!("{}: {errors:?}", case.name);
    assert!(errors.iter().all(|e| e.1 <= tolerance), "{}: {errors:?} over {tolerance:e}", case.name);
}

#[test]
#[ignore = "needs a GPU"]
fn fused_attention_matches_the_reference_on_the_gpu() {
    let (device, mut compiler) = gpu();
    for head_dim in [32, 64] {
        for (dtype, tolerance) in
            [(DType::F32, F32_TOLERANCE), (DType::BF16, BF16_TOLERANCE), (DType::F16, BF16_TOLERANCE)]
        {
            for (alibi, dropout) in [(false, false), (true, true)] {
                // The CUDA-core kernels, whatever the device.
                let kernel = AttentionKernel { head_dim, dtype, mask: DType::I64, alibi, dropout, tensor_cores: false };
                for shape in [[2, 3, 77], [1, 2, 512]] {
                    let name = format!("D={head_dim} {dtype:?} alibi {alibi} dropout {dropout} {shape:?}");
                    let case = AttentionCase::new(&name, kernel, shape, 2, 1);
                    check_attention(&device, &mut compiler, &case, tolerance);
                }
            }
        }
    }
    let i32_mask = AttentionKernel {
        head_dim: 64,
        dtype: DType::F32,
        mask: DType::I32,
        alibi: true,
        dropout: true,
        tensor_cores: false,
    };
    check_attention(
        &device,
        &mut compiler,
        &AttentionCase::new("i32 mask", i32_mask, [2, 12, 128], 1, 0),
        F32_TOLERANCE,
    );
}

/// The tensor-core kernels (sm_80+): bf16 and f16 at head dims 32, 64 and
/// 128, where `FlashAttention::kernel` picks them on this device, against
/// the f64 reference at the 16-bit tolerance.
#[test]
#[ignore = "needs a GPU"]
fn tensor_core_attention_matches_the_reference_on_the_gpu() {
    let (device, mut compiler) = gpu();
    for head_dim in [32, 64, 128] {
        for dtype in [DType::BF16, DType::F16] {
            for (alibi, dropout) in [(false, false), (true, true)] {
                let device_props = device.properties();
                let served = AttentionKernel::tensor_cores_serve(head_dim, dtype, device_props);
                assert!(served, "sm_{:?} has no tensor-core kernels", device_props.compute_capability);
                let kernel = AttentionKernel { head_dim, dtype, mask: DType::I64, alibi, dropout, tensor_cores: true };
                for shape in [[2, 3, 77], [1, 2, 512]] {
                    let name = format!("mma D={head_dim} {dtype:?} alibi {alibi} dropout {dropout} {shape:?}");
                    let case = AttentionCase::new(&name, kernel, shape, 2, 1);
                    check_attention(&device, &mut compiler, &case, BF16_TOLERANCE);
                }
            }
        }
    }
}

/// Fused attention forward + backward over BERT-base's `[32, 12, 128, 64]`
/// in bf16 (dropout 0.1, as in training), CUDA cores against tensor cores:
/// the mean of 20 runs after 3 warm-ups, printed with the products' rate
/// (`14·B·H·S²·D` FLOPs: `4·` forward, `10·` backward with its recomputed
/// `Q·Kᵀ`). Prints; asserts only that the runs complete.
#[test]
#[ignore = "needs a GPU"]
fn attention_speed_bert_base() {
    let (device, mut compiler) = gpu();
    let stream = device.context().default_stream();
    let flops = 14.0 * 32.0 * 12.0 * 128.0 * 128.0 * 64.0;
    for tensor_cores in [false, true] {
        let kernel = AttentionKernel {
            head_dim: 64,
            dtype: DType::BF16,
            mask: DType::I64,
            alibi: false,
            dropout: true,
            tensor_cores,
        };
        let case = AttentionCase::new("bert-base", kernel, [32, 12, 128], 1, 0);
        let x = case.data(7);
        let buffers = AttentionBuffers::new(&stream, &case, &x);
        let t = buffers.tensors(&stream);
        let loaded = load_attention(&device, &mut compiler, &case);
        for _ in 0..3 {
            queue_attention(&device, &stream, &loaded, &t, &case);
        }
        stream.synchronize().unwrap();
        let start = std::time::Instant::now();
        for _ in 0..20 {
            queue_attention(&device, &stream, &loaded, &t, &case);
        }
        stream.synchronize().unwrap();
        let ms = start.elapsed().as_secs_f64() * 1e3 / 20.0;
        let which = if tensor_cores { "tensor cores" } else { "CUDA cores" };
        println!("attention fwd+bwd bf16 [32, 12, 128, 64], {which}: {ms:.3} ms, {:.1} TFLOP/s", flops / ms / 1e9);
    }
}

/// One multi-tensor AdamW step on the GPU: p, m, v against the `f64`
/// reference at fp32 tolerance (the arithmetic is f32 whatever the
/// gradient's dtype), the working copy the new parameter rounded to its dtype.
fn check_adamw(device: &CudaDevice, compiler: &mut CudaKernelCompiler, case: &AdamWCase, working: Option<DType>) {
    use cudarc::driver::{CudaSlice, DevicePtr};
    use zeroplan_backend_cuda::adamw::{AdamWKernel, AdamWScalars, AdamWTensor, LoadedAdamW};
    let kernel = AdamWKernel { grad: case.grad, working };
    let rendered = kernel.render().unwrap();
    let nvrtc = common::nvrtc().unwrap();
    let ptx = nvrtc.compile_ptx(&rendered.entry, &rendered.source, &compiler.device().arch()).unwrap();
    let loaded = LoadedAdamW::load(device, &rendered, &ptx).unwrap();
    let stream = device.context().default_stream();
    let x = case.data(11);
    let want = adamw_reference(case, &x);
    let store = |values: &[f64], dtype: DType| -> CudaSlice<u8> {
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| match dtype {
                DType::BF16 => zeroplan_ir::to_bf16(v).to_le_bytes().to_vec(),
                DType::F16 => zeroplan_ir::to_f16(v).to_le_bytes().to_vec(),
                _ => (v as f32).to_le_bytes().to_vec(),
            })
            .collect();
        if bytes.is_empty() { stream.alloc_zeros::<u8>(4).unwrap() } else { stream.clone_htod(&bytes).unwrap() }
    };
    let mut buffers = Vec::new();
    for (t, &(n, _)) in case.tensors.iter().enumerate() {
        let working = working.map(|w| store(&vec![0.0; n], w));
        buffers.push((
            store(&x.p[t], DType::F32),
            store(&x.g[t], case.grad),
            store(&x.m[t], DType::F32),
            store(&x.v[t], DType::F32),
            working,
        ));
    }
    let ptr = |s: &CudaSlice<u8>| s.device_ptr(&stream).0;
    let tensors: Vec<AdamWTensor> = case
        .tensors
        .iter()
        .zip(&buffers)
        .map(|(&(len, weight_decay), (p, g, m, v, w))| AdamWTensor {
            param: ptr(p),
            grad: ptr(g),
            m: ptr(m),
            v: ptr(v),
            working: w.as_ref().map(ptr),
            len,
            weight_decay,
        })
        .collect();
    let table = kernel.table(&tensors).unwrap();
    let table_buffer = stream.clone_htod(&table.bytes).unwrap();
    let scalars = [case.lr, case.step, case.multiplier, case.finite].map(|s| store(&[s], DType::F32));
    let scalar_ptrs = AdamWScalars {
        lr: ptr(&scalars[0]),
        step: ptr(&scalars[1]),
        multiplier: ptr(&scalars[2]),
        finite: ptr(&scalars[3]),
    };
    // SAFETY: every buffer was allocated above at its tensor's size.
    unsafe { loaded.launch(device, &stream, ptr(&table_buffer), &table, &scalar_ptrs, &case.hyper) }.unwrap();
    let mut worst = 0.0f64;
    for (t, (p, _, m, v, w)) in buffers.iter().enumerate() {
        let n = case.tensors[t].0;
        let host = |s: &CudaSlice<u8>, dt: DType| from_bytes(&stream.clone_dtoh(s).unwrap(), dt)[..n].to_vec();
        let p_got = host(p, DType::F32);
        for (got, w) in [(&p_got, &want.p[t]), (&host(m, DType::F32), &want.m[t]), (&host(v, DType::F32), &want.v[t])] {
            worst = worst.max(error(got, w));
        }
        if let (Some(w), Some(dtype)) = (w, working) {
            let rounded: Vec<f64> = p_got.iter().map(|&x| common::attention::round_to(dtype, x)).collect();
            assert_eq!(host(w, dtype), rounded, "{}: tensor {t}'s working copy", case.name);
        }
    }
    println!("{} (working {working:?}): worst error {worst:e}", case.name);
    assert!(worst <= F32_TOLERANCE, "{}: {worst:e}", case.name);
}

#[test]
#[ignore = "needs a GPU"]
fn multi_tensor_adamw_matches_the_reference_on_the_gpu() {
    let (device, mut compiler) = gpu();
    check_adamw(&device, &mut compiler, &AdamWCase::new("f32", DType::F32, 1.0), None);
    check_adamw(&device, &mut compiler, &AdamWCase::new("bf16 gradients", DType::BF16, 1.0), Some(DType::BF16));
    check_adamw(&device, &mut compiler, &AdamWCase::new("f16 gradients", DType::F16, 1.0), Some(DType::F16));
    check_adamw(&device, &mut compiler, &AdamWCase::new("f32 accumulated", DType::F32, 1.0), Some(DType::BF16));
    check_adamw(&device, &mut compiler, &AdamWCase::new("overflow", DType::F32, 0.0), None);
}

/// Row-major `op(A)·op(B)` of one `m×k` by `k×n` pair, in f64.
fn matmul_f64(a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize), ta: bool, tb: bool) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|kk| {
                    let x = if ta { a[kk * m + i] } else { a[i * k + kk] };
                    let y = if tb { b[j * k + kk] } else { b[kk * n + j] };
                    x * y
                })
                .sum();
        }
    }
    c
}

/// One cuBLASLt product with `epilogue` on the GPU against the f64 reference:
/// `d` always, `aux` (the saved pre-activation, or the one read) and `bias`
/// (read, or the gradient written) where the epilogue uses them.
fn check_lt(
    blas: &BlasLt,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    dtype: DType,
    epilogue: Epilogue,
    tolerance: f64,
) {
    use cudarc::driver::{CudaSlice, DevicePtr};
    use zeroplan_ir::interp::{gelu_tanh, gelu_tanh_grad};
    // The bias-gradient epilogues in the layouts the `bias_grad` pass takes
    // them: dY as op(A) = Aᵀ, or as B untransposed (cuBLASLt refused BGRADB
    // on a transposed B, H100, CUDA 13.0).
    let (m, n, k) = (48, 64, 40);
    let (ta, tb) = (matches!(epilogue, Epilogue::BiasGradA), !matches!(epilogue, Epilogue::BiasGradB));
    let mut rng = common::Rng::new(5);
    let mut draw = |count: usize| -> Vec<f64> {
        (0..count).map(|_| common::attention::round_to(dtype, rng.uniform(-1.0, 1.0))).collect()
    };
    let (a, b, bias_in, aux_in) = (draw(m * k), draw(k * n), draw(n), draw(m * n));
    let bytes = |v: &[f64]| -> Vec<u8> {
        v.iter()
            .flat_map(|&x| match dtype {
                DType::BF16 => zeroplan_ir::to_bf16(x).to_le_bytes().to_vec(),
                DType::F16 => zeroplan_ir::to_f16(x).to_le_bytes().to_vec(),
                _ => (x as f32).to_le_bytes().to_vec(),
            })
            .collect()
    };
    let up = |v: &[f64]| -> CudaSlice<u8> { stream.clone_htod(&bytes(v)).unwrap() };
    let (da, db, dbias, daux) = (up(&a), up(&b), up(&bias_in), up(&aux_in));
    let dd = stream.alloc_zeros::<u8>(m * n * dtype.size_bytes() as usize).unwrap();
    let ptr = |s: &CudaSlice<u8>| s.device_ptr(stream).0;
    let batches = [(0, 0)];
    let g = LtGemm { gemm: Gemm { m, n, k, transpose_a: ta, transpose_b: tb, batches: &batches, dtype }, epilogue };
    let p = LtPointers { a: ptr(&da), b: ptr(&db), d: ptr(&dd), bias: Some(ptr(&dbias)), aux: Some(ptr(&daux)) };
    // SAFETY: every buffer was allocated above at its operand's size.
    unsafe { blas.matmul(&g, &p) }.unwrap_or_else(|e| panic!("{epilogue:?}: {e}"));
    let host = |s: &CudaSlice<u8>| from_bytes(&stream.clone_dtoh(s).unwrap(), dtype);
    let product = matmul_f64(&a, &b, (m, n, k), ta, tb);
    let biased: Vec<f64> = product.iter().enumerate().map(|(e, x)| x + bias_in[e % n]).collect();
    let mut checks: Vec<(&str, Vec<f64>, Vec<f64>)> = Vec::new();
    match epilogue {
        Epilogue::Default => checks.push(("d", host(&dd), product)),
        Epilogue::Bias => checks.push(("d", host(&dd), biased)),
        Epilogue::Gelu { bias, aux, .. } => {
            let pre = if bias { biased } else { product };
            checks.push(("d", host(&dd), pre.iter().map(|&x| gelu_tanh(x)).collect()));
            if aux {
                checks.push(("aux", host(&daux), pre));
            }
        }
        Epilogue::DGelu { bias_grad, .. } => {
            let grad: Vec<f64> = product.iter().zip(&aux_in).map(|(g, &x)| g * gelu_tanh_grad(x)).collect();
            if bias_grad {
                let sums = (0..n).map(|j| (0..m).map(|i| grad[i * n + j]).sum()).collect();
                checks.push(("bias", host(&dbias), sums));
            }
            checks.push(("d", host(&dd), grad));
        }
        Epilogue::BiasGradA => {
            // op(A) = Aᵀ: A is k×m; bias[i] = Σ_k A[k][i].
            checks.push((
                "bias",
                host(&dbias)[..m].to_vec(),
                (0..m).map(|i| (0..k).map(|kk| a[kk * m + i]).sum()).collect(),
            ));
            checks.push(("d", host(&dd), product));
        }
        Epilogue::BiasGradB => {
            // op(B) = B is k×n: bias[j] = Σ_k B[k][j].
            let sums = (0..n).map(|j| (0..k).map(|kk| b[kk * n + j]).sum()).collect();
            checks.push(("bias", host(&dbias), sums));
            checks.push(("d", host(&dd), product));
        }
    }
    for (what, got, want) in checks {
        let e = error(&got, &want);
        println!("cuBLASLt {dtype:?} {epilogue:?} {what}: error {e:e}");
        assert!(e <= tolerance, "{epilogue:?} {what}: {e:e} over {tolerance:e}");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn cublaslt_epilogues_match_the_reference_on_the_gpu() {
    use zeroplan_ir::GeluApproximation::Tanh;
    let (device, _) = gpu();
    let stream = device.context().default_stream();
    let blas = BlasLt::new(stream.clone()).unwrap();
    let epilogues = [
        Epilogue::Default,
        Epilogue::Bias,
        Epilogue::Gelu { bias: false, aux: false, approximation: Tanh },
        Epilogue::Gelu { bias: true, aux: false, approximation: Tanh },
        Epilogue::Gelu { bias: true, aux: true, approximation: Tanh },
        Epilogue::DGelu { bias_grad: false, approximation: Tanh },
        Epilogue::DGelu { bias_grad: true, approximation: Tanh },
        Epilogue::BiasGradA,
        Epilogue::BiasGradB,
    ];
    for (dtype, tolerance) in [(DType::F32, F32_TOLERANCE), (DType::BF16, BF16_TOLERANCE), (DType::F16, BF16_TOLERANCE)]
    {
        for epilogue in epilogues {
            check_lt(&blas, &stream, dtype, epilogue, tolerance);
        }
    }
}

/// The routine kernels on the GPU (`routines::device::run_host`: the plan
/// the CUDA device queues, over a copy of the arena) against the host
/// routine, on the host emulation's cases: copies, gathers, fills, the
/// embedding's scatter-add, broadcasts, sums, casts and the optimizer's
/// scalars byte for byte, the losses within their tolerances.
#[test]
#[ignore = "needs a GPU"]
fn routine_kernels_match_the_host_routines_on_the_gpu() {
    use common::routines::{cases, compare, reference};
    let (device, mut compiler) = gpu();
    let mut failures = Vec::new();
    let all = cases();
    for case in &all {
        let got = zeroplan_backend_cuda::routines::device::run_host(&device, &mut compiler, &case.instr, &case.arena)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let wrong = compare(case, &got, &reference(case));
        println!("{}: {}", case.name, wrong.as_deref().unwrap_or("matches"));
        failures.extend(wrong.map(|why| format!("{}: {why}", case.name)));
    }
    assert!(failures.is_empty(), "{} of {} cases:\n{}", failures.len(), all.len(), failures.join("\n"));
}
