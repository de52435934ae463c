//! Plan files and checkpoints are untrusted input: this crate mutates valid
//! ones and checks that the runtime either refuses each mutant with an
//! error or runs it without touching memory outside its arenas.
//!
//! The same functions serve three drivers:
//!
//! - the cargo-fuzz targets `fuzz/fuzz_targets/*.rs`, where libFuzzer's
//!   bytes choose the mutations (coverage-guided, nightly, minutes at a
//!   time: `scripts/fuzz.sh`); each is one line calling its function in
//!   [`targets`], which also holds the targets that parse files (specs,
//!   `config.json`, plans, safetensors, checkpoint manifests);
//! - `tests/timed.rs`, every target in [`targets`] for a minute each on the
//!   stable toolchain (its corpus, then mutated and random inputs), in CI;
//! - `tests/replay.rs`, fixed byte strings through the structured
//!   mutations, and each mutation the load-time validation exists for.
//!
//! [`plan`] mutates a compiled tiny-bert program (buffer offsets and sizes,
//! arena sizes, shapes, the schedule's order, operands, kernel IR) through
//! its serialised form, so every mutant is read the way a plan file is;
//! [`checkpoint`] mutates a real two-rank ZeRO-3 save on disk (shards
//! swapped, truncated, resized, duplicated, linked from outside; manifest
//! fields and paths); [`ranks`] mutates one rank's program of a two-rank
//! plan (data-parallel ZeRO-3, tensor-parallel) and runs every rank, each
//! on a thread, for one step together. [`Choices`] turns the fuzzer's bytes
//! into decisions.

pub mod checkpoint;
mod choices;
mod json;
pub mod plan;
pub mod ranks;
pub mod targets;

pub use choices::Choices;
