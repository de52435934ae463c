//! The fuzz targets' properties over a fixed set of inputs, as an ordinary
//! test (CI has no nightly toolchain and no minutes to fuzz): plan-file and
//! checkpoint mutants chosen by deterministic byte strings are refused or
//! run inside their arenas, and the mutations the load-time validation
//! exists for are each refused by name.

use std::sync::OnceLock;

use serde_json::Value;
use zeroplan_untrusted::{Choices, checkpoint, plan, ranks};

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

/// A buffer moved by one byte (found by the timed fuzz run: a debug build's
/// check of `slice::from_raw_parts_mut` aborted on the misaligned f32
/// slice a kernel was handed; a release build read it unaligned, which
/// Rust leaves undefined). Refused at load, naming the alignment.
#[test]
fn a_buffer_not_aligned_to_its_dtype_is_refused() {
    refused(
        |p| {
            let b = &mut p["buffers"][0];
            b["offset"] = Value::from(b["offset"].as_u64().unwrap() + 1);
        },
        "not a multiple of",
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
    let order = program.graph.topo_order();
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

fn rank_seeds() -> &'static [ranks::Seed] {
    static SEEDS: OnceLock<Vec<ranks::Seed>> = OnceLock::new();
    SEEDS.get_or_init(ranks::seeds)
}

/// One rank's plan of a two-rank data-parallel (ZeRO-3) or tensor-parallel
/// plan mutated, both ranks run together: each mutant is unreadable,
/// refused, or runs its step on both ranks inside their arenas, and no
/// rank is left waiting ([`ranks::check`]). Each kind of mutation aimed at
/// the ranks once per seed, on either rank, then random ones.
#[test]
fn multi_rank_mutants_are_refused_or_run_together_inside_their_arenas() {
    let (mut refused, mut ran) = (0, 0);
    for (s, seed) in rank_seeds().iter().enumerate() {
        let kinds = (1..7u8).map(|k| [&[k % 2, k][..], &inputs(1, 10 + u64::from(k))[0]].concat());
        for (i, bytes) in kinds.chain(inputs(20, 4 + s as u64)).enumerate() {
            let mutant = ranks::mutate(seed, &mut Choices::new(&bytes));
            let outcome = ranks::check(seed, &mutant);
            match outcome {
                plan::Outcome::Refused(_) => refused += 1,
                plan::Outcome::Ran(_) => ran += 1,
                plan::Outcome::Unreadable(_) | plan::Outcome::Skipped => {}
            }
            eprintln!("{}, input {i}: rank {} {:?} → {outcome:?}", seed.name, mutant.rank, mutant.what);
        }
    }
    assert!(refused >= 12 && ran >= 2, "{refused} refused, {ran} ran");
}

/// `seed`'s program with node `name`'s op replaced by `op`.
fn with_op(seed: &ranks::Seed, name: &str, op: Value) -> Value {
    let mut program = seed.plan.program.clone();
    let nodes = program["graph"]["nodes"].as_array_mut().unwrap();
    nodes.iter_mut().find(|n| n["name"] == name).unwrap()["op"] = op;
    program
}

/// Runs `seed`'s ranks on `programs` (`None`: the seed's) and returns what
/// refused them, failing if they ran. A rank left waiting fails within 30 s.
fn ranks_refused(seed: &ranks::Seed, programs: &[Option<&Value>]) -> String {
    match ranks::run_ranks(seed, programs, "a crafted plan", std::time::Duration::from_secs(30)) {
        plan::Outcome::Refused(e) => e,
        other => panic!("{}: expected a refusal, got {other:?}", seed.name),
    }
}

/// Rank 1's schedule gathers two parameter buckets of different sizes in
/// the other order: each rank's program is valid alone, but the first
/// collective of each would combine 1,408 elements with 4,096. Both ranks
/// refuse before the step runs, naming the call.
#[test]
fn a_collective_whose_count_differs_between_the_ranks_is_refused_before_the_step() {
    let seed = &rank_seeds()[0];
    let mut swapped = seed.plan.program.clone();
    let nodes = swapped["graph"]["nodes"].as_array_mut().unwrap();
    let at = |name: &str| nodes.iter().position(|n| n["name"] == name).unwrap();
    let (a, b) = (at("embeddings.decay.params.forward.gathered"), at("layer0.decay.params.forward.gathered"));
    nodes.swap(a, b);
    let e = ranks_refused(seed, &[None, Some(&swapped)]);
    assert!(e.contains("the ranks' programs differ") && e.contains("collective call 0"), "{e}");
    assert!(e.contains("1408 f32 elements in") && e.contains("4096 f32 elements in"), "{e}");
}

/// Rank 1's program computes the gradient norm's sum over the ranks as a
/// local copy: one collective fewer, the last of the step. Without the
/// check rank 1 would finish its step and rank 0 wait in the all-reduce
/// forever; with it both refuse. The same for a tensor-parallel all-reduce.
#[test]
fn a_rank_missing_a_collective_is_refused_instead_of_leaving_its_peer_waiting() {
    for (seed, node) in rank_seeds().iter().zip(["train.grad_sq.all_reduce", "train.grad_sq.tensor_all_reduce"]) {
        let copy = with_op(seed, node, Value::from("Copy"));
        let e = ranks_refused(seed, &[None, Some(&copy)]);
        assert!(e.contains("the ranks' programs differ") && e.contains("schedules"), "{}: {e}", seed.name);
    }
}

/// Rank 1 is given the plan compiled for four data-parallel ranks (ZeRO-3
/// shards cut for 4): it refuses at load, naming the rank count, and rank
/// 0, which loaded its own plan, ends its step with an error instead of
/// waiting for rank 1's collectives ([`ranks::run_ranks`] fails on a rank
/// that ran its step while a peer refused, and on a hang).
#[test]
fn a_rank_whose_peer_refused_a_plan_for_another_rank_count_ends_with_an_error() {
    let seed = &rank_seeds()[0];
    let mut c = Choices::new(&[1, 6]);
    let mutant = ranks::mutate(seed, &mut c);
    assert_eq!((mutant.rank, mutant.what.len()), (1, 1), "{:?}", mutant.what);
    assert!(mutant.what[0].contains("another rank count"), "{:?}", mutant.what);
    let e = ranks_refused(seed, &[None, Some(&mutant.program)]);
    assert!(e.contains("4 data-parallel ranks, this group has 2") || e.contains("a shard over 4 ranks"), "{e}");
}

/// Every rank's plan sums the gradient norm "over one rank" in a group of
/// two: the ranks agree with each other, but the sum would silently skip
/// the peer's share. Each refuses at load, naming the rank count.
#[test]
fn a_collective_over_one_rank_in_a_group_of_two_is_refused_at_load() {
    let seed = &rank_seeds()[0];
    let one = with_op(seed, "train.grad_sq.all_reduce", serde_json::json!({ "AllReduce": { "ranks": 1 } }));
    let e = ranks_refused(seed, &[Some(&one), Some(&one)]);
    assert!(e.contains("the plan runs on 1 data-parallel ranks, this group has 2"), "{e}");
}

/// The first parameter of `program` whose initialiser (or a flat member's)
/// is `kind`, as a mutable JSON value of that initialiser.
fn init_of<'v>(program: &'v mut Value, kind: &str) -> &'v mut Value {
    fn find<'v>(init: &'v mut Value, kind: &str) -> Option<&'v mut Value> {
        if init.get(kind).is_some() {
            return Some(init);
        }
        let members = init.get_mut("Flat")?.get_mut("members")?.as_array_mut()?;
        members.iter_mut().find_map(|m| find(&mut m["init"], kind))
    }
    let nodes = program["graph"]["nodes"].as_array_mut().unwrap();
    nodes.iter_mut().find_map(|n| find(n["op"].get_mut("Param")?.get_mut("init")?, kind)).unwrap()
}

/// A tensor shard's whole tensor given 2⁶⁴ − 1 rows (found by the timed
/// fuzz run: the interpreter drew the whole tensor before comparing it with
/// its node, and its element count overflowed), or two rows more than its
/// node's two shards hold: the reader refuses both.
#[test]
fn a_tensor_shard_whose_whole_disagrees_with_its_node_is_unreadable() {
    let tensor_parallel = &rank_seeds()[1];
    for (rows, expect) in [(None, "more than 2⁶⁴ elements"), (Some(2), "one rank's part of")] {
        let mut program = tensor_parallel.plan.program.clone();
        let shard = &mut init_of(&mut program, "TensorShard")["TensorShard"];
        let axis = shard["axis"].as_u64().unwrap() as usize;
        let whole = shard["whole"][axis].as_u64().unwrap();
        shard["whole"][axis] = Value::from(rows.map_or(u64::MAX, |more| whole + more));
        let timeout = std::time::Duration::from_secs(30);
        match ranks::run_ranks(tensor_parallel, &[Some(&program), None], "a crafted plan", timeout) {
            plan::Outcome::Unreadable(e) => assert!(e.contains(expect), "{e}"),
            other => panic!("expected the reader to refuse it, got {other:?}"),
        }
    }
}

/// A tensor shard cut for 2⁴⁰ tensor ranks, its whole tensor scaled to
/// match: it reads (the shapes agree), but initialising it would draw 2⁴⁰
/// times the node's elements. Refused at load, naming the group's size.
#[test]
fn a_tensor_shard_cut_for_another_group_size_is_refused() {
    let tensor_parallel = &rank_seeds()[1];
    let mut program = tensor_parallel.plan.program.clone();
    let shard = &mut init_of(&mut program, "TensorShard")["TensorShard"];
    let axis = shard["axis"].as_u64().unwrap() as usize;
    let part = shard["whole"][axis].as_u64().unwrap() / 2;
    shard["whole"][axis] = Value::from(part << 40);
    shard["ranks"] = Value::from(1u64 << 40);
    let e = ranks_refused(tensor_parallel, &[Some(&program), None]);
    assert!(e.contains("cut for 1099511627776 tensor-parallel ranks, this group has 2"), "{e}");
}

/// A ZeRO flat buffer whose initialiser claims 2⁴⁰ shards: the members fit
/// (the whole is len × shards), but drawing it would take 2⁴⁰ times the
/// node's memory. Refused at load, naming the group's size.
#[test]
fn a_flat_buffer_cut_for_another_group_size_is_refused() {
    let zero3 = &rank_seeds()[0];
    let mut program = zero3.plan.program.clone();
    init_of(&mut program, "Flat")["Flat"]["shards"] = Value::from(1u64 << 40);
    let e = ranks_refused(zero3, &[Some(&program), None]);
    assert!(e.contains("cut for 1099511627776 data-parallel ranks, this group has 2"), "{e}");
}
