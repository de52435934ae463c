//! The fuzz targets' properties over a fixed set of inputs, as an ordinary
//! test (CI has no nightly toolchain and no minutes to fuzz): plan-file and
//! checkpoint mutants chosen by deterministic byte strings are refused or
//! run inside their arenas, and the mutations the load-time validation
//! exists for are each refused by name.

use std::sync::OnceLock;

use serde_json::Value;
use zeroplan_untrusted::{Choices, checkpoint, plan};

/// Byte strings from a fixed xorshift stream: the same mutants every run.
fn inputs(count: usize, salt: u64) -> Vec<Vec<u8>> {
    let mut x = 0x9E37_79B9_7F4A_7C15 ^ salt;
    (0..count)
        .map(|_| {
            (0..48)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect()
}

fn seeds() -> &'static [plan::Seed] {
    static SEEDS: OnceLock<Vec<plan::Seed>> = OnceLock::new();
    SEEDS.get_or_init(plan::seeds)
}

#[test]
fn plan_mutants_are_refused_or_run_inside_their_arenas() {
    let (mut refused, mut ran, mut must_refuse) = (0, 0, 0);
    // Then 12 lone moves of a buffer onto another's offset (the bytes pick one
    // mutation, "buffer offset", its copying half): most land on a live value.
    let moves = inputs(12, 3).into_iter().map(|b| [&[0, 0, 0][..], &b].concat());
    for (i, bytes) in inputs(60, 1).into_iter().chain(moves).enumerate() {
        let seed = &seeds()[i % seeds().len()];
        let mutant = plan::mutate(seed, &mut Choices::new(&bytes));
        must_refuse += usize::from(mutant.must_refuse);
        let outcome = plan::check(&mutant);
        match outcome {
            plan::Outcome::Refused(_) => refused += 1,
            plan::Outcome::Ran(_) => ran += 1,
            plan::Outcome::Unreadable(_) | plan::Outcome::Skipped => {}
        }
        eprintln!("input {i}: {:?} (must refuse: {}) → {outcome:?}", mutant.what, mutant.must_refuse);
    }
    // Both sides of the property are exercised, not only the parser.
    assert!(refused >= 8 && ran >= 4, "{refused} refused, {ran} ran");
    assert!(must_refuse >= 4, "only {must_refuse} mutants moved a value onto a live one");
}

/// The seed with `edit` applied; loading it must fail naming `expect`.
fn refused(edit: impl Fn(&mut Value), expect: &str) {
    let mut mutant = seeds()[0].program.clone();
    edit(&mut mutant);
    match plan::run(&mutant) {
        plan::Outcome::Refused(e) => assert!(e.contains(expect), "{e}"),
        other => panic!("expected a refusal naming `{expect}`, got {other:?}"),
    }
}

fn buffer<'v>(program: &'v mut Value, value: &str) -> &'v mut Value {
    let buffers = program["buffers"].as_array_mut().unwrap();
    buffers.iter_mut().find(|b| b["value"] == value).unwrap()
}

#[test]
fn a_buffer_of_the_wrong_size_is_refused() {
    refused(
        |p| {
            let b = &mut p["buffers"][0];
            b["bytes"] = Value::from(b["bytes"].as_u64().unwrap() + 4);
        },
        "bytes, but",
    );
}

/// A shape whose element count wraps around `u64` (2³² × 2³²) once had a
/// zero-byte buffer, which passed the arena check, and a kernel that
/// writes 2⁶⁴ elements into it.
#[test]
fn a_shape_whose_element_count_overflows_is_refused() {
    refused(
        |p| {
            let huge = serde_json::json!([{ "shape": ["4294967296", "4294967296"], "dtype": "f32" }]);
            let nodes = p["graph"]["nodes"].as_array_mut().unwrap();
            nodes.push(
                serde_json::json!({ "name": "crafted.fill", "op": { "Fill": { "value": 1.0 } }, "outputs": huge }),
            );
            nodes.push(serde_json::json!({ "name": "crafted.relu", "op": "Relu", "operands": ["crafted.fill"], "outputs": huge }));
            let buffers = p["buffers"].as_array_mut().unwrap();
            for value in ["crafted.fill", "crafted.relu"] {
                buffers.push(serde_json::json!({ "value": value, "place": "Device", "offset": 0, "bytes": 0 }));
            }
        },
        "too many elements",
    );
}

/// A fused kernel's output moved to overlap its first input by one element:
/// inside the arena, and both live at the kernel (it reads the one and
/// writes the other), so neither the liveness check nor a kernel's code
/// allows it.
#[test]
fn a_kernel_output_overlapping_its_input_is_refused() {
    refused(
        |p| {
            let nodes = p["graph"]["nodes"].as_array().unwrap();
            let fused = nodes
                .iter()
                .find(|n| n["op"].get("Fused").is_some() && n["outputs"].as_array().unwrap().len() == 1)
                .unwrap();
            let (name, input) =
                (fused["name"].as_str().unwrap().to_string(), fused["operands"][0].as_str().unwrap().to_string());
            let at = buffer(p, &input)["offset"].as_u64().unwrap();
            buffer(p, &name)["offset"] = Value::from(at + 4);
        },
        "overlap, and both are live",
    );
}

/// A buffer moved onto another's offset in the seed's arena, as the
/// fuzzer's "buffer offset" mutation moves it.
struct Move {
    value: String,
    offset: u64,
    bytes: u64,
    /// It shares a byte with another buffer while both are live ([`plan::Seed::collides`]).
    collides: bool,
    /// The value owns its buffer, which stays inside its arena.
    fits: bool,
}

/// Every move of a buffer onto another buffer's offset of its arena.
fn moves(seed: &plan::Seed) -> Vec<Move> {
    let buffers = seed.program["buffers"].as_array().unwrap();
    let offsets = |place: &Value| {
        let same = buffers.iter().filter(|b| b["place"] == *place);
        same.map(|b| b["offset"].as_u64().unwrap()).collect::<std::collections::BTreeSet<_>>()
    };
    let mut moves = Vec::new();
    for to in buffers {
        let value = to["value"].as_str().unwrap();
        let bytes = to["bytes"].as_u64().unwrap();
        let arena =
            seed.program[if to["place"] == "Host" { "host_arena_bytes" } else { "arena_bytes" }].as_u64().unwrap();
        for offset in offsets(&to["place"]).into_iter().filter(|&o| Some(o) != to["offset"].as_u64()) {
            let (collides, fits) = (seed.collides(value, offset), seed.owns(value) && offset + bytes <= arena);
            moves.push(Move { value: value.to_string(), offset, bytes, collides, fits });
        }
    }
    moves
}

fn moved(seed: &plan::Seed, value: &str, offset: u64) -> Value {
    let mut mutant = seed.program.clone();
    buffer(&mut mutant, value)["offset"] = Value::from(offset);
    mutant
}

/// The load-time validation of `program` alone (no arenas, no kernels).
fn validates(program: &Value) -> Result<(), String> {
    let program: zeroplan_ir::plan::Program = serde_json::from_value(program.clone()).unwrap();
    let order = program.graph.topo_order().unwrap();
    let bindings = [("batch".to_string(), program.batch), ("seq".to_string(), program.seq)].into();
    let rank = zeroplan_exec::Rank { index: 0, ranks: 1, tensor: 0, tensor_ranks: 1 };
    zeroplan_exec::validate::buffers(&program, &order, &bindings, rank).map(drop).map_err(|e| e.to_string())
}

/// A value moved onto bytes another value holds while both are live — by
/// the memory planner's liveness, which the load does not read — is
/// refused, naming it; and one moved onto bytes free while it lives is
/// not. Over a sample of 50 moves of each kind per seed.
#[test]
fn a_value_moved_onto_one_live_at_the_same_time_is_refused() {
    for seed in seeds() {
        let moves = moves(seed);
        let (colliding, free): (Vec<&Move>, Vec<&Move>) = moves.iter().partition(|m| m.collides);
        assert!(colliding.len() > 50, "only {} colliding moves", colliding.len());
        for m in colliding.iter().step_by(colliding.len() / 50) {
            let e =
                validates(&moved(seed, &m.value, m.offset)).expect_err(&format!("`{}` moved to {}", m.value, m.offset));
            assert!(e.contains(&format!("`{}`", m.value)), "{e}");
        }
        let free: Vec<&Move> = free.into_iter().filter(|m| m.fits).collect();
        assert!(free.len() > 50, "only {} free moves", free.len());
        for m in free.iter().step_by(free.len() / 50) {
            validates(&moved(seed, &m.value, m.offset))
                .unwrap_or_else(|e| panic!("`{}` moved to {}: {e}", m.value, m.offset));
        }
    }
}

/// A value moved onto bytes whose other values are dead while it lives
/// loads and trains bit for bit as the plan as compiled: the load refuses
/// only what is wrong.
#[test]
fn a_value_moved_onto_bytes_free_while_it_lives_loads_and_trains_identically() {
    let seed = &seeds()[1];
    let free: Vec<Move> = moves(seed).into_iter().filter(|m| !m.collides && m.fits && m.bytes > 64).collect();
    assert!(free.len() > 20, "only {} free moves", free.len());
    let (value, offset) = (&free[free.len() / 2].value, free[free.len() / 2].offset);
    let step = |program: &Value| {
        let program: zeroplan_ir::plan::Program = serde_json::from_value(program.clone()).unwrap();
        let feeds = plan::feeds(&program);
        let mut runner = zeroplan_runtime::HostProgram::load(program, 7).unwrap();
        let out = runner.step(&[feeds]).unwrap();
        (format!("{:?}", out.outputs), runner.state())
    };
    let (compiled, after) = step(&seed.program);
    let (mutant, mutant_after) = step(&moved(seed, value, offset));
    assert_eq!(compiled, mutant, "`{value}` moved to {offset}: the step's outputs differ");
    assert!(after == mutant_after, "`{value}` moved to {offset}: the state after the step differs");
}

#[test]
fn checkpoint_mutants_are_refused_or_load_inside_their_arenas() {
    let root = std::env::temp_dir().join(format!("zeroplan-untrusted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let seed = checkpoint::seed(&root.join("seed"));
    let mut refused = 0;
    // The first inputs pick each kind of damage in turn; the rest at random.
    let kinds: Vec<Vec<u8>> = (0..10u8).map(|k| vec![0, 1, k]).collect();
    for (i, bytes) in kinds.iter().chain(&inputs(20, 2)).enumerate() {
        let into = root.join("mutant").join("step-00000000");
        let mutation = checkpoint::mutate(&seed, &into, &mut Choices::new(bytes));
        let outcome = checkpoint::check(&seed, &into, &mutation);
        eprintln!("input {i}: {} → {outcome:?}", mutation.what);
        refused += usize::from(outcome.is_err());
    }
    assert!(refused >= 10, "only {refused} of 30 damaged saves refused");
    std::fs::remove_dir_all(&root).unwrap();
}
