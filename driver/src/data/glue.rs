//! GLUE data: the TSV files of MNLI, QNLI, QQP, RTE, CoLA, SST-2, MRPC and
//! STS-B, tokenised into [`Example`]s.
//!
//! [`load_task`] reads a file as its [`TaskSpec`] lays it out: a header row
//! or none (CoLA's train and dev), the sentence and label columns by name or
//! 0-based position, the labels by the spec's class names in class order (or
//! a score in the spec's range, STS-B). A test file (GLUE's unlabelled
//! `test.tsv`) always has a header, its index first and no label; the index
//! is kept for the submission.
//!
//! [`load`] reads a GLUE-style file without a task (`train --data x.tsv`):
//! columns are found by the usual header names — the label is `label` (or
//! `gold_label`, `Quality`, `score`), the texts the first of `sentence`,
//! `sentence1`, `question`, `question1`, `#1 String`, `premise` and then
//! `sentence2`, `question2`, `#2 String`, `hypothesis` — and labels are
//! integers, floats (a one-output head regresses) or names numbered in
//! sorted order.
//!
//! Fields are split on tabs with no quoting, as GLUE writes them (its
//! sentences hold quotes). Blank lines are skipped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use zeroplan_ir::spec::{Column, Labels, TaskSpec};

use super::{DataError, Example, Label, Tokenizer};

const LABELS: [&str; 4] = ["label", "gold_label", "Quality", "score"];
const FIRST: [&str; 6] = ["sentence", "sentence1", "question", "question1", "#1 String", "premise"];
const SECOND: [&str; 4] = ["sentence2", "question2", "#2 String", "hypothesis"];

/// Which kind of file of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// A train or dev file: sentences and a label.
    Labelled,
    /// A test file: a header, the index first, sentences, no label.
    Test,
}

/// A task file's examples.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskData {
    pub examples: Vec<Example>,
    /// A test file's first column, one per example (GLUE's `index`, QQP's
    /// `id`), which a submission repeats; empty for a labelled file.
    pub index: Vec<String>,
}

/// Reads `path`, a file of `task` of kind `split`, in sequences of `seq` tokens.
pub fn load_task(
    path: &Path,
    task: &TaskSpec,
    split: Split,
    tokenizer: &Tokenizer,
    seq: usize,
) -> Result<TaskData, DataError> {
    let text = read(path)?;
    let header = task.header || split == Split::Test;
    let table = Table::new(path, &text, header);
    let kind = match split {
        Split::Labelled => format!("{}'s train or dev file", task.name),
        Split::Test => format!("{}'s test file", task.name),
    };
    let resolve = |c: &Column| table.resolve(c, &kind);
    let (sentences, label, index) = match split {
        Split::Labelled => {
            let sentences = task.sentences.iter().map(resolve).collect::<Result<Vec<_>, _>>()?;
            let labeling = match &task.labels {
                Labels::Classes(names) => Labeling::Names { task: &task.name, names },
                Labels::Regression { min, max } => Labeling::Score { task: &task.name, min: *min, max: *max },
            };
            (sentences, Some((resolve(&task.label)?, labeling)), None)
        }
        Split::Test => {
            let sentences = task.test_columns().iter().map(resolve).collect::<Result<Vec<_>, _>>()?;
            let first = table.header.as_ref().and_then(|h| h.first()).copied().unwrap_or("index");
            (sentences, None, Some(Col { at: 0, name: format!("`{first}`") }))
        }
    };
    table.examples(&sentences, label.as_ref().map(|(c, l)| (c, l)), index.as_ref(), tokenizer, seq)
}

/// Reads `path` for a head with `num_labels` outputs (1: regression), its
/// columns found by the usual header names.
pub fn load(path: &Path, tokenizer: &Tokenizer, seq: usize, num_labels: u64) -> Result<Vec<Example>, DataError> {
    let text = read(path)?;
    let table = Table::new(path, &text, true);
    let header = table.header.clone().unwrap_or_default();
    let find = |names: &[&str], what: &str| {
        let at = names.iter().find_map(|n| header.iter().position(|h| h == n));
        at.map(|at| Col { at, name: format!("`{}`", header[at]) }).ok_or_else(|| {
            table.fail(1, format!("no {what} column: the header needs one of {} (got {header:?})", names.join(", ")))
        })
    };
    let label = find(&LABELS, "label")?;
    let mut sentences = vec![find(&FIRST, "text")?];
    sentences.extend(find(&SECOND, "second text").ok());
    let labeling = if num_labels == 1 {
        Labeling::AnyScore
    } else {
        // Names are numbered in sorted order, so a file's labels read the same every time.
        let mut names = BTreeSet::new();
        for (line, row) in &table.rows {
            let l = table.field(*line, &fields(row), &label)?;
            if l.parse::<f64>().is_err() {
                names.insert(l.to_string());
            }
        }
        Labeling::Numbered { names: names.into_iter().collect(), count: num_labels }
    };
    Ok(table.examples(&sentences, Some((&label, &labeling)), None, tokenizer, seq)?.examples)
}

fn read(path: &Path) -> Result<String, DataError> {
    std::fs::read_to_string(path)
        .map_err(|e| DataError::File { path: path.to_path_buf(), message: format!("could not read it: {e}") })
}

fn fields(row: &str) -> Vec<&str> {
    row.split('\t').collect()
}

/// A column found in a file: its 0-based position, and how messages name it.
struct Col {
    at: usize,
    name: String,
}

/// How a label field becomes a [`Label`].
enum Labeling<'a> {
    /// A task's class names, in class order.
    Names { task: &'a str, names: &'a [String] },
    /// A task's score, within its range.
    Score { task: &'a str, min: f64, max: f64 },
    /// Without a task: an integer below `count`, else a name numbered in sorted order.
    Numbered { names: Vec<String>, count: u64 },
    /// Without a task: any number.
    AnyScore,
}

impl Labeling<'_> {
    fn label(&self, raw: &str) -> Result<Label, String> {
        match self {
            Labeling::Names { task, names } => match names.iter().position(|n| n == raw) {
                Some(class) => Ok(Label::Class(class as i64)),
                None => Err(format!(
                    "label `{raw}` is not one of {task}'s classes ({}): fix the row, or give the task this file \
                     belongs to",
                    names.join(", ")
                )),
            },
            Labeling::Score { task, min, max } => match raw.parse::<f64>() {
                Ok(x) if (*min..=*max).contains(&x) => Ok(Label::Target(x)),
                Ok(x) => Err(format!("score {x} is outside {task}'s range [{min}, {max}]: fix the row")),
                Err(_) => Err(format!(
                    "`{raw}` is not a number: {task}'s label is a score from {min} to {max}; is this {task}'s file?"
                )),
            },
            Labeling::Numbered { names, count } => {
                let class = match raw.parse::<i64>() {
                    Ok(c) => c,
                    Err(_) => names.iter().position(|n| n == raw).map_or(-1, |p| p as i64),
                };
                if (0..*count as i64).contains(&class) {
                    Ok(Label::Class(class))
                } else {
                    Err(format!("label `{raw}` is not one of the head's {count} classes"))
                }
            }
            Labeling::AnyScore => raw
                .parse()
                .map(Label::Target)
                .map_err(|_| format!("`{raw}` is not a number: a one-output head regresses")),
        }
    }
}

/// A TSV file's header (when it has one) and its non-blank rows.
struct Table<'t> {
    path: PathBuf,
    header: Option<Vec<&'t str>>,
    /// 1-based line numbers and lines.
    rows: Vec<(usize, &'t str)>,
}

impl<'t> Table<'t> {
    fn new(path: &Path, text: &'t str, header: bool) -> Table<'t> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.strip_suffix('\r').unwrap_or(l)));
        let header = if header { Some(lines.next().map(|(_, h)| fields(h)).unwrap_or_default()) } else { None };
        let rows = lines.filter(|(_, l)| !l.trim().is_empty()).collect();
        Table { path: path.to_path_buf(), header, rows }
    }

    fn fail(&self, line: usize, message: String) -> DataError {
        DataError::Line { path: self.path.clone(), line, message }
    }

    /// Where `column` is in this file, `kind` naming the file the task expects.
    fn resolve(&self, column: &Column, kind: &str) -> Result<Col, DataError> {
        match (column, &self.header) {
            (Column::Index(at), _) => Ok(Col { at: *at, name: format!("column {at} (0-based)") }),
            (Column::Name(name), Some(header)) => match header.iter().position(|h| h == name) {
                Some(at) => Ok(Col { at, name: format!("`{name}`") }),
                None => Err(self.fail(
                    1,
                    format!(
                        "no column `{name}` in the header ({}): give {kind} as GLUE distributes it, or a task spec \
                         (--task TASK.ron) naming this file's columns",
                        header.join(", ")
                    ),
                )),
            },
            (Column::Name(name), None) => {
                Err(self.fail(1, format!("column `{name}` is named, but {kind} has no header: use Index(N)")))
            }
        }
    }

    /// The field of `column` in the row at `line`.
    fn field<'r>(&self, line: usize, row: &[&'r str], column: &Col) -> Result<&'r str, DataError> {
        row.get(column.at).copied().ok_or_else(|| {
            let header = self.header.as_ref().map_or(String::new(), |h| format!(", the header {}", h.len()));
            self.fail(
                line,
                format!(
                    "{} fields{header}, and {} is field {}: the row is cut short (a tab missing?); fix or remove it",
                    row.len(),
                    column.name,
                    column.at + 1
                ),
            )
        })
    }

    /// Every row tokenised: `sentences` (one or a pair), the label of
    /// `label` when given, and the `index` column when given.
    fn examples(
        &self,
        sentences: &[Col],
        label: Option<(&Col, &Labeling)>,
        index: Option<&Col>,
        tokenizer: &Tokenizer,
        seq: usize,
    ) -> Result<TaskData, DataError> {
        let mut data = TaskData { examples: Vec::with_capacity(self.rows.len()), index: Vec::new() };
        for &(line, row) in &self.rows {
            let row = fields(row);
            let a = self.field(line, &row, &sentences[0])?;
            let b = sentences.get(1).map(|c| self.field(line, &row, c)).transpose()?;
            let (ids, type_ids) = tokenizer.pair(a, b, seq).map_err(|m| self.fail(line, m))?;
            let label = match label {
                Some((column, labeling)) => {
                    labeling.label(self.field(line, &row, column)?).map_err(|m| self.fail(line, m))?
                }
                None => Label::None,
            };
            if let Some(column) = index {
                data.index.push(self.field(line, &row, column)?.to_string());
            }
            data.examples.push(Example { ids, type_ids, label });
        }
        if data.examples.is_empty() {
            let after = if self.header.is_some() { " after the header" } else { "" };
            return Err(DataError::File { path: self.path.clone(), message: format!("no rows{after}") });
        }
        Ok(data)
    }
}
