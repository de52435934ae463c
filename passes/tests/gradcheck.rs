//! Gradient checks: the autodiff pass against central finite differences,
//! evaluated by the reference interpreter in f64.
//!
//! For each differentiable op, a small graph `loss = mse(flatten(op(params…)),
//! target)` is differentiated; every parameter element's analytic gradient
//! must match the fourth-order central difference
//! `(−L(θ+2h) + 8L(θ+h) − 8L(θ−h) + L(θ−2h)) / 12h` with h = 4e-4 — its
//! truncation error is O(h⁴) (measured ~1e-8 relative on these models), so
//! the check can be tight: relative 1e-6, plus 1e-10·max(1, |L|) absolute,
//! the rounding noise of the loss divided by h, for gradients near zero.
//! Where the loss curves on a scale near h (a LayerNorm of two close
//! values, whose scale is √eps ≈ 3e-3), the difference is refined at h/2
//! and its remaining truncation error estimated by Richardson's
//! `|D(h) − D(h/2)| / 15` (the stencil is fourth order), which the bound
//! then includes; elsewhere that estimate is negligible.
//! The same check runs on sampled elements of whole tiny BERTs of every
//! family, dropout on.

use proptest::prelude::*;
use std::collections::BTreeMap;
use zeroplan_ir::interp::{Feeds, Interpreter, Rounding, State};
use zeroplan_ir::{DType, Dim, GeluApproximation, Graph, Init, NodeIndex, Op, Shape, Tensor, TensorType, Value};
use zeroplan_passes::autodiff::backward;

const H: f64 = 4e-4;

fn f32_type(dims: &[u64]) -> TensorType {
    TensorType::new(Shape(dims.iter().map(|&d| Dim::constant(d)).collect()), DType::F32)
}

fn tensor(dims: &[u64], values: &[f64]) -> Tensor {
    Tensor::float(dims.iter().map(|&d| d as usize).collect(), DType::F32, values.to_vec()).unwrap()
}

/// Deterministic pseudo-random values in ±[0.01, 1) for test tensors: kept
/// off 0, where relu's kink would break the finite difference.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 52) as f64 * 2.0 - 1.0;
            u.signum() * (0.01 + 0.99 * u.abs())
        })
        .collect()
}

/// A graph under test: parameters with initial values, fixed inputs, and a scalar loss.
struct Case {
    graph: Graph,
    state: State,
    feeds: Feeds,
    loss: Value,
}

impl Case {
    fn new() -> Case {
        Case {
            graph: Graph::new("case"),
            state: State::new(),
            feeds: Feeds::new(),
            loss: Value { node: NodeIndex::new(0), output: 0 },
        }
    }

    fn param(&mut self, name: &str, dims: &[u64], seed: u64) -> Value {
        let v = self.graph.param(name, f32_type(dims), Init::Zeros).unwrap();
        let n = dims.iter().product::<u64>() as usize;
        self.state.insert(name.into(), tensor(dims, &values(n, seed)));
        v
    }

    fn input(&mut self, name: &str, t: Tensor, ty: TensorType) -> Value {
        self.feeds.insert(name.into(), t);
        self.graph.input(name, ty).unwrap()
    }

    /// `loss = mse(flatten(y), target)` for a fixed random target.
    fn finish(mut self, y: Value) -> Case {
        let numel = self.graph.value_type(y).shape.numel().as_constant().unwrap();
        let dtype = self.graph.value_type(y).dtype;
        let flat = self.graph.add("y.flat", Op::Reshape { shape: Shape(vec![Dim::constant(numel)]) }, &[y]).unwrap();
        let target = Tensor::float(vec![numel as usize], dtype, values(numel as usize, 99)).unwrap();
        let t = self.input("target", target, TensorType::new(Shape(vec![Dim::constant(numel)]), dtype));
        self.loss = self.graph.add("loss", Op::Mse, &[flat, t]).unwrap();
        self.graph.set_output("loss", self.loss);
        self
    }

    /// Checks every element of every parameter (or `sample` elements of each).
    fn check(mut self, sample: Option<usize>) {
        // Finite differences need the loss alone: evaluate the forward graph.
        let forward = self.graph.clone();
        let seed = self.graph.source("dloss", Op::Fill { value: 1.0 }, f32_type(&[])).unwrap();
        let grads = backward(&mut self.graph, self.loss, seed).unwrap();
        self.graph.verify().unwrap();
        let interp = Interpreter { rounding: Rounding::F64, seed: 7 };
        let values = interp.evaluate(&self.graph, &self.state, &self.feeds, 0).unwrap();
        let noise = 1e-10 * values.value(&self.graph, self.loss).item().unwrap().abs().max(1.0);
        let loss_at = |state: &State| {
            let v = interp.evaluate(&forward, state, &self.feeds, 0).unwrap();
            v.value(&forward, self.loss).item().unwrap()
        };
        assert!(!grads.is_empty(), "no parameter gradient");
        for (param, grad) in &grads {
            let name = self.graph.node(*param).name.clone();
            let analytic = values.value(&self.graph, *grad).floats().unwrap().to_vec();
            let n = analytic.len();
            let picks: Vec<usize> = match sample {
                None => (0..n).collect(),
                Some(k) => (0..k.min(n)).map(|i| (i * 7919 + 13) % n).collect(),
            };
            for i in picks {
                let at = |shift: f64| {
                    let mut moved = self.state.clone();
                    moved.get_mut(&*name).unwrap().floats_mut().unwrap()[i] += shift;
                    loss_at(&moved)
                };
                let derivative = |h: f64| (-at(2.0 * h) + 8.0 * at(h) - 8.0 * at(-h) + at(-2.0 * h)) / (12.0 * h);
                let bound = |numeric: f64, truncation: f64, noise: f64| {
                    1e-6 * numeric.abs().max(analytic[i].abs()) + noise + truncation
                };
                let mut numeric = derivative(H);
                if (numeric - analytic[i]).abs() > bound(numeric, 0.0, noise) {
                    let refined = derivative(H / 2.0);
                    // Halving h doubles the rounding noise the difference carries.
                    let truncation = (numeric - refined).abs() / 15.0;
                    numeric = refined;
                    assert!(
                        (numeric - analytic[i]).abs() <= bound(numeric, truncation, 2.0 * noise),
                        "{name}[{i}]: analytic {} vs numeric {numeric} (h/2, truncation ≈ {truncation:e})",
                        analytic[i]
                    );
                }
            }
        }
    }
}

fn unary_ops(dims: &[u64]) -> Vec<Op> {
    let perm: Vec<usize> = (0..dims.len()).rev().collect();
    let numel = dims.iter().product::<u64>();
    vec![
        Op::Scale { factor: -1.7 },
        Op::Gelu { approximation: GeluApproximation::Erf },
        Op::Gelu { approximation: GeluApproximation::Tanh },
        Op::Silu,
        Op::Relu,
        Op::Tanh,
        Op::Softmax,
        Op::Dropout { p: 0.3, stream: 4 },
        Op::Transpose { perm },
        Op::Reshape { shape: Shape(vec![Dim::constant(numel)]) },
        Op::Slice { axis: 0, start: dims[0] / 2, len: dims[0] - dims[0] / 2 },
        Op::Cast { to: DType::F32 },
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn elementwise_and_layout_ops(dims in prop::collection::vec(1u64..4, 1..4), seed in 0u64..1000) {
        for op in unary_ops(&dims) {
            let mut c = Case::new();
            let x = c.param("x", &dims, seed);
            let y = c.graph.add("y", op, &[x]).unwrap();
            c.finish(y).check(None);
        }
    }

    #[test]
    fn broadcasting_binary_ops(
        a in prop::collection::vec(1u64..4, 1..4),
        keep in prop::collection::vec(any::<bool>(), 4),
        drop_leading in 0usize..3,
        seed in 0u64..1000,
    ) {
        // b: a's shape with some axes set to 1 and some leading axes dropped.
        let b: Vec<u64> = a.iter().zip(&keep).map(|(&d, &k)| if k { d } else { 1 }).skip(drop_leading.min(a.len() - 1)).collect();
        for op in [Op::Add, Op::Sub, Op::Mul] {
            for (x_dims, y_dims) in [(&a, &b), (&b, &a)] {
                let mut c = Case::new();
                let x = c.param("a", x_dims, seed);
                let y = c.param("b", y_dims, seed + 1);
                let z = c.graph.add("z", op.clone(), &[x, y]).unwrap();
                c.finish(z).check(None);
            }
        }
    }

    #[test]
    fn matmul_every_transpose_and_batch_layout(m in 1u64..4, k in 1u64..4, n in 1u64..4, batch in 1u64..3, seed in 0u64..1000) {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let a_dims = if ta { vec![batch, k, m] } else { vec![batch, m, k] };
            let rank2 = if tb { vec![n, k] } else { vec![k, n] };
            let batched = if tb { vec![batch, n, k] } else { vec![batch, k, n] };
            for b_dims in [rank2, batched] {
                let mut c = Case::new();
                let a = c.param("a", &a_dims, seed);
                let b = c.param("b", &b_dims, seed + 1);
                let y = c.graph.add("y", Op::MatMul { transpose_a: ta, transpose_b: tb }, &[a, b]).unwrap();
                c.finish(y).check(None);
            }
        }
    }

    #[test]
    fn layer_norm_all_three_operands(rows in 1u64..4, width in 2u64..7, seed in 0u64..1000) {
        let mut c = Case::new();
        let x = c.param("x", &[rows, width], seed);
        let g = c.param("gamma", &[width], seed + 1);
        let b = c.param("beta", &[width], seed + 2);
        let y = c.graph.add("y", Op::LayerNorm { eps: 1e-5 }, &[x, g, b]).unwrap();
        c.finish(y).check(None);
    }
}

#[test]
fn split_with_an_unused_piece_and_concat() {
    let mut c = Case::new();
    let x = c.param("x", &[2, 6], 1);
    let parts = c.graph.add_multi("parts", Op::Split { axis: 1, sizes: vec![2, 3, 1] }, &[x]).unwrap();
    let y = c.graph.add("y", Op::Concat { axis: 1 }, &[parts[2], parts[0]]).unwrap();
    c.finish(y).check(None);
}

fn int_input(c: &mut Case, name: &str, dims: &[u64], ids: Vec<i64>) -> Value {
    let t = Tensor::int(dims.iter().map(|&d| d as usize).collect(), DType::I64, ids).unwrap();
    let ty = TensorType::new(Shape(dims.iter().map(|&d| Dim::constant(d)).collect()), DType::I64);
    c.input(name, t, ty)
}

#[test]
fn embedding_with_repeated_ids() {
    let mut c = Case::new();
    let table = c.param("table", &[5, 3], 1);
    let ids = int_input(&mut c, "ids", &[2, 3], vec![0, 4, 4, 2, 0, 1]);
    let y = c.graph.add("y", Op::Embedding, &[table, ids]).unwrap();
    c.finish(y).check(None);
}

#[test]
fn masked_alibi_attention_scores() {
    let mut c = Case::new();
    let scores = c.param("scores", &[2, 2, 3, 3], 1);
    let mask = int_input(&mut c, "mask", &[2, 3], vec![1, 1, 0, 1, 1, 1]);
    let biased = c.graph.add("biased", Op::AlibiBias { ranks: 1 }, &[scores]).unwrap();
    let masked = c.graph.add("masked", Op::AttentionMask, &[biased, mask]).unwrap();
    let probs = c.graph.add("probs", Op::Softmax, &[masked]).unwrap();
    c.finish(probs).check(None);
}

/// Fused attention's adjoint (`flash_attention_grad`), padded keys, ALiBi
/// over a non-power-of-two head count, and dropout (whose mask does not
/// move with the parameters, so the loss stays smooth).
#[test]
fn fused_attention_with_padding_alibi_and_dropout() {
    for (alibi_ranks, dropout) in [(None, 0.0), (Some(1), 0.25)] {
        let mut c = Case::new();
        let (q, k, v) =
            (c.param("q", &[2, 3, 4, 5], 1), c.param("k", &[2, 3, 4, 5], 2), c.param("v", &[2, 3, 4, 5], 3));
        let mask = int_input(&mut c, "mask", &[2, 4], vec![1, 1, 1, 1, 1, 0, 1, 0]);
        let op = Op::FlashAttention { scale: 0.7, alibi_ranks, dropout, stream: 3 };
        let out = c.graph.add_multi("attention", op, &[q, k, v, mask]).unwrap();
        c.finish(out[0]).check(None);
    }
}

#[test]
fn differentiating_through_the_log_sum_exp_is_refused() {
    let mut c = Case::new();
    let (q, k, v) = (c.param("q", &[1, 1, 2, 2], 1), c.param("k", &[1, 1, 2, 2], 2), c.param("v", &[1, 1, 2, 2], 3));
    let mask = int_input(&mut c, "mask", &[1, 2], vec![1, 1]);
    let op = Op::FlashAttention { scale: 1.0, alibi_ranks: None, dropout: 0.0, stream: 0 };
    let out = c.graph.add_multi("attention", op, &[q, k, v, mask]).unwrap();
    let c = c.finish(out[1]);
    let mut graph = c.graph;
    let seed = graph.source("dloss", Op::Fill { value: 1.0 }, f32_type(&[])).unwrap();
    let err = backward(&mut graph, c.loss, seed).unwrap_err().to_string();
    assert!(err.contains("`attention`") && err.contains("log-sum-exp"), "{err}");
}

#[test]
fn cross_entropy_with_ignored_rows() {
    let mut c = Case::new();
    let logits = c.param("logits", &[4, 5], 1);
    let labels = int_input(&mut c, "labels", &[4], vec![2, -100, 0, 4]);
    let loss = c.graph.add("ce", Op::CrossEntropy { ignore_index: -100 }, &[logits, labels]).unwrap();
    c.graph.set_output("loss", loss);
    c.loss = loss;
    c.check(None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random shapes and values through a small dense block.
    #[test]
    fn random_dense_blocks(rows in 1u64..4, width in 1u64..6, out in 1u64..5, seed in 0u64..1000) {
        let mut c = Case::new();
        let x = c.param("x", &[rows, width], seed);
        let w = c.param("w", &[out, width], seed + 1);
        let b = c.param("b", &[out], seed + 2);
        let mm = c.graph.add("mm", Op::MatMul { transpose_a: false, transpose_b: true }, &[x, w]).unwrap();
        let biased = c.graph.add("biased", Op::Add, &[mm, b]).unwrap();
        let act = c.graph.add("act", Op::Gelu { approximation: GeluApproximation::Erf }, &[biased]).unwrap();
        c.finish(act).check(None);
    }
}

/// Whole tiny models: sampled elements of every parameter, dropout on.
#[test]
fn tiny_bert_of_every_family() {
    use zeroplan_ir::build::{BuildOptions, forward};
    use zeroplan_ir::spec;
    for file in ["tiny-bert", "tiny-mosaicbert", "tiny-albert", "tiny-megatron-bert", "tiny-ssn-bert", "tiny-bert-sts"]
    {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../models/tiny/{file}.ron"));
        let graph = forward(&spec::load(&path).unwrap(), &BuildOptions::default()).unwrap();
        let interp = Interpreter { rounding: Rounding::F64, seed: 3 };
        let state = interp.init_state(&graph).unwrap();
        let (batch, seq) = (2usize, 5usize);
        let ids: Vec<i64> = (0..batch * seq).map(|i| (i as i64 * 37 + 5) % 64).collect();
        let int = |v: Vec<i64>, dims: Vec<usize>| Tensor::int(dims, DType::I64, v).unwrap();
        let mut feeds: BTreeMap<String, Tensor> = BTreeMap::new();
        feeds.insert("input_ids".into(), int(ids, vec![batch, seq]));
        feeds.insert("token_type_ids".into(), int((0..10).map(|i| (i / 7) as i64).collect(), vec![batch, seq]));
        feeds.insert("attention_mask".into(), int(vec![1, 1, 1, 1, 1, 1, 1, 1, 0, 0], vec![batch, seq]));
        let labels = match graph.value_type(graph.resolve("labels").unwrap()).dtype {
            DType::I64 if graph.value_type(graph.resolve("labels").unwrap()).shape.rank() == 2 => {
                int(vec![-100, 3, -100, -100, 9, 17, -100, 2, -100, -100], vec![batch, seq])
            }
            DType::I64 => int(vec![1, 0], vec![batch]),
            _ => Tensor::float(vec![batch], DType::F32, vec![0.3, -1.2]).unwrap(),
        };
        feeds.insert("labels".into(), labels);
        let loss = graph.outputs.iter().find(|(n, _)| n == "loss").unwrap().1;
        let mut c = Case { graph, state, feeds, loss };
        // Initial weights of 0.02 make gradients tiny; larger ones test more.
        for t in c.state.values_mut() {
            if let Some(v) = t.floats_mut() {
                let noise = values(v.len(), 5);
                for (x, r) in v.iter_mut().zip(noise) {
                    *x += 0.3 * r;
                }
            }
        }
        c.check(Some(4));
    }
}
