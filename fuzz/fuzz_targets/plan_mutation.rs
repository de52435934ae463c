//! Plan files are untrusted input: a compiled tiny-bert program mutated
//! where a crafted file would strike (offsets, sizes, places, arenas,
//! shapes, schedule order, operands, kernel IR) is unreadable, refused at
//! load, or runs a step without writing outside its arenas, and one that
//! moves a value onto another live at the same time is refused
//! (`zeroplan_untrusted::plan`; `untrusted/tests/replay.rs` replays the
//! same property over fixed inputs in CI).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zeroplan_untrusted::targets::plan_mutation(data));
