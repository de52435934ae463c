//! ZeRO partitioning: one rank trains exactly as the per-parameter step;
//! many ranks hold and move what the ZeRO formulas say.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::load_model as model;
use std::collections::BTreeMap;
use zeroplan_ir::interp::{Interpreter, Rounding};
use zeroplan_ir::plan::{DataParallel, Offload};
use zeroplan_ir::spec::{ModelSpec, Precision as Compute, TrainingSpec};
use zeroplan_ir::{DType, Graph, Op, Phase, Place, Tensor};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};

fn compiled(m: &ModelSpec, train: &TrainingSpec, dp: Option<DataParallel>, fuse: bool) -> Graph {
    let disabled = if fuse { Default::default() } else { ["fuse".to_string()].into() };
    let options = PassOptions { data_parallel: dp, disabled, ..PassOptions::default() };
    compile(m, &Target::Training(train), options).unwrap_or_else(|e| panic!("{dp:?}: {e}")).graph
}

fn feeds(k: i64) -> BTreeMap<String, Tensor> {
    let int = |v: Vec<i64>| Tensor::int(vec![2, 4], DType::I64, v).unwrap();
    BTreeMap::from([
        ("input_ids".to_string(), int(vec![3, 9, 1, 22, 7, 4, 4, 18].into_iter().map(|x| (x + k) % 30).collect())),
        ("token_type_ids".to_string(), int(vec![0, 0, 1, 1, 0, 0, 1, 1])),
        ("attention_mask".to_string(), int(vec![1, 1, 1, 0, 1, 1, 1, 1])),
        ("labels".to_string(), int(vec![-100, 9, -100, 2, 7, -100, 5, -100])),
    ])
}

/// The losses of three steps: the second and third read every parameter
/// the optimizer updated.
fn losses(graph: &Graph, micro_batches: u64) -> Vec<f64> {
    let interp = Interpreter { rounding: Rounding::F64, seed: 5 };
    let mut state = interp.init_state(graph).unwrap_or_else(|e| panic!("{e}"));
    (0..3)
        .map(|step| {
            let batch: Vec<_> = (0..micro_batches as i64).map(|k| feeds(k + step as i64)).collect();
            let out = interp.step(graph, &mut state, &batch, step).unwrap_or_else(|e| panic!("{e}"));
            out.micro_batches[0]["loss"].item().unwrap()
        })
        .collect()
}

fn one_rank(zero_stage: u8, offload: Offload) -> DataParallel {
    DataParallel { ranks: 1, zero_stage, offload }
}

#[test]
fn one_rank_trains_as_the_per_parameter_step() {
    for file in ["tiny/tiny-bert.ron", "tiny/tiny-mosaicbert.ron", "tiny/tiny-albert.ron"] {
        let m = model(file);
        for (precision, micro_batches) in [(Compute::F32, 1), (Compute::Bf16, 2)] {
            let train = TrainingSpec { precision, micro_batches, dropout: Some(0.1), ..TrainingSpec::default() };
            let reference = losses(&compiled(&m, &train, None, false), micro_batches);
            for (stage, offload) in
                [(0, Offload::None), (1, Offload::Optimizer), (2, Offload::None), (3, Offload::None)]
            {
                for fuse in [false, true] {
                    let graph = compiled(&m, &train, Some(one_rank(stage, offload)), fuse);
                    assert!(graph.op_histogram().contains_key("flatten"), "{file}: flat buckets");
                    let got = losses(&graph, micro_batches);
                    for (a, b) in got.iter().zip(&reference) {
                        // Only the order of the squared-norm sum differs.
                        assert!(
                            (a - b).abs() <= 1e-12 * b.abs(),
                            "{file} {precision:?} stage {stage}: {got:?} vs {reference:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn offload_puts_the_optimizer_on_the_host() {
    let train = TrainingSpec { precision: Compute::Bf16, ..TrainingSpec::default() };
    let dp = DataParallel { ranks: 4, zero_stage: 2, offload: Offload::Optimizer };
    let graph = compiled(&model("tiny/tiny-bert.ron"), &train, Some(dp), true);
    let host: Vec<&str> =
        graph.nodes().filter(|n| n.place == Place::Host && !matches!(n.op, Op::Copy)).map(|n| &*n.name).collect();
    assert!(host.iter().any(|n| n.ends_with(".master")) && host.iter().any(|n| n.ends_with(".adam_m")), "{host:?}");
    assert!(host.iter().all(|n| !n.ends_with(".params")), "16-bit parameters stay on the device: {host:?}");
    let bad = DataParallel { ranks: 4, zero_stage: 2, offload: Offload::OptimizerAndParams };
    let options = PassOptions { data_parallel: Some(bad), ..PassOptions::default() };
    let err = compile(&model("tiny/tiny-bert.ron"), &Target::Training(&train), options).err().unwrap().to_string();
    assert!(err.contains("needs ZeRO stage 3"), "{err}");
}

/// bert-large's bf16 training step, fused, for `ranks` ranks at a ZeRO stage.
fn bert_large_bf16(ranks: u64, zero_stage: u8) -> Graph {
    let train = TrainingSpec { precision: Compute::Bf16, ..TrainingSpec::default() };
    let dp = DataParallel { ranks, zero_stage, offload: Offload::None };
    compiled(&model("bert-large.ron"), &train, Some(dp), true)
}

/// ZeRO's model states per rank kept across steps (Rajbhandari et al.,
/// 2020, §5), mixed precision: 2Ψ parameters, 2Ψ gradients, 12Ψ optimizer
/// states (fp32 masters and moments), each divided by N_d from its stage on;
/// the parameters from stage 1 on, where each rank updates only its shard and
/// the next step's forward gathers the whole.
fn zero_formula(stage: u8, psi: f64, ranks: f64) -> (f64, f64, f64) {
    let shard = |from: u8| if stage >= from { ranks } else { 1.0 };
    (2.0 * psi / shard(1), 2.0 * psi / shard(2), 12.0 * psi / shard(1))
}

#[test]
fn model_state_per_rank_follows_the_zero_formulas() {
    let ranks = 64;
    for stage in 0..=3 {
        let graph = bert_large_bf16(ranks, stage);
        let (bytes, psi) = zeroplan_passes::accounting::model_state_bytes(&graph);
        let (params, grads, optimizer) = zero_formula(stage, psi as f64, ranks as f64);
        let got = (bytes.working_copies as f64, bytes.gradients as f64, (bytes.parameters + bytes.optimizer) as f64);
        // Padding: each bucket grows by less than ranks × 128 elements.
        let buckets = graph.op_histogram()["flatten"] as f64;
        let slack = |per_element: f64, sharded: bool| {
            buckets * (ranks * zeroplan_passes::partition::SHARD_ALIGN) as f64 * per_element
                / if sharded { ranks as f64 } else { 1.0 }
        };
        for (what, got, want, slack) in [
            ("parameters", got.0, params, slack(2.0, stage >= 1)),
            ("gradients", got.1, grads, slack(2.0, stage >= 2)),
            ("optimizer", got.2, optimizer, slack(12.0, stage >= 1)),
        ] {
            assert!(got >= want && got - want <= slack, "stage {stage} {what}: {got} vs formula {want} (+{slack})");
        }
    }
}

#[test]
fn each_rank_sends_two_psi_below_stage_three_and_three_psi_at_it() {
    let ranks = 8;
    for stage in 0..=3 {
        let graph = bert_large_bf16(ranks, stage);
        let psi = graph.parameter_count() as f64;
        let traffic = zeroplan_passes::cost::comm::traffic(&graph, 1, &Default::default());
        let sent: f64 = traffic.values().map(|t| t.elements).sum();
        // Ring collectives send (r−1)/r of the whole per pass.
        let passes = if stage == 3 { 3.0 } else { 2.0 };
        let want = passes * psi * (ranks - 1) as f64 / ranks as f64;
        assert!(sent >= want && sent < want * 1.01, "stage {stage}: {sent} elements vs {want}: {traffic:?}");
        let kinds: Vec<&str> = traffic.keys().copied().collect();
        let expected: &[&str] = match stage {
            0 => &["all_reduce"],
            _ => &["all_gather", "all_reduce", "reduce_scatter"],
        };
        assert_eq!(kinds, expected, "stage {stage}");
    }
}

/// From stage 1 on the forward gathers each bucket's updated shards, one
/// all-gather a bucket, one layer ahead of its readers; stages 1–2 keep that
/// copy for the backward, stage 3 gathers again for it. None gathers in the
/// optimizer phase, after the update, where no compute is left to hide it.
#[test]
fn parameters_are_gathered_by_the_forward_from_stage_one_on() {
    for stage in 0..=3 {
        let graph = bert_large_bf16(8, stage);
        let buckets = graph.op_histogram()["flatten"];
        let gathers = |phase: Phase| {
            let gathers = graph.nodes().filter(|n| matches!(n.op, Op::AllGather { .. }));
            gathers.filter(|n| n.phase == phase).count()
        };
        let (forward, backward) = match stage {
            0 => (0, 0),
            1 | 2 => (buckets, 0),
            _ => (buckets, buckets),
        };
        assert_eq!(gathers(Phase::Forward), forward, "stage {stage}: the forward's all-gathers");
        assert_eq!(gathers(Phase::Backward), backward, "stage {stage}: the backward's all-gathers");
        assert_eq!(gathers(Phase::Optimizer), 0, "stage {stage}: the optimizer phase's all-gathers");
    }
}
