//! Bad specs are clear errors, located in the file, with a fix; never panics.

mod common;

use common::models_dir;
use zeroplan_ir::spec::{self, ModelSpec, hf};

fn bert_base_text() -> String {
    std::fs::read_to_string(models_dir().join("bert-base.ron")).unwrap()
}

/// The RON error for bert-base.ron with `from` replaced by `to`.
fn ron_error(from: &str, to: &str) -> String {
    let text = bert_base_text();
    assert!(text.contains(from), "{from:?} is not in bert-base.ron");
    ModelSpec::from_ron(&text.replacen(from, to, 1), "bad.ron").unwrap_err().to_string()
}

#[test]
fn heads_not_dividing_hidden_points_at_heads() {
    let err = ron_error("heads: 12,", "heads: 7,");
    assert!(err.starts_with("bad.ron:9:5: error: hidden size 768 is not divisible by 7 heads"), "{err}");
    assert!(err.contains("help: choose `heads` dividing `hidden` (for hidden 768: 4, 6, 8)"), "{err}");
}

#[test]
fn zero_layers_points_at_layers() {
    let err = ron_error("layers: 12,", "layers: 0,");
    assert!(err.starts_with("bad.ron:8:5: error: `layers` is 0"), "{err}");
    assert!(err.contains("help: set `layers` to at least 1"), "{err}");
}

#[test]
fn every_problem_is_reported() {
    let text = bert_base_text().replacen("layers: 12,", "layers: 0,", 1).replacen("heads: 12,", "heads: 7,", 1);
    let err = ModelSpec::from_ron(&text, "bad.ron").unwrap_err();
    assert_eq!(err.diagnostics.len(), 2, "{err}");
}

#[test]
fn unknown_activation_lists_the_known_ones() {
    let err = ron_error("activation: Gelu,", "activation: Gleu,");
    assert!(err.starts_with("bad.ron:14:17:"), "{err}");
    assert!(err.contains("Gleu") && err.contains("Gelu, GeluTanh, Relu, Silu"), "{err}");
}

#[test]
fn missing_field_says_which_to_add() {
    let err = ron_error("    heads: 12,\n", "");
    assert!(err.contains("heads") && err.contains("help: add `heads: ...`"), "{err}");
}

#[test]
fn unknown_field_is_rejected_not_ignored() {
    let err = ron_error("heads: 12,", "heads: 12, num_heads: 12,");
    assert!(err.contains("num_heads") && err.contains("help: use one of"), "{err}");
}

#[test]
fn malformed_ron_gives_line_and_column() {
    let err = ron_error("hidden: 768,", "hidden 768,");
    assert!(err.starts_with("bad.ron:7:"), "{err}");
}

#[test]
fn config_json_of_another_model_type_is_refused() {
    let json = r#"{
  "model_type": "albert",
  "hidden_size": 768
}"#;
    let err = hf::from_config_json(json, "config.json", "m").unwrap_err().to_string();
    assert!(err.starts_with("config.json:2:3: error: model_type \"albert\" is not supported"), "{err}");
    assert!(err.contains("help: write a RON spec"), "{err}");
}

#[test]
fn config_json_problems_point_at_their_keys() {
    let json = r#"{
  "model_type": "bert",
  "vocab_size": 100,
  "hidden_size": 30,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "intermediate_size": 64,
  "max_position_embeddings": 16,
  "hidden_act": "gleu"
}"#;
    let err = hf::from_config_json(json, "config.json", "m").unwrap_err().to_string();
    assert!(err.contains("config.json:9:3: error: unknown activation \"gleu\""), "{err}");
    let fixed = json.replace("gleu", "gelu");
    let err = hf::from_config_json(&fixed, "config.json", "m").unwrap_err().to_string();
    assert!(err.starts_with("config.json:6:3: error: hidden size 30 is not divisible by 4 heads"), "{err}");
}

#[test]
fn config_json_missing_sizes_and_bad_types_are_named() {
    let err =
        hf::from_config_json(r#"{"model_type": "bert", "hidden_size": "768"}"#, "c.json", "m").unwrap_err().to_string();
    assert!(err.contains("`hidden_size` is \"768\", not a non-negative integer"), "{err}");
    assert!(err.contains("the config has no `vocab_size`"), "{err}");
    let err = hf::from_config_json("{\"model_type\": ", "c.json", "m").unwrap_err().to_string();
    assert!(err.starts_with("c.json:1:") && err.contains("invalid JSON"), "{err}");
}

#[test]
fn unreadable_and_unknown_files_are_errors() {
    let err = spec::load(&models_dir().join("no-such-model.ron")).unwrap_err().to_string();
    assert!(err.contains("no-such-model.ron: error: cannot read the file"), "{err}");
    let err = spec::load(&models_dir().join("../Cargo.toml")).unwrap_err().to_string();
    assert!(err.contains("unknown spec format"), "{err}");
}

#[test]
fn bert_base_spec_round_trips_through_ron() {
    let spec = ModelSpec::from_ron(&bert_base_text(), "bert-base.ron").unwrap();
    assert_eq!(ModelSpec::from_ron(&spec.to_ron(), "again.ron").unwrap(), spec);
}
