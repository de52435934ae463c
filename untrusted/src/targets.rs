//! One function per fuzz target: what a single input does, whichever
//! driver supplies it — libFuzzer through `fuzz/fuzz_targets/*.rs`
//! (coverage-guided, nightly: `scripts/fuzz.sh`), or `tests/timed.rs`
//! (a bounded run on stable, in CI). Each returns nothing and must not
//! panic: a panic is the finding. The seeds a target mutates are built
//! once per process.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use zeroplan_ir::Graph;
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::{Interpreter, Rounding, State};
use zeroplan_ir::plan::Plan;
use zeroplan_ir::spec::{self, ModelSpec, hf::from_config_json};
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::checkpoint::training::Checkpoint;
use zeroplan_runtime::checkpoint::{load_batch, load_weights};

use crate::{Choices, checkpoint, plan, ranks};

/// A target: its name (the cargo-fuzz binary's and its corpus folder's)
/// and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, in `scripts/fuzz.sh`'s order.
pub const ALL: [Target; 8] = [
    ("spec", spec),
    ("hf_config", hf_config),
    ("plan", plan_file),
    ("safetensors", safetensors),
    ("checkpoint", checkpoint_manifest),
    ("plan_mutation", plan_mutation),
    ("plan_mutation_ranks", plan_mutation_ranks),
    ("checkpoint_mutation", checkpoint_mutation),
];

/// What the targets write under the temporary directory.
const SCRATCH: [&str; 3] = ["safetensors", "manifest", "checkpoint"];

/// This process's scratch path for `what` (one of [`SCRATCH`]).
fn scratch(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("zeroplan-fuzz-{what}-{}", std::process::id()))
}

/// Removes what this process's targets wrote under the temporary directory.
pub fn remove_scratch() {
    for what in SCRATCH {
        let path = scratch(what);
        let _ = std::fs::remove_dir_all(&path);
        let _ = std::fs::remove_file(path.with_extension("safetensors"));
    }
}

/// A model spec (RON) is read and its forward graph built.
pub fn spec(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(spec) = ModelSpec::from_ron(text, "fuzz.ron") {
        let _ = forward(&spec, &BuildOptions::default());
    }
}

/// A Hugging Face `config.json` is read and its forward graph built.
pub fn hf_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(spec) = from_config_json(text, "config.json", "fuzz") {
        let _ = forward(&spec, &BuildOptions::default());
    }
}

/// Larger arenas are not loaded by [`plan_file`], only to keep it fast.
const PLAN_ARENA_CAP: u64 = 64 << 20;

/// A plan file (RON) is read and, where its arenas are small, loaded on the
/// host runtime.
pub fn plan_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(plan) = Plan::from_ron(text) else { return };
    if plan.program.arena_bytes <= PLAN_ARENA_CAP && plan.program.host_arena_bytes <= PLAN_ARENA_CAP {
        let _ = HostProgram::load(plan.program, 0);
    }
}

/// tiny-bert's spec, graph and initial state, for [`safetensors`].
fn tiny_bert() -> &'static (ModelSpec, Graph, State) {
    static MODEL: OnceLock<(ModelSpec, Graph, State)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tiny/tiny-bert.ron");
        let spec = spec::load(&path).expect("the tiny spec loads");
        let graph = forward(&spec, &BuildOptions::default()).expect("it builds");
        let state = Interpreter::new(Rounding::Native, 0).init_state(&graph).expect("it initialises");
        (spec, graph, state)
    })
}

/// A safetensors file is read as tiny-bert's weights and as a batch.
pub fn safetensors(data: &[u8]) {
    let path = scratch("safetensors").with_extension("safetensors");
    std::fs::write(&path, data).expect("the temporary file is writable");
    let (spec, graph, state) = tiny_bert();
    let _ = load_weights(&path, spec, graph, &mut state.clone());
    let _ = load_batch(&path);
}

/// A directory holding the shard files of [`checkpoint::seed`]'s save,
/// beside which [`checkpoint_manifest`] writes each input as
/// `manifest.json`. The save is deterministic, so its manifest, kept in the
/// target's corpus (`fuzz/corpus/checkpoint/seed-manifest.json`), names
/// these shards and their checksums: edits of it reach the shards.
fn shard_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("manifest");
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        for entry in std::fs::read_dir(&checkpoint_seed().dir).expect("the seed save is readable").flatten() {
            if entry.file_name().to_string_lossy().ends_with(".safetensors") {
                std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("the shard copies");
            }
        }
        dir
    })
}

/// A checkpoint manifest beside a real save's shards is opened, resharded
/// for one and three ranks, and its weights read.
pub fn checkpoint_manifest(data: &[u8]) {
    let dir = shard_dir();
    std::fs::write(dir.join("manifest.json"), data).expect("the temporary file is writable");
    if let Ok(checkpoint) = Checkpoint::open(dir) {
        let layout = checkpoint.manifest.layout.clone();
        let _ = checkpoint.states_for(&layout, 1);
        let _ = checkpoint.states_for(&layout, 3);
        let _ = checkpoint.weights();
    }
}

/// A compiled tiny-bert program mutated as the bytes choose ([`plan`]).
pub fn plan_mutation(data: &[u8]) {
    static SEEDS: OnceLock<Vec<plan::Seed>> = OnceLock::new();
    let seeds = SEEDS.get_or_init(plan::seeds);
    let mut choices = Choices::new(data);
    let seed = &seeds[choices.below(seeds.len())];
    let _ = plan::check(&plan::mutate(seed, &mut choices));
}

/// One rank's program of a two-rank plan mutated, both ranks run ([`ranks`]).
pub fn plan_mutation_ranks(data: &[u8]) {
    static SEEDS: OnceLock<Vec<ranks::Seed>> = OnceLock::new();
    let seeds = SEEDS.get_or_init(ranks::seeds);
    let mut choices = Choices::new(data);
    let seed = &seeds[choices.below(seeds.len())];
    let _ = ranks::check(seed, &ranks::mutate(seed, &mut choices));
}

/// The two-rank ZeRO-3 save the checkpoint targets start from.
fn checkpoint_seed() -> &'static checkpoint::Seed {
    static SEED: OnceLock<checkpoint::Seed> = OnceLock::new();
    SEED.get_or_init(|| checkpoint::seed(&scratch("checkpoint").join("seed")))
}

/// A real save mutated on disk as the bytes choose ([`checkpoint`]).
pub fn checkpoint_mutation(data: &[u8]) {
    let into = scratch("checkpoint").join("mutant").join("step-00000000");
    let mutation = checkpoint::mutate(checkpoint_seed(), &into, &mut Choices::new(data));
    // `Err`: refused, as a damaged save may be.
    let _ = checkpoint::check(checkpoint_seed(), &into, &mutation);
}
