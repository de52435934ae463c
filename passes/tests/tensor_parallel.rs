//! Tensor-parallel training steps (Megatron-LM layers, `zeroplan_ir::build`)
//! through the whole pipeline, alone and under ZeRO: what each tensor rank
//! holds and which collectives it runs. Numerical equivalence with one rank
//! is checked where the ranks execute, in the runtime's tests.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::{closed_form_params, load_model as model, tiny_models};
use zeroplan_ir::plan::{DataParallel, Offload};
use zeroplan_ir::spec::{ModelSpec, Precision, Sharing, TrainingSpec};
use zeroplan_ir::{Graph, Init, Op, Phase};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};

fn step(m: &ModelSpec, t: u64, dp: Option<DataParallel>, train: &TrainingSpec) -> Result<Graph, String> {
    let options = PassOptions { tensor_parallel: Some(t), data_parallel: dp, ..PassOptions::default() };
    compile(m, &Target::Training(train), options).map(|c| c.graph).map_err(|e| e.to_string())
}

fn count(g: &Graph, phase: Phase, op: &str) -> usize {
    g.petgraph().node_weights().filter(|n| n.phase == phase && n.op.name() == op).count()
}

#[test]
fn every_family_splits_over_two_and_four_tensor_ranks() {
    let train = TrainingSpec::default();
    for file in tiny_models() {
        let m = model(&file);
        for t in [2, 4] {
            let g = step(&m, t, None, &train);
            if let Sharing::TemplateBank { .. } = m.sharing {
                let err = g.expect_err("template banks are not split");
                assert!(err.contains("template-bank"), "{file}: {err}");
                continue;
            }
            let g = g.unwrap_or_else(|e| panic!("{file} t={t}: {e}"));
            assert_eq!(g.tensor_parallel(), t, "{file}");
            // Every rank holds 1/t of the split weights and all of the
            // replicated ones: together the whole model, once.
            assert_eq!(g.model_parameter_count(), closed_form_params(&m), "{file} t={t}");
            let layers = m.layers as usize;
            let reduces = count(&g, Phase::Forward, "tensor_all_reduce");
            // Per layer: attention output and feed-forward down (row-parallel).
            // Once: the word embeddings; with the MLM head, the loss statistics.
            let head = usize::from(g.petgraph().node_weights().any(|n| n.op.name() == "cross_entropy_stats"));
            assert_eq!(reduces, 2 * layers + 1 + head, "{file} t={t}: forward tensor all-reduces");
            // The backward's are the adjoints of the column-parallel regions'
            // entries (attention and feed-forward per layer, and the MLM decoder).
            assert_eq!(count(&g, Phase::Backward, "tensor_all_reduce"), 2 * layers + head, "{file} t={t}");
            // The squared global norm is summed over the tensor ranks once.
            assert_eq!(count(&g, Phase::Optimizer, "tensor_all_reduce"), 1, "{file} t={t}");
        }
    }
}

#[test]
fn indivisible_heads_are_refused_with_the_divisors() {
    let m = model("tiny/tiny-bert.ron");
    let err = step(&m, 3, None, &TrainingSpec::default()).unwrap_err();
    assert!(err.contains("4 attention heads do not split evenly"), "{err}");
}

#[test]
fn zero_runs_over_the_data_parallel_ranks_of_each_tensor_rank() {
    let m = model("tiny/tiny-bert.ron");
    let train = TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() };
    for (zero_stage, offload) in [(0, Offload::None), (1, Offload::Optimizer), (2, Offload::None), (3, Offload::None)] {
        let dp = DataParallel { ranks: 2, zero_stage, offload };
        let g = step(&m, 2, Some(dp), &train).unwrap_or_else(|e| panic!("ZeRO-{zero_stage}: {e}"));
        assert_eq!(g.model_parameter_count(), closed_form_params(&m), "ZeRO-{zero_stage}");
        // Tensor shards and replicated parameters never share a flat
        // buffer: they count differently in the global norm.
        for p in g.params() {
            if let Op::Param { init: Init::Flat { members, .. } } = &g.node(p).op {
                let sharded = members.iter().filter(|m| m.init.tensor_shard_ranks().is_some()).count();
                assert!(sharded == 0 || sharded == members.len(), "{} mixes shards and whole", g.node(p).name);
            }
        }
        // Data-parallel collectives span the data ranks, tensor ones the tensor ranks.
        for n in g.petgraph().node_weights() {
            match n.op {
                Op::AllReduce { ranks } | Op::ReduceScatter { ranks } | Op::AllGather { ranks } => {
                    assert_eq!(ranks, 2)
                }
                Op::TensorAllReduce { ranks } => assert_eq!(ranks, 2),
                _ => {}
            }
        }
        assert_eq!(count(&g, Phase::Optimizer, "tensor_all_reduce"), 1, "ZeRO-{zero_stage}");
    }
}
