//! Checkpoint mutants: a real save of tiny-bert on two ZeRO-3 ranks
//! (`rank-00000.safetensors`, `rank-00001.safetensors`, `manifest.json`),
//! copied and damaged as a crafted or broken save would be — shards
//! swapped, duplicated, truncated, resized, a byte flipped, replaced by a
//! link out of the directory; the manifest naming a file outside the save
//! or one file twice, its fields and lists mutated — then opened, resharded
//! and loaded into the ranks' runtimes.
//!
//! The property ([`check`]): opening or loading refuses the mutant with an
//! error, or it loads and the guards around every rank's arenas are
//! untouched. Mutants that must be refused (a shard that is not its rank's,
//! a file outside the save, a shard whose bytes are not those saved, which
//! its SHA-256 in the manifest tells) panic if they load — the failure a
//! fuzzer reports.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use zeroplan_ir::Bindings;
use zeroplan_ir::plan::{DataParallel, Offload, Program};
use zeroplan_ir::spec::{self, ModelSpec, TrainingSpec};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::checkpoint::training::{self, Checkpoint, Layout, MANIFEST, Manifest};
use zeroplan_runtime::comm::{Communicator, InProcess};

use crate::Choices;
use crate::json;

const RANKS: usize = 2;
const SEED: u64 = 7;

/// The seed save and the program it was saved from.
pub struct Seed {
    /// The step directory holding the shards and the manifest.
    pub dir: PathBuf,
    /// The two-rank program whose ranks saved it, and loads the mutants.
    pub program: Program,
    /// The program's checkpoint layout.
    pub layout: Layout,
    /// The ranks that saved it, kept loaded (never run): they hold the
    /// program's compiled kernels, which every mutant's load then reuses
    /// instead of compiling them again.
    _warm: std::sync::Mutex<Vec<HostProgram>>,
}

fn bindings() -> Bindings {
    [("batch".into(), 2), ("seq".into(), 8)].into()
}

fn model() -> ModelSpec {
    spec::load(&crate::plan::repo().join("models/tiny/tiny-bert.ron")).expect("models/tiny/tiny-bert.ron loads")
}

/// Saves tiny-bert on two ZeRO-3 ranks, as initialised, under `root`.
pub fn seed(root: &Path) -> Seed {
    let model = model();
    let data_parallel = Some(DataParallel { ranks: RANKS as u64, zero_stage: 3, offload: Offload::None });
    let options = PassOptions { shape_hint: bindings(), data_parallel, ..PassOptions::default() };
    let train = TrainingSpec::default();
    let graph = compile(&model, &Target::Training(&train), options).expect("tiny-bert compiles").graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings()).expect("tiny-bert plans");
    let program = zeroplan_passes::planner::program::program(graph, &memory, 2, 8);
    let ranks = load(&program, None).expect("the seed program loads");
    let dir = training::begin(root, 0).expect("a fresh step directory");
    let files = ranks
        .iter()
        .enumerate()
        .map(|(r, h)| training::save_rank(root, 0, r, &h.state()).expect("the shard saves"))
        .collect();
    let layout = Layout::of(&program.graph, &bindings(), &model).expect("tiny-bert has a layout");
    let manifest = Manifest {
        format: training::format_of(&layout),
        step: 0,
        seed: SEED,
        ranks: RANKS,
        data_parallel,
        data: None,
        model,
        layout: layout.clone(),
        files,
    };
    training::commit(root, &manifest, 1).expect("the manifest is written");
    Seed { dir, program, layout, _warm: std::sync::Mutex::new(ranks) }
}

/// `program` loaded on its ranks, from `given[r]` where given.
fn load(program: &Program, given: Option<&[zeroplan_ir::interp::State]>) -> Result<Vec<HostProgram>, String> {
    InProcess::group(RANKS)
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            let comm: Arc<dyn Communicator> = Arc::new(c);
            let state = given.and_then(|g| g.get(r).cloned()).unwrap_or_default();
            HostProgram::load_rank_with(program.clone(), SEED, comm, &state).map_err(|e| e.to_string())
        })
        .collect()
}

/// What a mutation did to the save, and whether the runtime must refuse it.
#[derive(Debug)]
pub struct Mutation {
    /// The kind of damage and the ranks it chose, for a failure's message.
    pub what: String,
    /// Whether loading the damaged save must fail (a shard not its rank's,
    /// a file outside the save, a truncated, resized or flipped shard).
    pub must_refuse: bool,
}

/// Copies `seed`'s step directory into `into` (a fresh directory beside an
/// `outside.safetensors`, a valid shard that no save names) and damages the
/// copy as the bytes choose.
pub fn mutate(seed: &Seed, into: &Path, c: &mut Choices) -> Mutation {
    let _ = std::fs::remove_dir_all(into);
    std::fs::create_dir_all(into).expect("a scratch directory");
    for entry in std::fs::read_dir(&seed.dir).expect("the seed save").flatten() {
        std::fs::copy(entry.path(), into.join(entry.file_name())).expect("the seed copies");
    }
    let outside = into.parent().expect("a parent").join("outside.safetensors");
    std::fs::copy(seed.dir.join(training::shard_file(1)), &outside).expect("the outside shard copies");
    let manifest_path = into.join(MANIFEST);
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let shard = |r: usize| into.join(training::shard_file(r));
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let (a, b) = (c.below(RANKS), c.below(RANKS));
    let kinds = ["swap", "duplicate", "name twice", "truncate", "resize", "flip", "escape", "link", "field", "list"];
    let kind = *c.pick(&kinds);
    let mut must_refuse = true;
    match kind {
        // Two ranks' files trade places; sizes (and the manifest) still agree.
        "swap" => {
            let tmp = into.join("swap.tmp");
            std::fs::rename(shard(0), &tmp).unwrap();
            std::fs::rename(shard(1), shard(0)).unwrap();
            std::fs::rename(&tmp, shard(1)).unwrap();
        }
        // One rank's file copied over another's, the manifest updated to match.
        "duplicate" => {
            let (from, to) = (a, (a + 1) % RANKS);
            std::fs::copy(shard(from), shard(to)).unwrap();
            manifest["files"][to]["bytes"] = Value::from(size(&shard(to)));
        }
        "name twice" => {
            let (from, to) = (a, (a + 1) % RANKS);
            manifest["files"][to]["file"] = manifest["files"][from]["file"].clone();
            manifest["files"][to]["bytes"] = manifest["files"][from]["bytes"].clone();
        }
        // Cut short, with or without the manifest agreeing.
        "truncate" => {
            let len = size(&shard(a));
            let keep = c.u64() % len.max(1);
            std::fs::OpenOptions::new().write(true).open(shard(a)).unwrap().set_len(keep).unwrap();
            if c.below(2) == 0 {
                manifest["files"][a]["bytes"] = Value::from(keep);
            }
        }
        // Bytes added at the end, the manifest agreeing.
        "resize" => {
            let grow = 1 + c.below(4096) as u64;
            let len = size(&shard(a)) + grow;
            std::fs::OpenOptions::new().write(true).open(shard(a)).unwrap().set_len(len).unwrap();
            manifest["files"][a]["bytes"] = Value::from(len);
        }
        // One byte changed, the size unchanged: the shard's SHA-256 differs.
        "flip" => {
            let mut bytes = std::fs::read(shard(a)).unwrap();
            let at = c.below(bytes.len());
            bytes[at] ^= 1 << c.below(8);
            std::fs::write(shard(a), bytes).unwrap();
        }
        "escape" => {
            let name = *c.pick(&["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors", ""]);
            manifest["files"][a]["file"] = Value::from(name);
            manifest["files"][a]["bytes"] = Value::from(size(&outside));
        }
        // The shard replaced by a link to a valid shard outside the save.
        "link" => {
            std::fs::remove_file(shard(a)).unwrap();
            std::os::unix::fs::symlink(&outside, shard(a)).unwrap();
            manifest["files"][a]["bytes"] = Value::from(size(&outside));
        }
        // Any field of the manifest, or any list in it reordered, cut or repeated.
        "field" => {
            let leaves = json::paths(&manifest, &json::is_leaf);
            let strings = json::strings(&manifest);
            let p = leaves[c.below(leaves.len())].clone();
            json::mutate_leaf(&mut manifest, &p, c, size(&shard(b)), &strings);
            must_refuse = false;
        }
        _ => {
            let lists = json::paths(&manifest, &Value::is_array);
            let p = lists[c.below(lists.len())].clone();
            json::mutate_array(&mut manifest, &p, c);
            must_refuse = false;
        }
    }
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    Mutation { what: format!("{kind} (ranks {a}, {b})"), must_refuse }
}

/// Opens the save in `dir`, reshards it for one rank and for the seed's
/// two, and loads the two ranks from it. `Err`: refused on the way, with
/// the error. Panics if the guards around an arena changed, or if a
/// mutation that must be refused loaded.
pub fn check(seed: &Seed, dir: &Path, mutation: &Mutation) -> Result<(), String> {
    let loaded = open_and_load(seed, dir);
    assert!(
        loaded.is_err() || !mutation.must_refuse,
        "the save damaged by `{}` loaded: it must be refused",
        mutation.what
    );
    loaded
}

fn open_and_load(seed: &Seed, dir: &Path) -> Result<(), String> {
    let checkpoint = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    checkpoint.states_for(&seed.layout, 1).map_err(|e| e.to_string())?;
    checkpoint.weights().map_err(|e| e.to_string())?;
    let states = checkpoint.states_for(&seed.layout, RANKS).map_err(|e| e.to_string())?;
    let ranks = load(&seed.program, Some(&states))?;
    for rank in &ranks {
        assert!(rank.device().guards_intact(), "loading a checkpoint wrote outside an arena");
    }
    Ok(())
}
