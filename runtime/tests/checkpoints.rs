//! Sharded training checkpoints: a run saved after two steps and resumed
//! on the same ranks and stage continues bit for bit as if it had never
//! stopped; resumed on other ranks, another ZeRO stage, offload, or no data
//! parallelism at all (the same global batch), it follows the uninterrupted
//! run's losses within 1e-6 relative and ends at its weights within 2e-5
//! (the bounds of `ranks.rs`, for the same reasons). An unfinished save is
//! passed over; a save that does not fit the program is refused with every
//! problem listed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use zeroplan_ir::Bindings;
use zeroplan_ir::interp::{Feeds, State};
use zeroplan_ir::plan::{DataParallel, Offload, Program};
use zeroplan_ir::spec::{ModelSpec, Precision, TrainingSpec};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::checkpoint::training::{self, Checkpoint, Layout, Manifest};
use zeroplan_runtime::comm::{Communicator, InProcess};
use zeroplan_runtime::reference::{StepLog, data_parallel_ranks};

mod common;

use common::{BATCH, SEQ, batch, max_abs_diff, model, relative};

const SEED: u64 = 7;
const LR: f64 = 1e-3;

/// A configuration: ranks × micro-batches is the global batch.
#[derive(Clone, Copy, Debug)]
struct Config {
    data_parallel: Option<DataParallel>,
    micro_batches: u64,
    precision: Precision,
}

impl Config {
    fn zero(ranks: u64, zero_stage: u8, offload: Offload, micro_batches: u64) -> Config {
        let data_parallel = Some(DataParallel { ranks, zero_stage, offload });
        Config { data_parallel, micro_batches, precision: Precision::F32 }
    }

    fn ranks(&self) -> usize {
        self.data_parallel.map_or(1, |dp| dp.ranks as usize)
    }
}

fn bindings() -> Bindings {
    [("batch".to_string(), BATCH as u64), ("seq".to_string(), SEQ as u64)].into()
}

fn program(model: &ModelSpec, config: Config) -> Program {
    let train = TrainingSpec {
        lr: LR,
        dropout: Some(0.1),
        micro_batches: config.micro_batches,
        precision: config.precision,
        ..TrainingSpec::default()
    };
    let options = PassOptions { shape_hint: bindings(), data_parallel: config.data_parallel, ..PassOptions::default() };
    let graph = compile(model, &Target::Training(&train), options).unwrap_or_else(|e| panic!("{e}")).graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings()).unwrap();
    zeroplan_passes::planner::program::program(graph, &memory, BATCH as u64, SEQ as u64)
}

/// The program loaded on its ranks, from `given[r]` where a state is given.
fn load(program: &Program, given: Option<&[State]>) -> Vec<HostProgram> {
    let ranks = data_parallel_ranks(&program.graph) as usize;
    InProcess::group(ranks)
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            let comm: Arc<dyn Communicator> = Arc::new(c);
            let state = given.map(|g| g[r].clone()).unwrap_or_default();
            HostProgram::load_rank_with(program.clone(), SEED, comm, &state).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

/// Steps `from+1 ..= to` on every rank; global micro-batch `g` of step `s`
/// is `batch(s·G + g)`, rank r taking its k consecutive ones. The ranks'
/// mean loss of each step.
fn train(model: &ModelSpec, hosts: &mut [HostProgram], from: u64, to: u64) -> Vec<f64> {
    let (ranks, k) = (hosts.len(), hosts[0].micro_batches() as usize);
    let global = (ranks * k) as i64;
    (from..to)
        .map(|step| {
            let feeds: Vec<Vec<Feeds>> = (0..ranks)
                .map(|r| (0..k).map(|i| batch(model, step as i64 * global + (r * k + i) as i64)).collect())
                .collect();
            let logs: Vec<StepLog> = std::thread::scope(|s| {
                let runs: Vec<_> =
                    hosts.iter_mut().zip(&feeds).map(|(h, f)| s.spawn(move || h.step(f).unwrap().outputs)).collect();
                runs.into_iter()
                    .map(|r| StepLog::from_rank_outputs(step + 1, &r.join().unwrap(), ranks as u64).unwrap())
                    .collect()
            });
            logs.iter().map(|l| l.loss).sum::<f64>() / ranks as f64
        })
        .collect()
}

/// A fresh directory for one test's saves.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zeroplan-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Saves every rank's state as `train --save` does.
fn save(dir: &Path, model: &ModelSpec, program: &Program, config: Config, hosts: &[HostProgram]) {
    let step = hosts[0].steps_done();
    training::begin(dir, step).unwrap();
    let files = hosts.iter().enumerate().map(|(r, h)| training::save_rank(dir, step, r, &h.state()).unwrap()).collect();
    let layout = Layout::of(&program.graph, &bindings(), model).unwrap();
    let manifest = Manifest {
        format: training::format_of(&layout),
        step,
        seed: SEED,
        ranks: hosts.len(),
        data_parallel: config.data_parallel,
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
    let layout = Layout::of(&plan.graph, &bindings(), model).unwrap();
    let states = checkpoint.states_for(&layout, config.ranks()).unwrap_or_else(|e| panic!("{e}"));
    let mut hosts = load(&plan, Some(&states));
    for h in &mut hosts {
        h.set_steps_done(checkpoint.manifest.step);
    }
    (plan, hosts)
}

fn logical(
    model: &ModelSpec,
    program: &Program,
    hosts: &[HostProgram],
) -> zeroplan_runtime::checkpoint::training::Logical {
    let states: Vec<State> = hosts.iter().map(HostProgram::state).collect();
    Layout::of(&program.graph, &bindings(), model).unwrap().consolidate(&states).unwrap()
}

#[test]
fn resuming_on_the_same_ranks_continues_bit_for_bit() {
    let model = model("tiny-bert");
    let bf16 = Config { precision: Precision::Bf16, ..Config::zero(3, 2, Offload::Optimizer, 1) };
    for (i, config) in
        [Config::zero(2, 1, Offload::None, 2), Config::zero(3, 3, Offload::None, 1), bf16].into_iter().enumerate()
    {
        let plan = program(&model, config);
        let mut never_stopped = load(&plan, None);
        let want_losses = train(&model, &mut never_stopped, 0, 4);

        let dir = scratch(&format!("same-{i}"));
        let mut first = load(&plan, None);
        train(&model, &mut first, 0, 2);
        save(&dir, &model, &plan, config, &first);
        drop(first);
        let (_, mut resumed) = resume(&dir, &model, config);
        let losses = train(&model, &mut resumed, 2, 4);
        assert_eq!(losses, want_losses[2..], "{config:?}: the resumed losses differ");
        for (r, (a, b)) in resumed.iter().zip(&never_stopped).enumerate() {
            assert!(a.state() == b.state(), "{config:?}: rank {r}'s state differs from the uninterrupted run's");
        }

        // The logical view holds everything: cut again for the same layout,
        // it gives back the saved shards exactly.
        let checkpoint = Checkpoint::open(&dir).unwrap();
        let logical = checkpoint.logical().unwrap();
        let saved = checkpoint.rank_states().unwrap();
        for (r, state) in saved.iter().enumerate() {
            let again = checkpoint.manifest.layout.distribute(&logical, r).unwrap();
            for (name, t) in &again {
                assert!(state[name] == *t, "{config:?}: rank {r}'s `{name}` changed through the logical view");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn resuming_on_other_ranks_and_stages_reshards() {
    let model = model("tiny-bert");
    // Global batches of 4 and 3 (three ranks pad their shards).
    let cases = [
        (Config::zero(4, 3, Offload::None, 1), Config::zero(2, 1, Offload::None, 2)),
        (Config::zero(2, 2, Offload::None, 2), Config::zero(4, 3, Offload::OptimizerAndParams, 1)),
        (
            Config::zero(3, 3, Offload::None, 1),
            Config { data_parallel: None, micro_batches: 3, precision: Precision::F32 },
        ),
        (
            Config { data_parallel: None, micro_batches: 3, precision: Precision::F32 },
            Config::zero(3, 1, Offload::Optimizer, 1),
        ),
    ];
    for (i, (from, to)) in cases.into_iter().enumerate() {
        let what = format!("{from:?} resumed as {to:?}");
        let plan = program(&model, from);
        let mut never_stopped = load(&plan, None);
        let want_losses = train(&model, &mut never_stopped, 0, 4);
        let want = logical(&model, &plan, &never_stopped);

        let dir = scratch(&format!("reshard-{i}"));
        let mut first = load(&plan, None);
        train(&model, &mut first, 0, 2);
        save(&dir, &model, &plan, from, &first);
        let (to_plan, mut resumed) = resume(&dir, &model, to);
        let losses = train(&model, &mut resumed, 2, 4);
        for (step, (got, want)) in losses.iter().zip(&want_losses[2..]).enumerate() {
            let err = (got - want).abs() / want.abs();
            assert!(err <= 1e-6, "{what}: step {}: loss {got} vs {want} (relative {err:e})", step + 3);
        }
        let got = logical(&model, &to_plan, &resumed);
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{what}: the logical tensors");
        for (name, t) in &want {
            let (a, b) = (got[name].floats().unwrap(), t.floats().unwrap());
            if name.contains("attn.k.bias") {
                // Zero gradient in exact arithmetic: AdamW moves it up to lr a step by rounding noise.
                assert!(max_abs_diff(a, b) <= 2.0 * LR * 1.0001, "{what}: {name}");
            } else {
                let err = relative(a, b);
                assert!(err <= 2e-5, "{what}: {name}: relative error {err:e}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn an_unfinished_save_is_passed_over_and_old_saves_are_pruned() {
    let model = model("tiny-bert");
    let config = Config::zero(2, 2, Offload::None, 1);
    let plan = program(&model, config);
    let dir = scratch("unfinished");
    let mut hosts = load(&plan, None);
    for step in 0..3 {
        train(&model, &mut hosts, step, step + 1);
        save(&dir, &model, &plan, config, &hosts);
    }
    // Keep 2: step 1 is gone.
    assert!(!training::step_dir(&dir, 1).exists() && training::step_dir(&dir, 2).exists());
    // A save of step 4 killed before its manifest: one shard written.
    train(&model, &mut hosts, 3, 4);
    training::begin(&dir, 4).unwrap();
    training::save_rank(&dir, 4, 0, &hosts[0].state()).unwrap();
    assert_eq!(Checkpoint::open(&dir).unwrap().manifest.step, 3);
    // A damaged shard is named.
    let shard = training::step_dir(&dir, 3).join("rank-00001.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let err = Checkpoint::open(&dir).unwrap_err().to_string();
    assert!(err.contains("rank-00001.safetensors") && err.contains("damaged"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();

    let empty = scratch("empty");
    let err = Checkpoint::open(&empty).unwrap_err().to_string();
    assert!(err.contains("no complete checkpoint"), "{err}");
    std::fs::remove_dir_all(&empty).unwrap();
}

#[test]
fn a_save_of_another_model_is_refused_with_its_problems() {
    let model = model("tiny-bert");
    let config = Config::zero(2, 1, Offload::None, 1);
    let plan = program(&model, config);
    let dir = scratch("other");
    let hosts = load(&plan, None);
    save(&dir, &model, &plan, config, &hosts);
    let mosaic = common::model("tiny-mosaicbert");
    let other = program(&mosaic, config);
    let layout = Layout::of(&other.graph, &bindings(), &mosaic).unwrap();
    let err = Checkpoint::open(&dir).unwrap().states_for(&layout, 2).unwrap_err().to_string();
    assert!(err.contains("does not fit this program") && err.contains("no `"), "{err}");
    assert!(err.contains("has no place here"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_crafted_manifest_is_refused_before_any_shard_is_read() {
    let model = model("tiny-bert");
    let config = Config::zero(2, 3, Offload::None, 1);
    let plan = program(&model, config);
    let dir = scratch("crafted");
    save(&dir, &model, &plan, config, &load(&plan, None));
    let at = training::step_dir(&dir, 0).join(training::MANIFEST);
    let original: Manifest = serde_json::from_slice(&std::fs::read(&at).unwrap()).unwrap();
    let refused = |edit: &dyn Fn(&mut Manifest), expect: &str| {
        let mut m = original.clone();
        edit(&mut m);
        std::fs::write(&at, serde_json::to_vec(&m).unwrap()).unwrap();
        let err = Checkpoint::open(&dir).unwrap_err().to_string();
        assert!(err.contains(expect), "{err}");
    };
    refused(&|m| m.files[1].file = "../../etc/passwd".into(), "is not a file name in the save");
    refused(
        &|m| {
            let flat = m.layout.slots.iter_mut().find_map(|s| s.flat.as_mut()).unwrap();
            flat.members[0].offset = usize::MAX - 1;
        },
        "does not fit",
    );
    refused(&|m| m.layout.slots.iter_mut().find_map(|s| s.flat.as_mut()).unwrap().shards = 0, "≥ 1 shards");
    refused(&|m| m.ranks = 3, "3 ranks");
    // A layout cut for more ranks than it is sharded over (found by fuzzing: it indexed past the buffer).
    std::fs::write(&at, serde_json::to_vec(&original).unwrap()).unwrap();
    let err = Checkpoint::open(&dir).unwrap().states_for(&original.layout, 3).unwrap_err().to_string();
    assert!(err.contains("is sharded over 2 ranks, not 3"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each shard's SHA-256 is in the manifest, as `sha256sum` prints it, and a
/// shard whose bytes are not those saved is refused when it is read, naming
/// the shard and the manifest: one byte of tensor data flipped (the size
/// unchanged), and two ranks' shards of equal size swapped. A manifest
/// written before the sums (none recorded) still loads.
#[test]
fn a_shard_whose_bytes_changed_is_refused_by_its_checksum() {
    use sha2::Digest;
    let model = model("tiny-bert");
    let config = Config::zero(2, 3, Offload::None, 1);
    let plan = program(&model, config);
    let dir = scratch("checksum");
    save(&dir, &model, &plan, config, &load(&plan, None));
    let step = training::step_dir(&dir, 0);
    let (manifest_path, shard) = (step.join(training::MANIFEST), |r: usize| step.join(training::shard_file(r)));
    let original: Manifest = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    for f in &original.files {
        let bytes = std::fs::read(step.join(&f.file)).unwrap();
        let hex: String = sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(f.sha256.as_deref(), Some(hex.as_str()), "{}", f.file);
    }
    let layout = Layout::of(&plan.graph, &bindings(), &model).unwrap();
    let saved = Checkpoint::open(&dir).unwrap().states_for(&layout, 2).unwrap();
    let refused = |expect_file: &str| {
        let checkpoint = Checkpoint::open(&dir).expect("sizes agree: the save opens");
        for err in [
            checkpoint.states_for(&layout, 2).unwrap_err().to_string(),
            checkpoint.states_for(&layout, 1).unwrap_err().to_string(),
        ] {
            assert!(err.contains(expect_file) && err.contains("manifest.json records"), "{err}");
            assert!(err.contains("its SHA-256 is"), "{err}");
        }
    };

    // The last byte of the file is the last tensor's data.
    let intact = std::fs::read(shard(1)).unwrap();
    let mut flipped = intact.clone();
    *flipped.last_mut().unwrap() ^= 0x10;
    std::fs::write(shard(1), &flipped).unwrap();
    refused("rank-00001.safetensors");
    let err = Checkpoint::open(&dir).unwrap().state_of_rank(&layout, 2, 1).unwrap_err().to_string();
    assert!(err.contains("rank-00001.safetensors: its SHA-256 is"), "{err}");
    std::fs::write(shard(1), &intact).unwrap();

    let tmp = step.join("swap");
    std::fs::rename(shard(0), &tmp).unwrap();
    std::fs::rename(shard(1), shard(0)).unwrap();
    std::fs::rename(&tmp, shard(1)).unwrap();
    refused("rank-00000.safetensors");
    std::fs::rename(shard(0), &tmp).unwrap();
    std::fs::rename(shard(1), shard(0)).unwrap();
    std::fs::rename(&tmp, shard(1)).unwrap();

    let mut unsummed = original.clone();
    unsummed.files.iter_mut().for_each(|f| f.sha256 = None);
    std::fs::write(&manifest_path, serde_json::to_vec(&unsummed).unwrap()).unwrap();
    let states = Checkpoint::open(&dir).unwrap().states_for(&layout, 2).unwrap();
    assert!(states == saved, "a save without checksums loads as it was saved");
    std::fs::remove_dir_all(&dir).unwrap();
}
