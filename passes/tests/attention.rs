//! The `attention` pass: where it fuses, what it fuses into, where it must
//! not, and that the rest of the pipeline keeps the fused op whole.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::{load_model as model, tiny_models};
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::spec::{ModelSpec, PositionEncoding, Sharing, TrainingSpec};
use zeroplan_ir::{DType, Graph, Op, Phase};
use zeroplan_passes::attention::Attention;
use zeroplan_passes::manager::{PassContext, PassOptions, run_passes};
use zeroplan_passes::pipeline::{Target, compile};

fn ops<'g>(g: &'g Graph, name: &str) -> Vec<&'g Op> {
    g.nodes().filter(|n| n.op.name() == name).map(|n| &n.op).collect()
}

fn options(disabled: &[&str], tensor_parallel: Option<u64>) -> PassOptions {
    PassOptions {
        disabled: disabled.iter().map(|s| s.to_string()).collect(),
        tensor_parallel,
        explain: ["attention".to_string()].into(),
        ..PassOptions::default()
    }
}

fn training(m: &ModelSpec, dropout: f64, disabled: &[&str], tensor_parallel: Option<u64>) -> Graph {
    let train = TrainingSpec { dropout: Some(dropout), ..TrainingSpec::default() };
    compile(m, &Target::Training(&train), options(disabled, tensor_parallel)).unwrap().graph
}

/// The attributes each layer's fused op must carry.
fn expected(m: &ModelSpec, dropout: f64, t: u64) -> (f64, Option<u64>, f64) {
    let scale = 1.0 / ((m.hidden / m.heads) as f64).sqrt();
    (scale, (m.position == PositionEncoding::Alibi).then_some(t), dropout)
}

#[test]
fn every_family_fuses_every_layer_forward_and_in_training() {
    for file in tiny_models() {
        let m = model(&file);
        for dropout in [0.0, 0.1] {
            let g = training(&m, dropout, &[], None);
            let fused = ops(&g, "flash_attention");
            assert_eq!(fused.len(), m.layers as usize, "{file}");
            for op in fused {
                let Op::FlashAttention { scale, alibi_ranks, dropout: p, .. } = op else { unreachable!() };
                assert_eq!((*scale, *alibi_ranks, *p), expected(&m, dropout, 1), "{file}");
            }
            // One adjoint per layer; nothing of the unfused chain is left.
            assert_eq!(ops(&g, "flash_attention_grad").len(), m.layers as usize, "{file}");
            for gone in ["softmax", "softmax_grad", "attention_mask", "alibi_bias"] {
                assert!(ops(&g, gone).is_empty(), "{file}: a {gone} is left");
            }
            // `fuse` left the fused ops as instructions of their own: no kernel softmaxes.
            for op in ops(&g, "fused") {
                let Op::Fused { kernel } = op else { unreachable!() };
                assert!(!kernel.to_text().contains("reduce_max"), "{file}: {}", kernel.name);
            }
        }
        // A forward target too, and `--disable attention` gives the unfused graph.
        let c = compile(&m, &Target::Forward(DType::F32), options(&[], None)).unwrap();
        assert_eq!(ops(&c.graph, "flash_attention").len(), m.layers as usize, "{file}");
        let stats = &c.records.iter().find(|r| r.name == "attention").unwrap().stats;
        assert!(stats.contains(&("attention fused".into(), m.layers.to_string())), "{stats:?}");
        let off = compile(&m, &Target::Forward(DType::F32), options(&["attention"], None)).unwrap();
        assert!(ops(&off.graph, "flash_attention").is_empty());
        assert!(!c.explanations.is_empty() && c.explanations.iter().all(|e| e.contains("fused")), "{file}");
        let off = training(&m, 0.1, &["attention", "fuse"], None);
        assert!(ops(&off, "flash_attention").is_empty() && !ops(&off, "softmax_grad").is_empty());
    }
}

#[test]
fn dropout_keeps_its_stream() {
    // The fused op draws the unfused dropout's mask: same stream.
    let m = model("tiny/tiny-bert.ron");
    let train = TrainingSpec { dropout: Some(0.1), ..TrainingSpec::default() };
    let unfused = compile(&m, &Target::Training(&train), options(&["attention", "fuse"], None)).unwrap().graph;
    let fused = training(&m, 0.1, &[], None);
    for l in 0..m.layers {
        let name = format!("layer{l}.attn.probs_dropout");
        let want = unfused.node(unfused.node_by_name(&name).unwrap()).op.clone();
        let Op::Dropout { p, stream } = want else { panic!("{name} is {want:?}") };
        let got = &fused.node(fused.node_by_name(&format!("layer{l}.attn.context")).unwrap()).op;
        assert!(
            matches!(got, Op::FlashAttention { dropout, stream: s, .. } if *dropout == p && *s == stream),
            "{got:?}"
        );
    }
}

#[test]
fn tensor_parallel_layers_fuse_with_their_ranks_slopes() {
    for file in tiny_models() {
        let m = model(&file);
        if let Sharing::TemplateBank { .. } = m.sharing {
            continue; // not split over tensor ranks
        }
        let g = training(&m, 0.1, &[], Some(2));
        let fused = ops(&g, "flash_attention");
        assert_eq!(fused.len(), m.layers as usize, "{file}");
        for op in fused {
            let Op::FlashAttention { scale, alibi_ranks, dropout, .. } = op else { unreachable!() };
            assert_eq!((*scale, *alibi_ranks, *dropout), expected(&m, 0.1, 2), "{file}");
            // With ALiBi the op depends on the tensor rank, like alibi_bias.
            assert_eq!(op.tensor_ranks(), alibi_ranks.map(|_| 2), "{file}");
        }
    }
}

#[test]
fn a_chain_value_read_elsewhere_is_not_fused() {
    let m = model("tiny/tiny-mosaicbert.ron");
    for (value, reader_is_output) in
        [("layer0.attn.probs", true), ("layer0.attn.scores", false), ("layer0.attn.masked", false)]
    {
        let mut g = forward(&m, &BuildOptions::new(DType::F32)).unwrap();
        let v = zeroplan_ir::Value { node: g.node_by_name(value).unwrap(), output: 0 };
        if reader_is_output {
            g.set_output("probs", v);
        } else {
            g.add("spy", Op::Scale { factor: 2.0 }, &[v]).unwrap();
            let spy = g.node_by_name("spy").unwrap();
            g.set_output("spy", zeroplan_ir::Value { node: spy, output: 0 });
        }
        let mut cx = PassContext::new(options(&[], None));
        let (out, records) = run_passes(g, &[&Attention], &mut cx).unwrap();
        // Layer 0 keeps its chain; layer 1 is fused.
        assert_eq!(out.node(out.node_by_name("layer0.attn.context").unwrap()).op.name(), "matmul", "{value}");
        assert!(out.node_by_name(value).is_some(), "{value}");
        assert_eq!(out.node(out.node_by_name("layer1.attn.context").unwrap()).op.name(), "flash_attention");
        assert!(records[0].stats.contains(&("attention kept".into(), "1".into())), "{:?}", records[0].stats);
        let why = cx.explanations.iter().find(|e| e.contains("kept")).unwrap();
        let reason = if reader_is_output { "graph output `probs`" } else { "also read by `spy`" };
        assert!(why.contains("layer0.attn.context") && why.contains(value) && why.contains(reason), "{why}");
        // The unfused layer still evaluates as before.
        out.verify().unwrap();
    }
}

#[test]
fn recomputing_a_layer_clones_the_fused_op_whole() {
    let m = model("tiny/tiny-bert.ron");
    let train = TrainingSpec { dropout: Some(0.1), ..TrainingSpec::default() };
    let opts = PassOptions { recompute: zeroplan_passes::recompute::Policy::Full, ..options(&[], None) };
    let g = compile(&m, &Target::Training(&train), opts).unwrap().graph;
    let clone = g.node(g.node_by_name("layer0.attn.context.recompute").unwrap());
    assert_eq!((clone.op.name(), clone.phase, clone.outputs.len()), ("flash_attention", Phase::Backward, 2));
    // The adjoint reads the clone's output and log-sum-exp, not the forward's.
    let grad = g.node_by_name("layer0.attn.context.back0").unwrap();
    let read: Vec<String> = g.operands(grad)[4..6].iter().map(|v| g.value_ref(*v)).collect();
    assert_eq!(read, ["layer0.attn.context.recompute#0", "layer0.attn.context.recompute#1"]);
}

/// Three training steps of `m` in the reference interpreter: each step's loss
/// and the final parameters.
fn three_steps(
    m: &ModelSpec,
    disabled: &[&str],
    precision: zeroplan_ir::interp::Rounding,
) -> (Vec<f64>, zeroplan_ir::interp::State) {
    use zeroplan_ir::Tensor;
    let train = TrainingSpec { dropout: Some(0.1), lr: 1e-2, ..TrainingSpec::default() };
    let g = compile(m, &Target::Training(&train), options(disabled, None)).unwrap().graph;
    let interp = zeroplan_ir::interp::Interpreter::new(precision, 21);
    let mut state = interp.init_state(&g).unwrap();
    let int = |v: Vec<i64>| Tensor::int(vec![2, 5], DType::I64, v).unwrap();
    let mut losses = Vec::new();
    for step in 0..3u64 {
        let shift = step as i64;
        let feeds = [
            ("input_ids", int((0..10).map(|i| (i * 7 + shift * 3) % 60 + 2).collect())),
            ("token_type_ids", int(vec![0, 0, 0, 1, 1, 0, 0, 1, 1, 1])),
            // The second sequence pads its last two keys.
            ("attention_mask", int(vec![1, 1, 1, 1, 1, 1, 1, 1, 0, 0])),
            ("labels", int(vec![-100, 17, 5, -100, 63, 9, -100, 2, -100, -100])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let out = interp.step(&g, &mut state, &[feeds], step).unwrap();
        losses.push(out.micro_batches[0]["loss"].item().unwrap());
    }
    (losses, state)
}

#[test]
fn training_with_and_without_the_pass_agrees_in_the_interpreter() {
    use zeroplan_ir::interp::Rounding;
    for file in ["tiny/tiny-bert.ron", "tiny/tiny-mosaicbert.ron"] {
        let m = model(file);
        // F64: the same steps in the same order, so bitwise equal.
        let (fused, fused_state) = three_steps(&m, &[], Rounding::F64);
        let (unfused, unfused_state) = three_steps(&m, &["attention"], Rounding::F64);
        assert!(fused[2] != fused[0], "{file}: the loss should move over three steps: {fused:?}");
        assert_eq!(fused, unfused, "{file}: F64 losses");
        assert_eq!(fused_state, unfused_state, "{file}: F64 state after three steps");
        // f32: each unfused intermediate is rounded once more than the fused op's.
        let (fused, fused_state) = three_steps(&m, &[], Rounding::Native);
        let (unfused, unfused_state) = three_steps(&m, &["attention"], Rounding::Native);
        for (a, b) in fused.iter().zip(&unfused) {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{file}: f32 losses {fused:?} vs {unfused:?}");
        }
        for (name, t) in unfused_state.iter().filter(|(name, _)| !name.contains("adam") && !name.starts_with("train")) {
            let (x, y) = (fused_state[name].floats().unwrap(), t.floats().unwrap());
            let worst = x.iter().zip(y).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            // The key bias's gradient is exactly 0 (softmax ignores a constant
            // per row): AdamW moves it by rounding noise, up to lr a step.
            let bound = if name.ends_with("attn.k.bias") {
                3.0 * 1e-2 * 1.0001
            } else {
                5e-5 * y.iter().fold(0.0f64, |m, v| m.max(v.abs()))
            };
            assert!(worst <= bound, "{file} {name}: after 3 f32 steps {worst:e} > {bound:e}");
        }
    }
}

#[test]
fn the_cost_model_counts_the_products_and_the_tensors_moved() {
    use zeroplan_passes::cost::work::{Engine, recomputed_share, work};
    let m = model("tiny/tiny-bert.ron");
    let g = training(&m, 0.1, &[], None);
    let at: zeroplan_ir::Bindings = [("batch".to_string(), 4), ("seq".to_string(), 16)].into();
    let (b, h, s, d) = (4u64, m.heads, 16u64, m.hidden / m.heads);
    let forward = 4.0 * (b * h * s * s * d) as f64;
    // bf16 or f32 aside, the bytes are the tensors read and written.
    let e = |shape: u64| shape * 4; // f32 training
    let (bhsd, bhs, mask) = (e(b * h * s * d), e(b * h * s), b * s * 8);
    for (name, flops, bytes, share) in [
        ("layer0.attn.context", forward, 3 * bhsd + mask + bhsd + bhs, 0.0),
        ("layer0.attn.context.back0", 2.5 * forward, 3 * bhsd + mask + bhsd + bhs + bhsd + 3 * bhsd, 0.2),
    ] {
        let n = g.node_by_name(name).unwrap();
        let w = work(&g, n, &at).unwrap();
        assert_eq!((w.engine, w.flops, w.bytes), (Engine::Gemm, flops, bytes as f64), "{name}");
        let shape = w.gemm.unwrap();
        assert_eq!((shape.batch, shape.m, shape.n, shape.k), (b * h, s, s, d), "{name}");
        assert_eq!(recomputed_share(&g.node(n).op), share);
    }
}
