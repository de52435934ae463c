//! The kernel tests' backend-agnostic half, shared by the CPU and CUDA
//! backends' tests (backend-cuda includes this file by path): real kernels
//! from the fuse pass on the tiny models, random operands, the
//! interpreter's answer, byte conversions and the error metric.

use std::collections::BTreeMap;
use std::path::PathBuf;

use zeroplan_ir::interp::{Feeds, Interpreter, Rounding, State};
use zeroplan_ir::kernel::Kernel;
use zeroplan_ir::spec::{self, TrainingSpec};
use zeroplan_ir::{Bindings, DType, Graph, Op, Tensor};
use zeroplan_passes::fuse::Fuse;
use zeroplan_passes::manager::{PassContext, PassOptions, run_passes};
use zeroplan_passes::training::training_graph;

/// Every spec under `models/tiny/`, sorted.
pub fn tiny_models() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("models/tiny exists")
        .map(|e| e.expect("readable").path())
        .filter(|p| p.extension().is_some_and(|x| x == "ron"))
        .collect();
    paths.sort();
    paths
}

/// The kernels of the fused training graph of `model` (dropout on), in node
/// order, without repeats (by text).
pub fn fused_kernels(model: &std::path::Path, precision: spec::Precision) -> Vec<Kernel> {
    let spec = spec::load(model).unwrap_or_else(|e| panic!("{e}"));
    let train = TrainingSpec { dropout: Some(0.1), precision, ..Default::default() };
    let graph = training_graph(&spec, &train).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let mut cx = PassContext::new(PassOptions::default());
    let (fused, _) = run_passes(graph, &[&Fuse], &mut cx).unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut kernels = Vec::new();
    for n in fused.topo_order() {
        if let Op::Fused { kernel } = &fused.node(n).op
            && seen.insert(kernel.to_text())
        {
            kernels.push((**kernel).clone());
        }
    }
    kernels
}

/// The kernel's shape with `batch` and `seq` bound.
pub fn dims(kernel: &Kernel, batch: u64, seq: u64) -> Vec<usize> {
    let bindings: Bindings = [("batch".to_string(), batch), ("seq".to_string(), seq)].into_iter().collect();
    kernel.shape.dims().iter().map(|d| d.eval(&bindings).expect("only batch and seq") as usize).collect()
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random operands for `kernel` at `dims`, exactly representable in each
/// input's dtype. Integer inputs (the attention mask) are 0/1 with about a
/// third zeros, and the whole last batch entry masked, so −∞ scores and
/// fully masked rows are exercised. AdamW's second moment (`…adam_v`) is
/// positive and its step count (`…step…`) a whole number in `[1, 20]`, so
/// its square roots are real.
pub fn random_inputs(kernel: &Kernel, dims: &[usize], seed: u64) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    kernel
        .inputs
        .iter()
        .map(|arg| {
            let shape: Vec<usize> = arg.axes.iter().map(|&a| dims[a]).collect();
            let n: usize = shape.iter().product();
            if arg.ty.dtype.is_float() {
                let values = if arg.name.contains("step") {
                    (0..n).map(|_| (1 + rng.next() % 20) as f64).collect()
                } else {
                    let lo = if arg.name.ends_with("adam_v") { 0.0 } else { -2.0 };
                    (0..n).map(|_| rng.uniform(lo, 2.0)).collect()
                };
                let mut t = Tensor::float(shape, arg.ty.dtype, values).unwrap();
                t.round_to_dtype();
                t
            } else {
                let last = shape.last().copied().unwrap_or(1).max(1);
                let masked_from = n.saturating_sub(last);
                let v = (0..n)
                    .map(|i| if (i >= masked_from && n > last) || rng.next().is_multiple_of(3) { 0 } else { 1 })
                    .collect();
                Tensor::int(shape, arg.ty.dtype, v).unwrap()
            }
        })
        .collect()
}

/// The interpreter's outputs (exact `f64`) of `kernel` on `inputs`.
pub fn interpret(kernel: &Kernel, inputs: &[Tensor], seed: u64, offset: u64) -> Vec<Tensor> {
    let mut g = Graph::new("one_kernel");
    let mut feeds: Feeds = BTreeMap::new();
    let mut values = Vec::new();
    for (i, (arg, t)) in kernel.inputs.iter().zip(inputs).enumerate() {
        let name = format!("in{i}");
        values.push(g.input(&*name, arg.ty.clone()).unwrap());
        feeds.insert(name, t.clone());
    }
    g.add_multi("kernel", Op::Fused { kernel: Box::new(kernel.clone()) }, &values).unwrap();
    let interp = Interpreter::new(Rounding::F64, seed);
    let out = interp.evaluate(&g, &State::new(), &feeds, offset).unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
    out.outputs("kernel").unwrap().to_vec()
}

/// `t`'s elements in its dtype's storage bytes.
pub fn to_bytes(t: &Tensor) -> Vec<u8> {
    match t.dtype() {
        DType::F32 => t.floats().unwrap().iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
        DType::BF16 => t.floats().unwrap().iter().flat_map(|&x| zeroplan_ir::to_bf16(x).to_le_bytes()).collect(),
        DType::F16 => t.floats().unwrap().iter().flat_map(|&x| zeroplan_ir::to_f16(x).to_le_bytes()).collect(),
        DType::I32 => t.ints().unwrap().iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
        DType::I64 => t.ints().unwrap().iter().flat_map(|&x| x.to_le_bytes()).collect(),
    }
}

/// Storage bytes of `dtype` back to `f64`s.
pub fn from_bytes(bytes: &[u8], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::BF16 => {
            bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes(c.try_into().unwrap()).to_f64()).collect()
        }
        DType::F16 => bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f64()).collect(),
        DType::I32 | DType::I64 => panic!("outputs are floats"),
    }
}

/// The error metric: `max |a − b| / max(1, max |b|)` over a tensor, `b` the
/// reference; NaN matches NaN and an infinity only the same infinity (a
/// mismatch there gives `+∞`).
pub fn error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().filter(|x| x.is_finite()).fold(1.0f64, |m, x| m.max(x.abs()));
    let mut worst = 0.0f64;
    for (&a, &b) in got.iter().zip(want) {
        let e = if a.is_nan() && b.is_nan() || a == b {
            0.0
        } else if !a.is_finite() || !b.is_finite() {
            f64::INFINITY
        } else {
            (a - b).abs() / scale
        };
        worst = worst.max(e);
    }
    worst
}
