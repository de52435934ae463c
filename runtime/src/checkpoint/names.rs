//! Our parameter names ↔ Hugging Face tensor names.
//!
//! Each family has a table of *modules*: our module (`layer3.attn.q`) against
//! the Hugging Face module (`encoder.layer.3.attention.self.query`), `#`
//! standing for the layer (or group) index in both. A parameter name is a
//! module plus a leaf: `weight`/`bias`, or for LayerNorms our `gamma`/`beta`
//! against Hugging Face's `weight`/`bias` (older checkpoints, converted from
//! TensorFlow, say `gamma`/`beta`: accepted when loading).
//!
//! Modules of the base model (`BertModel`, `AlbertModel`, …) may sit under the
//! prefix of a task model (`bert.`, `albert.`); head modules (`cls.…`,
//! `predictions.…`, `classifier`) never do. Linear weights are `[out, in]` on
//! both sides, so no tensor is transposed.

use zeroplan_ir::spec::{FeedForward, ModelSpec, NormPlacement, PositionEncoding, Sharing};

/// The checkpoint layout a spec is saved and loaded in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `BertModel` names: post-norm, learned positions, independent layers, MLP.
    Bert,
    /// `MegatronBertModel` names: as BERT but pre-norm.
    MegatronBert,
    /// `AlbertModel` names: layers shared in groups.
    Albert,
    /// zeroplan's own parameter names, verbatim (MosaicBERT's GLU, ALiBi,
    /// template banks: models without a Hugging Face layout here).
    Native,
}

impl Family {
    /// The family whose layout `spec` is saved in.
    pub fn of(spec: &ModelSpec) -> Family {
        let bert_like = spec.position == PositionEncoding::Learned && spec.feed_forward == FeedForward::Mlp;
        match (bert_like, spec.sharing, spec.norm) {
            (true, Sharing::Independent, NormPlacement::Post) => Family::Bert,
            (true, Sharing::Independent, NormPlacement::Pre) => Family::MegatronBert,
            (true, Sharing::CrossLayer { .. }, NormPlacement::Post) => Family::Albert,
            _ => Family::Native,
        }
    }

    /// The prefix task models put the base model's tensors under.
    pub fn base_prefix(self) -> Option<&'static str> {
        match self {
            Family::Bert | Family::MegatronBert => Some("bert."),
            Family::Albert => Some("albert."),
            Family::Native => None,
        }
    }

    /// How the layout is named in messages.
    pub fn describe(self) -> &'static str {
        match self {
            Family::Bert => "Hugging Face BertModel names",
            Family::MegatronBert => "Hugging Face MegatronBertModel names",
            Family::Albert => "Hugging Face AlbertModel names",
            Family::Native => "zeroplan's own parameter names",
        }
    }

    /// Checkpoint tensors that are deliberately not read, named without the
    /// base prefix: buffers, the decoder weight tied to the word embeddings,
    /// its bias's second name, and pre-training heads zeroplan does not build
    /// (next-sentence and sentence-order prediction).
    fn ignored(self) -> &'static [&'static str] {
        match self {
            Family::Bert | Family::MegatronBert => &[
                "embeddings.position_ids",
                "embeddings.token_type_ids",
                "cls.predictions.decoder.weight",
                "cls.predictions.decoder.bias",
                "cls.seq_relationship.weight",
                "cls.seq_relationship.bias",
            ],
            Family::Albert => &[
                "embeddings.position_ids",
                "embeddings.token_type_ids",
                "predictions.decoder.weight",
                "predictions.decoder.bias",
                "sop_classifier.classifier.weight",
                "sop_classifier.classifier.bias",
            ],
            Family::Native => &[],
        }
    }

    fn modules(self) -> &'static [Module] {
        match self {
            Family::Bert => BERT,
            Family::MegatronBert => MEGATRON,
            Family::Albert => ALBERT,
            Family::Native => &[],
        }
    }
}

/// A Hugging Face tensor name, without the base prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfName {
    pub name: String,
    /// Part of the base model: under `bert.`/`albert.` in task-model files.
    pub base: bool,
}

impl HfName {
    /// The full name, with `prefix` when the tensor belongs to the base model.
    pub fn with_prefix(&self, prefix: &str) -> String {
        if self.base { format!("{prefix}{}", self.name) } else { self.name.clone() }
    }
}

/// Whether our parameter belongs to a task head (MLM, pooler, classifier):
/// loading a base model's checkpoint leaves these at their initial values.
pub fn is_head(ours: &str) -> bool {
    ["mlm.", "pooler.", "classifier."].iter().any(|p| ours.starts_with(p))
}

/// The Hugging Face name our parameter `ours` is saved under; `None` when the
/// family has no such tensor (the spec and the graph disagree).
pub fn to_hf(family: Family, ours: &str) -> Option<HfName> {
    candidates(family, ours).into_iter().next()
}

/// The names `ours` is accepted under when loading, preferred first (the first
/// is what [`to_hf`] gives). Empty when the family has no such tensor.
pub fn candidates(family: Family, ours: &str) -> Vec<HfName> {
    if family == Family::Native {
        return vec![HfName { name: ours.to_string(), base: false }];
    }
    let Some((module, leaf)) = ours.rsplit_once('.') else { return Vec::new() };
    for m in family.modules() {
        let Some(hf_module) = substitute(m.ours, m.hf, module) else { continue };
        let leaves: &[&str] = match (m.norm, leaf) {
            (true, "gamma") => &["weight", "gamma"],
            (true, "beta") => &["bias", "beta"],
            (false, "weight") => &["weight"],
            (false, "bias") => &["bias"],
            _ => &[],
        };
        let mut names: Vec<HfName> =
            leaves.iter().map(|l| HfName { name: format!("{hf_module}.{l}"), base: m.base }).collect();
        // The MLM decoder's bias is also saved as `…decoder.bias` by newer versions.
        if module == "mlm.decoder" && leaf == "bias" {
            names.push(HfName { name: format!("{hf_module}.decoder.bias"), base: false });
        }
        return names;
    }
    Vec::new()
}

/// Our parameter for the Hugging Face tensor `hf` (without the base prefix),
/// with whether it belongs to the base model; `None` for a name outside the
/// family's layout.
pub fn from_hf(family: Family, hf: &str) -> Option<(String, bool)> {
    if family == Family::Native {
        return Some((hf.to_string(), false));
    }
    let (module, leaf) = hf.rsplit_once('.')?;
    for m in family.modules() {
        let Some(our_module) = substitute(m.hf, m.ours, module) else { continue };
        let our_leaf = match (m.norm, leaf) {
            (true, "weight" | "gamma") => "gamma",
            (true, "bias" | "beta") => "beta",
            (false, "weight") => "weight",
            (false, "bias") => "bias",
            _ => return None,
        };
        return Some((format!("{our_module}.{our_leaf}"), m.base));
    }
    None
}

/// Whether the checkpoint tensor `hf` (without the base prefix) is one that
/// loading skips on purpose.
pub fn is_ignored(family: Family, hf: &str) -> bool {
    family.ignored().contains(&hf)
}

/// One module of a layout: our name and Hugging Face's, `#` the index.
struct Module {
    ours: &'static str,
    hf: &'static str,
    /// A LayerNorm: our `gamma`/`beta` are Hugging Face's `weight`/`bias`.
    norm: bool,
    /// Part of the base model (else a head, never prefixed).
    base: bool,
}

const fn m(ours: &'static str, hf: &'static str) -> Module {
    Module { ours, hf, norm: false, base: true }
}

const fn norm(ours: &'static str, hf: &'static str) -> Module {
    Module { ours, hf, norm: true, base: true }
}

const fn head(ours: &'static str, hf: &'static str) -> Module {
    Module { ours, hf, norm: false, base: false }
}

const fn head_norm(ours: &'static str, hf: &'static str) -> Module {
    Module { ours, hf, norm: true, base: false }
}

const BERT: &[Module] = &[
    m("embeddings.word", "embeddings.word_embeddings"),
    m("embeddings.position", "embeddings.position_embeddings"),
    m("embeddings.token_type", "embeddings.token_type_embeddings"),
    norm("embeddings.norm", "embeddings.LayerNorm"),
    m("layer#.attn.q", "encoder.layer.#.attention.self.query"),
    m("layer#.attn.k", "encoder.layer.#.attention.self.key"),
    m("layer#.attn.v", "encoder.layer.#.attention.self.value"),
    m("layer#.attn.out", "encoder.layer.#.attention.output.dense"),
    norm("layer#.attn.norm", "encoder.layer.#.attention.output.LayerNorm"),
    m("layer#.ffn.up", "encoder.layer.#.intermediate.dense"),
    m("layer#.ffn.down", "encoder.layer.#.output.dense"),
    norm("layer#.ffn.norm", "encoder.layer.#.output.LayerNorm"),
    m("pooler.dense", "pooler.dense"),
    head("mlm.transform", "cls.predictions.transform.dense"),
    head_norm("mlm.norm", "cls.predictions.transform.LayerNorm"),
    head("mlm.decoder", "cls.predictions"),
    head("classifier", "classifier"),
];

const MEGATRON: &[Module] = &[
    m("embeddings.word", "embeddings.word_embeddings"),
    m("embeddings.position", "embeddings.position_embeddings"),
    m("embeddings.token_type", "embeddings.token_type_embeddings"),
    norm("layer#.attn.norm_in", "encoder.layer.#.attention.ln"),
    m("layer#.attn.q", "encoder.layer.#.attention.self.query"),
    m("layer#.attn.k", "encoder.layer.#.attention.self.key"),
    m("layer#.attn.v", "encoder.layer.#.attention.self.value"),
    m("layer#.attn.out", "encoder.layer.#.attention.output.dense"),
    norm("layer#.ffn.norm_in", "encoder.layer.#.ln"),
    m("layer#.ffn.up", "encoder.layer.#.intermediate.dense"),
    m("layer#.ffn.down", "encoder.layer.#.output.dense"),
    norm("encoder.norm", "encoder.ln"),
    m("pooler.dense", "pooler.dense"),
    head("mlm.transform", "cls.predictions.transform.dense"),
    head_norm("mlm.norm", "cls.predictions.transform.LayerNorm"),
    head("mlm.decoder", "cls.predictions"),
    head("classifier", "classifier"),
];

const ALBERT: &[Module] = &[
    m("embeddings.word", "embeddings.word_embeddings"),
    m("embeddings.position", "embeddings.position_embeddings"),
    m("embeddings.token_type", "embeddings.token_type_embeddings"),
    norm("embeddings.norm", "embeddings.LayerNorm"),
    m("embeddings.project", "encoder.embedding_hidden_mapping_in"),
    m("group#.attn.q", "encoder.albert_layer_groups.#.albert_layers.0.attention.query"),
    m("group#.attn.k", "encoder.albert_layer_groups.#.albert_layers.0.attention.key"),
    m("group#.attn.v", "encoder.albert_layer_groups.#.albert_layers.0.attention.value"),
    m("group#.attn.out", "encoder.albert_layer_groups.#.albert_layers.0.attention.dense"),
    norm("group#.attn.norm", "encoder.albert_layer_groups.#.albert_layers.0.attention.LayerNorm"),
    m("group#.ffn.up", "encoder.albert_layer_groups.#.albert_layers.0.ffn"),
    m("group#.ffn.down", "encoder.albert_layer_groups.#.albert_layers.0.ffn_output"),
    norm("group#.ffn.norm", "encoder.albert_layer_groups.#.albert_layers.0.full_layer_layer_norm"),
    m("pooler.dense", "pooler"),
    head("mlm.transform", "predictions.dense"),
    head_norm("mlm.norm", "predictions.LayerNorm"),
    head("mlm.decoder", "predictions"),
    head("classifier", "classifier"),
];

/// `name` matched against `from` (whose `#` stands for a decimal index), the
/// index put into `to`; `None` when `name` does not match.
fn substitute(from: &str, to: &str, name: &str) -> Option<String> {
    match from.split_once('#') {
        None => (name == from).then(|| to.to_string()),
        Some((before, after)) => {
            let index = name.strip_prefix(before)?.strip_suffix(after)?;
            let canonical = !index.is_empty()
                && index.bytes().all(|b| b.is_ascii_digit())
                && (index == "0" || !index.starts_with('0'));
            canonical.then(|| to.replacen('#', index, 1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways() {
        let cases = [
            (Family::Bert, "layer11.attn.q.weight", "encoder.layer.11.attention.self.query.weight", true),
            (Family::Bert, "layer0.ffn.norm.gamma", "encoder.layer.0.output.LayerNorm.weight", true),
            (Family::Bert, "embeddings.norm.beta", "embeddings.LayerNorm.bias", true),
            (Family::Bert, "mlm.decoder.bias", "cls.predictions.bias", false),
            (Family::Bert, "mlm.norm.gamma", "cls.predictions.transform.LayerNorm.weight", false),
            (Family::MegatronBert, "layer2.ffn.norm_in.beta", "encoder.layer.2.ln.bias", true),
            (Family::MegatronBert, "encoder.norm.gamma", "encoder.ln.weight", true),
            (
                Family::Albert,
                "group0.ffn.down.weight",
                "encoder.albert_layer_groups.0.albert_layers.0.ffn_output.weight",
                true,
            ),
            (Family::Albert, "pooler.dense.bias", "pooler.bias", true),
            (Family::Albert, "mlm.decoder.bias", "predictions.bias", false),
            (Family::Native, "bank.attn.q.templates", "bank.attn.q.templates", false),
        ];
        for (family, ours, hf, base) in cases {
            assert_eq!(to_hf(family, ours), Some(HfName { name: hf.into(), base }), "{ours}");
            assert_eq!(from_hf(family, hf), Some((ours.to_string(), base)), "{hf}");
        }
    }

    #[test]
    fn old_layer_norm_names_and_the_second_decoder_bias_are_accepted() {
        let names: Vec<String> =
            candidates(Family::Bert, "layer0.attn.norm.gamma").into_iter().map(|n| n.name).collect();
        assert_eq!(
            names,
            ["encoder.layer.0.attention.output.LayerNorm.weight", "encoder.layer.0.attention.output.LayerNorm.gamma"]
        );
        assert_eq!(from_hf(Family::Bert, "embeddings.LayerNorm.beta"), Some(("embeddings.norm.beta".into(), true)));
        let names: Vec<String> = candidates(Family::Bert, "mlm.decoder.bias").into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["cls.predictions.bias", "cls.predictions.decoder.bias"]);
    }

    #[test]
    fn names_outside_the_layout_map_to_nothing() {
        assert_eq!(to_hf(Family::Bert, "layer0.ffn.gate.weight"), None);
        assert_eq!(to_hf(Family::Bert, "layer0.attn.q.gamma"), None);
        assert_eq!(from_hf(Family::Bert, "encoder.layer.01.output.dense.weight"), None);
        assert_eq!(from_hf(Family::Bert, "encoder.layer.x.output.dense.weight"), None);
        assert_eq!(from_hf(Family::Bert, "embeddings.position_ids"), None);
        assert!(is_ignored(Family::Bert, "embeddings.position_ids"));
        assert!(is_ignored(Family::Albert, "predictions.decoder.weight"));
        assert!(!is_ignored(Family::Native, "embeddings.position_ids"));
    }
}
