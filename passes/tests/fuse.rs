//! The fuse pass: fused training graphs compute what the unfused ones do.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;

use common::{load_model as model, models_dir};
use zeroplan_ir::interp::{Feeds, Interpreter, Rounding};
use zeroplan_ir::kernel::Kernel;
use zeroplan_ir::plan::OffloadTo;
use zeroplan_ir::spec::{Cluster, GpuProfile, ModelSpec, Precision, TrainingSpec};
use zeroplan_ir::{Bindings, DType, Graph, NodeIndex, Op, Phase, Tensor};
use zeroplan_passes::cost::work::{Engine, work};
use zeroplan_passes::cost::{Machine, simulate, time::HBM_FRACTION};
use zeroplan_passes::fuse::{Fuse, kernels_text};
use zeroplan_passes::manager::{PassContext, PassOptions, run_passes};
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_passes::recompute::Policy;
use zeroplan_passes::training::training_graph;

fn train(spec: &ModelSpec) -> Graph {
    training_graph(spec, &TrainingSpec { dropout: Some(0.1), ..Default::default() }).unwrap()
}

fn fused(graph: &Graph) -> (Graph, Vec<(String, String)>) {
    fused_without(graph, &[])
}

/// The fuse pass with `disabled` passes named off, as the pipeline tells it:
/// `["attention"]` is attention pinned unfused (`--attention unfused`).
fn fused_without(graph: &Graph, disabled: &[&str]) -> (Graph, Vec<(String, String)>) {
    let disabled = disabled.iter().map(|d| d.to_string()).collect();
    let mut cx = PassContext::new(PassOptions { disabled, ..PassOptions::default() });
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
    let files =
        ["tiny/tiny-bert.ron", "tiny/tiny-mosaicbert.ron", "tiny/tiny-megatron-bert.ron", "tiny/tiny-albert.ron"];
    // Each with attention as the fuse pass runs it by default, and pinned unfused.
    for (path, disabled) in files.into_iter().flat_map(|f| [(f, &[][..]), (f, &["attention"][..])]) {
        let file = format!("{path}, disabled {disabled:?}");
        let graph = train(&model(path));
        let (fg, stats) = fused_without(&graph, disabled);
        assert!(fg.node_count() < graph.node_count(), "{file}: {} → {}", graph.node_count(), fg.node_count());
        let kernels: usize = stats.iter().find(|(k, _)| k == "kernels").unwrap().1.parse().unwrap();
        let fused_ops = fg.nodes().filter(|n| matches!(n.op, Op::Fused { .. })).count();
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
        g.nodes()
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
    assert!(!fg.nodes().any(|n| matches!(n.op, Op::AdamW { .. })));
    assert_eq!(model_state_bytes(&fg), model_state_bytes(&graph));
    assert!(model_state_bytes(&fg).0.optimizer > 0);
}

/// The `fused` nodes of `pattern`, with their nodes.
fn kernels_of<'g>(g: &'g Graph, pattern: &str) -> Vec<(NodeIndex, &'g Kernel)> {
    g.node_indices()
        .filter_map(|n| match &g.node(n).op {
            Op::Fused { kernel } if kernel.pattern.as_deref() == Some(pattern) => Some((n, &**kernel)),
            _ => None,
        })
        .collect()
}

/// With attention pinned unfused (the `attention` pass off) the attention
/// probabilities' dropout is a kernel of its own after the softmax's, and
/// its backward one before the softmax gradient's, as Megatron-LM runs
/// torch's dropout after its fused scale-mask-softmax and Hugging Face's
/// eager attention `nn.Dropout` after the softmax. By default the softmax's
/// kernels hold the dropout, as before. Either way the step computes the
/// same values (`fused_training_steps_match_unfused`).
#[test]
fn unfused_attention_runs_the_probability_dropout_as_kernels_of_its_own() {
    let spec = model("tiny/tiny-bert.ron");
    let graph = train(&spec);
    for (disabled, apart) in [(&[][..], false), (&["attention"][..], true)] {
        let (g, stats) = fused_without(&graph, disabled);
        let get = |k: &str| stats.iter().find(|(s, _)| s == k).map(|(_, v)| v.parse::<u64>().unwrap()).unwrap_or(0);
        assert_eq!(get("pattern.attention_softmax"), spec.layers, "{disabled:?}: {stats:?}");
        assert_eq!(get("pattern.attention_softmax_grad"), spec.layers, "{disabled:?}: {stats:?}");
        let (softmax, softmax_grad) = (kernels_of(&g, "attention_softmax"), kernels_of(&g, "attention_softmax_grad"));
        for (_, k) in softmax.iter().chain(&softmax_grad) {
            assert_eq!(k.to_text().contains("keep p=0.1"), !apart, "{disabled:?}: {}", k.to_text());
        }
        let lone_dropout = |n: NodeIndex, phase: Phase| {
            let node = g.node(n);
            matches!(node.op, Op::Dropout { .. }) && node.phase == phase
        };
        // Forward: a dropout reading each softmax kernel's probabilities,
        // read by the context matmul.
        let forward: Vec<NodeIndex> = softmax
            .iter()
            .flat_map(|&(n, _)| g.users(n).iter().copied())
            .filter(|&u| lone_dropout(u, Phase::Forward))
            .collect();
        // Backward: a dropout backward on the context matmul's gradient,
        // read by each softmax gradient's kernel.
        let backward: Vec<NodeIndex> = softmax_grad
            .iter()
            .flat_map(|&(n, _)| g.operands(n).iter().map(|v| v.node).collect::<Vec<_>>())
            .filter(|&p| lone_dropout(p, Phase::Backward))
            .collect();
        let want = if apart { spec.layers as usize } else { 0 };
        assert_eq!((forward.len(), backward.len()), (want, want), "{disabled:?}");
        for n in forward {
            assert!(g.users(n).iter().all(|&u| matches!(g.node(u).op, Op::MatMul { .. })), "{}", g.node(n).name);
        }
        for n in backward {
            let read = g.node(g.operands(n)[0].node);
            assert!(matches!(read.op, Op::MatMul { .. }), "{} reads {}", g.node(n).name, read.name);
        }
    }
}

/// What the probability dropout's kernels cost: two bert-base layers in
/// bf16 at 4 × 512 on one A100, compiled unfused, then fused with the
/// dropout in the softmax's kernels (the default) and apart (attention
/// pinned unfused). Apart, the memory-bound kernels move 2 bytes an s × s
/// element more for each time a tensor of the probabilities or of their
/// gradient is written or read between two kernels; no mask, each kernel
/// redraws it. The predicted step grows by those bytes at the kernels'
/// share of HBM bandwidth and a launch per dropout kernel.
#[test]
fn the_probability_dropout_kernels_cost_their_bytes_and_launches() {
    let mut spec = model("bert-base.ron");
    spec.layers = 2;
    let (batch, seq) = (4u64, 512u64);
    let bound: Bindings = [("batch".to_string(), batch), ("seq".to_string(), seq)].into();
    let gpu = GpuProfile::load(&models_dir().join("gpus/a100-80gb.ron")).unwrap();
    let cluster = Cluster { nodes: 1, gpus_per_node: 1, gpu, memory_budget: None, host_memory: None, nvme: None };
    let machine = Machine { cluster, dtype: DType::BF16, offload_to: OffloadTo::Cpu, launches: Default::default() };
    let elements = (spec.layers * batch * spec.heads * seq * seq) as f64;
    // Bytes an s × s element and dropout kernels, per layer. Recompute none:
    // the dropout reads the probabilities (2), the dropout backward writes
    // their gradient and the softmax gradient reads it (4). Full: the forward
    // that stores nothing writes and reads them (4; fused, they stayed in
    // registers), its recomputation reads them (2), the backward as before.
    for (policy, per_element, launches) in [(Policy::None, 2 + 4, 2), (Policy::Full, 4 + 2 + 4, 3)] {
        let train = TrainingSpec { precision: Precision::Bf16, dropout: Some(0.1), ..TrainingSpec::default() };
        let disabled = ["attention", "fuse"].map(String::from).into();
        let options = PassOptions { recompute: policy, shape_hint: bound.clone(), disabled, ..PassOptions::default() };
        let unfused = compile(&spec, &Target::Training(&train), options).unwrap().graph;
        let kernel_bytes = |g: &Graph| -> f64 {
            g.node_indices()
                .map(|n| work(g, n, &bound).unwrap())
                .filter(|w| w.engine == Engine::Kernel)
                .map(|w| w.bytes)
                .sum()
        };
        let step = |g: &Graph| {
            let order = g.topo_order();
            simulate(g, &order, &bound, &machine, 1, batch * seq).unwrap().step_seconds
        };
        let (together, apart) = (fused(&unfused).0, fused_without(&unfused, &["attention"]).0);
        let more_bytes = kernel_bytes(&apart) - kernel_bytes(&together);
        assert_eq!(more_bytes, per_element as f64 * elements, "{policy:?}");
        let streamed = more_bytes / (machine.cluster.gpu.hbm_gbps * 1e9 * HBM_FRACTION);
        let launched = (launches * spec.layers) as f64 * machine.launch_seconds();
        let longer = step(&apart) - step(&together);
        assert!((longer - (streamed + launched)).abs() < 1e-9, "{policy:?}: {longer} s, not {streamed} + {launched}");
    }
}
