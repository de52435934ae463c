//! BERT-family model specs.
//!
//! One [`ModelSpec`] type describes BERT, MosaicBERT, ALBERT, Megatron-BERT
//! and MiniLM: the families differ in a handful of structural choices
//! (feed-forward form, position encoding, norm placement, embedding
//! factorisation, parameter sharing), each a field here. Specs come from RON
//! files under `models/` ([`load`]) or from a Hugging Face `config.json`
//! ([`hf`]); both are validated ([`validate`]) with diagnostics that point
//! into the file.

mod error;
mod gpu;
pub mod hf;
mod task;
mod training;
mod validate;

use serde::{Deserialize, Serialize};
use std::path::Path;

pub use error::{Diagnostic, FieldProblem, SpecError};
pub use gpu::{Cluster, GpuProfile, Nvme, PeakTflops};
pub use task::{Column, Labels, Metric, TaskSpec};
pub use training::{LossScaling, Precision, TrainingSpec};
pub use validate::validate;

/// A BERT-family encoder and its task head.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub name: String,
    pub vocab_size: u64,
    /// Width of the encoder (`d_model`).
    pub hidden: u64,
    pub layers: u64,
    pub heads: u64,
    /// Width of the feed-forward inner layer (per GLU branch for GLU).
    pub intermediate: u64,
    /// The longest sequence: the learned position table's rows, and the limit
    /// on `seq` for ALiBi models.
    pub max_position: u64,
    /// Token-type (segment) vocabulary; 0 for none.
    #[serde(default = "default_type_vocab")]
    pub type_vocab: u64,
    /// ALBERT's factorised embedding width E; `None` embeds at `hidden`.
    #[serde(default)]
    pub embedding_size: Option<u64>,
    pub activation: Activation,
    pub feed_forward: FeedForward,
    pub position: PositionEncoding,
    pub norm: NormPlacement,
    pub layer_norm_eps: f64,
    pub hidden_dropout: f64,
    pub attention_dropout: f64,
    /// Standard deviation of the normal initialiser of weight matrices.
    #[serde(default = "default_initializer_range")]
    pub initializer_range: f64,
    #[serde(default)]
    pub sharing: Sharing,
    #[serde(default)]
    pub head: Head,
}

fn default_type_vocab() -> u64 {
    2
}

fn default_initializer_range() -> f64 {
    0.02
}

/// The feed-forward (and MLM transform) nonlinearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Activation {
    /// Exact GELU, `x·Φ(x)` (Hugging Face `gelu`).
    Gelu,
    /// GELU's tanh approximation (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    Relu,
    /// `x·σ(x)` (`silu`, `swish`).
    Silu,
}

/// The feed-forward block of each layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FeedForward {
    /// `W2·act(W1·x + b1) + b2` (BERT).
    Mlp,
    /// `W2·(act(Wg·x) ⊙ Wu·x) + b2`, gate and up without bias (MosaicBERT's
    /// GeGLU). Built as two matmuls; the rewrite pass may merge them.
    Glu,
}

/// How positions enter attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PositionEncoding {
    /// A learned `[max_position, E]` table added to the token embeddings.
    Learned,
    /// No position embeddings; ALiBi's linear distance bias on attention scores.
    Alibi,
}

/// Where each layer's LayerNorms sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NormPlacement {
    /// `LN(x + f(x))` (BERT). The embeddings end in a LayerNorm.
    Post,
    /// `x + f(LN(x))`, plus a final LayerNorm after the last layer; the
    /// embeddings have none (Megatron-BERT).
    Pre,
}

/// How layers get their weight matrices. Sharing is graph structure: shared
/// weights are one parameter node used by several layers, so parameter
/// counts count unique parameters and gradients accumulate from every use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Sharing {
    /// Every layer has its own weights (BERT).
    #[default]
    Independent,
    /// Layers are split into `groups` consecutive runs; each run uses one set
    /// of layer weights (ALBERT: `groups: 1`).
    CrossLayer { groups: u64 },
    /// Each layer's weight matrices are learned combinations of `templates`
    /// matrices from a shared bank, `W_l = Σ_k α_lk·T_k` (Shapeshifter
    /// Networks' template averaging). Biases and norms stay per layer.
    TemplateBank { templates: u64 },
}

/// What sits on top of the encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Head {
    /// Masked-language modelling: transform + LayerNorm + decoder tied to the
    /// word embeddings + bias; cross-entropy over labelled positions.
    #[default]
    Mlm,
    /// Pooler (first token, dense, tanh) + classifier; cross-entropy, or mean
    /// squared error when `num_labels` is 1 (regression, as GLUE's STS-B).
    Classification { num_labels: u64 },
    /// The bare encoder with its pooler and no loss (Hugging Face `BertModel`).
    Pooler,
}

impl ModelSpec {
    /// The width the embeddings are looked up at.
    pub fn embedding_width(&self) -> u64 {
        self.embedding_size.unwrap_or(self.hidden)
    }

    pub fn head_dim(&self) -> u64 {
        self.hidden / self.heads
    }

    /// Reads a RON spec from a string; `file` names it in errors.
    pub fn from_ron(text: &str, file: &str) -> Result<ModelSpec, SpecError> {
        from_ron(text, file, validate)
    }

    /// The spec as pretty-printed RON.
    pub fn to_ron(&self) -> String {
        ron::ser::to_string_pretty(self, ron::ser::PrettyConfig::default()).expect("specs serialise")
    }
}

/// Parses RON text into a `T` and checks it with `validate`; `file` names
/// it in errors, which point at the problem fields in `text`.
fn from_ron<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
    validate: impl FnOnce(&T) -> Result<(), Vec<FieldProblem>>,
) -> Result<T, SpecError> {
    let spec: T = ron::from_str(text).map_err(|e| SpecError::from_ron(file, e))?;
    validate(&spec).map_err(|problems| SpecError::located(file, text, problems, error::Syntax::Ron))?;
    Ok(spec)
}

/// A spec file's text and its name for diagnostics.
fn read(path: &Path) -> Result<(String, String), SpecError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| SpecError::io(&file, &e))?;
    Ok((text, file))
}

/// Loads a spec from a `.ron` file or a Hugging Face `config.json` (any
/// `.json` file, or a directory holding `config.json`).
pub fn load(path: &Path) -> Result<ModelSpec, SpecError> {
    let path = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
    let (text, file) = read(&path)?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => hf::from_config_json(&text, &file, &hf::default_name(&path)),
        Some("ron") => ModelSpec::from_ron(&text, &file),
        _ => Err(SpecError::whole_file(
            &file,
            "unknown spec format".into(),
            "give a `.ron` model spec (see models/) or a Hugging Face `config.json`".into(),
        )),
    }
}
