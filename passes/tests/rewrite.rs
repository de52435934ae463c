//! The rewrite pass: matmul merging by cost, semantics preserved.

use std::collections::BTreeMap;

use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::{Feeds, Interpreter, Rounding, State};
use zeroplan_ir::{Bindings, DType, Dim, Graph, Init, Op, Shape, Tensor, TensorType, Value, spec};
use zeroplan_passes::autodiff::backward;
use zeroplan_passes::manager::{PassContext, PassOptions, run_passes};
use zeroplan_passes::mixed_precision::master_weights;
use zeroplan_passes::rewrite::Rewrite;
use zeroplan_passes::rewrite::cost::GpuCostModel;

fn model(path: &str) -> spec::ModelSpec {
    spec::load(&std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)).unwrap()
}

fn tiny_in(name: &str, dtype: DType) -> Graph {
    forward(&model(&format!("models/tiny/{name}.ron")), &BuildOptions::new(dtype)).unwrap()
}

fn tiny(name: &str) -> Graph {
    tiny_in(name, BuildOptions::default().dtype)
}

fn hint(batch: u64, seq: u64) -> Bindings {
    [("batch".to_string(), batch), ("seq".to_string(), seq)].into()
}

/// Runs the pass (through the manager, which verifies) and returns the
/// graph, the stats and the explanations.
fn rewrite(graph: Graph, options: PassOptions) -> (Graph, BTreeMap<String, String>, Vec<String>) {
    let mut cx = PassContext::new(options);
    let (graph, records) = run_passes(graph, &[&Rewrite], &mut cx).unwrap();
    let stats = records[0].stats.iter().cloned().collect();
    (graph, stats, cx.explanations)
}

fn names(g: &Graph) -> Vec<String> {
    g.node_indices().map(|n| g.node(n).name.to_string()).collect()
}

#[test]
fn tiny_bert_merges_qkv() {
    let (g, stats, _) = rewrite(tiny("tiny-bert"), PassOptions { shape_hint: hint(8, 128), ..Default::default() });
    g.verify().unwrap();
    let names = names(&g);
    for l in 0..2 {
        for s in ["weight", "mm", "split"] {
            assert!(names.contains(&format!("layer{l}.attn.qkv.{s}")), "layer{l}.attn.qkv.{s} missing");
        }
        // The weights stay separate parameters; the old matmuls are gone.
        assert!(names.contains(&format!("layer{l}.attn.q.weight")));
        assert!(!names.contains(&format!("layer{l}.attn.q.mm")));
        // The biases now read the split.
        let q = g.node_by_name(&format!("layer{l}.attn.q")).unwrap();
        assert_eq!(&*g.node(g.operands(q)[0].node).name, format!("layer{l}.attn.qkv.split"));
    }
    assert_eq!(stats["groups merged"], "2");
    assert_eq!(stats["groups kept"], "0");
    // Both layers have one signature: saturated once (plus the head's region).
    assert_eq!((stats["regions"].as_str(), stats["regions saturated"].as_str()), ("3", "2"));
}

#[test]
fn tiny_mosaicbert_merges_gate_and_up() {
    let (g, stats, _) = rewrite(tiny("tiny-mosaicbert"), PassOptions::default());
    let names = names(&g);
    for l in 0..2 {
        assert!(names.contains(&format!("layer{l}.ffn.gate_up.mm")));
        assert!(names.contains(&format!("layer{l}.attn.qkv.mm")));
        assert!(!names.contains(&format!("layer{l}.ffn.gate")));
    }
    assert_eq!(stats["groups merged"], "4");
}

#[test]
fn stats_are_reported() {
    let (_, stats, _) = rewrite(tiny("tiny-bert"), PassOptions::default());
    for key in ["iterations", "e-nodes", "stop reason", "saturation ms", "groups merged", "groups kept"] {
        assert!(stats.contains_key(key), "stat `{key}` missing: {stats:?}");
    }
    assert_eq!(stats["stop reason"], "Saturated");
}

#[test]
fn saturation_does_not_grow_with_depth() {
    let large = forward(&model("models/bert-large.ron"), &BuildOptions::new(DType::BF16)).unwrap();
    let options = PassOptions { explain: ["rewrite".to_string()].into(), ..Default::default() };
    let (g, stats, lines) = rewrite(large, options);
    eprintln!("bert-large: {stats:?}\n{}", lines[0]);
    // 24 layers of one signature and the head: two e-graphs.
    assert_eq!((stats["regions"].as_str(), stats["regions saturated"].as_str()), ("25", "2"));
    assert_eq!(g.node_by_name("layer23.attn.qkv.mm").is_some(), g.node_by_name("layer0.attn.qkv.mm").is_some());
}

#[test]
fn pass_limit_merges_one_group() {
    let options = PassOptions { pass_limit: Some(1), ..Default::default() };
    let (g, stats, _) = rewrite(tiny("tiny-bert"), options);
    let names = names(&g);
    assert!(names.contains(&"layer0.attn.qkv.mm".to_string()));
    assert!(!names.contains(&"layer1.attn.qkv.mm".to_string()));
    assert!(names.contains(&"layer1.attn.q.mm".to_string()));
    assert_eq!(stats["groups merged"], "1");
    assert_eq!(stats["groups kept"], "1");
}

#[test]
fn explain_writes_one_line_per_group() {
    let options = PassOptions { explain: ["rewrite".to_string()].into(), ..Default::default() };
    let (_, _, lines) = rewrite(tiny("tiny-mosaicbert"), options);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert!(lines[0].contains("layer0.attn.q.mm") && lines[0].contains("µs") && lines[0].ends_with("merge"));
    assert!(lines.iter().any(|l| l.contains("layer1.ffn.gate, layer1.ffn.up")));
}

/// `x[batch, seq, h] @ [q, k, v]ᵀ` with `[h, h]` weights, each read by a
/// `tanh` so the pieces have consumers, summed into a scalar loss.
fn three_projections(h: u64, dtype: DType) -> Graph {
    let mut g = Graph::new("projections");
    let shape = Shape(vec![Dim::symbol("batch"), Dim::symbol("seq"), Dim::constant(h)]);
    let x = g.input("x", TensorType::new(shape, dtype)).unwrap();
    let mm = Op::MatMul { transpose_a: false, transpose_b: true };
    let mut outs = Vec::new();
    for s in ["q", "k", "v"] {
        let wt = TensorType::new(Shape(vec![Dim::constant(h), Dim::constant(h)]), dtype);
        let w = g.param(format!("layer0.attn.{s}.weight"), wt, Init::Normal { std: 0.02 }).unwrap();
        let p = g.add(format!("layer0.attn.{s}.mm"), mm.clone(), &[x, w]).unwrap();
        outs.push(g.add(format!("layer0.attn.{s}"), Op::Tanh, &[p]).unwrap());
    }
    let qk = g.add("qk", Op::Add, &[outs[0], outs[1]]).unwrap();
    let all = g.add("all", Op::Add, &[qk, outs[2]]).unwrap();
    g.set_output("y", all);
    g
}

#[test]
fn the_decision_flips_with_batch() {
    // BERT-base's Q/K/V in bf16 on an H100: merged at small per-GPU
    // batch, kept separate at large, where the GEMMs run at peak and the
    // split's traffic outweighs the launches saved.
    let model = GpuCostModel::h100_sxm();
    let small = model.compare(128, &[768; 3], 768, DType::BF16);
    let large = model.compare(256 * 128, &[768; 3], 768, DType::BF16);
    assert!(small.merge(), "{small:?}");
    assert!(!large.merge(), "{large:?}");
    let merged_at = |batch| {
        let options = PassOptions { shape_hint: hint(batch, 128), ..Default::default() };
        let (g, stats, _) = rewrite(three_projections(768, DType::BF16), options);
        g.verify().unwrap();
        (g.node_by_name("layer0.attn.qkv.mm").is_some(), stats["groups merged"].clone())
    };
    assert_eq!(merged_at(1), (true, "1".to_string()));
    assert_eq!(merged_at(256), (false, "0".to_string()));
}

fn feeds(graph: &Graph) -> Feeds {
    let (batch, seq) = (2usize, 5usize);
    let int = |v: Vec<i64>, dims: Vec<usize>| Tensor::int(dims, DType::I64, v).unwrap();
    let mut feeds = Feeds::new();
    let ids: Vec<i64> = (0..batch * seq).map(|i| (i as i64 * 37 + 5) % 64).collect();
    feeds.insert("input_ids".into(), int(ids, vec![batch, seq]));
    feeds.insert("token_type_ids".into(), int((0..10).map(|i| (i / 7) as i64).collect(), vec![batch, seq]));
    feeds.insert("attention_mask".into(), int(vec![1, 1, 1, 1, 1, 1, 1, 1, 0, 0], vec![batch, seq]));
    let labels = graph.value_type(graph.resolve("labels").unwrap());
    let labels = if labels.shape.rank() == 2 {
        int(vec![-100, 3, -100, -100, 9, 17, -100, 2, -100, -100], vec![batch, seq])
    } else {
        int(vec![1, 0], vec![batch])
    };
    feeds.insert("labels".into(), labels);
    feeds
}

/// Relative `tolerance`, plus `floor` absolute: values that are zero in
/// exact arithmetic (the key bias's gradient: softmax ignores a shift shared
/// by a row) are rounding noise of the order of the largest value.
fn close(a: &Tensor, b: &Tensor, tolerance: f64, floor: f64, what: &str) {
    let (a, b) = (a.floats().unwrap(), b.floats().unwrap());
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tolerance * x.abs().max(y.abs()) + floor, "{what}[{i}]: {x} vs {y}");
    }
}

/// Forward values and parameter gradients of `graph` (f64 reference),
/// through the training path: master weights, then autodiff.
fn evaluate(graph: &Graph, state: &State, feeds: &Feeds) -> (Tensor, Tensor, BTreeMap<String, Tensor>) {
    let interp = Interpreter { rounding: Rounding::F64, seed: 3 };
    let mut g = master_weights(graph).unwrap();
    let loss = g.outputs.iter().find(|(n, _)| n == "loss").unwrap().1;
    let f32_scalar = TensorType::new(Shape(vec![]), DType::F32);
    let seed = g.source("dloss", Op::Fill { value: 1.0 }, f32_scalar).unwrap();
    let grads = backward(&mut g, loss, seed).unwrap();
    g.verify().unwrap();
    let values = interp.evaluate(&g, state, feeds, 0).unwrap();
    let grads = grads.iter().map(|(p, v)| (g.node(*p).name.to_string(), values.value(&g, *v).clone())).collect();
    (values.graph_output(&g, "loss").unwrap().clone(), values.graph_output(&g, "logits").unwrap().clone(), grads)
}

#[test]
fn semantics_and_gradients_are_preserved() {
    for (name, dtype) in [("tiny-bert", DType::F32), ("tiny-mosaicbert", DType::BF16), ("tiny-albert", DType::F32)] {
        let before = tiny_in(name, dtype);
        let (after, stats, _) = rewrite(before.clone(), PassOptions::default());
        assert_ne!(stats["groups merged"], "0", "{name}: nothing merged");
        let masters = master_weights(&before).unwrap();
        let state = Interpreter { rounding: Rounding::F64, seed: 3 }.init_state(&masters).unwrap();
        let feeds = feeds(&before);
        let (loss0, logits0, grads0) = evaluate(&before, &state, &feeds);
        let (loss1, logits1, grads1) = evaluate(&after, &state, &feeds);
        close(&loss0, &loss1, 1e-12, 0.0, &format!("{name} loss"));
        close(&logits0, &logits1, 1e-12, 0.0, &format!("{name} logits"));
        assert_eq!(grads0.keys().collect::<Vec<_>>(), grads1.keys().collect::<Vec<_>>(), "{name}");
        let largest = grads0.values().flat_map(|g| g.floats().unwrap().iter().map(|x| x.abs())).fold(0.0, f64::max);
        for (p, g0) in &grads0 {
            close(g0, &grads1[p], 1e-10, 1e-15 * largest, &format!("{name} d{p}"));
        }
    }
}

#[test]
fn rewritten_forward_graphs_snapshot() {
    let (bert, _, _) = rewrite(tiny("tiny-bert"), PassOptions::default());
    insta::assert_snapshot!("tiny_bert", bert.to_text());
    let (mosaic, _, _) = rewrite(tiny("tiny-mosaicbert"), PassOptions::default());
    insta::assert_snapshot!("tiny_mosaicbert", mosaic.to_text());
}

#[test]
fn every_tiny_family_rewrites_and_verifies() {
    for name in ["tiny-bert", "tiny-mosaicbert", "tiny-albert", "tiny-megatron-bert", "tiny-ssn-bert", "tiny-bert-sts"]
    {
        let (g, stats, _) = rewrite(tiny(name), PassOptions::default());
        g.verify().unwrap();
        // Shapeshifter's weights are reshaped banks, not parameters: never merged.
        let expect_merges = name != "tiny-ssn-bert";
        assert_eq!(stats["groups merged"] != "0", expect_merges, "{name}: {stats:?}");
    }
}

// ── Clean-ups: transpose∘transpose, reshape∘reshape, scale∘scale ──

const MM: Op = Op::MatMul { transpose_a: false, transpose_b: true };

fn dims(s: &[&str]) -> Shape {
    Shape(s.iter().map(|d| d.parse::<Dim>().unwrap()).collect())
}

/// `x: [batch, seq, 8]` (f32), `w: [8, 8]`, and `chain` applied to `x`,
/// read by `mm = chain @ wᵀ` and a loss `Σ mm²`.
fn chain_graph(chain: &[(&str, Op)]) -> Graph {
    let mut g = Graph::new("chain");
    let x = g.input("x", TensorType::new(dims(&["batch", "seq", "8"]), DType::F32)).unwrap();
    let w = g.param("w", TensorType::new(dims(&["8", "8"]), DType::F32), Init::Normal { std: 0.5 }).unwrap();
    let mut v = x;
    for (name, op) in chain {
        v = g.add(*name, op.clone(), &[v]).unwrap();
    }
    let mm = g.add("mm", MM, &[v, w]).unwrap();
    let loss = g.add("loss", Op::SquaredSum, &[mm]).unwrap();
    g.set_output("y", mm);
    g.set_output("loss", loss);
    g
}

fn transpose(perm: &[usize]) -> Op {
    Op::Transpose { perm: perm.to_vec() }
}

fn reshape(s: &[&str]) -> Op {
    Op::Reshape { shape: dims(s) }
}

/// Every graph output of `before` and `after` (f64 reference) on the same
/// inputs and parameters: identical.
fn same_outputs(before: &Graph, after: &Graph) {
    let interp = Interpreter { rounding: Rounding::F64, seed: 3 };
    let state = interp.init_state(before).unwrap();
    let (batch, seq) = (2usize, 3usize);
    let mut feeds = Feeds::new();
    let xs: Vec<f64> = (0..batch * seq * 8).map(|i| ((i * 37 % 23) as f64 - 11.0) / 7.0).collect();
    feeds.insert("x".into(), Tensor::float(vec![batch, seq, 8], DType::F32, xs).unwrap());
    let v0 = interp.evaluate(before, &state, &feeds, 0).unwrap();
    let v1 = interp.evaluate(after, &state, &feeds, 0).unwrap();
    for (name, _) in &before.outputs {
        let (a, b) = (v0.graph_output(before, name).unwrap(), v1.graph_output(after, name).unwrap());
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert_eq!(a.floats().unwrap(), b.floats().unwrap(), "{name}");
    }
}

/// Runs the pass and checks the result verifies and computes the same.
fn clean(graph: Graph, options: PassOptions) -> (Graph, BTreeMap<String, String>, Vec<String>) {
    let (after, stats, lines) = rewrite(graph.clone(), options);
    after.verify().unwrap();
    same_outputs(&graph, &after);
    (after, stats, lines)
}

fn operand_name(g: &Graph, node: &str) -> String {
    let n = g.node_by_name(node).unwrap();
    g.node(g.operands(n)[0].node).name.to_string()
}

#[test]
fn inverse_transposes_vanish() {
    let before = chain_graph(&[("t1", transpose(&[1, 0, 2])), ("t2", transpose(&[1, 0, 2]))]);
    let (after, stats, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(after.node_count(), before.node_count() - 2);
    assert_eq!(operand_name(&after, "mm"), "x");
    assert!(!after.to_text().contains("= transpose"), "{}", after.to_text());
    assert_eq!(stats["clean-ups applied"], "1");
    assert_eq!(stats["clean-up regions"], "1");
}

#[test]
fn two_transposes_become_one_with_the_composed_permutation() {
    // [batch, seq, 2, 4] → t1 [batch, 2, seq, 4] → t2 [2, batch, seq, 4]:
    // output axis d of t2 is axis q[d] of t1, which is axis p[q[d]] of r.
    let before = chain_graph(&[
        ("r", reshape(&["batch", "seq", "2", "4"])),
        ("t1", transpose(&[0, 2, 1, 3])),
        ("t2", transpose(&[1, 0, 2, 3])),
        ("back", reshape(&["seq", "batch", "8"])),
    ]);
    let (after, stats, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(after.node_count(), before.node_count() - 1);
    let t2 = after.node_by_name("t2").unwrap();
    assert_eq!(after.node(t2).op, transpose(&[2, 0, 1, 3]));
    assert_eq!(operand_name(&after, "t2"), "r");
    assert!(after.node_by_name("t1").is_none());
    assert_eq!(operand_name(&after, "back"), "t2");
    assert_eq!(stats["clean-ups applied"], "1");
}

#[test]
fn reshape_chains_collapse() {
    // Back to x's own shape: the chain vanishes.
    let before = chain_graph(&[("flat", reshape(&["batch*seq*8"])), ("rows", reshape(&["batch", "seq", "8"]))]);
    let (after, _, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(after.node_count(), before.node_count() - 2);
    assert_eq!(operand_name(&after, "mm"), "x");
    assert!(!after.to_text().contains("= reshape"), "{}", after.to_text());
    // To another shape: one reshape, keeping the last one's name.
    let before = chain_graph(&[
        ("flat", reshape(&["batch*seq*8"])),
        ("split", reshape(&["batch*seq", "2", "4"])),
        ("rows", reshape(&["batch*seq", "8"])),
    ]);
    let (after, stats, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(after.node_count(), before.node_count() - 2);
    assert_eq!(after.node(after.node_by_name("rows").unwrap()).op, reshape(&["batch*seq", "8"]));
    assert_eq!(operand_name(&after, "rows"), "x");
    assert_eq!(stats["clean-ups applied"], "1");
    // A lone reshape to the operand's own shape.
    let before = chain_graph(&[("same", reshape(&["batch", "seq", "8"]))]);
    let (after, _, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(after.node_count(), before.node_count() - 1);
    assert_eq!(operand_name(&after, "mm"), "x");
}

#[test]
fn scale_chains_collapse() {
    let before = chain_graph(&[("s1", Op::Scale { factor: 4.0 }), ("s2", Op::Scale { factor: 0.125 })]);
    let (after, _, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(after.node_count(), before.node_count() - 1);
    assert_eq!(after.node(after.node_by_name("s2").unwrap()).op, Op::Scale { factor: 0.5 });
    assert_eq!(operand_name(&after, "s2"), "x");
    let before = chain_graph(&[("s1", Op::Scale { factor: 4.0 }), ("s2", Op::Scale { factor: 0.25 })]);
    let (after, _, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(after.node_count(), before.node_count() - 2);
    assert_eq!(operand_name(&after, "mm"), "x");
    let before = chain_graph(&[("one", Op::Scale { factor: 1.0 })]);
    let (after, _, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(after.node_count(), before.node_count() - 1);
    assert!(!after.to_text().contains("= scale"), "{}", after.to_text());
}

#[test]
fn mixed_chains_clean_each_kind() {
    // scale · transpose · transpose · scale · scale: one region, one root
    // (`c`); the transposes cancel and the last two scales merge. The first
    // scale stays: no rule commutes scales with transposes.
    let before = chain_graph(&[
        ("a", Op::Scale { factor: 2.0 }),
        ("t1", transpose(&[1, 0, 2])),
        ("t2", transpose(&[1, 0, 2])),
        ("b", Op::Scale { factor: 2.0 }),
        ("c", Op::Scale { factor: 0.25 }),
    ]);
    let (after, stats, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(after.node_count(), before.node_count() - 3, "{}", after.to_text());
    assert_eq!(after.node(after.node_by_name("c").unwrap()).op, Op::Scale { factor: 0.5 });
    assert_eq!(operand_name(&after, "c"), "a");
    assert_eq!(operand_name(&after, "mm"), "c");
    assert_eq!(stats["clean-ups applied"], "1");
}

#[test]
fn a_shared_value_of_a_chain_stays_for_its_other_consumer() {
    let mut before = chain_graph(&[("t1", transpose(&[1, 0, 2])), ("t2", transpose(&[1, 0, 2]))]);
    let t1 = Value { node: before.node_by_name("t1").unwrap(), output: 0 };
    let z = before.add("z", Op::Tanh, &[t1]).unwrap();
    before.set_output("z", z);
    let (after, stats, _) = clean(before.clone(), PassOptions::default());
    // t2 is gone (mm reads x); t1 stays for z.
    assert_eq!(after.node_count(), before.node_count() - 1);
    assert_eq!(operand_name(&after, "mm"), "x");
    assert_eq!(operand_name(&after, "z"), "t1");
    assert_eq!(after.node(after.node_by_name("t1").unwrap()).op, transpose(&[1, 0, 2]));
    assert_eq!(stats["clean-ups applied"], "1");
    // A graph output in the middle of a chain is kept too.
    let mut before = chain_graph(&[("s1", Op::Scale { factor: 4.0 }), ("s2", Op::Scale { factor: 0.125 })]);
    before.set_output("inner", Value { node: before.node_by_name("s1").unwrap(), output: 0 });
    let (after, _, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(after.node_count(), before.node_count());
    assert_eq!(operand_name(&after, "s2"), "x");
    assert_eq!(after.node(after.node_by_name("s2").unwrap()).op, Op::Scale { factor: 0.5 });
}

#[test]
fn pass_limit_stops_clean_ups() {
    let chain = [
        ("t1", transpose(&[1, 0, 2])),
        ("t2", transpose(&[1, 0, 2])),
        ("z", Op::Tanh),
        ("s1", Op::Scale { factor: 4.0 }),
        ("s2", Op::Scale { factor: 0.25 }),
    ];
    let before = chain_graph(&chain);
    let (after, stats, _) = clean(before.clone(), PassOptions { pass_limit: Some(0), ..Default::default() });
    assert_eq!(after.to_text(), before.to_text());
    assert_eq!(stats["clean-ups applied"], "0");
    let options = PassOptions { pass_limit: Some(1), explain: ["rewrite".to_string()].into(), ..Default::default() };
    let (after, stats, lines) = clean(before.clone(), options);
    assert_eq!(stats["clean-ups applied"], "1");
    assert_eq!(after.node_count(), before.node_count() - 2);
    assert!(after.node_by_name("s1").is_some() && after.node_by_name("t1").is_none());
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[0].starts_with("rewrite: clean-up of t2:") && lines[0].ends_with("→ clean up"), "{lines:#?}");
    assert!(
        lines[0].contains("(transpose perm[1,0,2] (transpose perm[1,0,2] x))") && lines[0].contains("→ x "),
        "{lines:#?}"
    );
    assert!(lines[1].starts_with("rewrite: clean-up of s2:") && lines[1].ends_with("keep (pass limit)"));
    let (after, stats, _) = clean(before.clone(), PassOptions::default());
    assert_eq!(stats["clean-ups applied"], "2");
    assert_eq!(after.node_count(), before.node_count() - 4);
}

#[test]
fn tiny_models_need_no_clean_ups() {
    for name in ["tiny-bert", "tiny-mosaicbert", "tiny-albert", "tiny-megatron-bert", "tiny-ssn-bert", "tiny-bert-sts"]
    {
        let (_, stats, _) = rewrite(tiny(name), PassOptions::default());
        assert_eq!(stats["clean-ups applied"], "0", "{name}: {stats:?}");
    }
}
