//! Plan files are untrusted input on every rank: one rank's program of a
//! two-rank plan (tiny-bert, data-parallel ZeRO-3 or tensor-parallel)
//! mutated — the single-rank mutations, or a collective's buffers, op,
//! group, rank count or place in the schedule, a shard's cut, a plan for
//! another rank count — while its peer loads the plan as compiled; both run
//! one step on threads joined by in-process groups. Each mutant is
//! unreadable, refused (at load, or by the ranks' agreement on their
//! collectives), or runs inside its arenas, and no rank is left waiting
//! (`zeroplan_untrusted::ranks`; `untrusted/tests/replay.rs` replays the
//! same property over fixed inputs in CI).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zeroplan_untrusted::targets::plan_mutation_ranks(data));
