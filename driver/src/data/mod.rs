//! Training data: batches of `input_ids`, `token_type_ids`,
//! `attention_mask` and `labels` from a text file (masked-language-model
//! pre-training, [`mlm`]) or a GLUE-style TSV of sentences or sentence
//! pairs with a label ([`glue`]), tokenised by a `tokenizer.json`.
//!
//! Every sequence is `[CLS] a [SEP] (b [SEP])`, truncated to the sequence
//! length (the longer of a pair first, as BERT's `longest_first`) and
//! padded with `[PAD]` under a zero attention mask. The data is walked in
//! order and wraps around; the position is [`Dataset::position`].

pub mod glue;
pub mod mlm;

use std::path::{Path, PathBuf};

pub use zeroplan_runtime::checkpoint::training::Cursor;

use zeroplan_ir::interp::Feeds;
use zeroplan_ir::{DType, Tensor};

/// Why data could not be read or batched.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("{}:{line}: {message}", path.display())]
    Line { path: PathBuf, line: usize, message: String },
}

/// One tokenised example before padding.
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    pub ids: Vec<i64>,
    pub type_ids: Vec<i64>,
    /// A class index, a regression target, or none (MLM draws its labels).
    pub label: Label,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Label {
    None,
    Class(i64),
    Target(f64),
}

/// The ids of the special tokens a BERT tokenizer has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Specials {
    pub cls: i64,
    pub sep: i64,
    pub pad: i64,
    pub mask: i64,
}

/// A tokenizer and what the model accepts.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pub specials: Specials,
    /// The model's vocabulary size: every id must be below it.
    pub vocab: i64,
    pub path: PathBuf,
}

impl Tokenizer {
    /// Reads a `tokenizer.json` with BERT's special tokens, for a model of `vocab` ids.
    pub fn load(path: &Path, vocab: u64) -> Result<Tokenizer, DataError> {
        let fail = |message: String| DataError::File { path: path.to_path_buf(), message };
        let bytes = std::fs::read(path).map_err(|e| fail(format!("could not read it: {e}")))?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| fail(format!("not a usable tokenizer.json (as the `tokenizers` library writes it): {e}")))?;
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| fail(e.to_string()))?;
        let id = |token: &str| {
            inner.token_to_id(token).map(i64::from).ok_or_else(|| {
                fail(format!("the vocabulary has no `{token}`: a BERT tokenizer has [CLS], [SEP], [PAD] and [MASK]"))
            })
        };
        let specials = Specials { cls: id("[CLS]")?, sep: id("[SEP]")?, pad: id("[PAD]")?, mask: id("[MASK]")? };
        let size = inner.get_vocab_size(true) as u64;
        if size > vocab {
            return Err(fail(format!(
                "{size} tokens, more than the model's vocab_size of {vocab}: use the model's own tokenizer"
            )));
        }
        Ok(Tokenizer { inner, specials, vocab: vocab as i64, path: path.to_path_buf() })
    }

    /// The ids of `text`, without special tokens.
    pub fn ids(&self, text: &str) -> Result<Vec<i64>, String> {
        let e = self.inner.encode(text, false).map_err(|e| e.to_string())?;
        Ok(e.get_ids().iter().map(|&x| i64::from(x)).collect())
    }

    /// `[CLS] a [SEP] (b [SEP])` truncated to `seq` tokens, with type ids.
    pub fn pair(&self, a: &str, b: Option<&str>, seq: usize) -> Result<(Vec<i64>, Vec<i64>), String> {
        let mut a = self.ids(a)?;
        let mut b = match b {
            Some(b) => Some(self.ids(b)?),
            None => None,
        };
        let specials = if b.is_some() { 3 } else { 2 };
        let room = seq.saturating_sub(specials);
        while a.len() + b.as_ref().map_or(0, Vec::len) > room {
            match &mut b {
                Some(b) if b.len() > a.len() => b.pop(),
                _ => a.pop(),
            };
        }
        let (s, c) = (self.specials.sep, self.specials.cls);
        let mut ids = vec![c];
        ids.extend(&a);
        ids.push(s);
        let mut types = vec![0; ids.len()];
        if let Some(b) = b {
            ids.extend(&b);
            ids.push(s);
            types.resize(ids.len(), 1);
        }
        Ok((ids, types))
    }
}

/// Examples walked in order, batched and padded.
pub struct Dataset {
    pub examples: Vec<Example>,
    pub seq: usize,
    pub specials: Specials,
    pub vocab: i64,
    /// MLM: draw 15% of the tokens as labels; else the examples' labels.
    pub mlm: bool,
    /// The next example.
    pub position: usize,
    rng: u64,
}

impl Dataset {
    pub fn new(examples: Vec<Example>, seq: usize, tokenizer: &Tokenizer, mlm: bool, seed: u64) -> Dataset {
        let rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        Dataset { examples, seq, specials: tokenizer.specials, vocab: tokenizer.vocab, mlm, position: 0, rng }
    }

    pub fn cursor(&self) -> Cursor {
        Cursor { position: self.position, rng: self.rng }
    }

    /// Continues from `cursor`, as [`Dataset::cursor`] returned it.
    pub fn seek(&mut self, cursor: Cursor) {
        self.position = cursor.position;
        self.rng = cursor.rng;
    }

    /// Puts the examples in a fresh order drawn from the dataset's seed and
    /// starts again from the first: fine-tuning walks each epoch in another
    /// order, as training samplers do (Fisher–Yates).
    pub fn shuffle(&mut self) {
        for i in (1..self.examples.len()).rev() {
            let j = ((self.uniform() * (i + 1) as f64) as usize).min(i);
            self.examples.swap(i, j);
        }
        self.position = 0;
    }

    /// A uniform draw in `[0, 1)` (xorshift64*).
    fn uniform(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next `batch` examples as feeds (wrapping around the data).
    pub fn next_batch(&mut self, batch: usize) -> Feeds {
        let (seq, pad) = (self.seq, self.specials.pad);
        let (mut ids, mut types, mut mask) = (vec![pad; batch * seq], vec![0; batch * seq], vec![0; batch * seq]);
        let mut mlm_labels = vec![-100; batch * seq];
        let (mut classes, mut targets) = (Vec::new(), Vec::new());
        for b in 0..batch {
            let e = self.examples[self.position % self.examples.len()].clone();
            self.position += 1;
            let n = e.ids.len().min(seq);
            ids[b * seq..b * seq + n].copy_from_slice(&e.ids[..n]);
            types[b * seq..b * seq + n].copy_from_slice(&e.type_ids[..n]);
            mask[b * seq..b * seq + n].fill(1);
            match e.label {
                Label::Class(c) => classes.push(c),
                Label::Target(t) => targets.push(t),
                Label::None => {}
            }
            if self.mlm {
                for i in b * seq..b * seq + n {
                    if [self.specials.cls, self.specials.sep].contains(&ids[i]) {
                        continue;
                    }
                    mlm::mask_token(self, &mut ids[i], &mut mlm_labels[i]);
                }
            }
        }
        let int = |v: Vec<i64>, shape: Vec<usize>| Tensor::int(shape, DType::I64, v).expect("sizes agree");
        let labels = if self.mlm {
            int(mlm_labels, vec![batch, seq])
        } else if !targets.is_empty() {
            Tensor::float(vec![batch], DType::F32, targets).expect("sizes agree")
        } else {
            int(classes, vec![batch])
        };
        Feeds::from([
            ("input_ids".to_string(), int(ids, vec![batch, seq])),
            ("token_type_ids".to_string(), int(types, vec![batch, seq])),
            ("attention_mask".to_string(), int(mask, vec![batch, seq])),
            ("labels".to_string(), labels),
        ])
    }
}
