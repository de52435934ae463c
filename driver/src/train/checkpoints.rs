//! Saving and resuming a run, for any number of ranks (`train --save`,
//! `--save-every`, `--resume`, `--weights`): training checkpoints through
//! `zeroplan_runtime::checkpoint::training`, Hugging Face weights through
//! the logical, per-parameter view of the ranks' flat buffers.

use std::path::{Path, PathBuf};

use super::process::ProcessRank;
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::State;
use zeroplan_ir::plan::{DataParallel, Program};
use zeroplan_ir::spec::ModelSpec;
use zeroplan_ir::{Bindings, DType, Tensor};
use zeroplan_runtime::checkpoint::training::Cursor;
use zeroplan_runtime::checkpoint::training::{Checkpoint, Layout, Manifest, ShardFile};
use zeroplan_runtime::checkpoint::{self, HeadShapes, Weights, training};
use zeroplan_runtime::runner::{Device, Runner};

/// Set to a step number, a save of that step stops after writing the
/// shards and before the manifest, says so on standard error, and waits:
/// the crash test kills the process there.
const PAUSE_BEFORE_MANIFEST: &str = "ZEROPLAN_PAUSE_BEFORE_MANIFEST";

/// Whether `--save PATH` names a weights file (`.safetensors`) rather
/// than a checkpoint directory.
pub fn is_weights_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "safetensors")
}

/// Training checkpoints into a directory.
pub struct Saver {
    pub dir: PathBuf,
    pub every: Option<u64>,
    pub keep: usize,
    pub model: ModelSpec,
    pub data_parallel: Option<DataParallel>,
    pub seed: u64,
    pub layout: Layout,
}

impl Saver {
    /// Whether to save after `step` of a run ending at `last`.
    pub fn due(&self, step: u64, last: u64) -> bool {
        step == last || self.every.is_some_and(|k| k > 0 && step.is_multiple_of(k))
    }

    /// Saves every rank's state (one writer thread per rank), then the
    /// manifest. With one process per rank, `ranks` is this process's rank: rank 0 starts the
    /// step directory, every process writes its own file, and rank 0
    /// writes the manifest once all have (the directory must be one they
    /// all see: a shared file system across nodes).
    pub fn save<D: Device>(
        &self,
        ranks: &[Runner<D>],
        data: Option<Cursor>,
        process: Option<&ProcessRank>,
    ) -> Result<PathBuf, String> {
        let error = |e: checkpoint::CheckpointError| format!("error: {e}");
        let step = ranks[0].steps_done();
        let (first, world) = process.map_or((0, ranks.len()), |p| (p.world.rank, p.world.world_size));
        // One value each: an exchange every rank has to reach.
        let barrier = |doing: &str| process.map_or(Ok(Vec::new()), |p| p.share(&[0.0], doing));
        if first == 0 {
            training::begin(&self.dir, step).map_err(error)?;
        }
        barrier("waiting for rank 0 to start the save")?;
        let mine = std::thread::scope(|s| {
            let writers: Vec<_> = ranks
                .iter()
                .enumerate()
                .map(|(r, host)| {
                    s.spawn(move || {
                        let state = host.state();
                        // States read off an NVMe tier whose transfer failed are not a checkpoint.
                        host.check_tier().map_err(|e| format!("error: {e}"))?;
                        training::save_rank(&self.dir, step, first + r, &state).map_err(error)
                    })
                })
                .collect();
            writers.into_iter().map(|w| w.join().expect("a writer thread panicked")).collect::<Result<Vec<_>, _>>()
        })?;
        let files = match process {
            None => mine,
            Some(p) => p
                .share(&shard_words(&mine[0]), "sharing the saved shards' sizes and checksums")?
                .chunks_exact(SHARD_WORDS)
                .enumerate()
                .map(|(rank, words)| shard_of_words(rank, words))
                .collect(),
        };
        if first != 0 {
            barrier("waiting for rank 0 to complete the save")?;
            return Ok(training::step_dir(&self.dir, step));
        }
        if std::env::var(PAUSE_BEFORE_MANIFEST).is_ok_and(|v| v == step.to_string()) {
            eprintln!("paused before the manifest of step {step}");
            std::thread::sleep(std::time::Duration::from_secs(600));
        }
        let manifest = Manifest {
            format: training::format_of(&self.layout),
            step,
            seed: self.seed,
            ranks: world,
            data_parallel: self.data_parallel,
            data,
            model: self.model.clone(),
            layout: self.layout.clone(),
            files,
        };
        let at = training::commit(&self.dir, &manifest, self.keep).map_err(error)?;
        barrier("waiting for rank 0 to complete the save")?;
        Ok(at)
    }
}

/// The numbers a launched rank sends rank 0 about its shard: its size,
/// then its SHA-256 in 32-bit words (each exact in an f64, as sizes far
/// below 2⁵³ bytes are).
const SHARD_WORDS: usize = 9;

fn shard_words(shard: &ShardFile) -> Vec<f64> {
    let digest = shard.sha256.as_deref().expect("`save_rank` records every shard's SHA-256");
    let word = |i: usize| digest.get(8 * i..8 * i + 8).and_then(|w| u32::from_str_radix(w, 16).ok()).unwrap_or(0);
    std::iter::once(shard.bytes as f64).chain((0..SHARD_WORDS - 1).map(|i| f64::from(word(i)))).collect()
}

/// Rank `rank`'s shard entry from the words [`shard_words`] made.
fn shard_of_words(rank: usize, words: &[f64]) -> ShardFile {
    let sha256 = words[1..].iter().map(|&w| format!("{:08x}", w as u32)).collect();
    ShardFile { rank, file: training::shard_file(rank), bytes: words[0] as u64, sha256: Some(sha256) }
}

/// A save to continue from, fitted to this run's program.
pub struct Resumed {
    pub step: u64,
    pub seed: u64,
    pub data: Option<Cursor>,
    /// Each rank's state (this process's rank's alone, launched).
    pub states: Vec<State>,
}

/// Opens the newest complete save in `dir` for `program` on `ranks` ranks:
/// the model must be the one saved; ranks, stage, offload and tensor
/// parallelism may differ. `only`: the state of that rank alone (a
/// launched process's).
pub fn resume(
    dir: &Path,
    model: &ModelSpec,
    layout: &Layout,
    ranks: usize,
    only: Option<usize>,
) -> Result<Resumed, String> {
    let checkpoint = Checkpoint::open(dir).map_err(|e| format!("error: {e}"))?;
    let m = &checkpoint.manifest;
    if m.model != *model {
        return Err(format!(
            "error: {}: saved from model `{}`, this run trains `{}` (or the same with other settings): resume with \
             the spec and --head the run was saved with",
            checkpoint.dir.display(),
            m.model.name,
            model.name
        ));
    }
    let states = match only {
        None => checkpoint.states_for(layout, ranks),
        Some(rank) => checkpoint.state_of_rank(layout, ranks, rank).map(|s| vec![s]),
    }
    .map_err(|e| format!("error: {e}"))?;
    if (m.ranks != ranks || m.layout != *layout) && only.is_none_or(|r| r == 0) {
        let (from, to) = (grid(m.ranks, &m.layout), grid(ranks, layout));
        eprintln!("note: resharded {} from {from} to {to}", checkpoint.dir.display());
    }
    Ok(Resumed { step: m.step, seed: m.seed, data: m.data, states })
}

/// `ranks` as data × tensor ranks where `layout` is tensor-parallel.
fn grid(ranks: usize, layout: &Layout) -> String {
    match &layout.tensor_parallel {
        Some(tp) if tp.ranks > 1 => format!("{ranks} ranks ({} × TP-{})", ranks / tp.ranks, tp.ranks),
        _ => format!("{ranks} rank(s)"),
    }
}

/// The layout of `program`'s persistent state (it trains `model`), for
/// saving and resharding.
pub fn layout(program: &Program, model: &ModelSpec) -> Result<Layout, String> {
    let bindings: Bindings = [("batch".to_string(), program.batch), ("seq".to_string(), program.seq)].into();
    Layout::of(&program.graph, &bindings, model).map_err(|e| format!("error: {e}"))
}

/// Overwrites the ranks' parameters from a Hugging Face file: read into
/// the per-parameter view, then cut for each rank (masters, 16-bit copies
/// and shards alike). `ranks` are global ranks `first..`: all of them, or a
/// launched process's own.
pub fn load_weights<D: Device>(
    path: &Path,
    model: &ModelSpec,
    layout: &Layout,
    ranks: &mut [Runner<D>],
    first: usize,
) -> Result<(), String> {
    load_weights_with(path, model, layout, ranks, first, HeadShapes::Strict)
}

/// As [`load_weights`]; `heads` says whether a task head of another shape
/// is an error or replaced (fine-tuning from another task's checkpoint).
/// Each rank's other state (moments, parameters the file lacks) stays as
/// it is, so no rank needs another's.
pub fn load_weights_with<D: Device>(
    path: &Path,
    model: &ModelSpec,
    layout: &Layout,
    ranks: &mut [Runner<D>],
    first: usize,
    heads: HeadShapes,
) -> Result<(), String> {
    let graph = forward(model, &BuildOptions::default()).map_err(|e| format!("error: {e}"))?;
    // Placeholders of each parameter's shape: what the file lacks is dropped below.
    let mut weights: Weights = graph
        .params()
        .into_iter()
        .map(|n| {
            let node = graph.node(n);
            let shape = node.outputs[0].shape.dims().iter().map(|d| d.as_constant().unwrap_or(0) as usize).collect();
            (node.name.to_string(), Tensor::full(shape, DType::F32, 0.0))
        })
        .collect();
    let report = checkpoint::load_weights_with(path, model, &graph, &mut weights, heads).map_err(|e| e.to_string())?;
    if first == 0 && !report.initialised.is_empty() {
        eprintln!("note: not in {}, initialised: {}", path.display(), report.initialised.join(", "));
    }
    if first == 0 && !report.replaced.is_empty() {
        eprintln!(
            "note: {} holds a head of another shape (another label count): replaced, initialised: {}",
            path.display(),
            report.replaced.join(", ")
        );
    }
    weights.retain(|name, _| report.loaded.contains(name));
    for (r, host) in ranks.iter_mut().enumerate() {
        let state =
            layout.overwrite(&host.state(), &weights, first + r).map_err(|p| format!("error: {}", p.join("; ")))?;
        host.set_state(&state).map_err(|e| format!("error: {e}"))?;
    }
    Ok(())
}

/// Writes the ranks' parameters, joined, as one Hugging Face file.
pub fn save_weights<D: Device>(
    path: &Path,
    model: &ModelSpec,
    layout: &Layout,
    ranks: &[Runner<D>],
) -> Result<(), String> {
    let (graph, weights) =
        training::model_weights(model, &logical(layout, ranks)?).map_err(|e| format!("error: {e}"))?;
    checkpoint::save_weights(path, model, &graph, &weights).map_err(|e| e.to_string())
}

/// The ranks' state joined into the per-parameter view.
fn logical<D: Device>(layout: &Layout, ranks: &[Runner<D>]) -> Result<training::Logical, String> {
    let states: Vec<State> = ranks.iter().map(Runner::state).collect();
    layout.consolidate(&states).map_err(|e| format!("error: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a launched rank sends rank 0 about its shard comes back as the
    /// same entry: size and SHA-256 to the bit.
    #[test]
    fn a_shard_s_size_and_checksum_cross_between_processes_intact() {
        let sha256 = "00ff10e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b78".to_string();
        let shard = ShardFile { rank: 3, file: training::shard_file(3), bytes: (1 << 40) + 17, sha256: Some(sha256) };
        let words = shard_words(&shard);
        assert_eq!(words.len(), SHARD_WORDS);
        assert_eq!(shard_of_words(3, &words), shard);
    }
}
