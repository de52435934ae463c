//! Batch files: one training (or inference) step's inputs in a safetensors
//! file, by the names of the graph's inputs.
//!
//! `input_ids` `[batch, seq]` is required; `token_type_ids` and
//! `attention_mask` have its shape; `labels` is `[batch, seq]` (MLM) or
//! `[batch]` (classification, regression). Token tensors are integers of any
//! width (read as i64); `labels` are integers, or floats for regression
//! (F32/F64 read as f32, F16 and BF16 kept).

use super::CheckpointError;
use super::safetensors_io::{self, Entry, floats, ints};
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;
use zeroplan_ir::{DType, Tensor};

/// The tensors a batch file may hold.
pub const BATCH_TENSORS: [&str; 4] = ["input_ids", "token_type_ids", "attention_mask", "labels"];

pub(super) const HOW_TO_FIX: &str = "write the batch with tensors `input_ids` [batch, seq] (required), \
     `token_type_ids` and `attention_mask` of the same shape, and `labels` [batch, seq] or [batch]; integer \
     tensors (I64 or I32), float `labels` for regression";

/// Reads a batch file: its tensors by name, integers as i64.
pub fn load_batch(path: &Path) -> Result<BTreeMap<String, Tensor>, CheckpointError> {
    let bytes = safetensors_io::read(path)?;
    let file = safetensors_io::parse(path, &bytes)?;
    let mut batch = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, view) in file.iter() {
        let shape = view.shape().to_vec();
        let float = matches!(view.dtype(), Dtype::F32 | Dtype::F64 | Dtype::F16 | Dtype::BF16);
        let tensor = if float {
            let dtype = match view.dtype() {
                Dtype::F16 => DType::F16,
                Dtype::BF16 => DType::BF16,
                _ => DType::F32,
            };
            floats(view.dtype(), view.data()).map(|v| Tensor::float(shape, dtype, v))
        } else {
            ints(view.dtype(), view.data()).map(|v| Tensor::int(shape, DType::I64, v))
        };
        match tensor {
            None => problems.push(format!("`{name}` has dtype {:?}, which is not read", view.dtype())),
            Some(Err(e)) => problems.push(format!("`{name}`: {e}")),
            Some(Ok(t)) => {
                batch.insert(name.to_string(), t);
            }
        }
    }
    problems.extend(check(&batch));
    if !problems.is_empty() {
        return Err(CheckpointError::Batch { path: path.to_path_buf(), problems });
    }
    Ok(batch)
}

/// Writes a batch file (each tensor in its own dtype), whole or not at all.
/// The batch must be one [`load_batch`] accepts.
pub fn save_batch(path: &Path, batch: &BTreeMap<String, Tensor>) -> Result<(), CheckpointError> {
    let problems = check(batch);
    if !problems.is_empty() {
        return Err(CheckpointError::Batch { path: path.to_path_buf(), problems });
    }
    let entries = batch.iter().map(|(name, t)| Entry { name: name.clone(), tensor: t, dtype: t.dtype() }).collect();
    safetensors_io::write(path, entries, &[]).map(drop)
}

/// What is wrong with `batch`'s names, dtypes and shapes.
fn check(batch: &BTreeMap<String, Tensor>) -> Vec<String> {
    let mut problems = Vec::new();
    for name in batch.keys().filter(|n| !BATCH_TENSORS.contains(&n.as_str())) {
        problems.push(format!("`{name}` is not a batch tensor (those are {})", BATCH_TENSORS.join(", ")));
    }
    let Some(ids) = batch.get("input_ids") else {
        problems.push("`input_ids` is missing".to_string());
        return problems;
    };
    let tokens = ids.shape();
    if tokens.len() != 2 {
        problems.push(format!("`input_ids` has shape {tokens:?}; it must be [batch, seq]"));
    }
    for name in ["input_ids", "token_type_ids", "attention_mask"] {
        let Some(t) = batch.get(name) else { continue };
        if !t.dtype().is_int() {
            problems.push(format!("`{name}` is {}; it must be an integer tensor", t.dtype()));
        }
        if t.shape() != tokens {
            problems.push(format!("`{name}` has shape {:?}; `input_ids` has {tokens:?}", t.shape()));
        }
    }
    if let Some(labels) = batch.get("labels")
        && labels.shape() != tokens
        && labels.shape() != &tokens[..tokens.len().min(1)]
    {
        problems.push(format!(
            "`labels` has shape {:?}; it must be [batch, seq] or [batch] ({tokens:?} or {:?})",
            labels.shape(),
            &tokens[..tokens.len().min(1)]
        ));
    }
    problems
}
