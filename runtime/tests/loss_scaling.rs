//! fp16 dynamic loss scaling on the host runtime, under an injected
//! overflow: a regression batch whose labels are far off (100 against
//! predictions near 0) has a finite loss (≈ 10⁴ < 65504) but a loss
//! gradient of ≈ 100 per sequence, which the loss scale of 1024 takes past
//! fp16's largest value. The step that sees it must be skipped — every
//! parameter, fp32 master, AdamW moment and the step counter bitwise as
//! before it — and the scale multiplied by the backoff; the following clean
//! steps apply, the scale grows again after `growth_interval` of them, and
//! no NaN or infinity ever reaches the state. On several data-parallel
//! ranks the overflow is injected into one rank's batch alone, and every
//! rank skips together, whatever ZeRO shards it holds and wherever (host
//! AdamW under offload) its optimizer runs. (The overflow reaches every
//! gradient bucket, so this does not single out the all-reduce of the
//! squared norm that would carry an overflow confined to one shard.)
//!
//! The step log's `loss_scale` is the scale the step ran with, as the
//! interpreter reports it (the host runtime once read it back after the
//! optimizer had updated it in place, so it logged the next step's scale
//! and a gradient norm off by the backoff or growth factor).

use std::sync::Arc;

use zeroplan_ir::interp::{Feeds, Rounding as Exactness, State};
use zeroplan_ir::plan::{DataParallel, Offload, Program};
use zeroplan_ir::spec::{LossScaling, ModelSpec, Precision, TrainingSpec};
use zeroplan_ir::{Bindings, DType, Tensor};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::comm::{Communicator, InProcess};
use zeroplan_runtime::reference::{ReferenceTrainer, StepLog};

mod common;

use common::{BATCH, SEQ, batch, model};

/// The state a skipped step still changes: the scale, and the count of
/// clean steps since the last overflow (reset).
const SCALER_STATE: [&str; 2] = ["train.loss_scale", "train.good_steps"];
const SCALING: LossScaling = LossScaling { initial_scale: 1024.0, growth_interval: 2, growth: 2.0, backoff: 0.5 };
/// The step (1-based) whose batch overflows, on the last rank.
const OVERFLOW_AT: usize = 2;

fn program(model: &ModelSpec, train: &TrainingSpec, dp: DataParallel) -> Program {
    let bindings: Bindings = [("batch".to_string(), BATCH as u64), ("seq".to_string(), SEQ as u64)].into();
    let options = PassOptions { shape_hint: bindings.clone(), data_parallel: Some(dp), ..PassOptions::default() };
    let graph = compile(model, &Target::Training(train), options).unwrap_or_else(|e| panic!("{e}")).graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).unwrap();
    zeroplan_passes::planner::program::program(graph, &memory, BATCH as u64, SEQ as u64)
}

/// Rank `rank`'s batch at `step`: labels of 100 at the overflowing step on
/// the last rank, the usual ones (within ±3) otherwise.
fn feeds(model: &ModelSpec, step: usize, rank: usize, ranks: usize) -> Feeds {
    let mut f = batch(model, (step * ranks + rank) as i64);
    if step == OVERFLOW_AT && rank == ranks - 1 {
        f.insert("labels".into(), Tensor::float(vec![BATCH], DType::F32, vec![100.0; BATCH]).unwrap());
    }
    f
}

/// `state` less the loss scaler's own.
fn without_scaler(mut state: State) -> State {
    for name in SCALER_STATE {
        state.remove(name).unwrap_or_else(|| panic!("no `{name}`: the program does not scale its loss"));
    }
    state
}

fn all_finite(state: &State) -> bool {
    state.values().filter_map(|t| t.floats()).all(|x| x.iter().all(|v| v.is_finite()))
}

/// Five steps of tiny-bert-sts in fp16 on `ranks` ranks, the last rank's
/// batch overflowing at step [`OVERFLOW_AT`]; returns the steps' logs.
fn train_through_an_overflow(ranks: usize, zero_stage: u8, offload: Offload) -> Vec<StepLog> {
    let what = format!("{ranks} ranks, ZeRO-{zero_stage}, offload {offload:?}");
    let model = model("tiny-bert-sts");
    let train = TrainingSpec { precision: Precision::F16(SCALING), lr: 1e-2, dropout: Some(0.0), ..Default::default() };
    let plan = program(&model, &train, DataParallel { ranks: ranks as u64, zero_stage, offload });
    let mut hosts: Vec<HostProgram> = InProcess::group(ranks)
        .into_iter()
        .map(|c| {
            let comm: Arc<dyn Communicator> = Arc::new(c);
            HostProgram::load_rank(plan.clone(), 7, comm).unwrap_or_else(|e| panic!("{what}: {e}"))
        })
        .collect();
    let mut logs = Vec::new();
    for step in 1..=5 {
        let before: Vec<State> = hosts.iter().map(|h| without_scaler(h.state())).collect();
        let rank_logs: Vec<StepLog> = std::thread::scope(|s| {
            let running: Vec<_> = hosts
                .iter_mut()
                .enumerate()
                .map(|(r, host)| {
                    let f = feeds(&model, step, r, ranks);
                    s.spawn(move || host.step(&[f]).map(|o| o.outputs))
                })
                .collect();
            running
                .into_iter()
                .map(|r| r.join().unwrap().unwrap_or_else(|e| panic!("{what}, step {step}: {e}")))
                .map(|out| StepLog::from_rank_outputs(step as u64, &out, ranks as u64).unwrap())
                .collect()
        });
        let at = format!("{what}, step {step}");
        for (r, (host, log)) in hosts.iter().zip(&rank_logs).enumerate() {
            assert_eq!(log.skipped, step == OVERFLOW_AT, "{at}: rank {r}'s step {log:?}");
            assert_eq!(log.loss_scale, rank_logs[0].loss_scale, "{at}: the ranks' loss scales differ");
            assert!(log.loss.is_finite(), "{at}: rank {r}'s loss is {}: the injection overflowed the loss", log.loss);
            let after = host.state();
            assert!(all_finite(&after), "{at}: a NaN or infinity reached rank {r}'s state");
            let unchanged = without_scaler(after) == before[r];
            assert_eq!(unchanged, log.skipped, "{at}: rank {r}'s state changed: {}", !unchanged);
        }
        logs.push(rank_logs[0].clone());
    }
    let scales: Vec<f64> = logs.iter().map(|l| l.loss_scale.unwrap()).collect();
    let (s, back, grow) = (SCALING.initial_scale, SCALING.backoff, SCALING.growth);
    // Step 1 clean, step 2 overflows (backoff), steps 3–4 clean (growth after two).
    assert_eq!(scales, [s, s, s * back, s * back, s * back * grow], "{what}: the scale each step ran with");
    logs
}

#[test]
fn an_injected_fp16_overflow_skips_the_step_backs_off_and_training_goes_on() {
    let one_rank = train_through_an_overflow(1, 0, Offload::None);
    // The interpreter, on the same program graph and batches, skips the same
    // step at the same scales: the host's loss scaling is the oracle's.
    let model = model("tiny-bert-sts");
    let train = TrainingSpec { precision: Precision::F16(SCALING), lr: 1e-2, dropout: Some(0.0), ..Default::default() };
    let graph = program(&model, &train, DataParallel { ranks: 1, zero_stage: 0, offload: Offload::None }).graph;
    let mut reference = ReferenceTrainer::new(graph, 7, Exactness::Native).unwrap();
    for (step, host) in (1..=5).zip(&one_rank) {
        let want = reference.step(&[feeds(&model, step, 0, 1)]).unwrap();
        assert_eq!((host.skipped, host.loss_scale), (want.skipped, want.loss_scale), "step {step}");
    }
}

#[test]
fn an_overflow_on_one_rank_skips_the_step_on_every_rank() {
    for (ranks, stage, offload) in
        [(2, 0, Offload::None), (2, 2, Offload::Optimizer), (3, 3, Offload::None), (2, 3, Offload::OptimizerAndParams)]
    {
        train_through_an_overflow(ranks, stage, offload);
    }
}
