//! Multi-tensor AdamW's test cases and its independent `f64` reference
//! (the update as PyTorch's `AdamW` and the IR's `AdamW` op define it), for
//! the host emulation and GPU tests.

use zeroplan_backend_cuda::adamw::AdamWHyper;
use zeroplan_ir::DType;

use super::Rng;
use super::attention::round_to;

/// One step over several tensors.
#[derive(Clone, Debug)]
pub struct AdamWCase {
    pub name: String,
    /// `(elements, weight decay)` per tensor.
    pub tensors: Vec<(usize, f64)>,
    pub hyper: AdamWHyper,
    pub lr: f64,
    pub step: f64,
    pub multiplier: f64,
    pub finite: f64,
    pub grad: DType,
}

/// Per tensor: the f32 parameter, the gradient (exact in the case's
/// gradient dtype), `m`, `v` (positive).
#[derive(Clone, Debug)]
pub struct AdamWData {
    pub p: Vec<Vec<f64>>,
    pub g: Vec<Vec<f64>>,
    pub m: Vec<Vec<f64>>,
    pub v: Vec<Vec<f64>>,
}

impl AdamWCase {
    /// Tensors of 1, 37, one chunk, none, a chunk and one, and 2.2 chunks,
    /// with and without decay; Adam's usual betas; step 7; half the gradient.
    pub fn new(name: &str, grad: DType, finite: f64) -> AdamWCase {
        AdamWCase {
            name: name.into(),
            tensors: vec![(1, 0.01), (37, 0.0), (4096, 0.01), (0, 0.01), (4097, 0.1), (9000, 0.0)],
            hyper: AdamWHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            lr: 0.01,
            step: 7.0,
            multiplier: 0.5,
            finite,
            grad,
        }
    }

    pub fn data(&self, seed: u64) -> AdamWData {
        let mut rng = Rng::new(seed);
        let mut draw = |n: usize, lo: f64, hi: f64, dtype: DType| -> Vec<f64> {
            (0..n).map(|_| round_to(dtype, rng.uniform(lo, hi))).collect()
        };
        let (mut p, mut g, mut m, mut v) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &(n, _) in &self.tensors {
            p.push(draw(n, -2.0, 2.0, DType::F32));
            g.push(draw(n, -2.0, 2.0, self.grad));
            m.push(draw(n, -0.5, 0.5, DType::F32));
            v.push(draw(n, 0.0, 0.5, DType::F32));
        }
        AdamWData { p, g, m, v }
    }
}

/// `(p, m, v)` after the step, per tensor.
pub fn reference(case: &AdamWCase, x: &AdamWData) -> AdamWData {
    if case.finite == 0.0 {
        return x.clone();
    }
    let AdamWHyper { beta1, beta2, eps } = case.hyper;
    let (bc1, bc2) = (1.0 - beta1.powf(case.step), 1.0 - beta2.powf(case.step));
    let mut out = AdamWData { p: Vec::new(), g: x.g.clone(), m: Vec::new(), v: Vec::new() };
    for (t, &(n, wd)) in case.tensors.iter().enumerate() {
        let (mut p, mut m, mut v) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        for e in 0..n {
            let g = x.g[t][e] * case.multiplier;
            m[e] = beta1 * x.m[t][e] + (1.0 - beta1) * g;
            v[e] = beta2 * x.v[t][e] + (1.0 - beta2) * g * g;
            let update = (m[e] / bc1) / ((v[e] / bc2).sqrt() + eps);
            p[e] = x.p[t][e] * (1.0 - case.lr * wd) - case.lr * update;
        }
        out.p.push(p);
        out.m.push(m);
        out.v.push(v);
    }
    out
}
