//! What the runtime's integration tests share: the tiny models and a
//! seeded batch for any head.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use zeroplan_ir::interp::Feeds;
use zeroplan_ir::spec::{self, Head, ModelSpec};
use zeroplan_ir::{DType, Tensor};

/// Sequences per batch and tokens per sequence of every test batch.
pub const BATCH: usize = 2;
pub const SEQ: usize = 6;

/// `models/tiny/NAME.ron`.
pub fn model(name: &str) -> ModelSpec {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../models/tiny/{name}.ron"));
    spec::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// A [`BATCH`] × [`SEQ`] batch of [`batch_of`].
pub fn batch(model: &ModelSpec, salt: i64) -> Feeds {
    batch_of(model, BATCH, SEQ, salt)
}

/// A `batch` × `seq` batch with labels for `model`'s head (a third of the
/// tokens for MLM) and one masked key; `salt` varies the tokens and labels.
/// Token ids are below 64, the tiny models' vocabulary.
pub fn batch_of(model: &ModelSpec, batch: usize, seq: usize, salt: i64) -> Feeds {
    let ints = |v: Vec<i64>, shape: Vec<usize>| Tensor::int(shape, DType::I64, v).unwrap();
    // Ids below 64, and below the vocabulary where it is smaller.
    let ids: Vec<i64> =
        (0..(batch * seq) as i64).map(|i| (i * 29 + salt * 11 + 3) % 64 % model.vocab_size as i64).collect();
    let labels = match model.head {
        Head::Mlm => ints(
            ids.iter().enumerate().map(|(i, &t)| if (i + salt as usize) % 3 == 1 { t } else { -100 }).collect(),
            vec![batch, seq],
        ),
        Head::Classification { num_labels: 1 } => {
            Tensor::float(vec![batch], DType::F32, (0..batch).map(|i| (i as f64 + salt as f64) * 0.7 - 0.3).collect())
                .unwrap()
        }
        Head::Classification { num_labels } => {
            ints((0..batch as i64).map(|i| (i + salt) % num_labels as i64).collect(), vec![batch])
        }
        Head::Pooler => ints(Vec::new(), vec![0]),
    };
    let mut mask = vec![1; batch * seq];
    mask[seq - 1] = 0;
    BTreeMap::from([
        ("input_ids".to_string(), ints(ids, vec![batch, seq])),
        ("token_type_ids".to_string(), ints((0..(batch * seq) as i64).map(|i| i % 2).collect(), vec![batch, seq])),
        ("attention_mask".to_string(), ints(mask, vec![batch, seq])),
        ("labels".to_string(), labels),
    ])
}

/// The relative error `‖a − b‖ / max(‖b‖, 1e-4·√n)`: relative to the
/// reference `b`'s norm, and absolute (1e-9 RMS at a 1e-5 tolerance) for
/// values that are zero in exact arithmetic but not in rounded (the
/// gradient of the key bias is Σ over a softmax's invariance: ~1e-13 noise).
pub fn relative(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff: f64 = a.iter().zip(b).map(|(p, q)| (p - q).powi(2)).sum::<f64>().sqrt();
    let norm: f64 = b.iter().map(|q| q * q).sum::<f64>().sqrt();
    diff / norm.max(1e-4 * (b.len() as f64).sqrt())
}

/// The largest elementwise difference: what AdamW's normalised noise on a
/// zero-gradient parameter (the key bias) is bounded by, `lr` a step.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}
