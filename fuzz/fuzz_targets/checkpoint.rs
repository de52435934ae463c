//! A training checkpoint's manifest: opened, joined and resharded, or
//! refused, never a panic, never a file outside the save read. The input is
//! the manifest's bytes; beside it lie the shard files of a real two-rank
//! ZeRO-3 save of tiny-bert (`scripts/fuzz.sh` makes it and names it in
//! `ZEROPLAN_FUZZ_SHARDS`), so mutated manifests reach the shards.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zeroplan_runtime::checkpoint::training::Checkpoint;

/// A private copy of the seed save's shard files, per fuzzing process.
fn save_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("zeroplan-fuzz-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        if let Ok(seed) = std::env::var("ZEROPLAN_FUZZ_SHARDS") {
            for entry in std::fs::read_dir(seed).expect("ZEROPLAN_FUZZ_SHARDS names a save").flatten() {
                if entry.file_name().to_string_lossy().ends_with(".safetensors") {
                    std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("the shard copies");
                }
            }
        }
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = save_dir();
    std::fs::write(dir.join("manifest.json"), data).expect("the temporary file is writable");
    if let Ok(checkpoint) = Checkpoint::open(dir) {
        let layout = checkpoint.manifest.layout.clone();
        let _ = checkpoint.states_for(&layout, 1);
        let _ = checkpoint.states_for(&layout, 3);
        let _ = checkpoint.weights();
    }
});
