//! GLUE-style fine-tuning data: a TSV with a header row, one or two text
//! columns and a label (the shape of MNLI, QNLI, QQP, RTE, CoLA, SST-2,
//! MRPC and STS-B). Columns are found by name: the label is `label`
//! (or `gold_label`, `quality`, `score`), the texts are the first of
//! `sentence`, `sentence1`, `question`, `question1`, `#1 String`, `premise`
//! and then `sentence2`, `question2`, `#2 String`, `hypothesis`. Labels are
//! integers, floats (regression: a one-output head) or names, numbered in
//! sorted order.

use std::collections::BTreeSet;
use std::path::Path;

use super::{DataError, Example, Label, Tokenizer};

const LABELS: [&str; 4] = ["label", "gold_label", "quality", "score"];
const FIRST: [&str; 6] = ["sentence", "sentence1", "question", "question1", "#1 String", "premise"];
const SECOND: [&str; 4] = ["sentence2", "question2", "#2 String", "hypothesis"];

/// Reads `path` for a head with `num_labels` outputs (1: regression).
pub fn load(path: &Path, tokenizer: &Tokenizer, seq: usize, num_labels: u64) -> Result<Vec<Example>, DataError> {
    let fail = |line: usize, message: String| DataError::Line { path: path.to_path_buf(), line, message };
    let text = std::fs::read_to_string(path)
        .map_err(|e| DataError::File { path: path.to_path_buf(), message: format!("could not read it: {e}") })?;
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = lines.next().map(|(_, h)| h.split('\t').collect()).unwrap_or_default();
    let find = |names: &[&str]| names.iter().find_map(|n| header.iter().position(|h| h == n));
    let label = find(&LABELS).ok_or_else(|| {
        fail(1, format!("no label column: the header needs one of {} (got {header:?})", LABELS.join(", ")))
    })?;
    let first = find(&FIRST).ok_or_else(|| {
        fail(1, format!("no text column: the header needs one of {} (got {header:?})", FIRST.join(", ")))
    })?;
    let second = find(&SECOND);
    let rows: Vec<(usize, Vec<&str>)> =
        lines.filter(|(_, l)| !l.trim().is_empty()).map(|(i, l)| (i + 1, l.split('\t').collect())).collect();
    fn field<'t>(
        row: &(usize, Vec<&'t str>),
        i: usize,
        columns: usize,
        fail: &impl Fn(usize, String) -> DataError,
    ) -> Result<&'t str, DataError> {
        let (line, cols) = row;
        cols.get(i).copied().ok_or_else(|| fail(*line, format!("{} columns, the header has {columns}", cols.len())))
    }
    // Names are numbered in sorted order, so a file's labels read the same every time.
    let mut names = BTreeSet::new();
    for row in &rows {
        let l = field(row, label, header.len(), &fail)?;
        if l.parse::<f64>().is_err() {
            names.insert(l.to_string());
        }
    }
    let names: Vec<String> = names.into_iter().collect();
    let mut examples = Vec::with_capacity(rows.len());
    for row in &rows {
        let (a, b) =
            (field(row, first, header.len(), &fail)?, second.map(|s| field(row, s, header.len(), &fail)).transpose()?);
        let (ids, type_ids) = tokenizer.pair(a, b, seq).map_err(|m| fail(row.0, m))?;
        let raw = field(row, label, header.len(), &fail)?;
        let label = if num_labels == 1 {
            Label::Target(
                raw.parse()
                    .map_err(|_| fail(row.0, format!("`{raw}` is not a number: a one-output head regresses")))?,
            )
        } else {
            let class = match raw.parse::<i64>() {
                Ok(c) => c,
                Err(_) => names.iter().position(|n| n == raw).map(|p| p as i64).unwrap_or(-1),
            };
            if !(0..num_labels as i64).contains(&class) {
                return Err(fail(row.0, format!("label `{raw}` is not one of the head's {num_labels} classes")));
            }
            Label::Class(class)
        };
        examples.push(Example { ids, type_ids, label });
    }
    if examples.is_empty() {
        return Err(DataError::File { path: path.to_path_buf(), message: "no rows after the header".into() });
    }
    Ok(examples)
}
