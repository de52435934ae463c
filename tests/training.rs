//! Training on the reference backend: the training graph computes a real
//! training step.

use std::collections::BTreeMap;
use std::path::PathBuf;
use zeroplan_ir::interp::{Feeds, Rounding as Exactness};
use zeroplan_ir::spec::{self, LossScaling, ModelSpec, Precision, TrainingSpec};
use zeroplan_ir::{DType, Tensor};
use zeroplan_passes::training::training_graph;
use zeroplan_runtime::reference::ReferenceTrainer;

fn model(name: &str) -> ModelSpec {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("models/tiny/{name}.ron"));
    spec::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn ints(values: Vec<i64>, shape: Vec<usize>) -> Tensor {
    Tensor::int(shape, DType::I64, values).unwrap()
}

/// A fixed batch of `batch` sequences of 6 tokens, labels for `model`'s head.
fn batch(model: &ModelSpec, batch: usize, salt: i64) -> Feeds {
    let seq = 6;
    let ids: Vec<i64> = (0..(batch * seq) as i64).map(|i| (i * 29 + salt * 11 + 3) % 64).collect();
    let labels = match model.head {
        spec::Head::Mlm => {
            ints(ids.iter().enumerate().map(|(i, &t)| if i % 3 == 1 { t } else { -100 }).collect(), vec![batch, seq])
        }
        spec::Head::Classification { num_labels: 1 } => {
            Tensor::float(vec![batch], DType::F32, (0..batch).map(|i| (i as f64 + salt as f64) * 0.7 - 1.0).collect())
                .unwrap()
        }
        spec::Head::Classification { num_labels } => {
            ints((0..batch as i64).map(|i| (i + salt) % num_labels as i64).collect(), vec![batch])
        }
        spec::Head::Pooler => unreachable!(),
    };
    let mut mask = vec![1; batch * seq];
    mask[seq - 1] = 0;
    BTreeMap::from([
        ("input_ids".to_string(), ints(ids, vec![batch, seq])),
        (
            "token_type_ids".to_string(),
            ints((0..batch * seq).map(|i| (i % seq >= 3) as i64).collect(), vec![batch, seq]),
        ),
        ("attention_mask".to_string(), ints(mask, vec![batch, seq])),
        ("labels".to_string(), labels),
    ])
}

fn trainer(model: &ModelSpec, train: &TrainingSpec, exactness: Exactness) -> ReferenceTrainer {
    ReferenceTrainer::new(training_graph(model, train).unwrap(), 11, exactness).unwrap()
}

#[test]
fn a_fixed_batch_is_learned_by_every_family() {
    for name in ["tiny-bert", "tiny-mosaicbert", "tiny-albert", "tiny-megatron-bert", "tiny-ssn-bert", "tiny-bert-sts"]
    {
        let m = model(name);
        let train = TrainingSpec { lr: 3e-3, weight_decay: 0.0, ..TrainingSpec::default() };
        let mut t = trainer(&m, &train, Exactness::Native);
        let feeds = vec![batch(&m, 2, 0)];
        let first = t.step(&feeds).unwrap().loss;
        let mut last = first;
        for _ in 0..24 {
            last = t.step(&feeds).unwrap().loss;
        }
        assert!(last < 0.7 * first, "{name}: loss {first} → {last}");
    }
}

#[test]
fn the_same_step_twice_is_bitwise_identical() {
    let m = model("tiny-bert");
    for precision in [Precision::F32, Precision::Bf16, Precision::F16(LossScaling::default())] {
        let train = TrainingSpec { precision, ..TrainingSpec::default() };
        let (mut a, mut b) = (trainer(&m, &train, Exactness::Native), trainer(&m, &train, Exactness::Native));
        let feeds = vec![batch(&m, 2, 0)];
        for _ in 0..3 {
            let (la, lb) = (a.step(&feeds).unwrap(), b.step(&feeds).unwrap());
            assert_eq!(la.loss.to_bits(), lb.loss.to_bits());
        }
        assert_eq!(a.state(), b.state(), "{precision:?}");
    }
}

#[test]
fn accumulating_two_micro_batches_equals_one_batch_of_both() {
    // Classification losses are means over equal-sized micro-batches, so the
    // mean of the two gradients is the gradient of the joined batch.
    let m = model("tiny-bert-sts");
    let (a, b) = (batch(&m, 2, 0), batch(&m, 2, 5));
    let joined: Feeds = a
        .iter()
        .map(|(name, t)| {
            let other = &b[name];
            let mut shape = t.shape().to_vec();
            shape[0] *= 2;
            let t = match (t.floats(), other.floats()) {
                (Some(x), Some(y)) => Tensor::float(shape, t.dtype(), [x, y].concat()).unwrap(),
                _ => ints([t.ints().unwrap(), other.ints().unwrap()].concat(), shape),
            };
            (name.clone(), t)
        })
        .collect();
    let base = TrainingSpec { dropout: Some(0.0), ..TrainingSpec::default() };
    let mut accumulated = trainer(&m, &TrainingSpec { micro_batches: 2, ..base.clone() }, Exactness::F64);
    let mut whole = trainer(&m, &base, Exactness::F64);
    for _ in 0..3 {
        let (x, y) =
            (accumulated.step(&[a.clone(), b.clone()]).unwrap(), whole.step(std::slice::from_ref(&joined)).unwrap());
        assert!((x.loss - y.loss).abs() < 1e-12 && (x.grad_norm - y.grad_norm).abs() < 1e-10, "{x:?} vs {y:?}");
    }
    for (name, w) in whole.weights() {
        let acc = &accumulated.weights()[&name];
        for (p, q) in w.floats().unwrap().iter().zip(acc.floats().unwrap()) {
            assert!((p - q).abs() <= 1e-12 * p.abs().max(1.0), "{name}: {p} vs {q}");
        }
    }
}

#[test]
fn fp16_overflow_skips_the_step_and_backs_off_then_grows() {
    let m = model("tiny-bert");
    let scaling = LossScaling { initial_scale: 2f64.powi(40), growth_interval: 2, growth: 2.0, backoff: 0.5 };
    let train = TrainingSpec { precision: Precision::F16(scaling), ..TrainingSpec::default() };
    let mut t = trainer(&m, &train, Exactness::Native);
    let feeds = vec![batch(&m, 2, 0)];
    let before = t.weights();
    let first = t.step(&feeds).unwrap();
    assert!(first.skipped, "a 2^40 loss scale overflows fp16 gradients: {first:?}");
    assert_eq!(t.weights(), before, "a skipped step leaves the weights alone");
    let mut scales = vec![first.loss_scale.unwrap()];
    let mut log = first;
    while log.skipped {
        log = t.step(&feeds).unwrap();
        scales.push(log.loss_scale.unwrap());
        assert!(scales.len() < 40, "never recovered: {scales:?}");
    }
    assert!(scales.windows(2).all(|w| w[1] == w[0] / 2.0), "halved on each overflow: {scales:?}");
    assert_ne!(t.weights(), before, "a clean step updates the weights");
    let clean = log.loss_scale.unwrap();
    let next = t.step(&feeds).unwrap();
    assert!(!next.skipped && t.step(&feeds).unwrap().loss_scale == Some(2.0 * clean), "grows after 2 clean steps");
    assert!(t.weights().values().all(|w| w.floats().unwrap().iter().all(|x| x.is_finite())));
}
