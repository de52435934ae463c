//! The GLUE task presets under `models/tasks/`: each loads, has the GLUE
//! distribution's layout, and the hyperparameters the MosaicBERT recipe gives
//! (Table S1, as the fine-tuning issue lists them); bad presets are refused
//! with the field named.

use std::path::PathBuf;

use zeroplan_ir::spec::{Column, Labels, Metric, TaskSpec};

fn task(name: &str) -> TaskSpec {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../models/tasks/{name}.ron"));
    TaskSpec::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_glue_preset_has_the_recipes_hyperparameters() {
    // (task, lr, betas, eps, weight decay, epochs)
    let table = [
        ("mnli", 5e-5, (0.9, 0.98), 1e-6, 5e-6, 3),
        ("qnli", 1e-5, (0.9, 0.98), 1e-6, 1e-6, 10),
        ("qqp", 3e-5, (0.9, 0.988), 1e-6, 3e-6, 5),
        ("rte", 1e-5, (0.9, 0.98), 1e-6, 1e-5, 3),
        ("cola", 5e-5, (0.9, 0.98), 1e-6, 5e-6, 10),
        ("sst2", 3e-5, (0.9, 0.988), 1e-6, 3e-6, 3),
        ("mrpc", 8e-5, (0.9, 0.98), 1e-6, 8e-6, 10),
    ];
    for (name, lr, betas, eps, wd, epochs) in table {
        let t = task(name);
        assert_eq!(t.name, name);
        assert_eq!(
            (t.train.lr, t.train.betas, t.train.eps, t.train.weight_decay, t.epochs),
            (lr, betas, eps, wd, epochs)
        );
        assert_eq!(t.seq_len, 256, "{name}");
    }
}

#[test]
fn presets_read_the_glue_layouts_and_report_the_tasks_metrics() {
    let mnli = task("mnli");
    assert_eq!(mnli.num_labels(), 3);
    assert_eq!(mnli.dev, ["dev_matched.tsv", "dev_mismatched.tsv"]);
    let cola = task("cola");
    assert!(!cola.header);
    assert_eq!((cola.sentences.as_slice(), &cola.label), (&[Column::Index(3)][..], &Column::Index(1)));
    assert_eq!(cola.metrics, [Metric::Matthews]);
    let mrpc = task("mrpc");
    assert_eq!(mrpc.sentences, [Column::Name("#1 String".into()), Column::Name("#2 String".into())]);
    assert_eq!(mrpc.metrics, [Metric::Accuracy, Metric::F1]);
    assert_eq!(task("qqp").metrics, [Metric::Accuracy, Metric::F1]);
    let stsb = task("stsb");
    assert_eq!(stsb.labels, Labels::Regression { min: 0.0, max: 5.0 });
    assert_eq!((stsb.num_labels(), stsb.metrics.as_slice()), (1, &[Metric::Pearson, Metric::Spearman][..]));
    assert_eq!(task("sst2").sentences.len(), 1);
    for name in ["qnli", "rte"] {
        assert_eq!(task(name).labels, Labels::Classes(vec!["entailment".into(), "not_entailment".into()]));
    }
}

#[test]
fn the_compiled_in_presets_are_the_files() {
    let names: Vec<&str> = TaskSpec::preset_names().collect();
    assert_eq!(names, ["cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb"]);
    for name in names {
        assert_eq!(TaskSpec::preset(name), Some(task(name)), "{name}");
    }
    assert_eq!(TaskSpec::preset("mnli-mm"), None);
    // Every GLUE test file has a header: CoLA's names its sentence column there.
    assert_eq!(task("cola").test_columns(), [Column::Name("sentence".into())]);
    assert_eq!(task("mrpc").test_columns(), task("mrpc").sentences.as_slice());
}

#[test]
fn inconsistent_presets_name_the_field() {
    let base = r#"(name: "x", header: true, sentences: [Name("s")], label: Name("l"),
        labels: Classes(["a", "b", "c"]), metrics: [Accuracy], dev: ["dev.tsv"], seq_len: 128, epochs: 1,
        train: ())"#;
    assert!(TaskSpec::from_ron(base, "x.ron").is_ok());
    let f1_on_three = base.replace("[Accuracy]", "[F1]");
    let err = TaskSpec::from_ron(&f1_on_three, "x.ron").unwrap_err().to_string();
    assert!(err.contains("x.ron") && err.contains("F1"), "{err}");
    let named_without_header = base.replace("header: true", "header: false");
    let err = TaskSpec::from_ron(&named_without_header, "x.ron").unwrap_err().to_string();
    assert!(err.contains("no header") && err.contains("Index"), "{err}");
    let bad_lr = base.replace("train: ()", "train: (lr: -1.0)");
    assert!(TaskSpec::from_ron(&bad_lr, "x.ron").unwrap_err().to_string().contains("learning rate"));
    let indexed_test = base.replace("label: Name", "test_sentences: Some([Index(0)]), label: Name");
    let err = TaskSpec::from_ron(&indexed_test, "x.ron").unwrap_err().to_string();
    assert!(err.contains("a test file has a header") && err.contains("Name("), "{err}");
    let typo = base.replace("epochs: 1", "epoch: 1");
    assert!(TaskSpec::from_ron(&typo, "x.ron").unwrap_err().to_string().contains("epoch"));
}
