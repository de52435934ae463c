//! Data-parallel execution on the host: a plan for two ranks, run as two
//! threads of this process joined by the in-process communicator, trains
//! as one rank accumulating the same two batches does. For every ZeRO
//! stage, with and without offload, the losses and the gradient norm of three steps equal the
//! reference interpreter's within 1e-5 relative (dropout on: the ranks draw
//! the masks the micro-batches would), and the replicated parameters of
//! stages 0–2 are the same bits on both ranks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use zeroplan_ir::interp::{Feeds, Precision as Exactness};
use zeroplan_ir::plan::{DataParallel, Offload, Program};
use zeroplan_ir::spec::{self, ModelSpec, TrainingSpec};
use zeroplan_ir::{Bindings, DType, Tensor};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::comm::{Communicator, InProcess};
use zeroplan_runtime::host::HostProgram;
use zeroplan_runtime::reference::{ReferenceTrainer, StepLog};

const RANKS: usize = 2;
const BATCH: usize = 2;
const SEQ: usize = 6;

fn model() -> ModelSpec {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny/tiny-bert.ron");
    spec::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// A masked-LM batch; `salt` varies the tokens.
fn batch(salt: i64) -> Feeds {
    let ints = |v: Vec<i64>| Tensor::int(vec![BATCH, SEQ], DType::I64, v).unwrap();
    let ids: Vec<i64> = (0..(BATCH * SEQ) as i64).map(|i| (i * 29 + salt * 11 + 3) % 64).collect();
    let labels = ids.iter().enumerate().map(|(i, &t)| if (i + salt as usize) % 3 == 1 { t } else { -100 }).collect();
    let mut mask = vec![1; BATCH * SEQ];
    mask[SEQ - 1] = 0;
    BTreeMap::from([
        ("input_ids".to_string(), ints(ids)),
        ("token_type_ids".to_string(), ints(vec![0; BATCH * SEQ])),
        ("attention_mask".to_string(), ints(mask)),
        ("labels".to_string(), ints(labels)),
    ])
}

fn program(train: &TrainingSpec, data_parallel: Option<DataParallel>) -> Program {
    let bindings: Bindings = [("batch".to_string(), BATCH as u64), ("seq".to_string(), SEQ as u64)].into();
    let options = PassOptions { shape_hint: bindings.clone(), data_parallel, ..PassOptions::default() };
    let graph = compile(&model(), &Target::Training(train), options).unwrap_or_else(|e| panic!("{e}")).graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).unwrap();
    zeroplan_passes::plan::program::program(graph, &memory, BATCH as u64, SEQ as u64)
}

fn close(what: &str, got: f64, want: f64) {
    let err = (got - want).abs() / want.abs().max(1e-12);
    assert!(err <= 1e-5, "{what}: {got} vs the reference's {want} (relative error {err:e})");
}

#[test]
fn two_ranks_train_as_one_rank_accumulating_their_batches() {
    let train = TrainingSpec { lr: 1e-2, dropout: Some(0.1), ..TrainingSpec::default() };
    let accumulated = TrainingSpec { micro_batches: RANKS as u64, ..train.clone() };
    let strategies = [
        (0, Offload::None),
        (1, Offload::None),
        (2, Offload::None),
        (3, Offload::None),
        (2, Offload::Optimizer),
        (3, Offload::OptimizerAndParams),
    ];
    for (stage, offload) in strategies {
        let dp = DataParallel { ranks: RANKS as u64, zero_stage: stage, offload };
        let plan = program(&train, Some(dp));
        let mut reference = ReferenceTrainer::new(program(&accumulated, None).graph, 7, Exactness::Native).unwrap();
        let group = InProcess::group(RANKS);
        let mut ranks: Vec<HostProgram> = group
            .into_iter()
            .map(|c| {
                let comm: Arc<dyn Communicator> = Arc::new(c);
                HostProgram::load_rank(plan.clone(), 7, comm).unwrap_or_else(|e| panic!("stage {stage}: {e}"))
            })
            .collect();
        for step in 0..3i64 {
            let feeds: Vec<Feeds> = (0..RANKS as i64).map(|r| batch(step * RANKS as i64 + r)).collect();
            let want = reference.step(&feeds).unwrap();
            let logs: Vec<StepLog> = std::thread::scope(|s| {
                let runs: Vec<_> = ranks
                    .iter_mut()
                    .zip(&feeds)
                    .map(|(host, f)| s.spawn(move || host.step(std::slice::from_ref(f)).map(|o| o.outputs)))
                    .collect();
                runs.into_iter()
                    .map(|r| r.join().unwrap().unwrap_or_else(|e| panic!("stage {stage}: {e}")))
                    .map(|out| StepLog::from_rank_outputs(step as u64 + 1, &out, RANKS as u64).unwrap())
                    .collect()
            });
            let what = format!("ZeRO-{stage} offload {offload:?}, step {}", step + 1);
            let mean_loss = logs.iter().map(|l| l.loss).sum::<f64>() / RANKS as f64;
            close(&format!("{what}: the ranks' mean loss"), mean_loss, want.loss);
            for (r, log) in logs.iter().enumerate() {
                close(&format!("{what}: rank {r}'s gradient norm"), log.grad_norm, want.grad_norm);
            }
        }
        if stage < 3 {
            let (a, b) = (ranks[0].weights(), ranks[1].weights());
            assert!(!a.is_empty());
            assert_eq!(a, b, "ZeRO-{stage}: replicated parameters differ between the ranks");
        }
    }
}

#[test]
fn a_plan_for_two_ranks_refuses_a_group_of_one() {
    let dp = DataParallel { ranks: 2, zero_stage: 1, offload: Offload::None };
    let err = HostProgram::load(program(&TrainingSpec::default(), Some(dp)), 0).err().expect("refused");
    assert!(err.to_string().contains("2 data-parallel ranks"), "{err}");
}
