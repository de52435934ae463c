//! Semantic checks on a parsed spec: what the types alone cannot say.

use super::error::FieldProblem;
use super::{Head, ModelSpec, Sharing};

/// Sizes beyond this are typos, and would overflow element counts.
const MAX_DIM: u64 = 1 << 24;
const MAX_LAYERS: u64 = 4096;

/// Every problem with the spec, or `Ok` if it can be built.
pub fn validate(spec: &ModelSpec) -> Result<(), Vec<FieldProblem>> {
    let mut problems = Vec::new();
    let mut problem = |field: &'static str, message: String, help: String| {
        problems.push(FieldProblem { field, message, help });
    };
    if spec.name.trim().is_empty() {
        problem("name", "the name is empty".into(), "name the model, e.g. `name: \"bert-base\"`".into());
    }
    for (field, value, max) in [
        ("vocab_size", spec.vocab_size, MAX_DIM),
        ("hidden", spec.hidden, MAX_DIM),
        ("layers", spec.layers, MAX_LAYERS),
        ("heads", spec.heads, MAX_DIM),
        ("intermediate", spec.intermediate, MAX_DIM),
        ("max_position", spec.max_position, MAX_DIM),
    ] {
        if value == 0 {
            problem(field, format!("`{field}` is 0"), format!("set `{field}` to at least 1"));
        } else if value > max {
            problem(field, format!("`{field}` = {value} is larger than {max}"), format!("check `{field}` for a typo"));
        }
    }
    if spec.type_vocab > MAX_DIM {
        problem(
            "type_vocab",
            format!("`type_vocab` = {} is larger than {MAX_DIM}", spec.type_vocab),
            "BERT uses 2".into(),
        );
    }
    if spec.heads != 0 && !spec.hidden.is_multiple_of(spec.heads) {
        // The head counts nearest the one asked for that do divide `hidden`.
        let mut nearest: Vec<u64> = (1..=spec.hidden).filter(|d| spec.hidden.is_multiple_of(*d)).collect();
        nearest.sort_by_key(|d| (d.abs_diff(spec.heads), *d));
        nearest.truncate(3);
        nearest.sort_unstable();
        let divisors: Vec<String> = nearest.iter().map(u64::to_string).collect();
        problem(
            "heads",
            format!("hidden size {} is not divisible by {} heads", spec.hidden, spec.heads),
            format!("choose `heads` dividing `hidden` (for hidden {}: {})", spec.hidden, divisors.join(", ")),
        );
    }
    if let Some(e) = spec.embedding_size
        && (e == 0 || e > MAX_DIM)
    {
        problem(
            "embedding_size",
            format!("`embedding_size` = {e} is out of range"),
            "use `Some(128)` as ALBERT does, or `None` to embed at `hidden`".into(),
        );
    }
    if !(spec.layer_norm_eps > 0.0 && spec.layer_norm_eps < 1.0) {
        problem(
            "layer_norm_eps",
            format!("`layer_norm_eps` = {} is not in (0, 1)", spec.layer_norm_eps),
            "BERT uses 1e-12".into(),
        );
    }
    for (field, p) in [("hidden_dropout", spec.hidden_dropout), ("attention_dropout", spec.attention_dropout)] {
        if !(0.0..1.0).contains(&p) {
            problem(
                field,
                format!("`{field}` = {p} is not a probability in [0, 1)"),
                "BERT uses 0.1; 0 disables".into(),
            );
        }
    }
    if !(spec.initializer_range > 0.0 && spec.initializer_range.is_finite()) {
        problem(
            "initializer_range",
            format!("`initializer_range` = {} must be positive", spec.initializer_range),
            "BERT uses 0.02".into(),
        );
    }
    match spec.sharing {
        Sharing::Independent => {}
        Sharing::CrossLayer { groups } => {
            if groups == 0 || !spec.layers.is_multiple_of(groups) {
                problem(
                    "sharing",
                    format!("{} layers cannot be split into {groups} equal groups", spec.layers),
                    "use `CrossLayer(groups: 1)` (ALBERT) or a divisor of `layers`".into(),
                );
            }
        }
        Sharing::TemplateBank { templates } => {
            if templates == 0 || templates > spec.layers {
                problem(
                    "sharing",
                    format!("a bank of {templates} templates for {} layers", spec.layers),
                    "use between 1 and `layers` templates".into(),
                );
            }
        }
    }
    if let Head::Classification { num_labels } = spec.head
        && (num_labels == 0 || num_labels > MAX_DIM)
    {
        problem(
            "head",
            format!("a classifier with {num_labels} labels"),
            "use `Classification(num_labels: 1)` for regression, 2 or more for classes".into(),
        );
    }
    if problems.is_empty() { Ok(()) } else { Err(problems) }
}
