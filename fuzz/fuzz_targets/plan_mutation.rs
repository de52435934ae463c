//! Plan files are untrusted input: a compiled tiny-bert program mutated
//! where a crafted file would strike (offsets, sizes, places, arenas,
//! shapes, schedule order, operands, kernel IR) is unreadable, refused at
//! load, or runs a step without writing outside its arenas, and one that
//! moves a value onto another live at the same time is refused
//! (`zeroplan_untrusted::plan`; `untrusted/tests/replay.rs` replays the
//! same property over fixed inputs in CI).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zeroplan_untrusted::{Choices, plan};

/// The seed programs, compiled once per fuzzing process.
fn seeds() -> &'static [plan::Seed] {
    static SEEDS: OnceLock<Vec<plan::Seed>> = OnceLock::new();
    SEEDS.get_or_init(plan::seeds)
}

fuzz_target!(|data: &[u8]| {
    let mut choices = Choices::new(data);
    let seed = &seeds()[choices.below(seeds().len())];
    let mutant = plan::mutate(seed, &mut choices);
    let _ = plan::check(&mutant);
});
