//! Where a run's batches come from: a fixed batch (a batch file, or a
//! seeded synthetic one) stepped again and again, or a dataset (MLM text or
//! a GLUE TSV) drawn in order.

use std::collections::BTreeMap;
use std::path::Path;

use zeroplan_ir::interp::Feeds;
use zeroplan_ir::spec::{Head, ModelSpec};
use zeroplan_ir::{DType, Tensor};

use crate::data::{Dataset, Tokenizer, glue, mlm};

/// Where batches come from.
pub enum Batches {
    /// The same batch every step.
    Fixed(Feeds),
    /// The next batch of a dataset every step.
    Data(Dataset),
}

impl Batches {
    /// The next batch of `batch` rows.
    pub fn next(&mut self, batch: usize) -> Feeds {
        match self {
            Batches::Fixed(f) => f.clone(),
            Batches::Data(d) => d.next_batch(batch),
        }
    }
}

/// The training data in `data` for a model with `head`: MLM text for an
/// MLM head, a GLUE-style `.tsv` for a classification head, tokenised by
/// the `tokenizer.json` at `tokenizer` into rows of `seq` tokens.
pub fn dataset(
    data: &Path,
    tokenizer: &Path,
    head: &Head,
    vocab: u64,
    seq: usize,
    seed: u64,
) -> Result<Dataset, String> {
    let tokenizer = Tokenizer::load(tokenizer, vocab).map_err(|e| format!("error: {e}"))?;
    let tsv = data.extension().is_some_and(|e| e == "tsv");
    let (examples, mlm) = match (head, tsv) {
        (Head::Mlm, false) => (mlm::load(data, &tokenizer, seq), true),
        (Head::Classification { num_labels }, true) => (glue::load(data, &tokenizer, seq, *num_labels), false),
        (Head::Mlm, true) => {
            return Err(format!(
                "error: {}: a .tsv is fine-tuning data, but the model's head is mlm: pass --head classification:N",
                data.display()
            ));
        }
        (Head::Classification { .. }, false) => {
            return Err(format!(
                "error: {}: text is MLM data, but the model's head classifies: give a GLUE-style .tsv or --head mlm",
                data.display()
            ));
        }
        (Head::Pooler, _) => return Err("error: a pooler head has no loss to train: pass --head".into()),
    };
    Ok(Dataset::new(examples.map_err(|e| format!("error: {e}"))?, seq, &tokenizer, mlm, seed))
}

/// A seeded synthetic batch: random tokens, every seventh position labelled
/// for MLM (its original token), random class labels or targets otherwise.
pub fn synthetic_batch(model: &ModelSpec, batch: usize, seq: usize, seed: u64) -> Result<Feeds, String> {
    if batch == 0 || seq == 0 || seq as u64 > model.max_position {
        return Err(format!(
            "error: a synthetic batch of {batch}×{seq} does not fit `{}` (max_position {})",
            model.name, model.max_position
        ));
    }
    Ok(synthetic_feeds(&model.head, model.vocab_size, batch, seq, seed))
}

/// [`synthetic_batch`] for a head and vocabulary (a plan's, which has no
/// spec), at a shape known to fit.
pub fn synthetic_feeds(head: &Head, vocab_size: u64, batch: usize, seq: usize, seed: u64) -> Feeds {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let tokens = batch * seq;
    let ids: Vec<i64> = (0..tokens).map(|_| next(vocab_size) as i64).collect();
    let int = |v: Vec<i64>, shape: Vec<usize>| Tensor::int(shape, DType::I64, v).expect("consistent");
    let labels = match *head {
        Head::Mlm => {
            int(ids.iter().enumerate().map(|(i, id)| if i % 7 == 3 { *id } else { -100 }).collect(), vec![batch, seq])
        }
        Head::Classification { num_labels: 1 } => {
            let targets = (0..batch).map(|_| next(500) as f64 / 100.0).collect();
            Tensor::float(vec![batch], DType::F32, targets).expect("consistent")
        }
        Head::Classification { num_labels } => int((0..batch).map(|_| next(num_labels) as i64).collect(), vec![batch]),
        Head::Pooler => int(Vec::new(), vec![0]),
    };
    let mut feeds = BTreeMap::new();
    feeds.insert("input_ids".to_string(), int(ids, vec![batch, seq]));
    feeds.insert("token_type_ids".to_string(), int(vec![0; tokens], vec![batch, seq]));
    feeds.insert("attention_mask".to_string(), int(vec![1; tokens], vec![batch, seq]));
    feeds.insert("labels".to_string(), labels);
    feeds
}
