//! Checkpoints of tensor-parallel runs: a save holds the model as one rank
//! holds it (split parameters and their moments joined along their axis,
//! the vocabulary padding dropped, replicated ones once), so a run saved on
//! `t` tensor × `d` data ranks after two steps resumes
//!
//! - on the same ranks and stage bit for bit (each rank reads its own file),
//! - on any other `t`, `d` or ZeRO stage (the same global batch) following
//!   the uninterrupted run's losses within 1e-6 relative and ending at its
//!   weights within 2e-5 — the bounds of `tensor_parallel.rs` and `ranks.rs`,
//!   for their reason: AdamW turns rounding-level gradient differences into
//!   steps of up to `lr`.
//!
//! Dropout is 0, as in `tensor_parallel.rs`: a column-parallel attention
//! dropout draws other masks than one rank would.

use std::path::{Path, PathBuf};

use zeroplan_ir::interp::{Feeds, State};
use zeroplan_ir::plan::{DataParallel, Offload, Program};
use zeroplan_ir::spec::{ModelSpec, Precision, TrainingSpec};
use zeroplan_ir::{Bindings, Tensor};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::checkpoint::training::{self, Checkpoint, Layout, Logical, Manifest};
use zeroplan_runtime::comm::InProcess;
use zeroplan_runtime::reference::StepLog;

mod common;

use common::{BATCH, SEQ, batch, max_abs_diff, model, relative};

const SEED: u64 = 7;
const LR: f64 = 1e-3;

/// `t` tensor × `d` data ranks at ZeRO `stage` (no data parallelism when
/// `d` is 1 and `stage` is `None`), each replica accumulating `k`
/// micro-batches: `d·k` is the global batch.
#[derive(Clone, Copy, Debug)]
struct Config {
    t: usize,
    d: usize,
    stage: Option<u8>,
    k: u64,
    precision: Precision,
}

const fn grid(t: usize, d: usize, stage: u8, k: u64) -> Config {
    Config { t, d, stage: Some(stage), k, precision: Precision::F32 }
}

const fn alone(t: usize, k: u64) -> Config {
    Config { t, d: 1, stage: None, k, precision: Precision::F32 }
}

impl Config {
    /// The same in bf16: fp32 masters beside 16-bit parameters.
    const fn bf16(self) -> Config {
        Config { precision: Precision::Bf16, ..self }
    }

    fn data_parallel(&self) -> Option<DataParallel> {
        self.stage.map(|zero_stage| DataParallel { ranks: self.d as u64, zero_stage, offload: Offload::None })
    }
}

fn bindings() -> Bindings {
    [("batch".to_string(), BATCH as u64), ("seq".to_string(), SEQ as u64)].into()
}

fn program(model: &ModelSpec, config: Config) -> Program {
    let train = TrainingSpec {
        lr: LR,
        dropout: Some(0.0),
        micro_batches: config.k,
        precision: config.precision,
        ..TrainingSpec::default()
    };
    let options = PassOptions {
        shape_hint: bindings(),
        data_parallel: config.data_parallel(),
        tensor_parallel: (config.t > 1).then_some(config.t as u64),
        ..PassOptions::default()
    };
    let graph = compile(model, &Target::Training(&train), options).unwrap_or_else(|e| panic!("{e}")).graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings()).unwrap();
    zeroplan_passes::planner::program::program(graph, &memory, BATCH as u64, SEQ as u64)
}

/// The program on its `d·t` ranks (global rank `data·t + tensor`), from
/// `given[r]` where a state is given.
fn load(program: &Program, config: Config, given: Option<&[State]>) -> Vec<HostProgram> {
    InProcess::grid(config.d, config.t)
        .into_iter()
        .enumerate()
        .map(|(r, groups)| {
            let state = given.map(|g| g[r].clone()).unwrap_or_default();
            HostProgram::load_groups_with(program.clone(), SEED, groups, &state).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

/// Steps `from+1 ..= to`: global micro-batch `g` of step `s` is
/// `batch(s·G + g)`, replica `r` taking its `k` consecutive ones (each of
/// its tensor ranks the same). The replicas' mean loss of each step.
fn train(model: &ModelSpec, hosts: &mut [HostProgram], config: Config, from: u64, to: u64) -> Vec<f64> {
    let (t, d, k) = (config.t, config.d, config.k as usize);
    (from..to)
        .map(|step| {
            let feeds: Vec<Vec<Feeds>> = (0..d * t)
                .map(|g| (0..k).map(|i| batch(model, (step as usize * d * k + g / t * k + i) as i64)).collect())
                .collect();
            let logs: Vec<StepLog> = std::thread::scope(|s| {
                let runs: Vec<_> =
                    hosts.iter_mut().zip(&feeds).map(|(h, f)| s.spawn(move || h.step(f).unwrap().outputs)).collect();
                runs.into_iter()
                    .map(|r| StepLog::from_rank_outputs(step + 1, &r.join().unwrap(), d as u64).unwrap())
                    .collect()
            });
            logs.iter().step_by(t).map(|l| l.loss).sum::<f64>() / d as f64
        })
        .collect()
}

fn layout(model: &ModelSpec, program: &Program) -> Layout {
    Layout::of(&program.graph, &bindings(), model).unwrap()
}

/// A fresh directory for one test's saves.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zeroplan-tp-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Saves every rank's state as `train --save` does.
fn save(dir: &Path, model: &ModelSpec, program: &Program, config: Config, hosts: &[HostProgram]) {
    let step = hosts[0].steps_done();
    training::begin(dir, step).unwrap();
    let files = hosts.iter().enumerate().map(|(r, h)| training::save_rank(dir, step, r, &h.state()).unwrap()).collect();
    let layout = layout(model, program);
    let manifest = Manifest {
        format: training::format_of(&layout),
        step,
        seed: SEED,
        ranks: hosts.len(),
        data_parallel: config.data_parallel(),
        data: None,
        model: model.clone(),
        layout,
        files,
    };
    training::commit(dir, &manifest, 2).unwrap();
}

/// Resumes the newest save in `dir` as `config`, at the saved step.
fn resume(dir: &Path, model: &ModelSpec, config: Config) -> (Program, Vec<HostProgram>) {
    let plan = program(model, config);
    let checkpoint = Checkpoint::open(dir).unwrap();
    let states = checkpoint.states_for(&layout(model, &plan), config.d * config.t).unwrap_or_else(|e| panic!("{e}"));
    let mut hosts = load(&plan, config, Some(&states));
    for h in &mut hosts {
        h.set_steps_done(checkpoint.manifest.step);
    }
    (plan, hosts)
}

fn logical(model: &ModelSpec, program: &Program, hosts: &[HostProgram]) -> Logical {
    let states: Vec<State> = hosts.iter().map(HostProgram::state).collect();
    layout(model, program).consolidate(&states).unwrap()
}

/// Tiny-bert with `vocab` words (62 pads to 64 over 4 tensor ranks).
fn tiny_bert(vocab: u64) -> ModelSpec {
    ModelSpec { vocab_size: vocab, ..model("tiny-bert") }
}

#[test]
fn a_tensor_parallel_run_resumed_on_its_ranks_continues_bit_for_bit() {
    let cases = [
        (tiny_bert(64), alone(2, 1)),
        (tiny_bert(64), grid(2, 2, 2, 1)),
        (tiny_bert(62), alone(4, 1)),
        (tiny_bert(62), grid(4, 2, 2, 1).bf16()),
    ];
    for (i, (model, config)) in cases.into_iter().enumerate() {
        let what = format!("vocabulary {}, {config:?}", model.vocab_size);
        let plan = program(&model, config);
        let mut never_stopped = load(&plan, config, None);
        let want_losses = train(&model, &mut never_stopped, config, 0, 4);

        let dir = scratch(&format!("same-{i}"));
        let mut first = load(&plan, config, None);
        train(&model, &mut first, config, 0, 2);
        save(&dir, &model, &plan, config, &first);
        drop(first);
        let (_, mut resumed) = resume(&dir, &model, config);
        let losses = train(&model, &mut resumed, config, 2, 4);
        assert_eq!(losses, want_losses[2..], "{what}: the resumed losses differ");
        for (r, (a, b)) in resumed.iter().zip(&never_stopped).enumerate() {
            assert!(a.state() == b.state(), "{what}: rank {r}'s state differs from the uninterrupted run's");
        }

        // The logical view holds everything but the vocabulary padding: cut
        // again for the same layout, it gives back the saved shards, but for
        // the padding rows (of the parameter, and its master), now zeros.
        let checkpoint = Checkpoint::open(&dir).unwrap();
        let logical = checkpoint.logical().unwrap();
        let word = &logical["embeddings.word.weight"];
        assert_eq!(word.shape(), [model.vocab_size as usize, model.hidden as usize], "{what}: saved unpadded");
        let saved = checkpoint.rank_states().unwrap();
        let mut changed = 0;
        for (r, state) in saved.iter().enumerate() {
            let again = checkpoint.manifest.layout.distribute(&logical, r).unwrap();
            assert_eq!(again.keys().collect::<Vec<_>>(), state.keys().collect::<Vec<_>>(), "{what}: rank {r}");
            for (name, t) in &again {
                let (got, want) = (t.floats().unwrap(), state[name].floats().unwrap());
                for (g, w) in got.iter().zip(want).filter(|(g, w)| g != w) {
                    assert_eq!(*g, 0.0, "{what}: rank {r}'s `{name}` holds {g}, saved {w}");
                    changed += 1;
                }
            }
        }
        let padding = (64 - model.vocab_size as usize) * model.hidden as usize;
        let copies = config.d * if config.precision == Precision::F32 { 1 } else { 2 };
        assert!(
            (padding == 0) == (changed == 0) && changed <= padding * copies,
            "{what}: {changed} elements changed through the logical view; the padding is {padding}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_save_under_one_tensor_degree_resumes_under_another() {
    // Each pair has one global batch: d·k micro-batches a step.
    let cases = [
        (tiny_bert(64), alone(2, 1), alone(1, 1)),
        (tiny_bert(64), alone(1, 1), alone(2, 1)),
        (tiny_bert(64), grid(2, 2, 2, 1), alone(1, 2)),
        (tiny_bert(64), alone(1, 2), grid(2, 2, 2, 1)),
        (tiny_bert(64), grid(2, 2, 3, 1), grid(4, 1, 1, 2)),
        (tiny_bert(64), grid(2, 2, 3, 1), grid(2, 2, 0, 1)),
        (tiny_bert(62), alone(4, 1), alone(1, 1)),
        (tiny_bert(62), alone(1, 1), grid(4, 1, 3, 1)),
        // bf16: the fp32 masters are the parameters; the 16-bit copies are derived.
        (tiny_bert(62), grid(4, 2, 2, 1).bf16(), grid(2, 1, 1, 2).bf16()),
        (tiny_bert(62), grid(4, 2, 2, 1).bf16(), grid(4, 2, 3, 1).bf16()),
        (model("tiny-albert"), grid(2, 2, 1, 1), alone(4, 2)),
    ];
    for (i, (model, from, to)) in cases.into_iter().enumerate() {
        let what = format!("{} ({} words): {from:?} resumed as {to:?}", model.name, model.vocab_size);
        let plan = program(&model, from);
        let mut never_stopped = load(&plan, from, None);
        let want_losses = train(&model, &mut never_stopped, from, 0, 4);
        let want = logical(&model, &plan, &never_stopped);

        let dir = scratch(&format!("reshard-{i}"));
        let mut first = load(&plan, from, None);
        train(&model, &mut first, from, 0, 2);
        save(&dir, &model, &plan, from, &first);
        let (to_plan, mut resumed) = resume(&dir, &model, to);
        let losses = train(&model, &mut resumed, to, 2, 4);
        // bf16: another t or d rounds other partial sums to 16 bits (the standard bf16 bound).
        let (loss_bound, weight_bound) = if from.precision == Precision::F32 { (1e-6, 2e-5) } else { (1e-2, 1e-2) };
        let mut worst_loss = 0.0f64;
        for (step, (got, want)) in losses.iter().zip(&want_losses[2..]).enumerate() {
            let err = (got - want).abs() / want.abs();
            assert!(err <= loss_bound, "{what}: step {}: loss {got} vs {want} (relative {err:e})", step + 3);
            worst_loss = worst_loss.max(err);
        }
        let got = logical(&model, &to_plan, &resumed);
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{what}: the logical tensors");
        let mut worst = (0.0f64, String::new());
        for (name, t) in &want {
            assert_eq!(got[name].shape(), t.shape(), "{what}: {name}");
            let (a, b) = (got[name].floats().unwrap(), t.floats().unwrap());
            if name.contains("attn.k.bias") {
                // Zero gradient in exact arithmetic: AdamW moves it up to lr a step by rounding noise.
                assert!(max_abs_diff(a, b) <= 4.0 * LR * 1.0001, "{what}: {name}");
            } else {
                let err = relative(a, b);
                assert!(err <= weight_bound, "{what}: {name}: relative error {err:e}");
                if err > worst.0 {
                    worst = (err, name.clone());
                }
            }
        }
        println!("{what}: worst loss {worst_loss:.1e}, weight {:.1e} ({})", worst.0, worst.1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_tensor_parallel_save_exports_the_one_rank_model() {
    // The export of a TP-4 save of a padded vocabulary is the weights of the
    // same run on one rank: unpadded, every parameter under its own name.
    let model = tiny_bert(62);
    let (tp, one) = (alone(4, 1), alone(1, 1));
    let mut exported = Vec::new();
    for (i, config) in [tp, one].into_iter().enumerate() {
        let plan = program(&model, config);
        let mut hosts = load(&plan, config, None);
        train(&model, &mut hosts, config, 0, 1);
        let dir = scratch(&format!("export-{i}"));
        save(&dir, &model, &plan, config, &hosts);
        exported.push(Checkpoint::open(&dir).unwrap().weights().unwrap().1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    assert_eq!(exported[0].keys().collect::<Vec<_>>(), exported[1].keys().collect::<Vec<_>>());
    for (name, t) in &exported[1] {
        let got: &Tensor = &exported[0][name];
        assert_eq!(got.shape(), t.shape(), "{name}");
        let err = relative(got.floats().unwrap(), t.floats().unwrap());
        assert!(err <= 2e-5 || name.contains("attn.k.bias"), "{name}: relative error {err:e}");
    }
}

#[test]
fn a_damaged_tensor_parallel_save_is_refused_naming_what() {
    let model = tiny_bert(64);
    let config = grid(2, 2, 1, 1);
    let plan = program(&model, config);
    let dir = scratch("damaged");
    save(&dir, &model, &plan, config, &load(&plan, config, None));
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let mut states = checkpoint.rank_states().unwrap();
    let layout = &checkpoint.manifest.layout;

    // Tensor ranks that disagree on a replicated parameter.
    let gamma = "embeddings.norm.gamma";
    let slot = layout.slots.iter().find(|s| s.flat.as_ref().is_some_and(|f| f.members.iter().any(|m| m.name == gamma)));
    let slot = slot.map_or(gamma.to_string(), |s| s.name.clone());
    let mut changed = states[1][&slot].clone();
    changed.floats_mut().unwrap()[0] += 1.0;
    states[1].insert(slot, changed);
    let err = layout.consolidate(&states).unwrap_err();
    assert!(err.contains("is replicated") && err.contains("tensor rank 1"), "{err}");
    // Rank states that do not make whole replicas.
    let err = layout.consolidate(&states[..3]).unwrap_err();
    assert!(err.contains("3 rank states") && err.contains("2 tensor ranks"), "{err}");

    // A crafted split the ranks do not divide.
    let at = training::step_dir(&dir, 0).join(training::MANIFEST);
    let mut manifest: Manifest = serde_json::from_slice(&std::fs::read(&at).unwrap()).unwrap();
    let tp = manifest.layout.tensor_parallel.as_mut().unwrap();
    tp.splits.get_mut("layer0.attn.q.weight").unwrap().padded[0] = 33;
    std::fs::write(&at, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let err = Checkpoint::open(&dir).unwrap_err().to_string();
    assert!(err.contains("`layer0.attn.q.weight`") && err.contains("does not split over 2 ranks"), "{err}");

    // A logical tensor of another shape is named once, in the model's terms.
    let mut logical = checkpoint.logical().unwrap();
    logical.insert("layer0.attn.q.weight".into(), Tensor::full(vec![32, 31], zeroplan_ir::DType::F32, 0.0));
    let problems = layout.distribute(&logical, 3).unwrap_err();
    assert_eq!(problems, ["`layer0.attn.q.weight` is [32, 31] in the checkpoint, the program's is [32, 32]"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn weights_written_into_each_rank_alone_join_into_the_model() {
    // What a launched process does with --weights: only its own rank's state
    // at hand, the parameters written in, the moments left as they are.
    for (model, config) in [(tiny_bert(62), grid(4, 1, 3, 1)), (tiny_bert(64), grid(2, 2, 3, 1))] {
        let plan = program(&model, config);
        let mut hosts = load(&plan, config, None);
        train(&model, &mut hosts, config, 0, 1);
        let layout = layout(&model, &plan);
        let before = logical(&model, &plan, &hosts);
        let weights: Logical = before
            .iter()
            .filter(|(name, _)| !name.contains(".adam_") && !name.starts_with("train."))
            .map(|(name, t)| {
                let values = t.floats().unwrap().iter().map(|v| v + 0.5).collect();
                (name.clone(), Tensor::float(t.shape().to_vec(), t.dtype(), values).unwrap())
            })
            .collect();
        // The parameters alone: each has its moments beside it.
        assert!(weights.contains_key("embeddings.word.weight"));
        assert!(weights.keys().all(|n| before.contains_key(&format!("{n}.adam_m"))));
        let states: Vec<State> = hosts
            .iter()
            .enumerate()
            .map(|(r, h)| layout.overwrite(&h.state(), &weights, r).unwrap_or_else(|p| panic!("{p:?}")))
            .collect();
        let after = layout.consolidate(&states).unwrap();
        let mut want = before.clone();
        want.extend(weights.clone());
        assert!(after == want, "{config:?}: the parameters written, nothing else changed");
    }
}
