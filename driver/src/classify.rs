//! Sequence classification and regression on the host runtime: how the GLUE
//! tasks' fine-tuning, evaluation and prediction score a model.
//!
//! A [`Classifier`] is a model's forward with its classification head
//! (`num_labels` outputs; one regresses, as STS-B) in f32 with dropout off,
//! compiled and planned for one batch × sequence length, as the embedder's
//! programs are. Examples run in batches of that size, the last one padded
//! with repeats whose outputs are dropped; a prediction is the arg-max class,
//! or the single output as a score.
//!
//! [`FineTuned::load`] reads a model directory `zeroplan finetune` wrote (or
//! `transformers` saved from `BertForSequenceClassification`): its
//! `config.json` must classify into the task's label count, and its
//! `model.safetensors` must hold the trained classifier.

use std::path::{Path, PathBuf};

use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::spec::{self, Head, ModelSpec};

use crate::data::{DataError, Dataset, Example, Label, Tokenizer};
use crate::metrics::Predictions;
use crate::model_dir::ModelDir;
use crate::program;
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::checkpoint::{self, CheckpointError, Weights};

/// The head's output a prediction is read from.
const LOGITS: &str = "logits";

/// Why a model could not be loaded or run as a classifier.
#[derive(Debug, thiserror::Error)]
pub enum ClassifyError {
    #[error("{}: error: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("{0}")]
    Spec(String),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("compiling the classifier for batch {batch} × seq {seq} failed: {message}")]
    Compile { batch: usize, seq: usize, message: String },
    #[error("the classifier's forward failed: {0}")]
    Forward(String),
}

/// A model's forward with its classification head, for one batch × seq.
pub struct Classifier {
    program: HostProgram,
    num_labels: usize,
    batch: usize,
    seq: usize,
}

impl Classifier {
    /// `model`'s classifier (its head must be `Classification`), every
    /// parameter of its forward set from `weights`, for batches of `batch`
    /// sequences of `seq` tokens.
    pub fn new(model: &ModelSpec, weights: &Weights, batch: usize, seq: usize) -> Result<Classifier, ClassifyError> {
        let compile = |message: String| ClassifyError::Compile { batch, seq, message };
        let Head::Classification { num_labels } = model.head else {
            return Err(compile(format!("model `{}` has no classification head", model.name)));
        };
        let mut eval = model.clone();
        eval.hidden_dropout = 0.0;
        eval.attention_dropout = 0.0;
        let program = program::forward(&eval, batch, seq, weights, &[LOGITS]).map_err(compile)?;
        Ok(Classifier { program, num_labels: num_labels as usize, batch, seq })
    }

    /// Replaces the weights, as after a fine-tuning epoch.
    pub fn set_weights(&mut self, weights: &Weights) -> Result<(), ClassifyError> {
        self.program.set_state(weights).map_err(|e| ClassifyError::Forward(e.to_string()))
    }

    /// The sequence length examples must be tokenised to.
    pub fn seq(&self) -> usize {
        self.seq
    }

    /// Each example's `num_labels` logits, in order.
    pub fn logits(&mut self, examples: &[Example], tokenizer: &Tokenizer) -> Result<Vec<Vec<f64>>, ClassifyError> {
        // The forward computes the head's loss too, so every row needs a
        // label of the head's kind; a test file's have none. Its loss is not read.
        let placeholder = if self.num_labels == 1 { Label::Target(0.0) } else { Label::Class(0) };
        let labelled = examples
            .iter()
            .map(|e| Example { label: if e.label == Label::None { placeholder } else { e.label }, ..e.clone() })
            .collect();
        let mut data = Dataset::new(labelled, self.seq, tokenizer, false, 0);
        let mut logits = Vec::with_capacity(examples.len());
        while logits.len() < examples.len() {
            let feeds = data.next_batch(self.batch);
            let mut out = self.program.step(&[feeds]).map_err(|e| ClassifyError::Forward(e.to_string()))?;
            let values = out.outputs.micro_batches.pop().and_then(|mut m| m.remove(LOGITS));
            let values = values
                .as_ref()
                .and_then(|t| t.floats())
                .ok_or_else(|| ClassifyError::Forward(format!("the program returned no float `{LOGITS}`")))?;
            if values.len() != self.batch * self.num_labels {
                return Err(ClassifyError::Forward(format!(
                    "`{LOGITS}` holds {} values, not {}×{}",
                    values.len(),
                    self.batch,
                    self.num_labels
                )));
            }
            // The last batch wraps around to the first examples: those rows are dropped.
            let wanted = (examples.len() - logits.len()).min(self.batch);
            logits.extend(values.chunks(self.num_labels).take(wanted).map(<[f64]>::to_vec));
        }
        Ok(logits)
    }

    /// Each example's predicted class, or score for a one-output head.
    pub fn predict(&mut self, examples: &[Example], tokenizer: &Tokenizer) -> Result<Predictions, ClassifyError> {
        Ok(predictions(&self.logits(examples, tokenizer)?))
    }
}

/// The arg-max class of each row of logits (the first of equal maxima), or
/// its single value as a score.
pub fn predictions(logits: &[Vec<f64>]) -> Predictions {
    if logits.first().is_some_and(|row| row.len() == 1) {
        return Predictions::Scores(logits.iter().map(|row| row[0]).collect());
    }
    let argmax = |row: &Vec<f64>| (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best });
    Predictions::Classes(logits.iter().map(argmax).collect())
}

/// The examples' gold labels; `None` when any is missing (a test file).
pub fn gold(examples: &[Example]) -> Option<Predictions> {
    match examples.first()?.label {
        Label::Target(_) => {
            let scores = examples.iter().map(|e| if let Label::Target(t) = e.label { Some(t) } else { None });
            scores.collect::<Option<_>>().map(Predictions::Scores)
        }
        _ => {
            let classes = examples.iter().map(|e| match e.label {
                Label::Class(c) => usize::try_from(c).ok(),
                _ => None,
            });
            classes.collect::<Option<_>>().map(Predictions::Classes)
        }
    }
}

/// A fine-tuned model directory: its spec, every weight of its classifier,
/// and its tokenizer.
pub struct FineTuned {
    pub spec: ModelSpec,
    pub weights: Weights,
    pub tokenizer: Tokenizer,
}

impl FineTuned {
    /// Reads `dir`, which must classify into `num_labels` labels (1: a
    /// score) with a trained classifier.
    pub fn load(dir: &Path, num_labels: u64) -> Result<FineTuned, ClassifyError> {
        let files = ModelDir::open(dir, "as `zeroplan finetune --out DIR` writes it")
            .map_err(|(path, message)| ClassifyError::File { path, message })?;
        let spec = spec::load(&files.config).map_err(|e| ClassifyError::Spec(e.to_string()))?;
        let refuse = |message: String| ClassifyError::File { path: files.config.clone(), message };
        match spec.head {
            Head::Classification { num_labels: n } if n == num_labels => {}
            Head::Classification { num_labels: n } => {
                return Err(refuse(format!(
                    "the model has {n} output(s), the task {num_labels}: give a model fine-tuned on this task \
                     (`zeroplan finetune --task …`)"
                )));
            }
            _ => {
                return Err(refuse(
                    "not a fine-tuned classifier (`architectures` is not [\"BertForSequenceClassification\"]): \
                     fine-tune the model first (`zeroplan finetune`)"
                        .into(),
                ));
            }
        }
        let graph = forward(&spec, &BuildOptions::default()).map_err(|e| refuse(e.to_string()))?;
        let mut weights = checkpoint::head_zeros(&graph);
        let report = checkpoint::load_weights(&files.weights, &spec, &graph, &mut weights)?;
        if !report.initialised.is_empty() {
            return Err(ClassifyError::File {
                path: files.weights,
                message: format!(
                    "no trained {}: this is not a fine-tuned model's file; fine-tune the model first (`zeroplan \
                     finetune`)",
                    report.initialised.join(", ")
                ),
            });
        }
        let tokenizer = Tokenizer::load(&files.tokenizer, spec.vocab_size)?;
        Ok(FineTuned { spec, weights, tokenizer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_take_the_first_maximum_or_the_score() {
        let logits = [vec![0.1, 0.7, 0.2], vec![0.5, 0.5, -1.0], vec![-3.0, -2.0, -1.0]];
        assert_eq!(predictions(&logits), Predictions::Classes(vec![1, 0, 2]));
        assert_eq!(predictions(&[vec![2.5], vec![-0.5]]), Predictions::Scores(vec![2.5, -0.5]));
    }

    #[test]
    fn gold_labels_are_classes_or_scores_and_absent_on_test_files() {
        let example = |label| Example { ids: vec![2, 3], type_ids: vec![0, 0], label };
        let classes = [example(Label::Class(1)), example(Label::Class(0))];
        assert_eq!(gold(&classes), Some(Predictions::Classes(vec![1, 0])));
        let scores = [example(Label::Target(4.5)), example(Label::Target(0.0))];
        assert_eq!(gold(&scores), Some(Predictions::Scores(vec![4.5, 0.0])));
        assert_eq!(gold(&[example(Label::None)]), None);
        assert_eq!(gold(&[example(Label::Class(1)), example(Label::None)]), None);
    }
}
