//! A training checkpoint's manifest: opened, joined and resharded, or
//! refused, never a panic, never a file outside the save read. The input is
//! the manifest's bytes; beside it lie the shard files of a real two-rank
//! ZeRO-3 save of tiny-bert (the one `ZEROPLAN_FUZZ_SHARDS` names, as
//! `scripts/fuzz.sh` does, else `checkpoint_mutation`'s seed save), so
//! mutated manifests reach the shards.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zeroplan_untrusted::targets::checkpoint_manifest(data));
