//! The NVMe tier on a GPU rank (`train --backend cuda --nvme-dir DIR`):
//! the host-placed params and states — fp32 masters, AdamW's moments,
//! offloaded parameter shards — live in the tier's slots
//! (`zeroplan_exec::nvme::Tier`: a file, and an anonymous mapping holding
//! the window of them in use), and the runner moves the slots along the
//! schedule's windows exactly as on the host device.
//!
//! What changes on a GPU is the DMA. The slots are ordinary pageable
//! memory, so the copies between them and the device go through a small
//! pool of pinned staging buffers on the copy stream ([`Staging`]); the
//! rest of the host arena stays page-locked for the copies that do not
//! touch a slot (ZeRO-Offload's gradients down), but the slots' planned
//! range of it is left unpinned, so states the tier holds take no RAM
//! there ([`pinned_ranges`]). Host routines (the host AdamW, casts) reach
//! the slots through the same redirection as on the CPU
//! (`GpuMemory::host_ptr`).
//!
//! **Why staging, not `cuMemHostRegister` on the slots.** Registering the
//! slots' mapping once would pin every slot's pages for the whole run —
//! the RAM the tier exists to give back — and the tier releases a slot
//! with `madvise(MADV_DONTNEED)`: on registered pages the process's next
//! touch maps fresh pages while the driver keeps DMA-ing the old pinned
//! ones, so a copy would read stale bytes. Registering each slot for its
//! window instead costs a page-table walk and IOMMU mapping per slot per
//! step, and the unregister must wait for the DMA first. A fixed pool
//! costs one `memcpy` per byte, which the pool pipelines against the DMA
//! (the CPU fills one buffer while the copy engine drains another) — the
//! shape of DeepSpeed's pinned swap buffers.
//!
//! **Ordering.** The runner makes a slot resident (its read awaited,
//! `Tier::ready`) before the step that uses it and writes it back after
//! the step returns. So:
//!
//! - a copy *from* a slot ([`Route::Up`]) reads the slot on the CPU into
//!   staging when it is issued (after the streams' earlier work on the
//!   device side is ordered by the copy stream's join), and only the
//!   staging buffer is read by the queued DMA: the slot may be written back
//!   and released as soon as the step returns;
//! - a copy *into* a slot ([`Route::Down`]) lands before the step returns:
//!   each chunk's DMA into staging ends with an event the CPU waits for
//!   before copying the chunk into the slot, so the slot's write-back never
//!   precedes the bytes it must carry. This blocks the runner until the
//!   compute stream's queued work is done; copies into persistent host
//!   states are the runner's commits and phase-end copies, not the
//!   micro-batch's gradient traffic (which goes to the pinned host arena
//!   by plain DMA).
//!
//! GPUDirect Storage is probed ([`super::gds`]) and not used: see there.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result, sys};
use zeroplan_exec::Buf;
use zeroplan_exec::nvme::Tier;
use zeroplan_ir::Place;

use super::memory::{PinnedArena, by_dma};

/// Bytes per staging buffer: a DMA of 4 MiB takes ~0.16 ms at PCIe 4's
/// 25 GB/s, far above a copy call's few microseconds of overhead, and
/// four of them (16 MiB pinned per rank) are small beside any state.
pub const CHUNK: usize = 4 << 20;

/// Staging buffers: enough that the CPU fills (or empties) one while the
/// copy engine works on the others.
pub const STAGES: usize = 4;

/// How a copy between `from` and `to` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// DMA between the device arena and the pinned host arena, or within
    /// the device arena.
    Dma,
    /// From a slot up to the device, through the staging buffers.
    Up,
    /// From the device down into a slot, through the staging buffers.
    Down,
    /// By the CPU once both streams are idle (host to host, an overlapping
    /// device copy).
    Cpu,
}

/// The route of a copy of `from` into `to`, where `in_slot` says which
/// host buffers lie in a tier slot (pageable memory).
pub fn route(from: Buf, to: Buf, in_slot: impl Fn(Buf) -> bool) -> Route {
    match (from.place, to.place) {
        (Place::Host, Place::Device) if in_slot(from) => Route::Up,
        (Place::Device, Place::Host) if in_slot(to) => Route::Down,
        _ if by_dma(from, to) => Route::Dma,
        _ => Route::Cpu,
    }
}

/// The route of a copy of `from` into `to` beside `tier`, if attached: a
/// host buffer inside one of its slots goes through staging.
pub fn route_beside(tier: Option<&Tier>, from: Buf, to: Buf) -> Route {
    route(from, to, |b| tier.is_some_and(|t| t.ptr(b).is_some()))
}

/// `0..len` in consecutive pieces of at most `chunk` bytes, each starting
/// at a multiple of `chunk`.
pub fn chunks(len: usize, chunk: usize) -> impl Iterator<Item = Range<usize>> {
    assert!(chunk > 0, "a staging chunk holds bytes");
    (0..len.div_ceil(chunk)).map(move |i| i * chunk..((i + 1) * chunk).min(len))
}

/// The parts of a host arena of `len` bytes to page-lock when `slots`
/// (sorted, disjoint) live in the tier: every byte outside them, widened to
/// whole `page`s (registration pins pages), merged where they meet. A
/// slot's pages that no other buffer shares stay unpinned and untouched.
pub fn pinned_ranges(len: usize, slots: &[Buf], page: usize) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut add = |start: usize, end: usize| {
        if start >= end {
            return;
        }
        let r = start / page * page..end.div_ceil(page) * page;
        match out.last_mut() {
            Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    };
    let mut at = 0;
    for s in slots {
        add(at, s.offset.min(len));
        at = at.max(s.offset + s.bytes());
    }
    add(at, len);
    out
}

/// This machine's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// The tier on a GPU rank: its slots, and the staging buffers their copies
/// go through.
pub struct OnNvme {
    pub tier: Tier,
    pub staging: Staging,
}

/// The pinned staging buffers, used in turn; each remembers the event that
/// ends the last DMA touching it, waited for before the CPU reuses it.
pub struct Staging {
    stages: Vec<PinnedArena>,
    busy: Mutex<Pool>,
}

struct Pool {
    done: Vec<Option<CudaEvent>>,
    next: usize,
}

impl Staging {
    /// [`STAGES`] buffers of [`CHUNK`] bytes.
    pub fn new(context: &Arc<CudaContext>) -> Result<Staging, DriverError> {
        let stages = (0..STAGES).map(|_| PinnedArena::new(context, CHUNK)).collect::<Result<Vec<_>, _>>()?;
        Ok(Staging { stages, busy: Mutex::new(Pool { done: (0..STAGES).map(|_| None).collect(), next: 0 }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next buffer, once the DMA last using it is done.
    fn take(&self, pool: &mut Pool) -> Result<usize, DriverError> {
        let i = pool.next;
        pool.next = (i + 1) % self.stages.len();
        if let Some(done) = pool.done[i].take() {
            done.synchronize()?;
        }
        Ok(i)
    }

    /// Queues `n` bytes from host `src` (a slot) to device `dst` on
    /// `stream`: each chunk copied into a staging buffer now, its DMA
    /// queued. Returns once `src` has been read.
    ///
    /// # Safety
    /// `src` holds `n` bytes nothing writes meanwhile; `dst` is `n` bytes of
    /// device memory that work queued on `stream` may overwrite; the rank's
    /// context is bound.
    pub unsafe fn up(
        &self,
        src: *const u8,
        dst: sys::CUdeviceptr,
        n: usize,
        stream: &CudaStream,
    ) -> Result<(), DriverError> {
        let mut pool = self.lock();
        for piece in chunks(n, CHUNK) {
            let i = self.take(&mut pool)?;
            let stage = self.stages[i].ptr();
            // SAFETY: the piece lies in `src` and fits a stage, which no DMA uses now.
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(piece.start), stage, piece.len());
                let staged = std::slice::from_raw_parts(stage.cast_const(), piece.len());
                result::memcpy_htod_async(dst + piece.start as u64, staged, stream.cu_stream())?;
            }
            pool.done[i] = Some(stream.record_event(None)?);
        }
        Ok(())
    }

    /// Copies `n` bytes from device `src` into host `dst` (a slot) through
    /// the staging buffers after the work queued on `stream`, and waits: the
    /// bytes are in `dst` when it returns.
    ///
    /// # Safety
    /// `dst` holds `n` bytes nothing else reads or writes meanwhile; `src`
    /// is `n` bytes of device memory; the rank's context is bound.
    pub unsafe fn down(
        &self,
        src: sys::CUdeviceptr,
        dst: *mut u8,
        n: usize,
        stream: &CudaStream,
    ) -> Result<(), DriverError> {
        let mut pool = self.lock();
        let mut landing: VecDeque<(usize, Range<usize>)> = VecDeque::with_capacity(self.stages.len());
        let land = |pool: &mut Pool, (i, piece): (usize, Range<usize>)| -> Result<(), DriverError> {
            if let Some(done) = pool.done[i].take() {
                done.synchronize()?;
            }
            // SAFETY: the DMA into the stage is done; the piece lies in `dst`.
            unsafe {
                std::ptr::copy_nonoverlapping(self.stages[i].ptr().cast_const(), dst.add(piece.start), piece.len())
            };
            Ok(())
        };
        for piece in chunks(n, CHUNK) {
            if landing.len() == self.stages.len() {
                let oldest = landing.pop_front().expect("a chunk in flight");
                land(&mut pool, oldest)?;
            }
            let i = self.take(&mut pool)?;
            // SAFETY: the stage is free and holds the piece; `src` holds it on the device.
            unsafe {
                let stage = std::slice::from_raw_parts_mut(self.stages[i].ptr(), piece.len());
                result::memcpy_dtoh_async(stage, src + piece.start as u64, stream.cu_stream())?;
            }
            pool.done[i] = Some(stream.record_event(None)?);
            landing.push_back((i, piece));
        }
        while let Some(oldest) = landing.pop_front() {
            land(&mut pool, oldest)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
