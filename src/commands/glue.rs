//! What `finetune`, `eval` and `predict` share: the task (a bundled GLUE
//! preset or a `TASK.ron`), the sequence length, the dev files and their
//! scores.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::cli::TaskArgs;
use zeroplan_driver::classify::{self, Classifier};
use zeroplan_driver::data::glue::{self, Split};
use zeroplan_driver::data::{Example, Tokenizer};
use zeroplan_driver::metrics::{self, MetricError, Predictions};
use zeroplan_ir::spec::{Metric, ModelSpec, TaskSpec};

/// The task `--task` names: a bundled preset, or a RON task spec file.
pub fn task(name: &str) -> Result<TaskSpec, String> {
    if let Some(task) = TaskSpec::preset(name) {
        return Ok(task);
    }
    let path = Path::new(name);
    if path.extension().is_some_and(|e| e == "ron") || path.is_file() {
        return TaskSpec::load(path).map_err(|e| e.to_string());
    }
    let presets: Vec<&str> = TaskSpec::preset_names().collect();
    Err(format!(
        "error: `{name}` is not a task: name a GLUE preset ({}) or give a task spec file (TASK.ron, as \
         models/tasks/ has them)",
        presets.join(", ")
    ))
}

/// Tokens per sequence: `--seq-len`, else the task's cut to the model's positions.
pub fn seq_len(args: &TaskArgs, task: &TaskSpec, model: &ModelSpec) -> Result<usize, String> {
    let positions = model.max_position;
    match args.seq_len {
        Some(seq) if seq > positions => Err(format!(
            "error: --seq-len {seq} is longer than the model's {positions} positions (max_position_embeddings): \
             give at most {positions}"
        )),
        Some(seq) => Ok(seq as usize),
        None if task.seq_len > positions => {
            eprintln!(
                "note: the model has {positions} positions: sequences of {positions} tokens, not {}",
                task.seq_len
            );
            Ok(positions as usize)
        }
        None => Ok(task.seq_len as usize),
    }
}

/// A dev file, read.
pub struct Dev {
    pub path: PathBuf,
    pub examples: Vec<Example>,
    pub gold: Predictions,
}

/// The files `--dev` names, a directory standing for the task's dev files in it.
fn dev_files(paths: &[PathBuf], task: &TaskSpec) -> Vec<PathBuf> {
    paths
        .iter()
        .flat_map(|p| if p.is_dir() { task.dev.iter().map(|f| p.join(f)).collect() } else { vec![p.clone()] })
        .collect()
}

/// Reads the dev files `--dev` names.
pub fn load_dev(paths: &[PathBuf], task: &TaskSpec, tokenizer: &Tokenizer, seq: usize) -> Result<Vec<Dev>, String> {
    dev_files(paths, task)
        .into_iter()
        .map(|path| {
            let examples = glue::load_task(&path, task, Split::Labelled, tokenizer, seq)
                .map_err(|e| format!("error: {e}"))?
                .examples;
            let gold =
                classify::gold(&examples).ok_or_else(|| format!("error: {}: a row has no label", path.display()))?;
            Ok(Dev { path, examples, gold })
        })
        .collect()
}

/// One dev file's scores, in the task's metric order.
pub struct DevScores {
    pub file: String,
    pub scores: Vec<(Metric, Result<f64, MetricError>)>,
}

impl DevScores {
    /// The first metric, by which the best epoch is chosen; an undefined one is the worst.
    pub fn key(&self) -> f64 {
        self.scores.first().and_then(|(_, s)| s.as_ref().ok().copied()).unwrap_or(f64::NEG_INFINITY)
    }
}

/// Every dev file scored by `classifier` with the task's metrics.
pub fn evaluate(
    classifier: &mut Classifier,
    devs: &[Dev],
    task: &TaskSpec,
    tokenizer: &Tokenizer,
) -> Result<Vec<DevScores>, String> {
    devs.iter()
        .map(|dev| {
            let predicted = classifier.predict(&dev.examples, tokenizer).map_err(|e| format!("error: {e}"))?;
            let scores = task.metrics.iter().map(|&m| (m, metrics::score(m, &predicted, &dev.gold))).collect();
            Ok(DevScores { file: dev.path.display().to_string(), scores })
        })
        .collect()
}

/// `FILE: metric value  metric value`, one line per dev file.
pub fn render(scores: &[DevScores]) -> String {
    let mut out = String::new();
    for dev in scores {
        let values: Vec<String> = dev
            .scores
            .iter()
            .map(|(metric, score)| match score {
                Ok(x) => format!("{} {x:.4}", metrics::name(*metric)),
                Err(e) => format!("{} undefined ({e})", metrics::name(*metric)),
            })
            .collect();
        let _ = writeln!(out, "{}: {}", dev.file, values.join("  "));
    }
    out
}

/// `{FILE: {METRIC: value}}`; an undefined score is null.
pub fn to_json(scores: &[DevScores]) -> serde_json::Value {
    let files = scores.iter().map(|dev| {
        let values = dev.scores.iter().map(|(m, s)| (metrics::name(*m).to_string(), s.as_ref().ok().copied().into()));
        (dev.file.clone(), serde_json::Value::Object(values.collect()))
    });
    serde_json::Value::Object(files.collect())
}
