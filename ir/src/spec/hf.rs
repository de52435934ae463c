//! Import of Hugging Face `config.json` files (`model_type: "bert"`).
//!
//! The encoder's sizes must be present; the other fields default as in
//! `transformers.BertConfig`. The head follows `architectures[0]`:
//! `BertModel` → the bare encoder with pooler, `BertForSequenceClassification`
//! → a classifier over `num_labels` (or `id2label`), anything else → MLM.

use serde_json::{Map, Value};
use std::path::Path;

use super::error::{FieldProblem, SpecError, Syntax};
use super::{Activation, FeedForward, Head, ModelSpec, NormPlacement, PositionEncoding, Sharing, validate};

/// The name of a config at `path` that names no model (neither
/// `_name_or_path` nor `architectures`): its directory's name.
pub fn default_name(path: &Path) -> String {
    path.parent()
        .and_then(|d| d.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".to_string())
}

/// Reads a `config.json`'s text; `file` names it in errors.
///
/// The spec is named after the model, not the folder it was saved in
/// (`checkpoint-500`, `snapshots/3f2a…`, `out` say nothing about it): its
/// `_name_or_path`, else `architectures[0]`, with its size ("BertForMaskedLM
/// 110M"); `fallback` only where the config names neither.
pub fn from_config_json(text: &str, file: &str, fallback: &str) -> Result<ModelSpec, SpecError> {
    let root: Value = serde_json::from_str(text).map_err(|e| SpecError {
        file: file.to_string(),
        diagnostics: vec![super::Diagnostic {
            location: Some((e.line(), e.column())),
            message: format!("invalid JSON: {e}"),
            help: "fix the JSON syntax here".into(),
        }],
    })?;
    let located = |problems| SpecError::located(file, text, problems, Syntax::Json);
    let Some(config) = root.as_object() else {
        return Err(SpecError::whole_file(
            file,
            "the config is not a JSON object".into(),
            "give a Hugging Face config.json".into(),
        ));
    };
    let mut spec = Reader { config, problems: Vec::new() }.read(fallback).map_err(located)?;
    validate(&spec).map_err(|problems| located(problems.into_iter().map(to_json_field).collect()))?;
    let named = config.get("_name_or_path").and_then(Value::as_str).filter(|n| !n.trim().is_empty());
    let architecture = config.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str);
    if let Some(model) = named.or(architecture) {
        spec.name = match parameters(&spec) {
            Some(count) => format!("{} {}", model.trim(), size(count)),
            None => model.trim().to_string(),
        };
    }
    Ok(spec)
}

/// The model's trainable parameters, from its forward graph (`None` where
/// a valid spec still does not build, e.g. sizes past the graph's limits:
/// the name then goes without its size).
fn parameters(spec: &ModelSpec) -> Option<u64> {
    let graph = crate::build::forward(spec, &crate::build::BuildOptions::default()).ok()?;
    Some(graph.model_parameter_count())
}

/// A parameter count as model cards write it: `110M`, `4.4M`, `1.3B`.
fn size(count: u64) -> String {
    let (value, unit) = [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")]
        .into_iter()
        .map(|(scale, unit)| (count as f64 / scale, unit))
        .find(|(value, _)| *value >= 1.0)
        .unwrap_or((count as f64, ""));
    if value >= 10.0 { format!("{value:.0}{unit}") } else { format!("{value:.1}{unit}") }
}

/// Renames a spec field to the `config.json` key that set it, so problems
/// found by [`validate`] point at the right key.
fn to_json_field(mut p: FieldProblem) -> FieldProblem {
    p.field = match p.field {
        "hidden" => "hidden_size",
        "layers" => "num_hidden_layers",
        "heads" => "num_attention_heads",
        "intermediate" => "intermediate_size",
        "max_position" => "max_position_embeddings",
        "type_vocab" => "type_vocab_size",
        "hidden_dropout" => "hidden_dropout_prob",
        "attention_dropout" => "attention_probs_dropout_prob",
        "head" => "num_labels",
        other => other,
    };
    p
}

struct Reader<'a> {
    config: &'a Map<String, Value>,
    problems: Vec<FieldProblem>,
}

impl Reader<'_> {
    fn read(mut self, name: &str) -> Result<ModelSpec, Vec<FieldProblem>> {
        match self.config.get("model_type").and_then(Value::as_str) {
            Some("bert") => {}
            Some(other) => {
                return Err(vec![FieldProblem {
                    field: "model_type",
                    message: format!("model_type \"{other}\" is not supported; only \"bert\" configs are imported"),
                    help: "write a RON spec for this model under models/ (albert-base.ron, megatron-bert-345m.ron and mosaicbert-base.ron show the other families)".into(),
                }]);
            }
            None => {
                return Err(vec![FieldProblem {
                    field: "model_type",
                    message: "the config has no string `model_type`; is this a transformers config.json?".into(),
                    help: "add `\"model_type\": \"bert\"` if this is a BERT config".into(),
                }]);
            }
        }
        let activation = match self.config.get("hidden_act").map(|v| v.as_str()) {
            None | Some(Some("gelu")) => Activation::Gelu,
            Some(Some("gelu_new" | "gelu_pytorch_tanh" | "gelu_fast")) => Activation::GeluTanh,
            Some(Some("relu")) => Activation::Relu,
            Some(Some("silu" | "swish")) => Activation::Silu,
            Some(other) => {
                self.problem(
                    "hidden_act",
                    format!("unknown activation {}", other.map_or("(not a string)".into(), |s| format!("\"{s}\""))),
                    "use \"gelu\", \"gelu_new\", \"gelu_pytorch_tanh\", \"relu\" or \"silu\"",
                );
                Activation::Gelu
            }
        };
        match self.config.get("position_embedding_type").map(|v| v.as_str()) {
            None | Some(Some("absolute")) => {}
            Some(_) => self.problem(
                "position_embedding_type",
                "only absolute position embeddings are supported in BERT configs".into(),
                "use \"absolute\", or a RON spec with `position: Alibi`",
            ),
        }
        let head = match self.config.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str) {
            Some("BertModel") => Head::Pooler,
            Some("BertForSequenceClassification") => {
                let labels = self.config.get("id2label").and_then(Value::as_object).map(|m| m.len() as u64);
                let num_labels = self.optional_u64("num_labels").or(labels).unwrap_or(2);
                Head::Classification { num_labels }
            }
            _ => Head::Mlm,
        };
        let spec = ModelSpec {
            name: name.to_string(),
            vocab_size: self.required_u64("vocab_size"),
            hidden: self.required_u64("hidden_size"),
            layers: self.required_u64("num_hidden_layers"),
            heads: self.required_u64("num_attention_heads"),
            intermediate: self.required_u64("intermediate_size"),
            max_position: self.required_u64("max_position_embeddings"),
            type_vocab: self.optional_u64("type_vocab_size").unwrap_or(2),
            embedding_size: None,
            activation,
            feed_forward: FeedForward::Mlp,
            position: PositionEncoding::Learned,
            norm: NormPlacement::Post,
            layer_norm_eps: self.optional_f64("layer_norm_eps").unwrap_or(1e-12),
            hidden_dropout: self.optional_f64("hidden_dropout_prob").unwrap_or(0.1),
            attention_dropout: self.optional_f64("attention_probs_dropout_prob").unwrap_or(0.1),
            initializer_range: self.optional_f64("initializer_range").unwrap_or(0.02),
            sharing: Sharing::Independent,
            head,
        };
        if self.problems.is_empty() { Ok(spec) } else { Err(self.problems) }
    }

    fn problem(&mut self, field: &'static str, message: String, help: &str) {
        self.problems.push(FieldProblem { field, message, help: help.to_string() });
    }

    fn required_u64(&mut self, key: &'static str) -> u64 {
        if !self.config.contains_key(key) {
            self.problems.push(FieldProblem {
                field: "model_type",
                message: format!("the config has no `{key}`"),
                help: format!("add `\"{key}\": N` (bert-base-uncased's config.json has every field)"),
            });
            return 0;
        }
        self.optional_u64(key).unwrap_or(0)
    }

    fn optional_u64(&mut self, key: &'static str) -> Option<u64> {
        let value = self.config.get(key)?;
        let n = value.as_u64();
        if n.is_none() {
            self.problem(key, format!("`{key}` is {value}, not a non-negative integer"), "write a whole number");
        }
        n
    }

    fn optional_f64(&mut self, key: &'static str) -> Option<f64> {
        let value = self.config.get(key)?;
        let x = value.as_f64();
        if x.is_none() {
            self.problem(key, format!("`{key}` is {value}, not a number"), "write a number such as 0.1");
        }
        x
    }
}
