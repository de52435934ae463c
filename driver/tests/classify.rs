//! The classifier `finetune`, `eval` and `predict` score with: its logits on
//! the host runtime against the reference interpreter (batches padded at the
//! end), fine-tuned model directories refused when they do not fit the
//! task, and a checkpoint's head of another label count replaced only when
//! asked — never an encoder tensor of another shape.

mod glue_files;

use glue_files::{model_dir, separable, temp_dir};
use zeroplan_driver::classify::{Classifier, FineTuned};
use zeroplan_driver::data::{Dataset, Example, Label};
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::{Interpreter, Rounding};
use zeroplan_ir::spec::Head;
use zeroplan_runtime::checkpoint::{self, CheckpointError, HeadShapes};

const SEQ: usize = 12;

#[test]
fn host_logits_equal_the_reference_interpreter_with_a_padded_last_batch() {
    for num_labels in [3, 1] {
        let dir = temp_dir("logits");
        model_dir(&dir, Some(num_labels), |_| {});
        let model = FineTuned::load(&dir, num_labels).unwrap_or_else(|e| panic!("{e}"));
        // Five examples in batches of two: the last batch is padded with the first example.
        let examples: Vec<Example> = separable(&["x"], 5, 4)
            .iter()
            .map(|row| {
                let (ids, type_ids) = model.tokenizer.pair(&row.a, Some(&row.b), SEQ).unwrap();
                Example { ids, type_ids, label: Label::None }
            })
            .collect();
        let mut classifier = Classifier::new(&model.spec, &model.weights, 2, SEQ).unwrap();
        let host = classifier.logits(&examples, &model.tokenizer).unwrap();
        assert_eq!(host.len(), 5);

        let mut eval = model.spec.clone();
        (eval.hidden_dropout, eval.attention_dropout) = (0.0, 0.0);
        let graph = forward(&eval, &BuildOptions::default()).unwrap();
        for (e, ours) in examples.iter().zip(&host) {
            let label = if num_labels == 1 { Label::Target(0.0) } else { Label::Class(0) };
            let one = Example { label, ..e.clone() };
            let feeds = Dataset::new(vec![one], SEQ, &model.tokenizer, false, 0).next_batch(1);
            let values = Interpreter::new(Rounding::Native, 0).evaluate(&graph, &model.weights, &feeds, 0).unwrap();
            let exact = values.graph_output(&graph, "logits").unwrap().floats().unwrap().to_vec();
            assert_eq!(ours.len(), num_labels as usize);
            let scale = exact.iter().map(|x| x.abs()).fold(1e-3, f64::max);
            for (a, b) in ours.iter().zip(&exact) {
                assert!((a - b).abs() <= 1e-5 * scale, "{num_labels} labels: host {ours:?}, reference {exact:?}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_model_directory_must_fit_the_task() {
    let dir = temp_dir("fit");
    model_dir(&dir, Some(3), |_| {});
    let err = FineTuned::load(&dir, 2).err().expect("refused").to_string();
    assert!(err.contains("config.json") && err.contains("3 output(s), the task 2"), "{err}");

    // A bare encoder's directory, then the same weights under a classifier's config.
    model_dir(&dir, None, |_| {});
    let err = FineTuned::load(&dir, 2).err().expect("refused").to_string();
    assert!(err.contains("not a fine-tuned classifier") && err.contains("zeroplan finetune"), "{err}");
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let classifier = config.replace("\"BertModel\"", "\"BertForSequenceClassification\"");
    std::fs::write(dir.join("config.json"), classifier).unwrap();
    let err = FineTuned::load(&dir, 2).err().expect("refused").to_string();
    assert!(err.contains("model.safetensors") && err.contains("no trained classifier.weight"), "{err}");

    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let err = FineTuned::load(&dir, 2).err().expect("refused").to_string();
    assert!(err.contains("tokenizer.json: error: not found"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn another_label_counts_head_is_replaced_only_when_asked() {
    // MNLI's three-label classifier, loaded for RTE's two.
    let dir = temp_dir("replace");
    let mnli = model_dir(&dir, Some(3), |_| {});
    let file = dir.join("model.safetensors");
    let mut rte = mnli.clone();
    rte.head = Head::Classification { num_labels: 2 };
    let graph = forward(&rte, &BuildOptions::default()).unwrap();
    let initial = Interpreter::new(Rounding::Native, 5).init_state(&graph).unwrap();

    let mut weights = initial.clone();
    let err = checkpoint::load_weights(&file, &rte, &graph, &mut weights).unwrap_err();
    let CheckpointError::Mismatch(m) = &err else { panic!("{err}") };
    let wrong: Vec<&str> = m.wrong_shape.iter().map(|w| w.param.as_str()).collect();
    assert_eq!(wrong, ["classifier.weight", "classifier.bias"]);
    assert_eq!(weights, initial, "nothing changes unless the whole file fits");

    let report = checkpoint::load_weights_with(&file, &rte, &graph, &mut weights, HeadShapes::Replace).unwrap();
    assert_eq!(report.replaced, ["classifier.weight", "classifier.bias"]);
    assert!(report.initialised.is_empty());
    let saved = FineTuned::load(&dir, 3).unwrap().weights;
    for (name, value) in &weights {
        let expected = if name.starts_with("classifier.") { &initial[name] } else { &saved[name] };
        assert_eq!(value, expected, "{name}");
    }

    // An encoder tensor of another shape stays an error, head or no head.
    let mut wider = rte.clone();
    wider.intermediate = 48;
    let graph = forward(&wider, &BuildOptions::default()).unwrap();
    let mut weights = Interpreter::new(Rounding::Native, 5).init_state(&graph).unwrap();
    let err = checkpoint::load_weights_with(&file, &wider, &graph, &mut weights, HeadShapes::Replace).unwrap_err();
    let CheckpointError::Mismatch(m) = &err else { panic!("{err}") };
    let wrong: Vec<&str> = m.wrong_shape.iter().map(|w| w.param.as_str()).collect();
    assert!(wrong.contains(&"layer0.ffn.up.weight") && !wrong.iter().any(|w| w.starts_with("classifier")), "{wrong:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
