//! `zeroplan finetune`, `eval` and `predict` end to end, on GLUE files in
//! each task's real layout that the tests write (`glue_files`, shared with
//! the runtime's tests) and a tiny BERT: a separable synthetic task is
//! learnt, the best epoch is kept in Hugging Face layout and scores the same
//! under `eval`; staged fine-tuning replaces the head; a constant model
//! scores what is computed by hand; bad input names the file, line and fix.

#[path = "../driver/tests/glue_files/mod.rs"]
mod glue_files;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use glue_files::{Kind, Row, model_dir, separable, temp_dir, write};
use zeroplan_driver::classify::FineTuned;
use zeroplan_ir::Tensor;

const MNLI: [&str; 3] = ["contradiction", "entailment", "neutral"];

fn zeroplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zeroplan")).args(args).output().unwrap()
}

fn ok(out: &Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The failure's message, checked to be one (not a panic).
fn failure(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && !err.contains("panicked"), "{err}");
    err
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The JSON lines `finetune --log-json` printed, one per epoch.
fn epochs(stdout: &str) -> Vec<serde_json::Value> {
    stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect()
}

/// A base model and MNLI's train and dev files (`glue/`) of the separable task.
fn mnli_files(dir: &Path, train: usize) -> (PathBuf, PathBuf) {
    let (base, glue) = (dir.join("base"), dir.join("glue"));
    std::fs::create_dir_all(&base).unwrap();
    std::fs::create_dir_all(&glue).unwrap();
    model_dir(&base, None, |_| {});
    write(&glue.join("train.tsv"), "mnli", Kind::Train, &separable(&MNLI, train, 1));
    write(&glue.join("dev_matched.tsv"), "mnli", Kind::Dev, &separable(&MNLI, 96, 2));
    write(&glue.join("dev_mismatched.tsv"), "mnli", Kind::Dev, &separable(&MNLI, 64, 3));
    (base, glue)
}

#[test]
fn mnli_is_learnt_the_best_epoch_kept_and_eval_and_predict_agree() {
    let dir = temp_dir("mnli");
    let (base, glue) = mnli_files(&dir, 256);
    let out = dir.join("out");
    let train = glue.join("train.tsv");
    let started = Instant::now();
    let args = ["finetune", "--task", "mnli", "--model", s(&base), "--train", s(&train), "--dev", s(&glue)];
    let rest = ["--out", s(&out), "--epochs", "6", "--batch-size", "16", "--seq-len", "12", "--lr", "3e-3"];
    let stdout = ok(&zeroplan(&[&args[..], &rest, &["--log-json"]].concat()), "finetune");
    let seconds = started.elapsed().as_secs_f64();
    let epochs = epochs(&stdout);
    assert_eq!(epochs.len(), 6);
    // A directory stands for the task's two dev files; 256 examples are 16 steps an epoch.
    let matched = s(&glue.join("dev_matched.tsv")).to_string();
    let accuracy = |e: &serde_json::Value| e["dev"][&matched]["accuracy"].as_f64().unwrap();
    for (i, e) in epochs.iter().enumerate() {
        assert_eq!(e["steps"], 16 * (i + 1) as u64);
        assert!(e["dev"][s(&glue.join("dev_mismatched.tsv"))]["accuracy"].is_f64(), "{e}");
    }
    let by_epoch: Vec<f64> = epochs.iter().map(accuracy).collect();
    let best = by_epoch.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "mnli, separable, 6 epochs of 16 steps (batch 16 × 12 tokens): dev_matched accuracy by epoch {by_epoch:?}, the whole command {seconds:.2} s"
    );
    assert!(best >= 0.9, "the separable task is learnt: best dev accuracy {best}");
    assert!(accuracy(&epochs[0]) < best, "training improves on the first epoch: {stdout}");

    // The kept epoch is the first with the best accuracy; its files are Hugging Face's.
    let kept = epochs.iter().position(|e| accuracy(e) == best).unwrap();
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("eval.json")).unwrap()).unwrap();
    assert_eq!(record["epoch"], kept as u64 + 1);
    assert_eq!(record["dev"], epochs[kept]["dev"]);
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "BertForSequenceClassification");
    assert_eq!(config["id2label"], serde_json::json!({"0": "contradiction", "1": "entailment", "2": "neutral"}));
    assert_eq!(config["hidden_size"], 32);
    assert_eq!(std::fs::read(out.join("tokenizer.json")).unwrap(), std::fs::read(base.join("tokenizer.json")).unwrap());

    // `eval` on the kept model scores what the run recorded.
    let eval = ["eval", "--task", "mnli", "--model", s(&out), "--dev", &matched, "--json"];
    let scores: serde_json::Value =
        serde_json::from_str(&ok(&zeroplan(&[&eval[..], &["--batch-size", "16", "--seq-len", "12"]].concat()), "eval"))
            .unwrap();
    assert_eq!(scores[&matched]["accuracy"], record["dev"][&matched]["accuracy"]);

    // `predict` writes GLUE's submission: the index, the class name.
    let test_rows = separable(&MNLI, 20, 4);
    let test = glue.join("test_matched.tsv");
    write(&test, "mnli", Kind::Test, &test_rows);
    let submission = dir.join("MNLI-m.tsv");
    ok(
        &zeroplan(&["predict", "--task", "mnli", "--model", s(&out), "--test", s(&test), "-o", s(&submission)]),
        "predict",
    );
    let text = std::fs::read_to_string(&submission).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("index\tprediction"));
    let mut right = 0;
    for (i, (line, row)) in lines.zip(&test_rows).enumerate() {
        let (index, class) = line.split_once('\t').unwrap();
        assert_eq!(index, i.to_string());
        assert!(MNLI.contains(&class), "{line}");
        right += usize::from(class == row.label);
    }
    assert_eq!(text.lines().count(), 21);
    assert!(right >= 17, "{right} of 20 test rows predicted right:\n{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn staged_fine_tuning_replaces_the_head_and_keeps_the_encoder() {
    let dir = temp_dir("staged");
    let (base, glue) = mnli_files(&dir, 64);
    let mnli = dir.join("mnli");
    let common = ["--batch-size", "16", "--seq-len", "12", "--epochs", "1", "--log-json"];
    let (train, dev) = (glue.join("train.tsv"), glue.join("dev_matched.tsv"));
    let args = ["finetune", "--task", "mnli", "--model", s(&base), "--train", s(&train), "--dev", s(&dev)];
    let run = [&args[..], &["--out", s(&mnli), "--lr", "3e-3"], &common];
    ok(&zeroplan(&run.concat()), "finetune mnli");

    // RTE (two labels) and STS-B (a score) from the MNLI model, at a learning
    // rate of 0: the encoder stays MNLI's exactly, the classifier is new.
    let from_mnli = FineTuned::load(&mnli, 3).unwrap();
    for (task, labels, num_labels, metric) in [
        ("rte", vec!["entailment", "not_entailment"], 2, "accuracy"),
        ("stsb", vec!["0.000", "2.500", "5.000"], 1, "pearson"),
    ] {
        let (train, dev, out) =
            (dir.join(format!("{task}-train.tsv")), dir.join(format!("{task}-dev.tsv")), dir.join(task));
        write(&train, task, Kind::Train, &separable(&labels, 32, 5));
        write(&dev, task, Kind::Dev, &separable(&labels, 32, 6));
        let args = ["finetune", "--task", task, "--model", s(&base), "--init-from", s(&mnli), "--train", s(&train)];
        let result = zeroplan(&[&args[..], &["--dev", s(&dev), "--out", s(&out), "--lr", "0"], &common].concat());
        let line = ok(&result, task);
        assert!(epochs(&line)[0]["dev"][s(&dev)][metric].is_f64(), "{line}");
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(stderr.contains("another label count): replaced") && stderr.contains("classifier.weight"), "{stderr}");
        let staged = FineTuned::load(&out, num_labels).unwrap_or_else(|e| panic!("{e}"));
        for (name, value) in &staged.weights {
            let shape = |t: &Tensor| t.shape().to_vec();
            if name.starts_with("classifier.") {
                assert_eq!(shape(value)[0], num_labels as usize, "{name}");
                assert_eq!(shape(&from_mnli.weights[name])[0], 3, "{name}");
            } else {
                assert_eq!(value, &from_mnli.weights[name], "{task}: {name} is MNLI's");
            }
        }
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("stsb").join("config.json")).unwrap()).unwrap();
    assert_eq!((&config["problem_type"], &config["num_labels"]), (&"regression".into(), &1.into()));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A classifier whose weight is zero, so it always outputs `bias`.
fn constant_model(dir: &Path, bias: &[f64]) {
    model_dir(dir, Some(bias.len() as u64), |w| {
        let (shape, dtype) = (w["classifier.weight"].shape().to_vec(), w["classifier.weight"].dtype());
        w.insert("classifier.weight".into(), Tensor::full(shape, dtype, 0.0));
        let b = Tensor::float(vec![bias.len()], dtype, bias.to_vec()).unwrap();
        w.insert("classifier.bias".into(), b);
    });
}

/// Rows of the separable task relabelled with `labels`.
fn labelled(labels: &[&str], seed: u64) -> Vec<Row> {
    let mut rows = separable(&["x"], labels.len(), seed);
    for (row, label) in rows.iter_mut().zip(labels) {
        row.label = label.to_string();
    }
    rows
}

#[test]
fn a_constant_model_scores_what_is_computed_by_hand() {
    let dir = temp_dir("constant");
    let (two, one) = (dir.join("two"), dir.join("one"));
    std::fs::create_dir_all(&two).unwrap();
    std::fs::create_dir_all(&one).unwrap();
    constant_model(&two, &[0.0, 1.0]); // always class 1
    constant_model(&one, &[2.5]); // always 2.5

    // Gold 1 1 0 1 0 0 1 1: tp 5, fp 3, fn 0 — accuracy 5/8, F1 2·5/(2·5 + 3) = 10/13.
    let gold = ["1", "1", "0", "1", "0", "0", "1", "1"];
    for task in ["mrpc", "qqp"] {
        let dev = dir.join(format!("{task}.tsv"));
        write(&dev, task, Kind::Dev, &labelled(&gold, 7));
        let out = ok(&zeroplan(&["eval", "--task", task, "--model", s(&two), "--dev", s(&dev), "--json"]), task);
        let scores: serde_json::Value = serde_json::from_str(&out).unwrap();
        let (accuracy, f1) = (scores[s(&dev)]["accuracy"].as_f64().unwrap(), scores[s(&dev)]["f1"].as_f64().unwrap());
        assert!((accuracy - 5.0 / 8.0).abs() < 1e-12 && (f1 - 10.0 / 13.0).abs() < 1e-12, "{task}: {out}");
    }
    // CoLA (headerless): a constant prediction's Matthews correlation is 0, not NaN.
    let cola = dir.join("cola.tsv");
    write(&cola, "cola", Kind::Dev, &labelled(&gold, 8));
    let out = ok(&zeroplan(&["eval", "--task", "cola", "--model", s(&two), "--dev", s(&cola)]), "cola");
    assert_eq!(out, format!("{}: matthews 0.0000\n", s(&cola)));

    // STS-B: the correlation of a constant prediction is undefined, and said so.
    let stsb = dir.join("stsb.tsv");
    write(&stsb, "stsb", Kind::Dev, &labelled(&["0.5", "3.0", "3.0", "4.8"], 9));
    let out = ok(&zeroplan(&["eval", "--task", "stsb", "--model", s(&one), "--dev", s(&stsb)]), "stsb");
    assert!(
        out.contains("pearson undefined (pearson: a series is constant") && out.contains("spearman undefined"),
        "{out}"
    );
    let out = ok(&zeroplan(&["eval", "--task", "stsb", "--model", s(&one), "--dev", s(&stsb), "--json"]), "stsb");
    assert_eq!(out.trim(), format!(r#"{{"{}":{{"pearson":null,"spearman":null}}}}"#, s(&stsb)));

    // Submissions: scores for STS-B, class names for CoLA (whose test file has a header).
    for (task, model, expected) in [("stsb", &one, "2.500"), ("cola", &two, "1")] {
        let test = dir.join(format!("{task}-test.tsv"));
        write(&test, task, Kind::Test, &labelled(&["", "", ""], 10));
        let out = ok(&zeroplan(&["predict", "--task", task, "--model", s(model), "--test", s(&test)]), task);
        assert_eq!(out, format!("index\tprediction\n0\t{expected}\n1\t{expected}\n2\t{expected}\n"));
        let json = ok(&zeroplan(&["predict", "--task", task, "--model", s(model), "--test", s(&test), "--json"]), task);
        let json: serde_json::Value = serde_json::from_str(&json).expect("predict --json prints JSON");
        assert_eq!(
            (json["task"].as_str(), json["rows"].as_u64(), &json["output"]),
            (Some(task), Some(3), &serde_json::Value::Null)
        );
        assert_eq!(json["predictions"][2], serde_json::json!({"index": "2", "prediction": expected}), "{json}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_names_the_file_the_line_and_the_fix() {
    let dir = temp_dir("bad");
    let (base, glue) = mnli_files(&dir, 8);
    let train = glue.join("train.tsv");
    let dev = glue.join("dev_matched.tsv");
    let finetune = |task: &str, train: &Path, extra: &[&str]| {
        let args = ["finetune", "--task", task, "--model", s(&base), "--train", s(train), "--dev", s(&dev)];
        failure(&zeroplan(&[&args[..], &["--out", s(&dir.join("out")), "--epochs", "1"], extra].concat()))
    };
    let err = finetune("mnlii", &train, &[]);
    assert!(
        err.contains("`mnlii` is not a task") && err.contains("cola, mnli, mrpc") && err.contains("TASK.ron"),
        "{err}"
    );

    let err = finetune("qqp", &train, &[]);
    assert!(err.contains(&format!("{}:1: no column `question1`", s(&train))), "{err}");
    assert!(err.contains("qqp's train or dev file as GLUE distributes it"), "{err}");

    let mut rows = separable(&MNLI, 4, 1);
    rows[1].label = "entailed".into();
    let bad = glue.join("bad.tsv");
    write(&bad, "mnli", Kind::Train, &rows);
    let err = finetune("mnli", &bad, &[]);
    assert!(err.contains(&format!("{}:3: label `entailed` is not one of mnli's classes", s(&bad))), "{err}");

    // A learning rate that blows the weights up: the first value that is not finite is named.
    let err = finetune("mnli", &train, &["--lr", "1e30", "--batch-size", "4", "--seq-len", "12"]);
    assert!(err.contains("error: step 2: the loss is NaN; stopping.") && err.contains("not finite: `"), "{err}");
    assert!(err.contains("how to fix: lower --lr"), "{err}");

    let err = finetune("mnli", &train, &["--seq-len", "64"]);
    assert!(
        err.contains("--seq-len 64 is longer than the model's 16 positions") && err.contains("at most 16"),
        "{err}"
    );

    // `eval` wants a fine-tuned classifier of the task's labels, and labelled dev files.
    let err = failure(&zeroplan(&["eval", "--task", "mnli", "--model", s(&base), "--dev", s(&dev)]));
    assert!(err.contains("not a fine-tuned classifier") && err.contains("zeroplan finetune"), "{err}");
    let three = dir.join("three");
    std::fs::create_dir_all(&three).unwrap();
    model_dir(&three, Some(3), |_| {});
    let err = failure(&zeroplan(&["eval", "--task", "rte", "--model", s(&three), "--dev", s(&dev)]));
    assert!(err.contains("3 output(s), the task 2"), "{err}");
    let test = glue.join("test_matched.tsv");
    write(&test, "mnli", Kind::Test, &separable(&MNLI, 2, 1));
    let err = failure(&zeroplan(&["eval", "--task", "mnli", "--model", s(&three), "--dev", s(&test)]));
    assert!(err.contains(&format!("{}:1: no column `gold_label`", s(&test))), "{err}");
    let err = failure(&zeroplan(&["predict", "--task", "mnli", "--model", s(&dir.join("none")), "--test", s(&test)]));
    assert!(err.contains("config.json: error: not found"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
