//! A training checkpoint's manifest: opened, joined and resharded, or
//! refused, never a panic, never a file outside the save read. The input is
//! the manifest's bytes; beside it lie the shard files of a real two-rank
//! ZeRO-3 save of tiny-bert (`checkpoint_mutation`'s seed save, whose
//! manifest is in the corpus), so mutated manifests reach the shards.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zeroplan_untrusted::targets::checkpoint_manifest(data));
