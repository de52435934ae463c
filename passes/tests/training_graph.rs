//! Training graphs build and verify for every family, precision and
//! accumulation setting, and state their model-state bytes.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::load_model as model;
use zeroplan_ir::spec::{Head, LossScaling, Precision, TrainingSpec};
use zeroplan_ir::{Op, Phase};
use zeroplan_passes::accounting::model_state_bytes;
use zeroplan_passes::training::{TrainError, training_graph};

fn precisions() -> [Precision; 3] {
    [Precision::F32, Precision::Bf16, Precision::F16(LossScaling::default())]
}

#[test]
fn every_family_precision_and_accumulation_builds() {
    for file in common::tiny_models() {
        let file = file.as_str();
        for precision in precisions() {
            for micro_batches in [1, 3] {
                let train = TrainingSpec { precision, micro_batches, ..TrainingSpec::default() };
                let graph =
                    training_graph(&model(file), &train).unwrap_or_else(|e| panic!("{file} {precision:?}: {e}"));
                let phases = graph.phase_counts();
                assert!(phases[&Phase::Backward] > phases[&Phase::Forward] / 2, "{file}: {phases:?}");
                let adamw = graph.op_histogram()["adamw"];
                assert_eq!(adamw, graph.params().len(), "{file}: one AdamW per parameter");
            }
        }
    }
}

#[test]
fn model_state_is_sixteen_bytes_per_parameter() {
    for precision in precisions() {
        let graph =
            training_graph(&model("bert-base.ron"), &TrainingSpec { precision, ..TrainingSpec::default() }).unwrap();
        let (bytes, params) = model_state_bytes(&graph);
        assert_eq!(params, 109_514_298);
        assert_eq!(bytes.total(), 16 * params, "{precision:?}: {bytes:?}");
        let expected_split = match precision {
            Precision::F32 => (4, 0, 4, 8),
            Precision::Bf16 | Precision::F16(_) => (4, 2, 2, 8),
        };
        let per = |b: u64| b / params;
        assert_eq!(
            (per(bytes.parameters), per(bytes.working_copies), per(bytes.gradients), per(bytes.optimizer)),
            expected_split
        );
    }
}

#[test]
fn accumulation_adds_f32_accumulators() {
    let train = TrainingSpec { precision: Precision::Bf16, micro_batches: 4, ..TrainingSpec::default() };
    let graph = training_graph(&model("tiny/tiny-bert.ron"), &train).unwrap();
    let (bytes, params) = model_state_bytes(&graph);
    // master 4 + working 2 + accumulator 4 + moments 8, plus the micro-batch's own bf16 gradient 2.
    assert_eq!((bytes.total() - bytes.micro_batch_gradients) / params, 18);
    assert_eq!(bytes.micro_batch_gradients / params, 2);
}

#[test]
fn shared_weights_get_one_summed_gradient() {
    let graph = training_graph(&model("tiny/tiny-albert.ron"), &TrainingSpec::default()).unwrap();
    // group0's query weight is read by both layers: its gradient is a sum.
    let sum = graph.node_by_name("grad.group0.attn.q.weight").expect("a summed gradient");
    assert_eq!(graph.node(sum).op, Op::Add);
    // The word embeddings feed the input embedding and the tied decoder.
    assert!(graph.node_by_name("grad.embeddings.word.weight").is_some());
}

#[test]
fn weight_decay_skips_biases_and_norms() {
    let graph =
        training_graph(&model("tiny/tiny-bert.ron"), &TrainingSpec { weight_decay: 0.1, ..TrainingSpec::default() })
            .unwrap();
    let decay = |name: &str| match &graph.node(graph.node_by_name(&format!("{name}.adamw")).unwrap()).op {
        Op::AdamW { weight_decay, .. } => *weight_decay,
        _ => unreachable!(),
    };
    assert_eq!(decay("layer0.attn.q.weight"), 0.1);
    assert_eq!(decay("layer0.attn.q.bias"), 0.0);
    assert_eq!(decay("layer0.attn.norm.gamma"), 0.0);
}

#[test]
fn the_bare_encoder_has_nothing_to_train() {
    let mut spec = model("tiny/tiny-bert.ron");
    spec.head = Head::Pooler;
    assert!(matches!(training_graph(&spec, &TrainingSpec::default()), Err(TrainError::NoLoss)));
}

#[test]
fn one_layer_training_graph_snapshot() {
    let mut spec = model("tiny/tiny-bert.ron");
    spec.layers = 1;
    let graph = training_graph(&spec, &TrainingSpec::default()).unwrap();
    insta::assert_snapshot!(graph.to_text());
}
