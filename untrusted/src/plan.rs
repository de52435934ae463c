//! Plan-file mutants: a compiled tiny-bert program, serialised as a plan
//! file holds it, mutated where a crafted file would strike — buffer
//! offsets, sizes and places, arena sizes, the bound batch and sequence,
//! tensor shapes, the schedule's order, operands, op attributes and the
//! kernel IR of fused nodes — then read back, loaded and, where loading
//! accepts it, run for one training step on the host runtime.
//!
//! The property ([`check`]): the mutant is unreadable, or loading refuses
//! it with an error, or it runs — and either way no byte of the guards
//! around its arenas changed. A change there, or a panic, is a failure; so
//! is a mutant that loads although it must be refused: a value moved onto
//! bytes another value holds while both are live, by the memory planner's
//! own liveness ([`Seed::collides`]), which the load derives again without
//! trusting the plan.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_json::Value;
use zeroplan_exec::buffers::constant_update;
use zeroplan_ir::interp::Feeds;
use zeroplan_ir::plan::{DataParallel, Offload, Program};
use zeroplan_ir::spec::{self, Precision, TrainingSpec};
use zeroplan_ir::{Bindings, DType, Op, Tensor};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::HostProgram;

use crate::Choices;
use crate::json::{self, Key};

/// The seeds' batch and sequence length.
const BATCH: u64 = 2;
const SEQ: u64 = 8;

/// Mutants with larger arenas are not run (a larger batch or sequence than
/// the seeds' only makes each run slower): 16× the seeds' largest.
pub(crate) const ARENA_CAP: u64 = 8 << 20;

/// More micro-batches than this are not fed (each is a whole pass).
pub(crate) const MICRO_BATCH_CAP: u64 = 4;

/// A seed program, serialised, and where the memory planner placed its
/// values: what tells a mutant that moves one onto another live at the
/// same time (which must be refused) from one that reuses dead bytes.
pub struct Seed {
    /// The program as a plan file holds it.
    pub program: Value,
    /// Each value that owns its buffer (no view or in-place update of
    /// another), by name.
    owners: HashMap<String, Owner>,
    /// Each update's value and the name of the node it updates.
    targets: HashMap<String, String>,
    /// Where in the program the mutations strike, found once (a mutant's
    /// are the seed's until a mutation changes its structure).
    paths: Paths,
    /// The strings of each field, which a string leaf is swapped among.
    strings: BTreeMap<String, Vec<String>>,
    /// The program loaded on each of its ranks, never run: it holds the
    /// compiled kernels, which every mutant's load then reuses instead of
    /// compiling them again (most mutants leave most kernels as they were).
    warm: std::sync::Mutex<Vec<HostProgram>>,
}

/// A buffer as the memory planner placed it.
#[derive(Clone, Copy, Debug)]
struct Owner {
    place: zeroplan_ir::Place,
    offset: u64,
    bytes: u64,
    /// The schedule positions it is held, `first..=last` (its value's
    /// life, with its views' and in-place updates').
    first: usize,
    last: usize,
    /// A constant update no node reads: written into its target when its
    /// phase ends, it never holds anything itself.
    empty: bool,
}

impl Seed {
    /// Keeps `runner` (the seed loaded on one of its ranks), and with it
    /// its kernels, for the process's life.
    pub fn keep_warm(&self, runner: HostProgram) {
        self.warm.lock().unwrap_or_else(|e| e.into_inner()).push(runner);
    }

    /// Every leaf of the program (numbers and strings), in document order.
    pub(crate) fn leaves(&self) -> &[json::Path] {
        &self.paths.leaves
    }

    /// Whether `value` owns a buffer that holds something: its offset is
    /// where its bytes are (a view's or an in-place update's follows its owner's).
    pub fn owns(&self, value: &str) -> bool {
        self.owners.get(value).is_some_and(|o| !o.empty && o.bytes > 0)
    }

    /// Whether `value`'s buffer moved to `offset` would share a byte with
    /// another buffer while both are live — by the planner's liveness, the
    /// program as compiled. `false` for a value that owns no buffer (a view
    /// or in-place update follows its owner, whatever its own offset says),
    /// and for an update moved exactly onto its target (an update made in
    /// place, which the load judges by the target's readers).
    pub fn collides(&self, value: &str, offset: u64) -> bool {
        let Some(moved) = self.owners.get(value).filter(|_| self.owns(value)) else { return false };
        let end = offset.saturating_add(moved.bytes);
        let onto_target = |name: &str| self.targets.get(value).is_some_and(|t| t == name);
        self.owners.iter().any(|(name, o)| {
            name != value
                && !o.empty
                && o.place == moved.place
                && o.offset < end
                && offset < o.offset + o.bytes
                && o.first <= moved.last
                && moved.first <= o.last
                && !(onto_target(name) && o.offset == offset)
        })
    }
}

/// What became of a mutant.
#[derive(Debug)]
pub enum Outcome {
    /// Its text is not a program: the plan reader refused it.
    Unreadable(String),
    /// It reads, but an arena or the micro-batch count is past this
    /// harness's caps; not loaded.
    Skipped,
    /// Loading refused it (the load-time validation, or selection).
    Refused(String),
    /// It loaded and ran a step: `Ok`, or the step's error.
    Ran(Result<(), String>),
}

/// The seed programs: tiny-bert at batch 2 × seq 8, every pass on, in
/// f32; and in bf16 with ZeRO-2 and the optimizer offloaded (host arena,
/// casts, 16-bit buffers).
pub fn seeds() -> Vec<Seed> {
    let model = tiny_bert();
    let offload = Some(DataParallel { ranks: 1, zero_stage: 2, offload: Offload::Optimizer });
    [(Precision::F32, None), (Precision::Bf16, offload)]
        .into_iter()
        .map(|(precision, data_parallel)| {
            let train = TrainingSpec { precision, dropout: Some(0.1), ..TrainingSpec::default() };
            let seed = seed(&model, &train, PassOptions { data_parallel, ..PassOptions::default() });
            let program = serde_json::from_value(seed.program.clone()).expect("a seed program reads back");
            seed.keep_warm(HostProgram::load(program, 7).expect("a seed program loads"));
            seed
        })
        .collect()
}

/// `models/tiny/tiny-bert.ron`.
pub fn tiny_bert() -> spec::ModelSpec {
    spec::load(&repo().join("models/tiny/tiny-bert.ron")).expect("models/tiny/tiny-bert.ron loads")
}

/// `model` compiled for `train` under `options` (its shape hint set to the
/// seeds' batch and sequence), planned, as a seed.
pub fn seed(model: &spec::ModelSpec, train: &TrainingSpec, options: PassOptions) -> Seed {
    let bindings: Bindings = [("batch".into(), BATCH), ("seq".into(), SEQ)].into();
    let options = PassOptions { shape_hint: bindings.clone(), ..options };
    let graph = compile(model, &Target::Training(train), options).expect("the seed compiles").graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).expect("the seed's memory plans");
    let owners = owners(&graph, &memory);
    let targets = graph.updates.iter().map(|(t, v)| (graph.value_ref(*v), graph.node(*t).name.to_string())).collect();
    let program = zeroplan_passes::planner::program::program(graph, &memory, BATCH, SEQ);
    let program = serde_json::to_value(&program).expect("programs serialise");
    let (paths, strings) = (Paths::of(&program), json::strings(&program));
    Seed { program, owners, targets, paths, strings, warm: Default::default() }
}

/// Every buffer-owning value of `memory`, both arenas, by name.
fn owners(graph: &zeroplan_ir::Graph, memory: &zeroplan_passes::memory::MemoryPlan) -> HashMap<String, Owner> {
    let arenas = [(&memory.intervals, &memory.arena), (&memory.host_intervals, &memory.host)];
    let mut owners = HashMap::new();
    for (intervals, arena) in arenas {
        for p in &arena.placements {
            let interval = &intervals[p.interval];
            let owner = Owner {
                place: interval.place,
                offset: p.offset,
                bytes: p.bytes,
                first: p.start,
                last: p.end,
                empty: constant_update(graph, interval.value.node).is_some(),
            };
            owners.insert(graph.value_ref(interval.value), owner);
        }
    }
    owners
}

/// The repository's root (for the bundled tiny models).
pub fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where a mutation strikes, chosen first: each names the part of a plan
/// file it rewrites.
const TARGETS: [&str; 10] = [
    "buffer offset",
    "buffer bytes",
    "buffer place",
    "arena size",
    "batch or seq",
    "tensor shape",
    "schedule order",
    "operand",
    "op or kernel IR",
    "any field",
];

/// The field prefixes the mutations draw leaves under ([`Paths::under`]).
const PREFIXES: [&[&str]; 9] = [
    &["buffers", "offset"],
    &["buffers", "bytes"],
    &["buffers", "place"],
    &["arena_bytes"],
    &["host_arena_bytes"],
    &["nodes", "outputs", "shape"],
    &["nodes", "operands"],
    &["nodes", "op"],
    &[],
];

/// A program's leaves, those under each of [`PREFIXES`], and its arrays
/// inside ops: what the mutations choose among. Walking a whole program
/// for them took most of a mutation's time, so a seed's are found once.
struct Paths {
    leaves: Vec<json::Path>,
    /// Indices into `leaves`, per prefix.
    under: Vec<Vec<usize>>,
    op_arrays: Vec<json::Path>,
}

impl Paths {
    fn of(program: &Value) -> Paths {
        let leaves = json::paths(program, &json::is_leaf);
        let under = PREFIXES
            .iter()
            .map(|prefix| (0..leaves.len()).filter(|&i| through(&leaves[i], prefix)).collect())
            .collect();
        let op_arrays = json::paths(program, &Value::is_array)
            .into_iter()
            .filter(|p| p.iter().any(|k| matches!(k, Key::Field(f) if f == "op")))
            .collect();
        Paths { leaves, under, op_arrays }
    }

    /// The leaves that pass through every field of `prefix` (one of [`PREFIXES`]).
    fn under(&self, prefix: &[&str]) -> Vec<&json::Path> {
        let i = PREFIXES.iter().position(|p| *p == prefix).expect("a listed prefix");
        self.under[i].iter().map(|&j| &self.leaves[j]).collect()
    }
}

/// Whether `path` passes through every field of `prefix`.
fn through(path: &json::Path, prefix: &[&str]) -> bool {
    prefix.iter().all(|f| path.iter().any(|k| matches!(k, Key::Field(name) if name == f)))
}

/// A mutated program, what was done to it, and whether loading must refuse it.
#[derive(Debug)]
pub struct Mutant {
    /// The program as a plan file would hold it.
    pub program: Value,
    /// What each mutation did, for a failure's message.
    pub what: Vec<String>,
    /// Its one mutation moved a value onto bytes another holds while both
    /// are live ([`Seed::collides`]).
    pub must_refuse: bool,
}

/// `seed` with one to four mutations the bytes choose.
pub fn mutate(seed: &Seed, c: &mut Choices) -> Mutant {
    let mut mutant = seed.program.clone();
    let strings = &seed.strings;
    let arena = seed.program["arena_bytes"].as_u64().unwrap_or(0);
    let mut done = Vec::new();
    let mut collides = false;
    // The mutant's paths once an array mutation changed its structure
    // (leaf mutations leave the seed's valid).
    let (mut own, mut reshaped): (Option<Paths>, bool) = (None, false);
    // Mostly one mutation, so most mutants still read and reach the loader.
    let rounds = *c.pick(&[1, 1, 1, 2, 3, 4]);
    for _ in 0..rounds {
        let target = *c.pick(&TARGETS);
        if reshaped {
            own = Some(Paths::of(&mutant));
            reshaped = false;
        }
        let paths = own.as_ref().unwrap_or(&seed.paths);
        let leaf = |m: &mut Value, c: &mut Choices, prefix: &[&str]| {
            let paths = paths.under(prefix);
            if !paths.is_empty() {
                json::mutate_leaf(m, paths[c.below(paths.len())], c, arena, strings);
            }
        };
        match target {
            // Half the time another buffer's offset: inside the arena, over a
            // value live at the same time or one whose bytes are free by then.
            "buffer offset" if c.below(2) == 0 => {
                let count = mutant["buffers"].as_array().map_or(0, Vec::len);
                if count > 0 {
                    let (to, from) = (c.below(count), c.below(count));
                    let taken = mutant["buffers"][from]["offset"].clone();
                    if let (Some(value), Some(offset)) = (mutant["buffers"][to]["value"].as_str(), taken.as_u64()) {
                        collides |= seed.collides(value, offset);
                    }
                    mutant["buffers"][to]["offset"] = taken;
                }
            }
            "buffer offset" => leaf(&mut mutant, c, &["buffers", "offset"]),
            "buffer bytes" => leaf(&mut mutant, c, &["buffers", "bytes"]),
            "buffer place" => {
                let places = paths.under(&["buffers", "place"]);
                if !places.is_empty() {
                    let p = places[c.below(places.len())];
                    if let Some(v) = json::at_mut(&mut mutant, p) {
                        *v = Value::from(if v == "Device" { "Host" } else { "Device" });
                    }
                }
            }
            "arena size" => {
                let field = *c.pick(&["arena_bytes", "host_arena_bytes"]);
                leaf(&mut mutant, c, &[field]);
            }
            "batch or seq" => {
                let key = *c.pick(&["batch", "seq"]);
                let n = mutant[key].as_u64().unwrap_or(0);
                let picks =
                    [0, 1, n.saturating_add(1), n.saturating_mul(2), n.saturating_mul(64), 1 << 31, 1 << 32, u64::MAX];
                mutant[key] = Value::from(*c.pick(&picks));
            }
            "tensor shape" => {
                let dims = paths.under(&["nodes", "outputs", "shape"]);
                if !dims.is_empty() {
                    let p = dims[c.below(dims.len())];
                    let dim = *c.pick(&["0", "1", "3", "4096", "4294967296", "batch*seq", "seq/3", "batch*seq*seq"]);
                    if let Some(v) = json::at_mut(&mut mutant, p) {
                        *v = Value::from(dim);
                    }
                }
            }
            "schedule order" => {
                json::mutate_array(&mut mutant, &[Key::Field("graph".into()), Key::Field("nodes".into())], c);
                reshaped = true;
            }
            "operand" => leaf(&mut mutant, c, &["nodes", "operands"]),
            "op or kernel IR" if c.below(2) == 0 => leaf(&mut mutant, c, &["nodes", "op"]),
            "op or kernel IR" => {
                let arrays = &paths.op_arrays;
                if !arrays.is_empty() {
                    let p = arrays[c.below(arrays.len())].clone();
                    json::mutate_array(&mut mutant, &p, c);
                    reshaped = true;
                }
            }
            _ => leaf(&mut mutant, c, &[]),
        }
        done.push(target.to_string());
    }
    // With other mutations besides, what is live when is no longer the seed's.
    Mutant { program: mutant, what: done, must_refuse: rounds == 1 && collides }
}

/// Reads `mutant` as a plan file's program is read, loads it on the host
/// runtime and runs one step where loading accepts it. Panics — the
/// failure a fuzzer reports — if the guards around an arena changed, or if
/// a mutant that must be refused was not.
pub fn check(mutant: &Mutant) -> Outcome {
    let outcome = run(&mutant.program);
    assert!(
        !mutant.must_refuse || matches!(outcome, Outcome::Refused(_)),
        "{:?} moved a value onto bytes live at the same time, yet: {outcome:?}",
        mutant.what
    );
    outcome
}

/// The outcome of `program`: unreadable, skipped, refused, or one step run.
pub fn run(program: &Value) -> Outcome {
    let program = match Program::deserialize(program) {
        Ok(p) => p,
        Err(e) => return Outcome::Unreadable(e.to_string()),
    };
    if program.arena_bytes > ARENA_CAP || program.host_arena_bytes > ARENA_CAP {
        return Outcome::Skipped;
    }
    let feeds = feeds(&program);
    let mut runner = match HostProgram::load(program, 7) {
        Ok(r) => r,
        Err(e) => return Outcome::Refused(e.to_string()),
    };
    assert!(runner.device().guards_intact(), "loading wrote outside an arena");
    if runner.micro_batches() > MICRO_BATCH_CAP {
        return Outcome::Skipped;
    }
    let batches = vec![feeds; runner.micro_batches() as usize];
    let ran = runner.step(&batches).map(|_| ()).map_err(|e| e.to_string());
    assert!(runner.device().guards_intact(), "a step wrote outside an arena ({ran:?})");
    Outcome::Ran(ran)
}

/// A batch for `program`'s inputs at their bound shapes: ids a tiny model's
/// tables hold, every key attended to, a third of the tokens labelled.
pub fn feeds(program: &Program) -> Feeds {
    let g = &program.graph;
    let bindings: Bindings = [("batch".into(), program.batch), ("seq".into(), program.seq)].into();
    let mut feeds = BTreeMap::new();
    for n in g.node_indices().filter(|&n| g.node(n).op == Op::Input) {
        let node = g.node(n);
        let ty = &node.outputs[0];
        let Some(shape) = bound_shape(&ty.shape, &bindings) else { continue };
        let len: usize = shape.iter().product();
        if len > ARENA_CAP as usize {
            continue;
        }
        let value = |i: usize| -> i64 {
            match &*node.name {
                "token_type_ids" => (i % 2) as i64,
                "attention_mask" => 1,
                "labels" if i % 3 != 1 => -100,
                _ => (i * 7 + 3) as i64 % 16,
            }
        };
        let tensor = if ty.dtype.is_int() {
            Tensor::int(shape, ty.dtype, (0..len).map(value).collect())
        } else {
            Tensor::float(shape, DType::F32, vec![0.25; len])
        };
        if let Ok(t) = tensor {
            feeds.insert(node.name.to_string(), t);
        }
    }
    feeds
}

/// `shape` with its symbols bound; `None` where one is unbound or the
/// element count overflows.
fn bound_shape(shape: &zeroplan_ir::Shape, bindings: &Bindings) -> Option<Vec<usize>> {
    let dims: Vec<usize> =
        shape.dims().iter().map(|d| d.eval(bindings).and_then(|v| usize::try_from(v).ok())).collect::<Option<_>>()?;
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
    Some(dims)
}
