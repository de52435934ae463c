//! The NVMe tier of one rank: its persistent host buffers (fp32 masters,
//! AdamW's moments, offloaded 16-bit parameter shards) kept in a
//! [`StateFile`], and resident in memory only while the schedule uses
//! them ([`super::schedule`]).
//!
//! Each buffer has a *slot*: the same block-aligned range in the file and
//! in an anonymous mapping (page-aligned, as direct I/O needs). A device
//! redirects the buffer's bytes to its slot ([`Tier::ptr`]). A slot is
//! fetched (read from the file) before its first use in a step, written
//! back after its last use if the step wrote it, and then released
//! (`madvise(MADV_DONTNEED)` gives its pages back to the system). So the
//! states occupy RAM one window at a time, not all at once.
//!
//! Outside a step's schedule (checkpoints reading the state, loading
//! writing it, the runner's phase-end copies) [`Tier::hold`] makes the
//! slots a buffer overlaps resident for one access and releases them after.
//! The tier is a cache: the checkpoint copies the states out of it, and a
//! load writes every slot, so a run never reads a file it did not write.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memmap2::MmapMut;
use zeroplan_ir::Place;

use super::file::{BLOCK, Completion, Io, StateFile, Transfer};
use crate::buffers::Buf;

/// Where a slot's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Residency {
    /// Only in the file; its pages are released.
    Released,
    /// Being read from the file.
    Reading,
    /// In memory; `dirty` if written since it was read.
    Resident { dirty: bool },
    /// Being written back; released when done unless fetched meanwhile.
    Writing { release: bool },
}

/// One persistent buffer on the tier.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    /// The buffer, as the plan placed it in the host arena.
    pub buf: Buf,
    /// Its first byte in the file and in the tier's memory.
    pub at: usize,
    /// Its length rounded up to [`BLOCK`].
    pub len: usize,
}

struct Inner {
    file: StateFile,
    residency: Vec<Residency>,
    /// Bytes of slots resident or in flight now, and the most at once.
    resident: usize,
    high_water: usize,
    /// The first I/O error, kept: every later access reports it.
    error: Option<String>,
}

/// A rank's NVMe tier: its slots, their memory and their file.
pub struct Tier {
    dir: PathBuf,
    slots: Vec<Slot>,
    /// Before `memory`: fields drop in order, and the file's drop waits for
    /// the transfers into the memory.
    inner: Mutex<Inner>,
    /// The slots' memory, reached through `base`; owned for its unmapping.
    _memory: MmapMut,
    base: *mut u8,
}

// The slots' memory is reached through `base`; the runner orders every
// access to a slot after its fetch and before its release, and `inner`'s
// lock orders the tier's own bookkeeping.
unsafe impl Send for Tier {}
unsafe impl Sync for Tier {}

impl Tier {
    /// Moves `bufs` (host-placed, not overlapping) to a new state file
    /// `name` in `dir`, every slot released (loading writes them all).
    pub fn open(dir: &Path, name: &str, bufs: &[Buf], io: Io) -> Result<Tier, String> {
        let mut sorted: Vec<Buf> = bufs.iter().copied().filter(|b| b.bytes() > 0).collect();
        sorted.sort_by_key(|b| b.offset);
        sorted.dedup();
        let mut slots = Vec::with_capacity(sorted.len());
        let mut at = 0;
        for buf in sorted {
            assert_eq!(buf.place, Place::Host, "only host buffers go to the NVMe tier");
            if let Some(prev) = slots.last().map(|s: &Slot| s.buf)
                && prev.overlaps(&buf)
            {
                return Err(format!(
                    "the NVMe tier's buffers overlap at host offset {}: the plan is corrupt",
                    buf.offset
                ));
            }
            let len = buf.bytes().div_ceil(BLOCK) * BLOCK;
            slots.push(Slot { buf, at, len });
            at += len;
        }
        let file = StateFile::create(dir, name, at as u64, io)?;
        let mut memory = MmapMut::map_anon(at.max(BLOCK))
            .map_err(|e| format!("could not map {at} bytes for the NVMe tier's staging memory: {e}"))?;
        let base = memory.as_mut_ptr();
        debug_assert_eq!(memory.len() % BLOCK, 0);
        tracing::info!(
            "NVMe tier: {} slot(s), {at} bytes in {} ({}, {})",
            slots.len(),
            file.path().display(),
            if file.direct() { "O_DIRECT" } else { "buffered" },
            if file.asynchronous() { "io_uring" } else { "synchronous" }
        );
        let inner =
            Inner { file, residency: vec![Residency::Released; slots.len()], resident: 0, high_water: 0, error: None };
        Ok(Tier { dir: dir.to_path_buf(), slots, inner: Mutex::new(inner), _memory: memory, base })
    }

    /// The slots, in host-offset order.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The bytes it keeps: every slot, rounded to blocks (the file's size).
    pub fn bytes(&self) -> usize {
        self.slots.iter().map(|s| s.len).sum()
    }

    /// The state file's path.
    pub fn path(&self) -> PathBuf {
        self.lock().file.path().to_path_buf()
    }

    /// Whether the file is read and written with `O_DIRECT`.
    pub fn direct(&self) -> bool {
        self.lock().file.direct()
    }

    /// The most bytes of slots resident (or in flight) at once so far.
    pub fn high_water_bytes(&self) -> usize {
        self.lock().high_water
    }

    /// The slot bytes resident now.
    pub fn resident_bytes(&self) -> usize {
        self.lock().resident
    }

    /// Where `b`'s bytes are when it lies in a slot (a host buffer the tier
    /// holds, or a view inside one): in the slot's memory.
    pub fn ptr(&self, b: Buf) -> Option<*mut u8> {
        let s = self.slot_containing(b)?;
        let slot = &self.slots[s];
        // SAFETY: `b` lies inside the slot, which lies inside the mapping.
        Some(unsafe { self.base.add(slot.at + (b.offset - slot.buf.offset)) })
    }

    /// The slot `b` lies in.
    fn slot_containing(&self, b: Buf) -> Option<usize> {
        if b.place != Place::Host || self.slots.is_empty() {
            return None;
        }
        let i = self.slots.partition_point(|s| s.buf.offset <= b.offset).checked_sub(1)?;
        let s = self.slots[i].buf;
        (b.offset + b.bytes() <= s.offset + s.bytes() && b.offset >= s.offset).then_some(i)
    }

    /// The slots `b` overlaps.
    pub fn overlapping(&self, b: &Buf) -> Vec<usize> {
        (0..self.slots.len()).filter(|&s| self.slots[s].buf.overlaps(b)).collect()
    }

    /// An error if an earlier transfer failed or the state file vanished
    /// with its directory: never go on with states that may be wrong.
    pub fn check(&self) -> Result<(), String> {
        let inner = self.lock();
        if let Some(e) = &inner.error {
            return Err(e.clone());
        }
        if !inner.file.path().exists() {
            return Err(format!(
                "--nvme-dir {}: the state file {} is gone (the directory was removed or unmounted mid-run): the states \
                 since the last checkpoint are lost; resume from it with --resume",
                self.dir.display(),
                inner.file.path().display()
            ));
        }
        Ok(())
    }

    /// Starts reading slot `s` unless it is in memory or on its way.
    pub fn fetch(&self, s: usize) {
        let mut inner = self.lock();
        self.fetch_locked(&mut inner, s);
    }

    /// Makes slot `s` resident, waiting for its read.
    pub fn ready(&self, s: usize) -> Result<(), String> {
        let mut inner = self.lock();
        self.fetch_locked(&mut inner, s);
        while !matches!(inner.residency[s], Residency::Resident { .. }) {
            self.reap_locked(&mut inner, true);
            if let Some(e) = &inner.error {
                return Err(e.clone());
            }
        }
        Ok(())
    }

    /// Notes that slot `s` was written (it is resident).
    pub fn mark_dirty(&self, s: usize) {
        let mut inner = self.lock();
        if let Residency::Resident { dirty } = &mut inner.residency[s] {
            *dirty = true;
        }
    }

    /// Ends slot `s`'s window: written back if dirty, then released.
    pub fn evict(&self, s: usize) {
        let mut inner = self.lock();
        match inner.residency[s] {
            Residency::Resident { dirty: true } => {
                let slot = self.slots[s];
                inner.residency[s] = Residency::Writing { release: true };
                // SAFETY: the slot's memory lives as long as the tier, whose
                // drop waits for the write; nothing writes it until a fetch,
                // which waits for the write first.
                unsafe {
                    inner.file.submit(Transfer::Write, s as u64, slot.at as u64, self.base.add(slot.at), slot.len)
                };
            }
            Residency::Resident { dirty: false } => self.release(&mut inner, s),
            Residency::Reading => {
                // Fetched ahead but never used: let the read finish, then drop it.
                while inner.residency[s] == Residency::Reading {
                    self.reap_locked(&mut inner, true);
                }
                if inner.residency[s] == (Residency::Resident { dirty: false }) {
                    self.release(&mut inner, s);
                }
            }
            Residency::Writing { .. } | Residency::Released => {}
        }
        self.reap_locked(&mut inner, false);
    }

    /// Waits for every transfer in flight; the first error, if any.
    pub fn settle(&self) -> Result<(), String> {
        let mut inner = self.lock();
        while inner.file.in_flight() > 0 {
            self.reap_locked(&mut inner, true);
        }
        inner.error.clone().map_or(Ok(()), Err)
    }

    /// Makes the slots `b` overlaps resident for one access outside the
    /// schedule; returns those it fetched, for [`Tier::unhold`]. A write
    /// covering a whole slot needs no read first.
    pub fn hold(&self, b: &Buf, write: bool) -> Vec<usize> {
        let mut fetched = Vec::new();
        for s in self.overlapping(b) {
            let mut inner = self.lock();
            let whole = write
                && b.offset <= self.slots[s].buf.offset
                && self.slots[s].buf.offset + self.slots[s].buf.bytes() <= b.offset + b.bytes();
            match inner.residency[s] {
                Residency::Released if whole => {
                    inner.residency[s] = Residency::Resident { dirty: true };
                    inner.resident += self.slots[s].len;
                    inner.high_water = inner.high_water.max(inner.resident);
                }
                Residency::Released | Residency::Writing { .. } | Residency::Reading => {
                    drop(inner);
                    if let Err(e) = self.ready(s) {
                        tracing::error!("{e}");
                    }
                }
                Residency::Resident { .. } => continue,
            }
            fetched.push(s);
        }
        if write {
            for s in self.overlapping(b) {
                self.mark_dirty(s);
            }
        }
        fetched
    }

    /// Ends a [`Tier::hold`]: writes back and releases what it fetched,
    /// waiting for the writes (so a failure shows at once in [`Tier::check`]).
    pub fn unhold(&self, fetched: Vec<usize>) {
        let wrote = !fetched.is_empty();
        for s in fetched {
            self.evict(s);
        }
        if wrote {
            let _ = self.settle();
        }
    }

    /// Runs `access` with the slots its buffers overlap resident
    /// (`(buffer, written)`), by [`Tier::hold`] and [`Tier::unhold`]: how a
    /// device's reads, writes, copies and fills outside the step's schedule
    /// (loading, checkpoints, phase-end copies) reach the states.
    pub fn held<T>(&self, bufs: &[(Buf, bool)], access: impl FnOnce() -> T) -> T {
        let held: Vec<usize> = bufs.iter().flat_map(|(b, write)| self.hold(b, *write)).collect();
        let out = access();
        self.unhold(held);
        out
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fetch_locked(&self, inner: &mut Inner, s: usize) {
        match inner.residency[s] {
            Residency::Released => {
                let slot = self.slots[s];
                inner.residency[s] = Residency::Reading;
                inner.resident += slot.len;
                inner.high_water = inner.high_water.max(inner.resident);
                // SAFETY: as in `evict`; nothing reads the slot until `ready`.
                unsafe {
                    inner.file.submit(Transfer::Read, s as u64, slot.at as u64, self.base.add(slot.at), slot.len)
                };
            }
            // Written back but not yet released: keep it.
            Residency::Writing { .. } => inner.residency[s] = Residency::Writing { release: false },
            Residency::Reading | Residency::Resident { .. } => {}
        }
    }

    fn reap_locked(&self, inner: &mut Inner, wait: bool) {
        for Completion { tag, result } in inner.file.reap(wait) {
            let s = tag as usize;
            if let Err(e) = result {
                inner.error.get_or_insert(e);
            }
            match inner.residency[s] {
                Residency::Reading => inner.residency[s] = Residency::Resident { dirty: false },
                Residency::Writing { release: true } => self.release(inner, s),
                Residency::Writing { release: false } => inner.residency[s] = Residency::Resident { dirty: false },
                Residency::Released | Residency::Resident { .. } => {}
            }
        }
    }

    /// Gives slot `s`'s pages back to the system; the next read refills them.
    fn release(&self, inner: &mut Inner, s: usize) {
        let slot = self.slots[s];
        // SAFETY: the range is whole pages of this mapping, in no transfer.
        unsafe { libc::madvise(self.base.add(slot.at).cast(), slot.len, libc::MADV_DONTNEED) };
        inner.residency[s] = Residency::Released;
        inner.resident -= slot.len;
    }
}
