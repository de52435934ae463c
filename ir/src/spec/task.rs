//! Fine-tuning task presets: the eight GLUE tasks BERT is fine-tuned on,
//! as RON files under `models/tasks/`.
//!
//! A [`TaskSpec`] says how to read the task's TSV files as the GLUE
//! distribution lays them out (header or not, which columns hold the
//! sentence or pair and the label), what the labels are, which dev-set
//! metrics to report, and the default hyperparameters (MosaicBERT's Table S1
//! where it gives them). `zeroplan_driver::metrics` computes the metrics.

use serde::{Deserialize, Serialize};

use super::error::{FieldProblem, SpecError};
use super::training::TrainingSpec;

/// A fine-tuning task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub name: String,
    /// Whether each TSV starts with a header row (CoLA's train and dev do not).
    pub header: bool,
    /// The sentence column, or the two of a sentence pair.
    pub sentences: Vec<Column>,
    /// The sentence columns of the unlabelled `test.tsv`, where they differ
    /// from `sentences`: every GLUE test file has a header and an index
    /// first, so CoLA's reads `sentence` by name there.
    #[serde(default)]
    pub test_sentences: Option<Vec<Column>>,
    pub label: Column,
    pub labels: Labels,
    /// Dev-set metrics, the first the one a best checkpoint is chosen by.
    pub metrics: Vec<Metric>,
    /// The dev files of the distribution (MNLI has matched and mismatched).
    pub dev: Vec<String>,
    /// Tokens per sequence.
    pub seq_len: u64,
    pub epochs: u64,
    /// Optimizer and schedule.
    pub train: TrainingSpec,
}

/// A TSV column: by its header name, or by position (0-based) in a file
/// without a header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Column {
    Name(String),
    Index(usize),
}

/// What a label is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Labels {
    /// Class names as the files write them, in class-index order; for a
    /// two-class task, index 1 is the positive class of F1 and Matthews.
    Classes(Vec<String>),
    /// A real-valued score in `[min, max]` (STS-B's 0–5).
    Regression { min: f64, max: f64 },
}

/// A dev-set metric (see `zeroplan_driver::metrics`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Metric {
    Accuracy,
    F1,
    Matthews,
    Pearson,
    Spearman,
}

/// The GLUE presets as `models/tasks/` holds them, compiled in so that the
/// binary finds them wherever it runs.
const PRESETS: [(&str, &str); 8] = [
    ("cola", include_str!("../../../models/tasks/cola.ron")),
    ("mnli", include_str!("../../../models/tasks/mnli.ron")),
    ("mrpc", include_str!("../../../models/tasks/mrpc.ron")),
    ("qnli", include_str!("../../../models/tasks/qnli.ron")),
    ("qqp", include_str!("../../../models/tasks/qqp.ron")),
    ("rte", include_str!("../../../models/tasks/rte.ron")),
    ("sst2", include_str!("../../../models/tasks/sst2.ron")),
    ("stsb", include_str!("../../../models/tasks/stsb.ron")),
];

impl TaskSpec {
    /// The names of the bundled presets.
    pub fn preset_names() -> impl Iterator<Item = &'static str> {
        PRESETS.iter().map(|(name, _)| *name)
    }

    /// The bundled preset `name` (`mnli`, `cola`, …); `None` for another name.
    pub fn preset(name: &str) -> Option<TaskSpec> {
        let (_, text) = PRESETS.iter().find(|(n, _)| *n == name)?;
        let spec = TaskSpec::from_ron(text, &format!("models/tasks/{name}.ron"));
        // `ir/tests/tasks.rs` loads every preset, so a bad one fails the tests, not a run.
        Some(spec.expect("the bundled task presets are valid"))
    }

    /// Reads a RON task spec; `file` names it in errors.
    pub fn from_ron(text: &str, file: &str) -> Result<TaskSpec, SpecError> {
        super::from_ron(text, file, TaskSpec::validate)
    }

    /// Loads a RON task spec from a file.
    pub fn load(path: &std::path::Path) -> Result<TaskSpec, SpecError> {
        let (text, file) = super::read(path)?;
        TaskSpec::from_ron(&text, &file)
    }

    /// The sentence columns of a test file.
    pub fn test_columns(&self) -> &[Column] {
        self.test_sentences.as_deref().unwrap_or(&self.sentences)
    }

    /// The label count of the classification head (1 for regression).
    pub fn num_labels(&self) -> u64 {
        match &self.labels {
            Labels::Classes(names) => names.len() as u64,
            Labels::Regression { .. } => 1,
        }
    }

    /// Every problem with the values.
    pub fn validate(&self) -> Result<(), Vec<FieldProblem>> {
        let mut problems = self.train.validate().err().unwrap_or_default();
        let mut problem = |field: &'static str, message: String, help: &str| {
            problems.push(FieldProblem { field, message, help: help.to_string() });
        };
        if !(1..=2).contains(&self.sentences.len()) {
            problem(
                "sentences",
                format!("{} sentence columns", self.sentences.len()),
                "give one column (a single sentence) or two (a pair)",
            );
        }
        for c in self.sentences.iter().chain([&self.label]) {
            match (c, self.header) {
                (Column::Index(_), true) => {
                    problem("header", "a file with a header names its columns".into(), "use Name(\"…\")")
                }
                (Column::Name(n), false) => problem(
                    "header",
                    format!("column `{n}` is named, but the files have no header"),
                    "use Index(N), 0-based",
                ),
                _ => {}
            }
        }
        if let Some(test) = &self.test_sentences {
            if test.len() != self.sentences.len() {
                problem(
                    "test_sentences",
                    format!("{} test columns for {} sentence columns", test.len(), self.sentences.len()),
                    "name as many as `sentences` has",
                );
            }
            if test.iter().any(|c| matches!(c, Column::Index(_))) {
                problem("test_sentences", "a test file has a header".into(), "name its columns: Name(\"…\")");
            }
        }
        let regression = matches!(self.labels, Labels::Regression { .. });
        match &self.labels {
            Labels::Classes(names) if names.len() < 2 => {
                problem("labels", format!("{} classes", names.len()), "a classification task has at least two")
            }
            Labels::Regression { min, max } if min.partial_cmp(max) != Some(std::cmp::Ordering::Less) => {
                problem("labels", format!("the score range [{min}, {max}] is empty"), "STS-B's is 0 to 5")
            }
            _ => {}
        }
        if self.metrics.is_empty() {
            problem("metrics", "no metric".into(), "name at least one, e.g. [Accuracy]");
        }
        for m in &self.metrics {
            let fits = match m {
                Metric::Pearson | Metric::Spearman => regression,
                Metric::Accuracy => !regression,
                Metric::F1 | Metric::Matthews => self.num_labels() == 2 && !regression,
            };
            if !fits {
                problem(
                    "metrics",
                    format!("{m:?} does not fit {} labels", if regression { "regression" } else { "these" }),
                    "Pearson/Spearman for scores; Accuracy for classes; F1/Matthews for two classes",
                );
            }
        }
        if self.dev.is_empty() {
            problem("dev", "no dev file".into(), "the GLUE distribution's is `dev.tsv`");
        }
        if self.seq_len == 0 || self.epochs == 0 {
            problem("seq_len", "seq_len and epochs must be positive".into(), "MosaicBERT fine-tunes at 256 tokens");
        }
        if problems.is_empty() { Ok(()) } else { Err(problems) }
    }
}
