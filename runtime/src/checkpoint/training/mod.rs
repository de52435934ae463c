//! Training checkpoints: every rank's shard of the training state, so that a
//! run can stop and go on — bit for bit on the same ranks and stage, or
//! resharded onto others.
//!
//! On disk, a save of step 12 is the directory `DIR/step-00000012/`:
//!
//! - `rank-00000.safetensors`, … — each rank's param and state nodes by
//!   node name, in their own dtypes (parameters, fp32 masters, AdamW's
//!   moments, the step counter and loss scale; a sharded buffer as the
//!   rank's shard);
//! - `manifest.json` — the step, the seed (dropout's masks are a function of
//!   seed, step and rank), the data cursor, the model spec, the ranks and
//!   the program's [`Layout`], and each shard file's size and SHA-256.
//!
//! Every file goes to a temporary, is synced, and is renamed into place; the
//! manifest is written last, once every shard is. A step directory without a
//! manifest is therefore a save that did not finish — the process was
//! killed in the middle — and [`Checkpoint::open`] passes over it to the
//! newest complete one. [`commit`] then removes saves older than the newest
//! `keep`.
//!
//! A shard's SHA-256 is hashed from its bytes as they are written and
//! checked against the manifest when the shard is read, before any of its
//! tensors is used: a shard damaged after the save (a flipped bit, a
//! truncated copy, another save's file of the same size) is refused. It
//! guards against damage, not forgery: whoever can rewrite a shard can
//! rewrite the manifest. A manifest written before the sums has none; its
//! shards are read with a warning (docs/checkpoints.md says why).
//!
//! Resuming on the layout and rank count of the save sets each rank's state
//! from its own file. Any other layout (ranks, ZeRO stage, offload, tensor
//! parallelism, or none of them) goes through the logical, per-parameter
//! tensors ([`layout`], [`tensor_parallel`]): the shards are joined and cut
//! again for the new ranks.

pub mod layout;
pub mod tensor_parallel;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::State;
use zeroplan_ir::plan::DataParallel;
use zeroplan_ir::spec::ModelSpec;
use zeroplan_ir::{DType, Tensor};

use super::safetensors_io::{self, Entry, atomic_write, sync_dir};
use super::{CheckpointError, Weights};
pub use layout::{Layout, Logical};
pub use tensor_parallel::{Split, TensorParallel};

/// The manifest's file name in a step directory.
pub const MANIFEST: &str = "manifest.json";

/// The newest manifest format this build writes and reads: 2 added the
/// layout's tensor-parallel splits. A save without tensor parallelism is
/// still written as format 1 ([`format_of`]), which older builds read.
pub const FORMAT: u32 = 2;

/// The format a manifest of `layout` is written in: the oldest that holds it.
pub fn format_of(layout: &Layout) -> u32 {
    if layout.tensor_parallel.is_some() { 2 } else { 1 }
}

/// What a save holds besides the tensors: enough to continue, reshard, or
/// export it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// Optimizer steps done when it was saved.
    pub step: u64,
    /// The run's seed: initialisation, synthetic batches, dropout.
    pub seed: u64,
    /// Every rank: data-parallel × tensor-parallel ranks.
    pub ranks: usize,
    /// The ZeRO stage and offload, when the program was partitioned.
    pub data_parallel: Option<DataParallel>,
    /// Where the data stood (absent for a fixed or synthetic batch).
    pub data: Option<Cursor>,
    pub model: ModelSpec,
    pub layout: Layout,
    /// One per rank, in rank order.
    pub files: Vec<ShardFile>,
}

/// One rank's shard file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardFile {
    pub rank: usize,
    /// Its name in the step directory.
    pub file: String,
    pub bytes: u64,
    /// The SHA-256 of its bytes, lowercase hex (as `sha256sum` prints it),
    /// checked when the shard is read. `None` in saves made before it was
    /// recorded, whose shards are read unchecked, with a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// The directory of the save of `step` in `dir`.
pub fn step_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:08}"))
}

/// Starts the save of `step`: a fresh, empty step directory (what a save of
/// the same step left, finished or killed, is removed first).
pub fn begin(dir: &Path, step: u64) -> Result<PathBuf, CheckpointError> {
    let at = step_dir(dir, step);
    let io = |source| CheckpointError::Io { path: at.clone(), doing: "write", source };
    if at.exists() {
        std::fs::remove_dir_all(&at).map_err(io)?;
    }
    std::fs::create_dir_all(&at).map_err(io)?;
    sync_dir(Some(dir));
    Ok(at)
}

/// The shard header's metadata key holding the rank whose state it is, so
/// that shards swapped or copied between ranks are refused (saves from
/// before it have none, and are trusted by name).
pub const RANK_TAG: &str = "zeroplan.rank";

/// Rank `rank`'s shard file name in a step directory.
pub fn shard_file(rank: usize) -> String {
    format!("rank-{rank:05}.safetensors")
}

/// Writes rank `rank`'s `state` into the save of `step` that [`begin`]
/// started; each rank writes its own file, in parallel.
pub fn save_rank(dir: &Path, step: u64, rank: usize, state: &State) -> Result<ShardFile, CheckpointError> {
    let file = shard_file(rank);
    let path = step_dir(dir, step).join(&file);
    let entries = state.iter().map(|(name, t)| Entry { name: name.clone(), tensor: t, dtype: t.dtype() }).collect();
    let sha256 = safetensors_io::write(&path, entries, &[(RANK_TAG, rank.to_string())])?;
    let bytes = std::fs::metadata(&path)
        .map_err(|source| CheckpointError::Io { path: path.clone(), doing: "read", source })?
        .len();
    Ok(ShardFile { rank, file, bytes, sha256: Some(sha256) })
}

/// Completes a save: writes its manifest (last, atomically), then removes
/// every older save but the newest `keep` complete ones, and any unfinished
/// one older than this.
pub fn commit(dir: &Path, manifest: &Manifest, keep: usize) -> Result<PathBuf, CheckpointError> {
    let at = step_dir(dir, manifest.step);
    let ranks: Vec<usize> = manifest.files.iter().map(|f| f.rank).collect();
    if ranks != (0..manifest.ranks).collect::<Vec<_>>() {
        return Err(invalid(
            &at,
            format!("shard files for ranks {ranks:?}, expected one for each of {}", manifest.ranks),
        ));
    }
    let json = serde_json::to_vec_pretty(manifest).expect("a manifest serialises");
    atomic_write(&at.join(MANIFEST), |w| w.write_all(&json))?;
    let mut complete = 0;
    for (step, path, finished) in saves(dir)?.into_iter().rev() {
        if step >= manifest.step {
            complete += usize::from(finished);
            continue;
        }
        if finished && complete < keep {
            complete += 1;
            continue;
        }
        // A failure to clean up is not a failure to save.
        let _ = std::fs::remove_dir_all(path);
    }
    sync_dir(Some(dir));
    Ok(at)
}

/// The step directories in `dir`, by step: `(step, path, has a manifest)`.
fn saves(dir: &Path) -> Result<Vec<(u64, PathBuf, bool)>, CheckpointError> {
    let entries = std::fs::read_dir(dir).map_err(|source| CheckpointError::Io {
        path: dir.to_path_buf(),
        doing: "read",
        source,
    })?;
    let mut found: Vec<(u64, PathBuf, bool)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            let step = name.to_str()?.strip_prefix("step-")?.parse().ok()?;
            let path = e.path();
            let finished = path.join(MANIFEST).is_file();
            Some((step, path, finished))
        })
        .collect();
    found.sort();
    Ok(found)
}

fn invalid(path: &Path, message: String) -> CheckpointError {
    CheckpointError::Training { path: path.to_path_buf(), message }
}

/// A complete save, opened.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// Its step directory.
    pub dir: PathBuf,
    pub manifest: Manifest,
}

impl Checkpoint {
    /// The save at `path`: a step directory, or the newest complete save in
    /// a directory `--save` wrote (unfinished saves are passed over).
    pub fn open(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let dir = if path.join(MANIFEST).is_file() {
            path.to_path_buf()
        } else {
            let newest = saves(path)?.into_iter().rev().find(|(_, _, finished)| *finished);
            newest.map(|(_, p, _)| p).ok_or_else(|| {
                invalid(
                    path,
                    "no complete checkpoint here (a step-N directory with a manifest.json): pass the directory \
                     `train --save` wrote"
                        .into(),
                )
            })?
        };
        let manifest_path = dir.join(MANIFEST);
        let bytes = safetensors_io::read(&manifest_path)?;
        let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
            invalid(
                &manifest_path,
                format!("not a manifest zeroplan wrote ({e}); it is corrupt: remove the step directory"),
            )
        })?;
        manifest.layout.check().map_err(|m| invalid(&manifest_path, format!("{m}: the manifest is corrupt")))?;
        if manifest.files.len() != manifest.ranks {
            return Err(invalid(
                &manifest_path,
                format!("{} shard files for {} ranks: the manifest is corrupt", manifest.files.len(), manifest.ranks),
            ));
        }
        if !(1..=FORMAT).contains(&manifest.format) || manifest.format < format_of(&manifest.layout) {
            return Err(invalid(
                &manifest_path,
                format!("manifest format {}, this zeroplan reads 1 to {FORMAT}", manifest.format),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, f) in manifest.files.iter().enumerate() {
            // A file name, not a path: a crafted manifest must not reach outside its directory.
            let plain =
                matches!(Path::new(&f.file).components().collect::<Vec<_>>()[..], [std::path::Component::Normal(_)]);
            if !plain {
                return Err(invalid(&manifest_path, format!("shard file `{}` is not a file name in the save", f.file)));
            }
            if f.rank != i || !names.insert(&f.file) {
                return Err(invalid(
                    &manifest_path,
                    format!(
                        "shard entry {i} is rank {}'s file `{}`: each rank needs its own file, in rank order; the \
                         manifest is corrupt",
                        f.rank, f.file
                    ),
                ));
            }
            let path = dir.join(&f.file);
            // Nor through a link: only a regular file in the save is read.
            let bytes = std::fs::symlink_metadata(&path).ok().filter(|m| m.is_file()).map_or(0, |m| m.len());
            if bytes != f.bytes {
                return Err(invalid(
                    &path,
                    format!("{bytes} bytes, the manifest says {}: the shard is missing or damaged", f.bytes),
                ));
            }
        }
        if manifest.files.iter().any(|f| f.sha256.is_none()) {
            tracing::warn!(
                "{}: written before shard checksums, so damage to its shards' data cannot be detected; saves \
                 made from now on carry a SHA-256 per shard",
                manifest_path.display()
            );
        }
        Ok(Checkpoint { dir, manifest })
    }

    /// Every rank's saved state, in rank order.
    pub fn rank_states(&self) -> Result<Vec<State>, CheckpointError> {
        self.manifest.files.iter().map(|f| self.read_state(f)).collect()
    }

    /// Rank `f.rank`'s shard file's tensors, each in the dtype it was saved
    /// in, once its bytes are checked against the manifest's SHA-256; a
    /// file another rank saved (its [`RANK_TAG`] says so) is refused.
    fn read_state(&self, f: &ShardFile) -> Result<State, CheckpointError> {
        let path = self.dir.join(&f.file);
        let bytes = safetensors_io::read(&path)?;
        if let Some(recorded) = &f.sha256 {
            let found = safetensors_io::sha256(&bytes);
            if found != *recorded {
                return Err(invalid(
                    &path,
                    format!(
                        "its SHA-256 is {found}, but {} records {recorded} for it: the shard was damaged or \
                         replaced after it was saved; restore it from a copy, or resume from an earlier save",
                        self.dir.join(MANIFEST).display()
                    ),
                ));
            }
        }
        parse_state(&path, &bytes, f.rank)
    }

    /// The logical, per-parameter tensors of the save.
    pub fn logical(&self) -> Result<Logical, CheckpointError> {
        let states = self.rank_states()?;
        self.manifest.layout.consolidate(&states).map_err(|m| invalid(&self.dir, m))
    }

    /// The state of each of `ranks` ranks of a program laid out as `layout`:
    /// the saved shards as they are when the layout and rank count are the
    /// save's (so the run continues bit for bit), else resharded.
    pub fn states_for(&self, layout: &Layout, ranks: usize) -> Result<Vec<State>, CheckpointError> {
        if *layout == self.manifest.layout && ranks == self.manifest.ranks {
            return self.rank_states();
        }
        let logical = self.logical()?;
        (0..ranks).map(|r| self.cut(layout, &logical, r)).collect()
    }

    /// As [`Checkpoint::states_for`], for rank `rank` alone (a process of
    /// a launched run): its own file when the layout and rank count are the
    /// save's, else resharded (which reads every shard).
    pub fn state_of_rank(&self, layout: &Layout, ranks: usize, rank: usize) -> Result<State, CheckpointError> {
        if *layout == self.manifest.layout && ranks == self.manifest.ranks {
            let file = self.manifest.files.get(rank).ok_or_else(|| {
                invalid(&self.dir, format!("no rank {rank} among the save's {} ranks", self.manifest.ranks))
            })?;
            return self.read_state(file);
        }
        if rank >= ranks {
            return Err(invalid(&self.dir, format!("rank {rank} of a run of {ranks}")));
        }
        self.cut(layout, &self.logical()?, rank)
    }

    /// Rank `rank`'s state of a program laid out as `layout`, from `logical`.
    fn cut(&self, layout: &Layout, logical: &Logical, rank: usize) -> Result<State, CheckpointError> {
        layout.distribute(logical, rank).map_err(|problems| {
            let list: Vec<String> = problems.iter().map(|p| format!("  - {p}")).collect();
            invalid(
                &self.dir,
                format!(
                    "does not fit this program (resharding from {} rank(s)):\n{}\nhow to fix: resume with the model \
                     spec and precision the run was saved with",
                    self.manifest.ranks,
                    list.join("\n")
                ),
            )
        })
    }

    /// The model's parameters as one rank without data parallelism holds
    /// them, by parameter name: what `zeroplan export` writes.
    pub fn weights(&self) -> Result<(zeroplan_ir::Graph, Weights), CheckpointError> {
        model_weights(&self.manifest.model, &self.logical()?).map_err(|m| invalid(&self.dir, m))
    }
}

/// The parameters of `model`'s forward graph among the `logical` tensors,
/// in f32, with that graph (whose names [`super::save_weights`] maps to
/// Hugging Face's).
pub fn model_weights(model: &ModelSpec, logical: &Logical) -> Result<(zeroplan_ir::Graph, Weights), String> {
    let graph =
        forward(model, &BuildOptions::default()).map_err(|e| format!("model `{}` does not build: {e}", model.name))?;
    let mut weights = Weights::new();
    for n in graph.params() {
        let name: &str = &graph.node(n).name;
        let t = logical.get(name).ok_or_else(|| format!("no parameter `{name}` saved"))?;
        let values = t.floats().ok_or_else(|| format!("`{name}` is not a float tensor"))?;
        let f32 = Tensor::float(t.shape().to_vec(), DType::F32, values.to_vec()).expect("same shape");
        weights.insert(name.to_string(), f32);
    }
    Ok((graph, weights))
}

/// Writes the model's parameters of the save at `path` to `out` as a
/// Hugging Face safetensors file (fp32; see [`super::save_weights`]).
pub fn export(path: &Path, out: &Path) -> Result<Checkpoint, CheckpointError> {
    let checkpoint = Checkpoint::open(path)?;
    let (graph, weights) = checkpoint.weights()?;
    super::save_weights(out, &checkpoint.manifest.model, &graph, &weights)?;
    Ok(checkpoint)
}

/// The tensors of `bytes`, rank `rank`'s shard file at `path`; a file
/// another rank saved (its [`RANK_TAG`] says so) is refused.
fn parse_state(path: &Path, bytes: &[u8], rank: usize) -> Result<State, CheckpointError> {
    let file = safetensors_io::parse(path, bytes)?;
    if let Some(saved_by) = safetensors_io::tag(bytes, RANK_TAG)
        && saved_by != rank.to_string()
    {
        return Err(invalid(
            path,
            format!("rank {saved_by}'s shard, read as rank {rank}'s: the save's shards were swapped or copied"),
        ));
    }
    let mut state = State::new();
    for (name, view) in file.tensors() {
        let dtype = safetensors_io::our_dtype(view.dtype())
            .ok_or_else(|| invalid(path, format!("`{name}` is stored as {:?}, which no state uses", view.dtype())))?;
        let shape = view.shape().to_vec();
        let tensor = if dtype.is_float() {
            safetensors_io::floats(view.dtype(), view.data()).map(|v| Tensor::float(shape, dtype, v))
        } else {
            safetensors_io::ints(view.dtype(), view.data()).map(|v| Tensor::int(shape, dtype, v))
        };
        let tensor = tensor
            .ok_or_else(|| invalid(path, format!("`{name}` cannot be read")))?
            .map_err(|e| invalid(path, format!("`{name}`: {}", e.0)))?;
        state.insert(name, tensor);
    }
    Ok(state)
}

/// Where a training data stream stands (the driver's `Dataset`): the next
/// example and the masking draws' state. A checkpoint keeps it, so a
/// resumed run sees the batches an uninterrupted one would.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cursor {
    pub position: usize,
    pub rng: u64,
}
