//! Checkpoints are untrusted input: a real two-rank ZeRO-3 save of
//! tiny-bert, damaged on disk (shards swapped, duplicated, truncated,
//! resized, flipped, linked from outside; manifest paths and fields), is
//! refused or loads inside its arenas, and the damage that must be refused
//! is (`zeroplan_untrusted::checkpoint`; `untrusted/tests/replay.rs`
//! replays the same property over fixed inputs in CI).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zeroplan_untrusted::targets::checkpoint_mutation(data));
