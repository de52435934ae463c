//! The fuse pass: fused training graphs compute what the unfused ones do.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;

use common::load_model as model;
use zeroplan_ir::interp::{Feeds, Interpreter, Rounding};
use zeroplan_ir::spec::{ModelSpec, TrainingSpec};
use zeroplan_ir::{DType, Graph, Op, Tensor};
use zeroplan_passes::fuse::{Fuse, kernels_text};
use zeroplan_passes::manager::{PassContext, PassOptions, run_passes};
use zeroplan_passes::training::training_graph;

fn train(spec: &ModelSpec) -> Graph {
    training_graph(spec, &TrainingSpec { dropout: Some(0.1), ..Default::default() }).unwrap()
}

fn fused(graph: &Graph) -> (Graph, Vec<(String, String)>) {
    let mut cx = PassContext::new(PassOptions::default());
    let (g, records) = run_passes(graph.clone(), &[&Fuse], &mut cx).unwrap();
    (g, records[0].stats.clone())
}

fn feeds(graph: &Graph) -> Feeds {
    let (batch, seq) = (2usize, 5usize);
    let int = |v: Vec<i64>, dims: Vec<usize>| Tensor::int(dims, DType::I64, v).unwrap();
    let mut feeds: Feeds = BTreeMap::new();
    feeds.insert("input_ids".into(), int((0..10).map(|i| (i * 37 + 5) % 64).collect(), vec![batch, seq]));
    feeds.insert("token_type_ids".into(), int((0..10).map(|i| i / 7).collect(), vec![batch, seq]));
    feeds.insert("attention_mask".into(), int(vec![1, 1, 1, 1, 1, 1, 1, 1, 0, 0], vec![batch, seq]));
    assert!(graph.resolve("labels").is_some());
    feeds.insert("labels".into(), int(vec![-100, 3, -100, -100, 9, 17, -100, 2, -100, -100], vec![batch, seq]));
    feeds
}

fn close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    match (a.floats(), b.floats()) {
        (Some(x), Some(y)) => {
            for (p, q) in x.iter().zip(y) {
                let ok = p == q || (p - q).abs() <= 1e-12 * p.abs().max(q.abs());
                assert!(ok, "{what}: {p} vs {q}");
            }
        }
        _ => assert_eq!(a, b, "{what}"),
    }
}

#[test]
fn fused_training_steps_match_unfused() {
    for file in
        ["tiny/tiny-bert.ron", "tiny/tiny-mosaicbert.ron", "tiny/tiny-megatron-bert.ron", "tiny/tiny-albert.ron"]
    {
        let graph = train(&model(file));
        let (fg, stats) = fused(&graph);
        assert!(fg.node_count() < graph.node_count(), "{file}: {} → {}", graph.node_count(), fg.node_count());
        let kernels: usize = stats.iter().find(|(k, _)| k == "kernels").unwrap().1.parse().unwrap();
        let fused_ops = fg.petgraph().node_weights().filter(|n| matches!(n.op, Op::Fused { .. })).count();
        assert_eq!(kernels, fused_ops, "{file}");
        assert!(kernels > 0, "{file}");

        let interp = Interpreter { rounding: Rounding::F64, seed: 11 };
        let feeds = feeds(&graph);
        let state = interp.init_state(&graph).unwrap();
        assert_eq!(state, interp.init_state(&fg).unwrap(), "{file}: the same parameters and states");
        let (mut s0, mut s1) = (state.clone(), state);
        let o0 = interp.step(&graph, &mut s0, std::slice::from_ref(&feeds), 0).unwrap();
        let o1 = interp.step(&fg, &mut s1, std::slice::from_ref(&feeds), 0).unwrap();
        let loss = |o: &zeroplan_ir::interp::StepOutputs| o.micro_batches[0]["loss"].clone();
        close(&loss(&o0), &loss(&o1), &format!("{file}: loss"));
        assert_eq!(s0.keys().collect::<Vec<_>>(), s1.keys().collect::<Vec<_>>());
        for (name, t) in &s0 {
            close(t, &s1[name], &format!("{file}: updated {name}"));
        }
    }
}

#[test]
fn the_expected_patterns_fuse() {
    let stats = fused(&train(&model("tiny/tiny-bert.ron"))).1;
    let get = |k: &str| stats.iter().find(|(s, _)| s == k).map(|(_, v)| v.parse::<usize>().unwrap()).unwrap_or(0);
    // Per layer: bias+GELU, two residual LayerNorms, the softmax; plus the
    // embeddings' and the MLM head's LayerNorms.
    assert_eq!(get("pattern.bias_act"), 2, "{stats:?}");
    assert_eq!(get("pattern.bias_dropout_residual_layer_norm"), 4, "{stats:?}");
    assert_eq!(get("pattern.attention_softmax"), 2, "{stats:?}");
    assert_eq!(get("pattern.embedding_layer_norm"), 1, "{stats:?}");
    assert_eq!(get("pattern.bias_act_layer_norm"), 1, "{stats:?}");
    // Backward: every LayerNorm's gradient (2 per layer, the embeddings'
    // and the MLM head's); each FFN's GELU gradient with its bias gradient.
    assert_eq!(get("pattern.layer_norm_grad"), 6, "{stats:?}");
    assert_eq!(get("pattern.act_grad_bias_grad"), 2, "{stats:?}");
    // Optimizer: one AdamW and one squared norm per parameter (42).
    assert_eq!(get("pattern.adamw"), 42, "{stats:?}");
    assert_eq!(get("pattern.squared_sum"), 42, "{stats:?}");
    // Bias adds folded into the GEMM: attention output, FFN up and down per
    // layer, the MLM transform.
    assert_eq!(get("gemm_epilogues"), 7, "{stats:?}");
    // dγ, dβ per LayerNorm (12), the bias gradients of the attention output
    // and FFN down (dropout backward) and FFN up (GELU gradient) per layer
    // and the MLM transform (7), the position embeddings' sum (1), and the
    // 42 squared norms.
    assert_eq!(get("cross_row_outputs"), 12 + 7 + 1 + 42, "{stats:?}");
    let mosaic = fused(&train(&model("tiny/tiny-mosaicbert.ron"))).1;
    assert!(mosaic.iter().any(|(k, _)| k == "pattern.glu"), "{mosaic:?}");
    let albert = fused(&train(&model("tiny/tiny-albert.ron"))).1;
    assert!(albert.iter().any(|(k, v)| k == "pattern.layer_norm_grad" && v == "6"), "{albert:?}");
}

#[test]
fn kernels_hold_the_backward_layer_norm_and_the_optimizer() {
    let mut spec = model("tiny/tiny-bert.ron");
    spec.layers = 1;
    let (g, _) = fused(&train(&spec));
    let kernel = |name: &str| {
        g.petgraph()
            .node_weights()
            .find_map(|n| match &n.op {
                Op::Fused { kernel } if kernel.name == name => Some(kernel.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no kernel {name}"))
    };
    // LayerNorm backward: the residual-gradient add, dx, dγ, dβ, the
    // dropout backward of dx and its bias gradient, all in one kernel.
    let ln = kernel("layer0.attn.norm.back0.fused").to_text();
    for want in [
        "out1 = %layer0.attn.norm.back0#1: f32[32] axes=[2] sum",
        "out2 = %layer0.attn.norm.back0#2: f32[32] axes=[2] sum",
        "out3 = %layer0.attn.out_dropout.back0: f32[batch, seq, 32]",
        "out4 = %layer0.attn.out.back1: f32[32] axes=[2] sum",
        "add v0, v1",
        "keep p=0.1 stream=2",
    ] {
        assert!(ln.contains(want), "{want}\n{ln}");
    }
    assert!(g.resolve("grad.layer0.attn.norm").is_none() && g.resolve("layer0.attn.out.back1").is_none());
    let adamw = kernel("layer0.attn.q.weight.adamw.fused");
    assert_eq!((adamw.inputs.len(), adamw.outputs.len()), (8, 3));
    assert!(adamw.to_text().contains("pow "), "{}", adamw.to_text());
    let sq = kernel("layer0.attn.q.weight.grad_sq.fused");
    assert_eq!(sq.outputs[0].axes, Vec::<usize>::new());
    assert_eq!(kernel("layer0.ffn.act.fused").epilogue_of.as_deref(), Some("layer0.ffn.up.mm"));
}

#[test]
fn one_layer_fused_snapshot() {
    let mut spec = model("tiny/tiny-bert.ron");
    spec.layers = 1;
    let (g, _) = fused(&train(&spec));
    insta::assert_snapshot!(format!("{}\n{}", g.to_text(), kernels_text(&g)));
}

#[test]
fn model_state_accounting_sees_fused_adamw() {
    use zeroplan_passes::accounting::model_state_bytes;
    let graph = train(&model("tiny/tiny-bert.ron"));
    let (fg, _) = fused(&graph);
    assert!(!fg.petgraph().node_weights().any(|n| matches!(n.op, Op::AdamW { .. })));
    assert_eq!(model_state_bytes(&fg), model_state_bytes(&graph));
    assert!(model_state_bytes(&fg).0.optimizer > 0);
}
