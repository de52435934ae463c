//! The optimising passes preserve what a training step computes.
//!
//! Random small specs of every family are compiled to a training step with
//! `rewrite`, `attention` and `fuse` on, each off, and all off; one step of each on the
//! same inputs and seed, in f64, must give the same loss and the same
//! updated parameters (relative 1e-9, absolute 1e-10 against weights of
//! order 0.1: the key bias's gradient is exactly zero, so it moves only by
//! rounding noise, differently in each graph). The shape hint is batch 1, where the
//! cost model merges Q/K/V and GLU projections, so the rewrite really fires.

use proptest::prelude::*;
use std::collections::BTreeMap;
use zeroplan_ir::interp::{Interpreter, Rounding};
use zeroplan_ir::spec::{
    Activation, FeedForward, Head, ModelSpec, NormPlacement, PositionEncoding, Sharing, TrainingSpec,
};
use zeroplan_ir::{DType, Tensor};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};

fn arb_spec() -> impl Strategy<Value = ModelSpec> {
    (
        prop::sample::select(vec![(8u64, 2u64), (12, 3), (16, 4)]),
        1u64..3,
        prop::sample::select(vec![FeedForward::Mlp, FeedForward::Glu]),
        prop::sample::select(vec![PositionEncoding::Learned, PositionEncoding::Alibi]),
        prop::sample::select(vec![NormPlacement::Post, NormPlacement::Pre]),
        prop::bool::ANY,
        prop::sample::select(vec![
            Head::Mlm,
            Head::Classification { num_labels: 3 },
            Head::Classification { num_labels: 1 },
        ]),
        prop::sample::select(vec![Activation::Gelu, Activation::GeluTanh, Activation::Silu]),
    )
        .prop_map(|((hidden, heads), layers, ffn, position, norm, albert, head, activation)| ModelSpec {
            name: "random".into(),
            vocab_size: 24,
            hidden,
            layers,
            heads,
            intermediate: 2 * hidden,
            max_position: 8,
            type_vocab: 2,
            embedding_size: albert.then_some(6),
            activation,
            feed_forward: ffn,
            position,
            norm,
            layer_norm_eps: 1e-5,
            hidden_dropout: 0.1,
            attention_dropout: 0.1,
            initializer_range: 0.2,
            sharing: if albert { Sharing::CrossLayer { groups: 1 } } else { Sharing::Independent },
            head,
        })
}

fn batch(head: Head) -> BTreeMap<String, Tensor> {
    let int = |v: Vec<i64>, shape: Vec<usize>| Tensor::int(shape, DType::I64, v).unwrap();
    let labels = match head {
        Head::Mlm => int(vec![-100, 5, -100, 7, 1, -100, -100, 2, -100, -100], vec![2, 5]),
        Head::Classification { num_labels: 1 } => Tensor::float(vec![2], DType::F32, vec![0.5, -1.0]).unwrap(),
        _ => int(vec![2, 0], vec![2]),
    };
    BTreeMap::from([
        ("input_ids".to_string(), int(vec![3, 9, 1, 22, 7, 4, 4, 18, 0, 11], vec![2, 5])),
        ("token_type_ids".to_string(), int(vec![0, 0, 1, 1, 1, 0, 0, 0, 1, 1], vec![2, 5])),
        ("attention_mask".to_string(), int(vec![1, 1, 1, 1, 0, 1, 1, 1, 1, 1], vec![2, 5])),
        ("labels".to_string(), labels),
    ])
}

/// Loss and parameters after one step with the passes in `disabled` off.
fn one_step(model: &ModelSpec, disabled: &[&str]) -> (f64, BTreeMap<String, Tensor>, usize) {
    let train = TrainingSpec { lr: 1e-2, ..TrainingSpec::default() };
    let options = PassOptions {
        disabled: disabled.iter().map(|s| s.to_string()).collect(),
        shape_hint: [("batch".to_string(), 1), ("seq".to_string(), 5)].into(),
        ..PassOptions::default()
    };
    let compiled = compile(model, &Target::Training(&train), options).unwrap();
    let graph = compiled.graph;
    let merged = graph.nodes().filter(|n| n.op.name() == "split").count();
    let interp = Interpreter { rounding: Rounding::F64, seed: 5 };
    let mut state = interp.init_state(&graph).unwrap();
    let out = interp.step(&graph, &mut state, &[batch(model.head)], 0).unwrap();
    let loss = out.micro_batches[0]["loss"].item().unwrap();
    let params = graph
        .params()
        .into_iter()
        .map(|p| graph.node(p).name.to_string())
        .map(|n| (n.clone(), state[&*n].clone()))
        .collect();
    (loss, params, merged)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn rewrite_attention_and_fuse_preserve_the_training_step(model in arb_spec()) {
        let (loss, params, merged) = one_step(&model, &[]);
        if model.sharing == Sharing::Independent || model.feed_forward == FeedForward::Glu {
            prop_assert!(merged > 0, "the rewrite should merge at batch 1");
        }
        for disabled in [&["rewrite"][..], &["attention"], &["fuse"], &["rewrite", "fuse"], &["rewrite", "attention", "fuse"]] {
            let (other_loss, other_params, _) = one_step(&model, disabled);
            prop_assert!((loss - other_loss).abs() <= 1e-9 * loss.abs(), "{disabled:?}: loss {loss} vs {other_loss}");
            prop_assert_eq!(params.len(), other_params.len());
            for (name, t) in &params {
                for (x, y) in t.floats().unwrap().iter().zip(other_params[name].floats().unwrap()) {
                    prop_assert!((x - y).abs() <= 1e-9 * x.abs().max(0.1), "{disabled:?} {name}: {x} vs {y}");
                }
            }
        }
    }
}
