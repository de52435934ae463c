//! Random specs: valid ones build and verify with the closed-form parameter
//! count; invalid ones are errors; nothing panics, including on mangled text.

mod common;

use common::closed_form_params;
use proptest::prelude::*;
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::spec::{Activation, FeedForward, Head, ModelSpec, NormPlacement, PositionEncoding, Sharing, validate};

fn arb_spec() -> impl Strategy<Value = ModelSpec> {
    let sizes = (0u64..40, 0u64..34, 0u64..4, 0u64..6, 0u64..40, 0u64..20, 0u64..3, prop::option::of(0u64..20));
    let choices = (
        prop::sample::select(vec![Activation::Gelu, Activation::GeluTanh, Activation::Relu, Activation::Silu]),
        prop::sample::select(vec![FeedForward::Mlp, FeedForward::Glu]),
        prop::sample::select(vec![PositionEncoding::Learned, PositionEncoding::Alibi]),
        prop::sample::select(vec![NormPlacement::Post, NormPlacement::Pre]),
        prop_oneof![
            Just(Sharing::Independent),
            (0u64..4).prop_map(|groups| Sharing::CrossLayer { groups }),
            (0u64..4).prop_map(|templates| Sharing::TemplateBank { templates }),
        ],
        prop_oneof![
            Just(Head::Mlm),
            Just(Head::Pooler),
            (0u64..4).prop_map(|num_labels| Head::Classification { num_labels })
        ],
        (-0.5f64..1.5, prop::sample::select(vec![1e-12, 1e-5, 0.0, -1.0])),
    );
    (sizes, choices).prop_map(|((v, h, l, heads, i, p, t, e), (act, ffn, pos, norm, sharing, head, (drop, eps)))| {
        ModelSpec {
            name: "random".into(),
            vocab_size: v,
            hidden: h,
            layers: l,
            heads,
            intermediate: i,
            max_position: p,
            type_vocab: t,
            embedding_size: e,
            activation: act,
            feed_forward: ffn,
            position: pos,
            norm,
            layer_norm_eps: eps,
            hidden_dropout: drop,
            attention_dropout: drop / 2.0,
            initializer_range: 0.02,
            sharing,
            head,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn valid_specs_build_and_invalid_ones_are_errors(spec in arb_spec()) {
        let built = forward(&spec, &BuildOptions::default());
        match validate(&spec) {
            Ok(()) => {
                let graph = built.map_err(|e| TestCaseError::fail(e.to_string()))?;
                graph.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(graph.parameter_count(), closed_form_params(&spec));
            }
            Err(problems) => {
                prop_assert!(!problems.is_empty());
                prop_assert!(built.is_err());
            }
        }
        // The RON file agrees with the in-memory check.
        prop_assert_eq!(ModelSpec::from_ron(&spec.to_ron(), "random.ron").is_ok(), validate(&spec).is_ok());
    }

    #[test]
    fn mangled_spec_text_never_panics(cut in 0usize..900, insert in "[a-z0-9:,()\\[\\] \"]{0,6}") {
        let text = std::fs::read_to_string(common::models_dir().join("bert-base.ron")).unwrap();
        let at = text.char_indices().map(|(i, _)| i).nth(cut % text.chars().count()).unwrap_or(0);
        let mangled = format!("{}{insert}{}", &text[..at], &text[at..]);
        let _ = ModelSpec::from_ron(&mangled, "mangled.ron");
        let _ = zeroplan_ir::spec::hf::from_config_json(&mangled, "mangled.json", "m");
    }
}
