//! Plan-file mutants: a compiled tiny-bert program, serialised as a plan
//! file holds it, mutated where a crafted file would strike — buffer
//! offsets, sizes and places, arena sizes, the bound batch and sequence,
//! tensor shapes, the schedule's order, operands, op attributes and the
//! kernel IR of fused nodes — then read back, loaded and, where loading
//! accepts it, run for one training step on the host runtime.
//!
//! The property ([`check`]): the mutant is unreadable, or loading refuses
//! it with an error, or it runs — and either way no byte of the guards
//! around its arenas changed. A change there, or a panic, is a failure.

use std::collections::BTreeMap;

use serde_json::Value;
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
const ARENA_CAP: u64 = 8 << 20;

/// More micro-batches than this are not fed (each is a whole pass).
const MICRO_BATCH_CAP: u64 = 4;

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

/// The seed programs, serialised: tiny-bert at batch 2 × seq 8, every pass
/// on, in f32; and in bf16 with ZeRO-2 and the optimizer offloaded (host
/// arena, casts, 16-bit buffers).
pub fn seeds() -> Vec<Value> {
    let model = spec::load(&repo().join("models/tiny/tiny-bert.ron")).expect("models/tiny/tiny-bert.ron loads");
    let offload = Some(DataParallel { ranks: 1, zero_stage: 2, offload: Offload::Optimizer });
    [(Precision::F32, None), (Precision::Bf16, offload)]
        .into_iter()
        .map(|(precision, data_parallel)| {
            let train = TrainingSpec { precision, dropout: Some(0.1), ..TrainingSpec::default() };
            let bindings: Bindings = [("batch".into(), BATCH), ("seq".into(), SEQ)].into();
            let options = PassOptions { shape_hint: bindings.clone(), data_parallel, ..PassOptions::default() };
            let graph = compile(&model, &Target::Training(&train), options).expect("tiny-bert compiles").graph;
            let memory = zeroplan_passes::memory::plan(&graph, &bindings).expect("tiny-bert plans");
            let program = zeroplan_passes::planner::program::program(graph, &memory, BATCH, SEQ);
            serde_json::to_value(&program).expect("programs serialise")
        })
        .collect()
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

/// `seed` with one to four mutations the bytes choose; returns what each
/// did, for a failure's message.
pub fn mutate(seed: &Value, c: &mut Choices) -> (Value, Vec<String>) {
    let mut mutant = seed.clone();
    let strings = json::strings(seed);
    let arena = seed["arena_bytes"].as_u64().unwrap_or(0);
    let mut done = Vec::new();
    // Mostly one mutation, so most mutants still read and reach the loader.
    for _ in 0..*c.pick(&[1, 1, 1, 2, 3, 4]) {
        let target = *c.pick(&TARGETS);
        let leaves = json::paths(&mutant, &json::is_leaf);
        let leaf = |m: &mut Value, c: &mut Choices, prefix: &[&str]| {
            let paths = under(&leaves, prefix);
            if !paths.is_empty() {
                json::mutate_leaf(m, paths[c.below(paths.len())], c, arena, &strings);
            }
        };
        match target {
            // Half the time another buffer's offset: inside the arena, over a live value.
            "buffer offset" if c.below(2) == 0 => {
                let offsets = under(&leaves, &["buffers", "offset"]);
                if !offsets.is_empty() {
                    let (to, from) = (offsets[c.below(offsets.len())], offsets[c.below(offsets.len())]);
                    let taken = json::at_mut(&mut mutant, from).map(|v| v.clone());
                    if let (Some(taken), Some(v)) = (taken, json::at_mut(&mut mutant, to)) {
                        *v = taken;
                    }
                }
            }
            "buffer offset" => leaf(&mut mutant, c, &["buffers", "offset"]),
            "buffer bytes" => leaf(&mut mutant, c, &["buffers", "bytes"]),
            "buffer place" => {
                let places = under(&leaves, &["buffers", "place"]);
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
                mutant[key] = Value::from(*c.pick(&[0, 1, n + 1, n * 2, n * 64, 1 << 31, 1 << 32, u64::MAX]));
            }
            "tensor shape" => {
                let dims = under(&leaves, &["nodes", "outputs", "shape"]);
                if !dims.is_empty() {
                    let p = dims[c.below(dims.len())];
                    let dim = *c.pick(&["0", "1", "3", "4096", "4294967296", "batch*seq", "seq/3", "batch*seq*seq"]);
                    if let Some(v) = json::at_mut(&mut mutant, p) {
                        *v = Value::from(dim);
                    }
                }
            }
            "schedule order" => {
                json::mutate_array(&mut mutant, &[Key::Field("graph".into()), Key::Field("nodes".into())], c)
            }
            "operand" => leaf(&mut mutant, c, &["nodes", "operands"]),
            "op or kernel IR" if c.below(2) == 0 => leaf(&mut mutant, c, &["nodes", "op"]),
            "op or kernel IR" => {
                let arrays: Vec<json::Path> = json::paths(&mutant, &Value::is_array)
                    .into_iter()
                    .filter(|p| p.iter().any(|k| matches!(k, Key::Field(f) if f == "op")))
                    .collect();
                if !arrays.is_empty() {
                    let p = arrays[c.below(arrays.len())].clone();
                    json::mutate_array(&mut mutant, &p, c);
                }
            }
            _ => leaf(&mut mutant, c, &[]),
        }
        done.push(target.to_string());
    }
    (mutant, done)
}

/// The paths among `paths` that pass through every field of `prefix`.
fn under<'p>(paths: &'p [json::Path], prefix: &[&str]) -> Vec<&'p json::Path> {
    let through = |p: &json::Path, field: &str| p.iter().any(|k| matches!(k, Key::Field(name) if name == field));
    paths.iter().filter(|p| prefix.iter().all(|f| through(p, f))).collect()
}

/// Reads `mutant` as a plan file's program is read, loads it on the host
/// runtime and runs one step where loading accepts it. Panics — the
/// failure a fuzzer reports — if the guards around an arena changed.
pub fn check(mutant: &Value) -> Outcome {
    let program: Program = match serde_json::from_value(mutant.clone()) {
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
fn feeds(program: &Program) -> Feeds {
    let g = &program.graph;
    let bindings: Bindings = [("batch".into(), program.batch), ("seq".into(), program.seq)].into();
    let mut feeds = BTreeMap::new();
    for n in g.petgraph().node_indices().filter(|&n| g.node(n).op == Op::Input) {
        let node = g.node(n);
        let ty = &node.outputs[0];
        let Some(shape) = bound_shape(&ty.shape, &bindings) else { continue };
        let len: usize = shape.iter().product();
        if len > ARENA_CAP as usize {
            continue;
        }
        let value = |i: usize| -> i64 {
            match node.name.as_str() {
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
            feeds.insert(node.name.clone(), t);
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
