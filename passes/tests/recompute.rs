//! Recomputation changes lifetimes, never values; the optimal policy
//! recomputes least for what it stores.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::{load_model as model, tiny_models};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use zeroplan_ir::interp::{Interpreter, Rounding};
use zeroplan_ir::spec::{ModelSpec, Precision as Compute, TrainingSpec};
use zeroplan_ir::{Bindings, DType, Graph, Op, Phase, Tensor};
use zeroplan_passes::cost::work::work;
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::memory::{Category, plan};
use zeroplan_passes::pipeline::{Compiled, Target, compile};
use zeroplan_passes::recompute::Policy;
use zeroplan_passes::recompute::regions::{Choice, Layers};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn hint(batch: u64, seq: u64) -> Bindings {
    [("batch".to_string(), batch), ("seq".to_string(), seq)].into()
}

fn compiled_at(m: &ModelSpec, train: &TrainingSpec, policy: Policy, disabled: &[&str], at: &Bindings) -> Graph {
    compile_at(m, train, policy, disabled, at).graph
}

fn compile_at(m: &ModelSpec, train: &TrainingSpec, policy: Policy, disabled: &[&str], at: &Bindings) -> Compiled {
    let options = PassOptions {
        recompute: policy,
        disabled: disabled.iter().map(|s| s.to_string()).collect(),
        shape_hint: at.clone(),
        ..PassOptions::default()
    };
    compile(m, &Target::Training(train), options).unwrap()
}

/// A statistic of the `recompute` pass.
fn stat(c: &Compiled, key: &str) -> String {
    let record = c.records.iter().find(|r| r.name == "recompute").unwrap();
    record.stats.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no `{key}`")).1.clone()
}

/// At the default shape hint (batch 32, seq 128).
fn compiled(m: &ModelSpec, train: &TrainingSpec, policy: Policy, disabled: &[&str]) -> Graph {
    compiled_at(m, train, policy, disabled, &hint(32, 128))
}

/// Measured on a compiled step (before `fuse`, so clones keep their names):
/// the bytes of the forward's activation buffers that something after the
/// forward reads (a view's buffer is the value it views; working copies of
/// weights are model state), and the FLOPs of the `.recompute` clones.
fn stored_and_recomputed(graph: &Graph, at: &Bindings) -> (u64, f64) {
    let params_only =
        |n: zeroplan_ir::NodeIndex| graph.operands(n).iter().all(|v| matches!(graph[v.node].op, Op::Param { .. }));
    let activation = |n: zeroplan_ir::NodeIndex| {
        graph[n].phase == Phase::Forward
            && !graph[n].op.is_source()
            && !(matches!(graph[n].op, Op::Cast { .. }) && params_only(n))
    };
    let mut stored = HashSet::new();
    for m in graph.node_indices().filter(|&m| graph[m].phase != Phase::Forward) {
        for mut v in graph.operands(m).iter().copied() {
            while graph[v.node].op.is_view() {
                v = graph.operands(v.node)[0];
            }
            if activation(v.node) {
                stored.insert(v);
            }
        }
    }
    let bytes = stored.iter().map(|&v| graph.value_type(v).size_bytes(at).unwrap()).sum();
    let flops = graph
        .node_indices()
        .filter(|&n| graph[n].name.ends_with(".recompute"))
        .map(|n| work(graph, n, at).unwrap().flops)
        .sum();
    (bytes, flops)
}

fn step(graph: &Graph) -> (f64, BTreeMap<String, Tensor>) {
    let int = |v: Vec<i64>| Tensor::int(vec![2, 4], DType::I64, v).unwrap();
    let feeds = BTreeMap::from([
        ("input_ids".to_string(), int(vec![3, 9, 1, 22, 7, 4, 4, 18])),
        ("token_type_ids".to_string(), int(vec![0, 0, 1, 1, 0, 0, 1, 1])),
        ("attention_mask".to_string(), int(vec![1, 1, 1, 0, 1, 1, 1, 1])),
        ("labels".to_string(), int(vec![-100, 9, -100, 2, 7, -100, 5, -100])),
    ]);
    let interp = Interpreter { rounding: Rounding::F64, seed: 9 };
    let mut state = interp.init_state(graph).unwrap();
    let out = interp.step(graph, &mut state, &[feeds], 0).unwrap();
    (out.micro_batches[0]["loss"].item().unwrap(), state)
}

#[test]
fn a_recomputed_step_is_the_same_step() {
    let train = TrainingSpec { dropout: Some(0.1), ..TrainingSpec::default() };
    for file in
        ["tiny/tiny-bert.ron", "tiny/tiny-mosaicbert.ron", "tiny/tiny-megatron-bert.ron", "tiny/tiny-albert.ron"]
    {
        let m = model(file);
        // Budgets between the fixed policies' stored bytes (of the unfused
        // attention, where selective recomputes something), and one nothing fits.
        let at = hint(32, 128);
        let stored = |p| stored_and_recomputed(&compiled(&m, &train, p, &["attention", "fuse"]), &at).0;
        let (none, selective, full) = (stored(Policy::None), stored(Policy::Selective), stored(Policy::Full));
        let optimal = [(none + selective) / 2, (selective + full) / 2, 0].map(|b| Policy::Optimal { budget_bytes: b });
        for disabled in [&["attention", "fuse"][..], &["attention"], &["fuse"], &[]] {
            let flash = !disabled.contains(&"attention");
            let (loss, state) = step(&compiled(&m, &train, Policy::None, disabled));
            for policy in [Policy::Full, Policy::Selective].into_iter().chain(optimal) {
                let graph = compiled(&m, &train, policy, disabled);
                let clones: Vec<_> = graph.nodes().filter(|n| n.name.ends_with(".recompute")).collect();
                assert!(clones.iter().all(|n| n.phase == Phase::Backward), "{file} {policy:?}");
                // Fused attention stores no seq² values: selective finds nothing
                // to recompute, and a budget may be met by keeping everything.
                let must_clone = policy == Policy::Full || !flash;
                assert!(!must_clone || !clones.is_empty(), "{file} {policy:?} {disabled:?}: nothing recomputed");
                if flash && policy == Policy::Selective {
                    assert!(clones.is_empty(), "{file}: selective recomputes {:?}", clones[0].name);
                }
                let (other_loss, other_state) = step(&graph);
                // Dropout redraws the identical mask: with the same ops the results are bitwise equal.
                assert_eq!(loss.to_bits(), other_loss.to_bits(), "{file} {policy:?} {disabled:?}");
                assert_eq!(state, other_state, "{file} {policy:?} {disabled:?}");
            }
        }
    }
}

/// Every recomputed value is read. A pre-LN layer's last dropout (its
/// gradient needs only the mask, redrawn) was once cloned all the same: a
/// dead clone, which `fuse` made a kernel with no output that the host
/// runtime could not load (`runtime/tests/planner_invariants.rs` found it).
#[test]
fn every_recomputed_value_is_read() {
    let train = TrainingSpec::default();
    for file in tiny_models() {
        let m = model(&file);
        for policy in [Policy::Full, Policy::Selective] {
            for disabled in [&["fuse"][..], &[]] {
                let g = compiled_at(&m, &train, policy, disabled, &hint(2, 8));
                for n in g.node_indices().filter(|&n| g.node(n).name.contains(".recompute")) {
                    let name = &g.node(n).name;
                    assert!(!g.node(n).outputs.is_empty(), "{file} {policy:?} {disabled:?}: {name} has no output");
                    assert!(!g.users(n).is_empty(), "{file} {policy:?} {disabled:?}: nothing reads {name}");
                }
            }
        }
    }
}

#[test]
fn recomputation_lowers_activation_memory() {
    let train = TrainingSpec { precision: Compute::Bf16, ..TrainingSpec::default() };
    let m = model("bert-base.ron");
    let bindings = [("batch".to_string(), 8), ("seq".to_string(), 512)].into();
    let activations = |policy| {
        // The unfused attention: selective recomputation has its seq² values to drop.
        let p = plan(&compiled(&m, &train, policy, &["attention"]), &bindings).unwrap();
        (p.at_peak[&Category::Activations], p.arena.size)
    };
    let (none, _) = activations(Policy::None);
    let (selective, _) = activations(Policy::Selective);
    let (full, _) = activations(Policy::Full);
    assert!(full < selective && selective < none, "none {none}, selective {selective}, full {full}");
    // Full recomputation keeps the 12 layer inputs (b·s·h bf16 each) plus
    // one layer's working set while it is recomputed and differentiated:
    // its stored activations (none's per layer) and their gradients.
    // The MLM head's bf16 logits (b·s·V) are live at the peak either way.
    let layer_inputs = m.layers * 8 * 512 * m.hidden * 2;
    let logits = 8 * 512 * m.vocab_size * 2;
    let one_layer = (none - logits) / m.layers;
    assert!(full >= layer_inputs, "full {full} keeps less than the layer inputs {layer_inputs}");
    assert!(
        full <= layer_inputs + logits + 2 * one_layer,
        "full {full}: inputs {layer_inputs} + logits {logits} + one layer {one_layer}"
    );
}

#[test]
fn optimal_recomputes_no_more_than_a_fixed_policy_storing_as_much() {
    let train = TrainingSpec { precision: Compute::Bf16, ..TrainingSpec::default() };
    let mut cases: Vec<(String, Bindings)> = tiny_models().into_iter().map(|file| (file, hint(2, 16))).collect();
    cases.push(("bert-base.ron".to_string(), hint(8, 128)));
    for (file, at) in cases {
        let m = model(&file);
        for fixed in [Policy::None, Policy::Selective, Policy::Full] {
            let (budget, flops) = stored_and_recomputed(&compiled_at(&m, &train, fixed, &["fuse"], &at), &at);
            let optimal = compile_at(&m, &train, Policy::Optimal { budget_bytes: budget }, &["fuse"], &at);
            let (stored, optimal_flops) = stored_and_recomputed(&optimal.graph, &at);
            assert!(stored <= budget, "{file} {fixed:?}: optimal stores {stored} > {budget}");
            // The dynamic program's model of the stored bytes is the measurement.
            assert_eq!(stat(&optimal, "stored bytes"), stored.to_string(), "{file} {fixed:?}");
            assert!(
                optimal_flops <= flops * (1.0 + 1e-12),
                "{file} {fixed:?}: optimal recomputes {optimal_flops} > {flops} FLOPs"
            );
        }
    }
}

#[test]
fn a_budget_between_policies_mixes_layers() {
    let train = TrainingSpec { precision: Compute::Bf16, ..TrainingSpec::default() };
    let m = model("bert-base.ron");
    let at = hint(8, 128);
    let unfused = ["attention", "fuse"];
    let measure = |p| stored_and_recomputed(&compiled_at(&m, &train, p, &unfused, &at), &at);
    let ((none, _), (selective, selective_flops)) = (measure(Policy::None), measure(Policy::Selective));
    let budget = (none + selective) / 2;
    let graph = compiled_at(&m, &train, Policy::Optimal { budget_bytes: budget }, &unfused, &at);
    let (stored, flops) = stored_and_recomputed(&graph, &at);
    let recomputing: BTreeSet<&str> =
        graph.nodes().filter(|n| n.name.ends_with(".recompute")).filter_map(|n| n.name.split('.').next()).collect();
    assert!(stored <= budget && flops < selective_flops, "stored {stored} of {budget}, {flops} FLOPs");
    assert!(
        !recomputing.is_empty() && recomputing.len() < m.layers as usize,
        "the layers recomputing: {recomputing:?}"
    );
}

#[test]
fn regions_are_attention_feed_forward_and_the_layer_less_its_boundary() {
    let train = TrainingSpec { dropout: Some(0.1), ..TrainingSpec::default() };
    let names_of = |file: &str, layer: u64, choice: Choice, disabled: &[&str]| {
        let graph = compiled(&model(file), &train, Policy::None, disabled);
        let layers = Layers::of(&graph, &graph.topo_order());
        let region = layers.region(&graph, layer, choice);
        let mut names: Vec<String> = region.keys().map(|&n| graph.node(n).name.to_string()).collect();
        names.sort();
        names
    };
    let names =
        |file: &str, layer: u64, choice: Choice| names_of(file, layer, choice, &["attention", "recompute", "fuse"]);
    let attention = ["attn.masked", "attn.probs", "attn.probs_dropout", "attn.scaled", "attn.scores"];
    assert_eq!(names("tiny/tiny-bert.ron", 0, Choice::Attention), attention.map(|s| format!("layer0.{s}")));
    assert_eq!(
        names("tiny/tiny-bert.ron", 1, Choice::FeedForward),
        ["layer1.ffn.act", "layer1.ffn.up", "layer1.ffn.up.mm"]
    );
    // GLU: the fused gate/up product, its halves, the activation, the gated product and its dropout.
    let glu = ["ffn.act", "ffn.dropout", "ffn.gate_up.mm", "ffn.gate_up.split", "ffn.glu"];
    assert_eq!(names("tiny/tiny-mosaicbert.ron", 0, Choice::FeedForward), glu.map(|s| format!("layer0.{s}")));
    assert!(names("tiny/tiny-bert.ron", 0, Choice::Keep).is_empty());
    // A layer keeps its output for the next layer; the last layer's output only the head reads.
    let first = names("tiny/tiny-bert.ron", 0, Choice::Layer);
    let last = names("tiny/tiny-bert.ron", 1, Choice::Layer);
    assert!(!first.contains(&"layer0.ffn.norm".to_string()) && first.contains(&"layer0.ffn.residual".to_string()));
    assert!(last.contains(&"layer1.ffn.norm".to_string()), "{last:?}");
    // Fused attention holds no seq² values: its attention region is empty,
    // and recomputing the layer clones the fused op (both outputs) whole.
    let fused = &["recompute", "fuse"][..];
    assert!(names_of("tiny/tiny-bert.ron", 0, Choice::Attention, fused).is_empty());
    assert!(names_of("tiny/tiny-mosaicbert.ron", 0, Choice::Layer, fused).contains(&"layer0.attn.context".to_string()));
    // Working copies of weights are model state.
    let bf16 = TrainingSpec { precision: Compute::Bf16, ..train };
    let graph = compiled(&model("tiny/tiny-bert.ron"), &bf16, Policy::None, &["attention", "recompute", "fuse"]);
    let layers = Layers::of(&graph, &graph.topo_order());
    assert!(layers.region(&graph, 0, Choice::Layer).keys().all(|&n| !graph.node(n).name.ends_with(".bf16")));
}

#[test]
fn policies_read_back_their_names() {
    let optimal = |budget_bytes| Policy::Optimal { budget_bytes };
    assert_eq!(optimal(4 * GIB).name(), "optimal:4GiB");
    assert_eq!(optimal(512 * MIB).name(), "optimal:512MiB");
    assert_eq!(optimal(4_000_000_000).name(), "optimal:4000000000");
    assert_eq!(Policy::from_name("optimal:4000000000"), Some(optimal(4_000_000_000)));
    assert_eq!(Policy::from_name("optimal:1.5GiB"), Some(optimal(1536 * MIB)));
    assert_eq!(Policy::from_name("optimal:4GB"), Some(optimal(4_000_000_000)));
    let policies =
        [Policy::None, Policy::Full, Policy::Selective, optimal(4 * GIB), optimal(512 * MIB), optimal(123), optimal(0)];
    for p in policies {
        assert_eq!(Policy::from_name(&p.name()), Some(p), "{}", p.name());
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p, "{json}");
    }
    for bad in ["optimal", "optimal:", "optimal:4XB", "optimal:-1GiB", "Optimal:4GiB", "fastest"] {
        assert_eq!(Policy::from_name(bad), None, "{bad}");
    }
}

/// The nodes of `g`: names and operands, in order.
fn listing(g: &Graph) -> Vec<(String, Vec<zeroplan_ir::Value>)> {
    g.nodes().map(|n| (n.name.to_string(), n.operands().to_vec())).collect()
}

#[test]
fn a_step_weighed_ahead_recomputes_as_one_weighed_by_the_pass_and_another_steps_weighing_is_not_taken() {
    use std::sync::Arc;
    use zeroplan_passes::pipeline::{Resume, compile_between};
    use zeroplan_passes::recompute::optimal::step_costs;
    let train = TrainingSpec { precision: Compute::Bf16, ..TrainingSpec::default() };
    let (m, at) = (model("bert-base.ron"), hint(8, 128));
    let unfused = ["attention", "fuse"];
    let ((none, _), (selective, _)) = (
        stored_and_recomputed(&compiled_at(&m, &train, Policy::None, &unfused, &at), &at),
        stored_and_recomputed(&compiled_at(&m, &train, Policy::Selective, &unfused, &at), &at),
    );
    let policy = Policy::Optimal { budget_bytes: (none + selective) / 2 };
    let options = |weighed| PassOptions {
        recompute: policy,
        disabled: unfused.iter().map(|s| s.to_string()).collect(),
        shape_hint: at.clone(),
        weighed,
        ..PassOptions::default()
    };
    let target = Target::Training(&train);
    let before =
        |m: &ModelSpec| compile_between(m, &target, options(None), Resume::Build, Some("training-step")).unwrap().graph;
    let after = |graph: Graph, weighed| {
        let from = Resume::After { graph: Box::new(graph), after: "training-step" };
        compile_between(&m, &target, options(weighed), from, None).unwrap().graph
    };
    let step = before(&m);
    let weighed = Arc::new(step_costs(&step, &at).unwrap());
    let by_pass = listing(&after(step.clone(), None));
    assert!(by_pass.iter().any(|(name, _)| name.ends_with(".recompute")), "the budget recomputes something");
    assert!(listing(&after(step.clone(), Some(weighed))) == by_pass, "the weighing handed over recomputes otherwise");
    // A shorter stack's weighing, handed over by mistake, is weighed again.
    let short = ModelSpec { layers: 2, ..m.clone() };
    let other = Arc::new(step_costs(&before(&short), &at).unwrap());
    assert!(listing(&after(step, Some(other))) == by_pass, "another step's weighing was taken");
}
