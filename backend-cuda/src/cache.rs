//! Compiled PTX on disk, keyed by a hash of (source, NVRTC options — the
//! architecture among them — and NVRTC's version).
//!
//! A file is `{hash:016x}.ptx` holding a header, the options and source it
//! was compiled from, then the PTX. A hit is only a hit when the stored
//! options and source equal the ones asked for, so a hash collision or a
//! damaged file is a miss, never wrong code. Files are written to a
//! temporary in the same directory and renamed into place: a reader sees a
//! whole entry or none, also with several processes compiling at once.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The first line of every cache file (bump when the format changes).
const MAGIC: &str = "zeroplan-ptx-cache 1";

/// A directory of compiled PTX.
#[derive(Clone, Debug)]
pub struct PtxCache {
    dir: PathBuf,
}

/// FNV-1a, 64 bits: a file name, not a proof of identity (see the module docs).
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for part in parts {
        for b in part.bytes().chain([0xFF]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
    }
    h
}

impl PtxCache {
    /// A cache in `dir`, created on the first entry written.
    pub fn new(dir: impl Into<PathBuf>) -> PtxCache {
        PtxCache { dir: dir.into() }
    }

    /// `$ZEROPLAN_PTX_CACHE`, else `$XDG_CACHE_HOME/zeroplan/ptx`, else
    /// `~/.cache/zeroplan/ptx`.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("ZEROPLAN_PTX_CACHE") {
            return Some(dir.into());
        }
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(cache.join("zeroplan").join("ptx"))
    }

    /// The directory the entries are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str, source: &str) -> PathBuf {
        self.dir.join(format!("{:016x}.ptx", fnv1a(&[key, source])))
    }

    /// The header and body of an entry: everything before the PTX.
    fn preamble(key: &str, source: &str) -> String {
        format!("{MAGIC}\n{}\n{}\n{key}\n{source}", key.len(), source.len())
    }

    /// The PTX compiled from `source` under `key` (options and NVRTC
    /// version), if cached.
    pub fn get(&self, key: &str, source: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.path(key, source)).ok()?;
        text.strip_prefix(&PtxCache::preamble(key, source)).map(str::to_string)
    }

    /// Stores `ptx` for (`key`, `source`), atomically.
    pub fn put(&self, key: &str, source: &str, ptx: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(key, source);
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
            std::process::id()
        ));
        let result = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(PtxCache::preamble(key, source).as_bytes())?;
            file.write_all(ptx.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("zeroplan-ptx-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn entries_round_trip_and_other_keys_miss() {
        let dir = scratch("round-trip");
        let cache = PtxCache::new(&dir);
        assert_eq!(cache.get("k", "src"), None);
        cache.put("k", "src", ".version 9.0\n").unwrap();
        assert_eq!(cache.get("k", "src").as_deref(), Some(".version 9.0\n"));
        assert_eq!(cache.get("k2", "src"), None);
        assert_eq!(cache.get("k", "src2"), None);
        // Nothing but whole entries in the directory.
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), 1);
        assert!(names[0].ends_with(".ptx"), "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_or_colliding_entry_is_a_miss() {
        let dir = scratch("damaged");
        let cache = PtxCache::new(&dir);
        cache.put("k", "source A", "ptx A").unwrap();
        let path = cache.path("k", "source A");
        // Another source written under this file name (as a hash collision would).
        std::fs::write(&path, format!("{}ptx B", PtxCache::preamble("k", "source B"))).unwrap();
        assert_eq!(cache.get("k", "source A"), None);
        std::fs::write(&path, "zeroplan-ptx-cache 1\n1").unwrap();
        assert_eq!(cache.get("k", "source A"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
