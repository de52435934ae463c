//! Sentence embeddings, on the host runtime or the reference interpreter.
//!
//! [`Embedder::load`] reads a model directory as Hugging Face and
//! sentence-transformers lay it out — `config.json`, `model.safetensors`,
//! `tokenizer.json` — and [`Embedder::embed`] follows sentence-transformers'
//! recipe for all-MiniLM-L6-v2: tokenise (the file's truncation kept, its
//! padding replaced by padding to the longest text of the call), run the bare
//! encoder in f32 with dropout off, mean-pool the last hidden state over the
//! attention mask, L2-normalise.
//!
//! Where the encoder runs is the [`Backend`]:
//!
//! - [`Backend::Cpu`] (the default): the compiled program on the host
//!   runtime ([`HostProgram`]: every pass on, Cranelift kernels and GEMMs on
//!   one planned arena). A program is specific to its batch and sequence
//!   length, so the first call at a shape compiles and plans one, loads the
//!   checkpoint's weights into it, and keeps it for later calls at that shape.
//! - [`Backend::Reference`]: the exact reference interpreter, slow and
//!   shape-agnostic: the oracle the host runtime is checked against
//!   (`driver/tests/embed.rs`, within 1e-5 relative).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::{Feeds, Interpreter, Rounding, State};
use zeroplan_ir::spec::{self, Head, ModelSpec};
use zeroplan_ir::{DType, Graph, Tensor};

use crate::model_dir::{ModelDir, TOKENIZER};
use crate::program;
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::checkpoint;

/// Compiled programs kept per [`Embedder`]. Each holds its own copy of the
/// weights in its arena (90 MB for MiniLM), so texts of ever new lengths
/// must not grow the cache without bound; the least recently used goes.
const PROGRAMS: usize = 4;

/// The encoder output the embeddings are pooled from.
const HIDDEN: &str = "sequence_output";

/// Where the encoder's forward runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The compiled program on the host runtime, one per (batch, seq) seen.
    #[default]
    Cpu,
    /// The exact reference interpreter: slow, the oracle.
    Reference,
}

/// Why embedding failed. Every message names the file or node at fault.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("{}: error: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("{0}")]
    Spec(String),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error("tokenising failed: {0}")]
    Tokenize(String),
    #[error(
        "compiling the encoder for batch {batch} × seq {seq} failed: {message} (the reference backend runs without \
         compiling: `--backend reference`)"
    )]
    Compile { batch: usize, seq: usize, message: String },
    #[error("the forward failed: {0}")]
    Forward(String),
    #[error("nothing to embed: give at least one text")]
    NoText,
}

/// A loaded model: its encoder graph, weights and tokenizer, and the
/// programs compiled for it so far.
pub struct Embedder {
    spec: ModelSpec,
    graph: Graph,
    /// The encoder's parameters as the checkpoint gives them, by name.
    state: State,
    tokenizer: tokenizers::Tokenizer,
    backend: Backend,
    /// Host programs by (batch, seq), least recently used first.
    programs: Vec<((usize, usize), HostProgram)>,
}

/// Embeddings of some texts, unit vectors, and their cosine similarities.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Embeddings {
    pub dim: usize,
    pub embeddings: Vec<Vec<f64>>,
    pub similarity: Vec<Vec<f64>>,
}

impl Embedder {
    /// Reads `dir`/config.json, model.safetensors and tokenizer.json; the
    /// forward will run on `backend`.
    pub fn load(dir: &Path, backend: Backend) -> Result<Embedder, EmbedError> {
        let ModelDir { config, weights, tokenizer } =
            ModelDir::open(dir, "scripts/fetch-minilm.sh fetches all-MiniLM-L6-v2's")
                .map_err(|(path, message)| EmbedError::File { path, message })?;

        let mut spec = spec::load(&config).map_err(|e| EmbedError::Spec(e.to_string()))?;
        spec.head = Head::Pooler;
        spec.hidden_dropout = 0.0;
        spec.attention_dropout = 0.0;
        let graph = forward(&spec, &BuildOptions::new(DType::F32))
            .map_err(|e| EmbedError::File { path: config.clone(), message: e.to_string() })?;
        // `load_weights` replaces every encoder weight and needs a value only
        // for the head's, which a sentence-transformers checkpoint may lack
        // (the pooler's are never read: the embeddings pool `sequence_output`).
        let mut state = checkpoint::head_zeros(&graph);
        checkpoint::load_weights(&weights, &spec, &graph, &mut state)?;

        let bytes = std::fs::read(&tokenizer)
            .map_err(|e| EmbedError::File { path: tokenizer.clone(), message: format!("could not read it: {e}") })?;
        let mut tokenizer_model = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| EmbedError::File {
            path: tokenizer.clone(),
            message: format!("not a usable tokenizer.json (as the `tokenizers` library writes it): {e}"),
        })?;
        tokenizer_model.with_padding(None);
        Ok(Embedder { spec, graph, state, tokenizer: tokenizer_model, backend, programs: Vec::new() })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Token ids, token type ids and attention mask of each text, unpadded.
    pub fn tokenize(&self, texts: &[&str]) -> Result<Vec<Encoded>, EmbedError> {
        texts
            .iter()
            .map(|t| {
                let e = self.tokenizer.encode(*t, true).map_err(|e| EmbedError::Tokenize(e.to_string()))?;
                Ok(Encoded {
                    ids: e.get_ids().iter().map(|&x| i64::from(x)).collect(),
                    type_ids: e.get_type_ids().iter().map(|&x| i64::from(x)).collect(),
                    mask: e.get_attention_mask().iter().map(|&x| i64::from(x)).collect(),
                })
            })
            .collect()
    }

    /// Unit-norm sentence embeddings of `texts`, batched (padded to the
    /// longest). On [`Backend::Cpu`] the first call at a new batch × length
    /// compiles a program, which later calls at that shape reuse.
    pub fn embed(&mut self, texts: &[&str]) -> Result<Embeddings, EmbedError> {
        if texts.is_empty() {
            return Err(EmbedError::NoText);
        }
        let encoded = self.tokenize(texts)?;
        let batch = encoded.len();
        let seq = encoded.iter().map(|e| e.ids.len()).max().unwrap_or(0).max(1);
        if seq as u64 > self.spec.max_position {
            return Err(EmbedError::Tokenize(format!(
                "a text is {seq} tokens long, more than the model's {} positions: shorten it or set a truncation \
                 in {TOKENIZER}",
                self.spec.max_position
            )));
        }
        let mut ids = vec![0i64; batch * seq];
        let mut types = vec![0i64; batch * seq];
        let mut mask = vec![0i64; batch * seq];
        for (i, e) in encoded.iter().enumerate() {
            let row = i * seq;
            ids[row..row + e.ids.len()].copy_from_slice(&e.ids);
            types[row..row + e.ids.len()].copy_from_slice(&e.type_ids);
            mask[row..row + e.ids.len()].copy_from_slice(&e.mask);
        }
        let int = |v: Vec<i64>| Tensor::int(vec![batch, seq], DType::I64, v).expect("consistent");
        let mut feeds: Feeds = BTreeMap::new();
        feeds.insert("input_ids".into(), int(ids));
        if self.spec.type_vocab > 0 {
            feeds.insert("token_type_ids".into(), int(types));
        }
        feeds.insert("attention_mask".into(), int(mask.clone()));

        let hidden = match self.backend {
            Backend::Cpu => self.host_forward(batch, seq, feeds)?,
            Backend::Reference => self.reference_forward(&feeds)?,
        };
        let hidden = hidden
            .floats()
            .ok_or_else(|| EmbedError::Forward(format!("the encoder's `{HIDDEN}` is not a float tensor")))?;
        let dim = self.spec.hidden as usize;
        if hidden.len() != batch * seq * dim {
            return Err(EmbedError::Forward(format!(
                "`{HIDDEN}` holds {} values, not {batch}×{seq}×{dim}",
                hidden.len()
            )));
        }
        let embeddings: Vec<Vec<f64>> = (0..batch)
            .map(|b| {
                let rows = (0..seq).filter(|&s| mask[b * seq + s] != 0);
                mean_pool_normalise(rows.map(|s| &hidden[(b * seq + s) * dim..(b * seq + s + 1) * dim]), dim)
            })
            .collect();
        let similarity = cosine_matrix(&embeddings);
        Ok(Embeddings { dim, embeddings, similarity })
    }

    fn reference_forward(&self, feeds: &Feeds) -> Result<Tensor, EmbedError> {
        let values = Interpreter::new(Rounding::Native, 0)
            .evaluate(&self.graph, &self.state, feeds, 0)
            .map_err(|e| EmbedError::Forward(e.to_string()))?;
        values
            .graph_output(&self.graph, HIDDEN)
            .cloned()
            .ok_or_else(|| EmbedError::Forward(format!("the encoder graph has no `{HIDDEN}`")))
    }

    fn host_forward(&mut self, batch: usize, seq: usize, feeds: Feeds) -> Result<Tensor, EmbedError> {
        let (shape, mut program) = match self.programs.iter().position(|(shape, _)| *shape == (batch, seq)) {
            Some(at) => self.programs.remove(at),
            None => {
                let program = self.compile(batch, seq)?;
                if self.programs.len() == PROGRAMS {
                    self.programs.remove(0);
                }
                ((batch, seq), program)
            }
        };
        let step = program.step(&[feeds]);
        self.programs.push((shape, program));
        let mut step = step.map_err(|e| EmbedError::Forward(e.to_string()))?;
        step.outputs
            .micro_batches
            .pop()
            .and_then(|mut outputs| outputs.remove(HIDDEN))
            .ok_or_else(|| EmbedError::Forward(format!("the compiled program returned no `{HIDDEN}`")))
    }

    /// The encoder compiled and planned for `batch` × `seq`, loaded on the
    /// host with the checkpoint's weights, reading back only [`HIDDEN`].
    fn compile(&self, batch: usize, seq: usize) -> Result<HostProgram, EmbedError> {
        program::forward(&self.spec, batch, seq, &self.state, &[HIDDEN]).map_err(|message| EmbedError::Compile {
            batch,
            seq,
            message,
        })
    }
}

/// One tokenised text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<i64>,
    pub type_ids: Vec<i64>,
    pub mask: Vec<i64>,
}

/// The mean of `rows`, scaled to unit L2 norm (sentence-transformers clamps
/// the count at 1e-9 and the norm at 1e-12; so do we).
pub fn mean_pool_normalise<'a>(rows: impl Iterator<Item = &'a [f64]>, dim: usize) -> Vec<f64> {
    let mut sum = vec![0.0; dim];
    let mut count = 0usize;
    for row in rows {
        for (s, x) in sum.iter_mut().zip(row) {
            *s += x;
        }
        count += 1;
    }
    let count = (count as f64).max(1e-9);
    let mean: Vec<f64> = sum.iter().map(|s| s / count).collect();
    let norm = mean.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
    mean.iter().map(|x| x / norm).collect()
}

/// Pairwise cosine similarities.
pub fn cosine_matrix(vectors: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
    vectors
        .iter()
        .map(|a| {
            vectors.iter().map(|b| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / (norm(a) * norm(b))).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_pooling_averages_then_normalises() {
        let rows = [vec![1.0, 0.0], vec![3.0, 4.0]];
        let e = mean_pool_normalise(rows.iter().map(Vec::as_slice), 2);
        assert!((e[0] - 2.0 / 8f64.sqrt()).abs() < 1e-12 && (e[1] - 2.0 / 8f64.sqrt()).abs() < 1e-12);
        let s = cosine_matrix(&[vec![1.0, 0.0], vec![0.0, 2.0], vec![1.0, 1.0]]);
        assert!((s[0][0] - 1.0).abs() < 1e-12 && s[0][1].abs() < 1e-12);
        assert!((s[0][2] - 0.5f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn a_missing_file_is_named() {
        let dir = std::env::temp_dir().join(format!("zeroplan-embed-missing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = Embedder::load(&dir, Backend::Cpu).err().expect("an error").to_string();
        assert!(err.contains("config.json") && err.contains("not found"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
