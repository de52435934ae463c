//! A model directory as Hugging Face lays it out: `config.json` (the
//! encoder's sizes and its head), `model.safetensors` and `tokenizer.json`.

use std::path::{Path, PathBuf};

pub const CONFIG: &str = "config.json";
pub const WEIGHTS: &str = "model.safetensors";
pub const TOKENIZER: &str = "tokenizer.json";

/// The three files of a model directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDir {
    pub config: PathBuf,
    pub weights: PathBuf,
    pub tokenizer: PathBuf,
}

impl ModelDir {
    /// The files of `dir`, each checked to be there; the first missing one is
    /// the error, with what a model directory holds and `hint` (where to get one).
    pub fn open(dir: &Path, hint: &str) -> Result<ModelDir, (PathBuf, String)> {
        let file = |name: &str| {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err((path, format!("not found: a model directory holds {CONFIG}, {WEIGHTS} and {TOKENIZER} ({hint})")))
            }
        };
        Ok(ModelDir { config: file(CONFIG)?, weights: file(WEIGHTS)?, tokenizer: file(TOKENIZER)? })
    }
}
