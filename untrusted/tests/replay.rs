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

fn seeds() -> &'static [Value] {
    static SEEDS: OnceLock<Vec<Value>> = OnceLock::new();
    SEEDS.get_or_init(plan::seeds)
}

#[test]
fn plan_mutants_are_refused_or_run_inside_their_arenas() {
    let (mut refused, mut ran) = (0, 0);
    for (i, bytes) in inputs(60, 1).iter().enumerate() {
        let seed = &seeds()[i % seeds().len()];
        let (mutant, what) = plan::mutate(seed, &mut Choices::new(bytes));
        let outcome = plan::check(&mutant);
        match outcome {
            plan::Outcome::Refused(_) => refused += 1,
            plan::Outcome::Ran(_) => ran += 1,
            plan::Outcome::Unreadable(_) | plan::Outcome::Skipped => {}
        }
        eprintln!("input {i}: {what:?} → {outcome:?}");
    }
    // Both sides of the property are exercised, not only the parser.
    assert!(refused >= 8 && ran >= 4, "{refused} refused, {ran} ran");
}

/// The seed with `edit` applied; loading it must fail naming `expect`.
fn refused(edit: impl Fn(&mut Value), expect: &str) {
    let mut mutant = seeds()[0].clone();
    edit(&mut mutant);
    match plan::check(&mutant) {
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
/// inside the arena, but not the in-place update a kernel's code allows.
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
        "overlaps input",
    );
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
