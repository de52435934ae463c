//! GLUE files read as each task's preset lays them out: every task's train,
//! dev and test file in GLUE's own layout (written by `glue_files`, apart
//! from the presets) reads back to the sentences and labels written; bad
//! files are refused with the file, the line and the fix; the task-less
//! reader of `train --data x.tsv` still reads GLUE files.

mod glue_files;

use std::path::Path;

use glue_files::{Kind, Row, WORDS, model_dir, separable, temp_dir, write};
use zeroplan_driver::data::glue::{Split, TaskData, load, load_task};
use zeroplan_driver::data::{DataError, Dataset, Label, Tokenizer};
use zeroplan_ir::spec::{Labels, TaskSpec};

const SEQ: usize = 12;

fn tokenizer(dir: &Path) -> Tokenizer {
    model_dir(dir, None, |_| {});
    Tokenizer::load(&dir.join("tokenizer.json"), WORDS.len() as u64).unwrap()
}

/// The label names a task's files write: its classes, or three scores.
fn label_names(task: &TaskSpec) -> Vec<String> {
    match &task.labels {
        Labels::Classes(names) => names.clone(),
        Labels::Regression { .. } => vec!["0.000".into(), "2.500".into(), "5.000".into()],
    }
}

fn task(name: &str) -> TaskSpec {
    TaskSpec::preset(name).unwrap()
}

/// The error of reading `path` as `task`'s `split` file, with its line.
fn refused(path: &Path, task: &TaskSpec, split: Split, tok: &Tokenizer) -> (Option<usize>, String) {
    let err = load_task(path, task, split, tok, SEQ).expect_err("the file is refused");
    let line = match &err {
        DataError::Line { line, .. } => Some(*line),
        DataError::File { .. } => None,
    };
    (line, err.to_string())
}

#[test]
fn every_task_reads_back_its_glue_layout() {
    let dir = temp_dir("layouts");
    let tok = tokenizer(&dir);
    for name in TaskSpec::preset_names() {
        let task = task(name);
        let names = label_names(&task);
        let labels: Vec<&str> = names.iter().map(String::as_str).collect();
        let rows = separable(&labels, 7, 3);
        let pair = task.sentences.len() == 2;
        for kind in [Kind::Train, Kind::Dev, Kind::Test] {
            let path = dir.join(format!("{name}-{kind:?}.tsv"));
            write(&path, name, kind, &rows);
            let split = if kind == Kind::Test { Split::Test } else { Split::Labelled };
            let TaskData { examples, index } =
                load_task(&path, &task, split, &tok, SEQ).unwrap_or_else(|e| panic!("{name} {kind:?}: {e}"));
            assert_eq!(examples.len(), rows.len(), "{name} {kind:?}");
            for (e, row) in examples.iter().zip(&rows) {
                let (ids, type_ids) = tok.pair(&row.a, pair.then_some(row.b.as_str()), SEQ).unwrap();
                assert_eq!((&e.ids, &e.type_ids), (&ids, &type_ids), "{name} {kind:?}: {row:?}");
                let expected = match (kind, &task.labels) {
                    (Kind::Test, _) => Label::None,
                    (_, Labels::Classes(_)) => Label::Class(names.iter().position(|n| *n == row.label).unwrap() as i64),
                    (_, Labels::Regression { .. }) => Label::Target(row.label.parse().unwrap()),
                };
                assert_eq!(e.label, expected, "{name} {kind:?}: {row:?}");
            }
            let expected_index: Vec<String> =
                if kind == Kind::Test { (0..rows.len()).map(|i| i.to_string()).collect() } else { Vec::new() };
            assert_eq!(index, expected_index, "{name} {kind:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_files_are_refused_with_the_line_and_the_fix() {
    let dir = temp_dir("bad");
    let tok = tokenizer(&dir);
    let (mnli, qqp, cola, stsb, sst2) = (task("mnli"), task("qqp"), task("cola"), task("stsb"), task("sst2"));
    let mut rows = separable(&["contradiction", "entailment", "neutral"], 4, 5);

    // Another task's file: the missing column is named, with the file the task expects.
    let mnli_train = dir.join("train.tsv");
    write(&mnli_train, "mnli", Kind::Train, &rows);
    let (line, err) = refused(&mnli_train, &qqp, Split::Labelled, &tok);
    assert_eq!(line, Some(1), "{err}");
    assert!(err.starts_with(&format!("{}:1: no column `question1`", mnli_train.display())), "{err}");
    assert!(err.contains("sentence1_binary_parse") && err.contains("qqp's train or dev file"), "{err}");

    // A label outside the task's classes, on the third row (line 4).
    rows[2].label = "entailed".into();
    write(&mnli_train, "mnli", Kind::Train, &rows);
    let (line, err) = refused(&mnli_train, &mnli, Split::Labelled, &tok);
    assert_eq!(line, Some(4), "{err}");
    assert!(
        err.contains("label `entailed` is not one of mnli's classes (contradiction, entailment, neutral)"),
        "{err}"
    );

    // A headerless CoLA row cut short (line 2, its sentence missing).
    let cola_dev = dir.join("dev.tsv");
    std::fs::write(&cola_dev, "gj04\t1\t\tthe cat sat\ngj04\t0\n").unwrap();
    let (line, err) = refused(&cola_dev, &cola, Split::Labelled, &tok);
    assert_eq!(line, Some(2), "{err}");
    assert!(err.contains("2 fields") && err.contains("column 3 (0-based)") && err.contains("cut short"), "{err}");

    // Scores: out of range, or not a number (a label column of another task).
    let stsb_dev = dir.join("stsb.tsv");
    let mut scores = separable(&["1.0"], 2, 1);
    scores[1].label = "7.5".into();
    write(&stsb_dev, "stsb", Kind::Dev, &scores);
    let (line, err) = refused(&stsb_dev, &stsb, Split::Labelled, &tok);
    assert_eq!(line, Some(3), "{err}");
    assert!(err.contains("score 7.5 is outside stsb's range [0, 5]"), "{err}");
    scores[1].label = "entailment".into();
    write(&stsb_dev, "stsb", Kind::Dev, &scores);
    assert!(refused(&stsb_dev, &stsb, Split::Labelled, &tok).1.contains("`entailment` is not a number"));

    // A test file has no label: it cannot be a dev file.
    let sst2_test = dir.join("test.tsv");
    write(&sst2_test, "sst2", Kind::Test, &separable(&["0", "1"], 2, 2));
    let (line, err) = refused(&sst2_test, &sst2, Split::Labelled, &tok);
    assert_eq!(line, Some(1), "{err}");
    assert!(err.contains("no column `label` in the header (index, sentence)"), "{err}");

    // A header and nothing else.
    std::fs::write(&sst2_test, "index\tsentence\n").unwrap();
    let (line, err) = refused(&sst2_test, &sst2, Split::Test, &tok);
    assert_eq!(line, None);
    assert!(err.ends_with("no rows after the header"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_task_less_reader_still_reads_glue_files() {
    // `train --data x.tsv`: columns by the usual names, named labels numbered in sorted order.
    let dir = temp_dir("legacy");
    let tok = tokenizer(&dir);
    let rows = separable(&["contradiction", "entailment", "neutral"], 6, 9);
    let path = dir.join("train.tsv");
    write(&path, "mnli", Kind::Train, &rows);
    let examples = load(&path, &tok, SEQ, 3).unwrap();
    let classes: Vec<Label> = examples.iter().map(|e| e.label).collect();
    let sorted =
        |l: &str| Label::Class(["contradiction", "entailment", "neutral"].iter().position(|n| *n == l).unwrap() as i64);
    assert_eq!(classes, rows.iter().map(|r| sorted(&r.label)).collect::<Vec<_>>());
    // MRPC's label column is `Quality`; its texts `#1 String` and `#2 String`.
    let mrpc: Vec<Row> = separable(&["0", "1"], 5, 4);
    write(&path, "mrpc", Kind::Train, &mrpc);
    let examples = load(&path, &tok, SEQ, 2).unwrap();
    for (e, row) in examples.iter().zip(&mrpc) {
        assert_eq!(e.label, Label::Class(row.label.parse().unwrap()));
        assert_eq!(e.ids, tok.pair(&row.a, Some(&row.b), SEQ).unwrap().0);
    }
    // STS-B's `score` regresses a one-output head; a class name cannot.
    write(&path, "stsb", Kind::Train, &separable(&["0.5", "4.25"], 4, 6));
    let targets: Vec<Label> = load(&path, &tok, SEQ, 1).unwrap().iter().map(|e| e.label).collect();
    assert!(targets.iter().all(|t| matches!(t, Label::Target(x) if *x == 0.5 || *x == 4.25)), "{targets:?}");
    write(&path, "sst2", Kind::Train, &separable(&["good", "bad"], 2, 6));
    let err = load(&path, &tok, SEQ, 1).unwrap_err().to_string();
    assert!(err.contains(":2: `") && err.contains("is not a number: a one-output head regresses"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shuffling_draws_a_new_order_of_the_same_examples_from_the_seed() {
    let dir = temp_dir("shuffle");
    let tok = tokenizer(&dir);
    let path = dir.join("train.tsv");
    write(&path, "sst2", Kind::Train, &separable(&["0", "1"], 40, 8));
    let examples = load_task(&path, &task("sst2"), Split::Labelled, &tok, SEQ).unwrap().examples;
    let order = |seed: u64| {
        let mut data = Dataset::new(examples.clone(), SEQ, &tok, false, seed);
        data.next_batch(3);
        data.shuffle();
        assert_eq!(data.position, 0);
        data.examples
    };
    let (a, b, c) = (order(1), order(1), order(2));
    assert_eq!(a, b, "the order is the seed's");
    assert!(a != examples && a != c, "a new order, another for another seed");
    let key = |v: &[zeroplan_driver::data::Example]| {
        let mut k: Vec<String> = v.iter().map(|e| format!("{:?}", e)).collect();
        k.sort();
        k
    };
    assert_eq!(key(&a), key(&examples), "the same examples");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn class_indices_follow_the_specs_order_not_the_alphabet() {
    let dir = temp_dir("order");
    let tok = tokenizer(&dir);
    let spec = r#"(name: "nli", header: true, sentences: [Name("sentence1"), Name("sentence2")],
        label: Name("gold_label"), labels: Classes(["neutral", "entailment", "contradiction"]),
        metrics: [Accuracy], dev: ["dev.tsv"], seq_len: 12, epochs: 1, train: ())"#;
    let nli = TaskSpec::from_ron(spec, "nli.ron").unwrap();
    let rows = separable(&["contradiction", "entailment", "neutral"], 9, 2);
    let path = dir.join("dev.tsv");
    write(&path, "mnli", Kind::Dev, &rows);
    let labels: Vec<Label> =
        load_task(&path, &nli, Split::Labelled, &tok, SEQ).unwrap().examples.iter().map(|e| e.label).collect();
    let expected: Vec<Label> = rows
        .iter()
        .map(|r| {
            Label::Class(["neutral", "entailment", "contradiction"].iter().position(|n| *n == r.label).unwrap() as i64)
        })
        .collect();
    assert_eq!(labels, expected);
    assert!(expected.contains(&Label::Class(0)) && expected.contains(&Label::Class(2)));
    let _ = std::fs::remove_dir_all(&dir);
}
