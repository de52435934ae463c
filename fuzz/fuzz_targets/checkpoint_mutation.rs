//! Checkpoints are untrusted input: a real two-rank ZeRO-3 save of
//! tiny-bert, damaged on disk (shards swapped, duplicated, truncated,
//! resized, flipped, linked from outside; manifest paths and fields), is
//! refused or loads inside its arenas, and the damage that must be refused
//! is (`zeroplan_untrusted::checkpoint`; `untrusted/tests/replay.rs`
//! replays the same property over fixed inputs in CI).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zeroplan_untrusted::{Choices, checkpoint};

/// This process's scratch directory: the seed save, and the mutant beside it.
fn root() -> PathBuf {
    std::env::temp_dir().join(format!("zeroplan-fuzz-checkpoint-{}", std::process::id()))
}

fn seed() -> &'static checkpoint::Seed {
    static SEED: OnceLock<checkpoint::Seed> = OnceLock::new();
    SEED.get_or_init(|| checkpoint::seed(&root().join("seed")))
}

fuzz_target!(|data: &[u8]| {
    let into = root().join("mutant").join("step-00000000");
    let mutation = checkpoint::mutate(seed(), &into, &mut Choices::new(data));
    let _ = checkpoint::check(seed(), &into, &mutation);
});
