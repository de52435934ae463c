//! Recomputation changes lifetimes, never values.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::load_model as model;
use std::collections::BTreeMap;
use zeroplan_ir::interp::{Interpreter, Precision};
use zeroplan_ir::spec::{ModelSpec, Precision as Compute, TrainingSpec};
use zeroplan_ir::{DType, Graph, Phase, Tensor};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::memory::{Category, plan};
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_passes::recompute::Policy;

fn compiled(m: &ModelSpec, train: &TrainingSpec, policy: Policy, disabled: &[&str]) -> Graph {
    let options = PassOptions {
        recompute: policy,
        disabled: disabled.iter().map(|s| s.to_string()).collect(),
        ..PassOptions::default()
    };
    compile(m, &Target::Training(train), options).unwrap().graph
}

fn step(graph: &Graph) -> (f64, BTreeMap<String, Tensor>) {
    let int = |v: Vec<i64>| Tensor::int(vec![2, 4], DType::I64, v).unwrap();
    let feeds = BTreeMap::from([
        ("input_ids".to_string(), int(vec![3, 9, 1, 22, 7, 4, 4, 18])),
        ("token_type_ids".to_string(), int(vec![0, 0, 1, 1, 0, 0, 1, 1])),
        ("attention_mask".to_string(), int(vec![1, 1, 1, 0, 1, 1, 1, 1])),
        ("labels".to_string(), int(vec![-100, 9, -100, 2, 7, -100, 5, -100])),
    ]);
    let interp = Interpreter { precision: Precision::F64, seed: 9 };
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
        for disabled in [&["fuse"][..], &[]] {
            let (loss, state) = step(&compiled(&m, &train, Policy::None, disabled));
            for policy in [Policy::Full, Policy::Selective] {
                let graph = compiled(&m, &train, policy, disabled);
                let clones: Vec<_> =
                    graph.petgraph().node_weights().filter(|n| n.name.ends_with(".recompute")).collect();
                assert!(!clones.is_empty() && clones.iter().all(|n| n.phase == Phase::Backward), "{file} {policy:?}");
                let (other_loss, other_state) = step(&graph);
                // Dropout redraws the identical mask: with the same ops the results are bitwise equal.
                assert_eq!(loss.to_bits(), other_loss.to_bits(), "{file} {policy:?} {disabled:?}");
                assert_eq!(state, other_state, "{file} {policy:?} {disabled:?}");
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
        let p = plan(&compiled(&m, &train, policy, &[]), &bindings).unwrap();
        (p.at_peak[&Category::Activations], p.arena.size)
    };
    let (none, _) = activations(Policy::None);
    let (selective, _) = activations(Policy::Selective);
    let (full, _) = activations(Policy::Full);
    assert!(full < selective && selective < none, "none {none}, selective {selective}, full {full}");
    // Full recomputation keeps the 12 layer inputs (b·s·h bf16 each) plus
    // one layer's working set while it is recomputed and differentiated:
    // its stored activations (none's per layer) and their gradients.
    let layer_inputs = m.layers * 8 * 512 * m.hidden * 2;
    let one_layer = none / m.layers;
    assert!(full >= layer_inputs, "full {full} keeps less than the layer inputs {layer_inputs}");
    assert!(full <= layer_inputs + 2 * one_layer, "full {full}: inputs {layer_inputs} + one layer {one_layer}");
}
