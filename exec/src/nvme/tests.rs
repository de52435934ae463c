//! The tier against its file: states survive eviction bit for bit through
//! io_uring with O_DIRECT on a disk, and through each fallback (buffered,
//! synchronous) on tmpfs; a missing or vanished directory is an error
//! naming it.

use std::path::{Path, PathBuf};

use zeroplan_ir::{DType, Place};

use super::*;

fn host(offset: usize, len: usize) -> Buf {
    Buf { place: Place::Host, offset, len, dtype: DType::F32 }
}

fn scratch(root: &str, name: &str) -> PathBuf {
    let dir = Path::new(root).join(format!("zeroplan-nvme-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fill(tier: &Tier, b: Buf, seed: u32) {
    let held = tier.hold(&b, true);
    let p = tier.ptr(b).unwrap().cast::<u32>();
    for i in 0..b.len {
        // SAFETY: `b` is held resident, f32-sized elements.
        unsafe { p.add(i).write(seed.wrapping_mul(2654435761).wrapping_add(i as u32)) };
    }
    tier.unhold(held);
}

fn read(tier: &Tier, b: Buf) -> Vec<u32> {
    let held = tier.hold(&b, false);
    let p = tier.ptr(b).unwrap().cast::<u32>();
    // SAFETY: as in `fill`.
    let out = (0..b.len).map(|i| unsafe { p.add(i).read() }).collect();
    tier.unhold(held);
    out
}

/// Three buffers (one not a whole block, one at an unaligned host offset)
/// written, evicted, read back through windows and through holds.
fn round_trip(dir: &Path, io: Io) -> bool {
    let bufs = [host(256, 1000), host(8192, 5000), host(40_000, 3)];
    let tier = Tier::open(dir, "rank.states", &bufs, io).unwrap();
    for (i, b) in bufs.iter().enumerate() {
        fill(&tier, *b, i as u32 + 1);
    }
    assert_eq!(tier.resident_bytes(), 0, "holds release what they fetched");
    let want: Vec<Vec<u32>> = bufs.iter().map(|b| read(&tier, *b)).collect();
    for (i, b) in bufs.iter().enumerate() {
        assert_eq!(
            want[i][7.min(b.len - 1)],
            (i as u32 + 1).wrapping_mul(2654435761).wrapping_add(7.min(b.len as u32 - 1))
        );
    }
    // A window: fetch ahead, ready, write, evict (written back), read again.
    tier.fetch(0);
    tier.fetch(1);
    tier.ready(0).unwrap();
    tier.ready(1).unwrap();
    assert_eq!(tier.resident_bytes(), 4096 + 20480);
    let view = host(8192 + 4 * 100, 10);
    // SAFETY: slot 1 is resident.
    unsafe { tier.ptr(view).unwrap().cast::<u32>().write(0xdead_beef) };
    tier.mark_dirty(1);
    tier.evict(0);
    tier.evict(1);
    tier.settle().unwrap();
    assert_eq!(tier.resident_bytes(), 0);
    let again = read(&tier, bufs[1]);
    assert_eq!(again[100], 0xdead_beef);
    assert_eq!(again[..100], want[1][..100]);
    assert_eq!(again[101..], want[1][101..]);
    assert_eq!(read(&tier, bufs[0]), want[0]);
    assert!(tier.high_water_bytes() >= 4096 + 20480);
    tier.check().unwrap();
    let direct = tier.direct();
    let path = tier.path();
    drop(tier);
    assert!(!path.exists(), "the state file is a cache, removed with its tier");
    direct
}

#[test]
fn states_survive_eviction_with_direct_io_on_a_disk() {
    let dir = scratch(&std::env::temp_dir().to_string_lossy(), "disk");
    let direct = round_trip(&dir, Io::default());
    eprintln!("O_DIRECT on {}: {direct}", dir.display());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn buffered_and_synchronous_fallbacks_keep_the_states_on_tmpfs() {
    if !Path::new("/dev/shm").is_dir() {
        return eprintln!("no /dev/shm here: skipped");
    }
    let dir = scratch("/dev/shm", "tmpfs");
    assert!(!round_trip(&dir, Io { direct: false, io_uring: true }));
    assert!(!round_trip(&dir, Io { direct: false, io_uring: false }));
    eprintln!("O_DIRECT on tmpfs: {}", round_trip(&dir, Io::default()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_directory_is_named() {
    let dir = std::env::temp_dir().join("zeroplan-nvme-test-no-such-dir");
    let e = Tier::open(&dir, "rank.states", &[host(0, 10)], Io::default()).err().unwrap();
    assert!(
        e.contains("--nvme-dir") && e.contains("no such directory") && e.contains(&dir.display().to_string()),
        "{e}"
    );
}

#[test]
fn a_vanished_directory_is_an_error_not_silent_states() {
    let dir = scratch(&std::env::temp_dir().to_string_lossy(), "vanish");
    let tier = Tier::open(&dir, "rank.states", &[host(0, 10)], Io::default()).unwrap();
    tier.check().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let e = tier.check().unwrap_err();
    assert!(e.contains("is gone") && e.contains(&dir.display().to_string()) && e.contains("--resume"), "{e}");
}
