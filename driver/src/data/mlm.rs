//! Masked-language-model data: one example per non-empty line of a text
//! file, and BERT's masking (Devlin et al., 2019): 15% of the tokens are
//! chosen as labels; of those 80% become `[MASK]`, 10% a random token and
//! 10% stay as they are.

use std::path::Path;

use super::{DataError, Dataset, Example, Label, Tokenizer};

/// The chance a token is chosen as a label.
pub const MASK_RATE: f64 = 0.15;

/// Reads `path`: each non-empty line a sequence.
pub fn load(path: &Path, tokenizer: &Tokenizer, seq: usize) -> Result<Vec<Example>, DataError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| DataError::File { path: path.to_path_buf(), message: format!("could not read it: {e}") })?;
    let mut examples = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let (ids, type_ids) = tokenizer.pair(line, None, seq).map_err(|message| DataError::Line {
            path: path.to_path_buf(),
            line: i + 1,
            message,
        })?;
        examples.push(Example { ids, type_ids, label: Label::None });
    }
    if examples.is_empty() {
        return Err(DataError::File { path: path.to_path_buf(), message: "no text: MLM needs non-empty lines".into() });
    }
    Ok(examples)
}

/// Draws whether token `id` becomes a label, and what the model sees.
pub(super) fn mask_token(data: &mut Dataset, id: &mut i64, label: &mut i64) {
    if data.uniform() >= MASK_RATE {
        return;
    }
    *label = *id;
    let r = data.uniform();
    if r < 0.8 {
        *id = data.specials.mask;
    } else if r < 0.9 {
        *id = (data.uniform() * data.vocab as f64) as i64;
    }
}
