//! The copy stream: DMA between the device arena and the pinned host arena
//! (ZeRO-Offload's gradients down, parameters up) beside the compute
//! stream, so a copy overlaps the kernels that do not depend on it.
//!
//! Ordering, by events and byte ranges (see `exec.rs`'s module doc):
//!
//! - a copy first waits for everything queued on the compute stream so far
//!   (an event recorded there): whatever produced its source, and whatever
//!   still reads its destination, is done before it starts;
//! - copies run in order among themselves (one stream);
//! - before compute work is queued that reads or writes a pending copy's
//!   destination, or writes its source, the compute stream waits for that
//!   copy's completion event ([`CopyStream::order`]);
//! - anything the CPU does waits for the copy stream too
//!   ([`CopyStream::synchronize`], with the compute stream's).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaStream, DriverError};

use super::memory::GpuMemory;
use zeroplan_exec::Buf;

/// A queued copy and the event that marks its end.
struct Pending {
    done: CudaEvent,
    from: Buf,
    to: Buf,
}

/// Whether compute touching `touched` (buffer, written) must wait for a
/// copy of `from` into `to`: it reads or writes the destination, or
/// overwrites the source.
pub fn must_wait(touched: &[(Buf, bool)], from: &Buf, to: &Buf) -> bool {
    touched.iter().any(|(b, write)| b.overlaps(to) || (*write && b.overlaps(from)))
}

/// The copy stream and the copies on it not yet known to be ordered.
pub struct CopyStream {
    stream: Arc<CudaStream>,
    pending: Mutex<Vec<Pending>>,
    /// A CUDA graph is being recorded: its events may not be queried.
    recording: AtomicBool,
}

impl CopyStream {
    pub fn new(stream: Arc<CudaStream>) -> CopyStream {
        CopyStream { stream, pending: Mutex::new(Vec::new()), recording: AtomicBool::new(false) }
    }

    /// Queues `from → to` (device ↔ pinned host) after the compute
    /// stream's queued work; `false` when the DMA engines cannot do it.
    pub fn copy(&self, memory: &GpuMemory, compute: &CudaStream, from: Buf, to: Buf) -> Result<bool, DriverError> {
        self.stream.join(compute)?;
        if !memory.copy_async(from, to, &self.stream)? {
            return Ok(false);
        }
        let done = self.stream.record_event(None)?;
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(Pending { done, from, to });
        Ok(true)
    }

    /// Makes `compute` wait for the pending copies that work touching
    /// `touched` must follow (computed only when a copy is pending).
    pub fn order(&self, compute: &CudaStream, touched: impl FnOnce() -> Vec<(Buf, bool)>) -> Result<(), DriverError> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.is_empty() {
            return Ok(());
        }
        let touched = touched();
        // A recorded event has no status to query: kept until the join.
        let recording = self.recording.load(Ordering::Acquire);
        let mut kept = Vec::with_capacity(pending.len());
        for p in pending.drain(..) {
            if must_wait(&touched, &p.from, &p.to) {
                compute.wait(&p.done)?;
            } else if recording || !p.done.try_is_complete()? {
                kept.push(p);
            }
        }
        *pending = kept;
        Ok(())
    }

    /// Makes `compute` wait for every pending copy and forgets them: the
    /// join a CUDA graph's recording needs at both ends (a recording may
    /// wait only on events recorded inside it, and must end with the copy
    /// stream's recorded work joined back into the compute stream), and
    /// what a replay needs first (its copies assume nothing pending).
    pub fn join(&self, compute: &CudaStream) -> Result<(), DriverError> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut result = Ok(());
        for p in pending.drain(..) {
            result = result.and(compute.wait(&p.done));
        }
        result
    }

    /// Marks a CUDA graph's recording as started or ended.
    pub fn recording(&self, on: bool) {
        self.recording.store(on, Ordering::Release);
    }

    /// Waits for every queued copy.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        self.stream.synchronize()?;
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use zeroplan_ir::{DType, Place};

    use super::*;

    #[test]
    fn compute_waits_for_a_copy_whose_destination_it_touches_or_source_it_overwrites() {
        let grad = Buf { place: Place::Device, offset: 0, len: 8, dtype: DType::F32 };
        let host = Buf { place: Place::Host, offset: 0, len: 8, dtype: DType::F32 };
        let other = Buf { offset: 256, ..grad };
        // A gradient going down to the pinned arena.
        assert!(!must_wait(&[(grad, false)], &grad, &host), "reading the source can overlap the copy");
        assert!(must_wait(&[(grad, true)], &grad, &host), "overwriting the source must wait");
        assert!(!must_wait(&[(other, true)], &grad, &host));
        // A parameter coming up from it.
        assert!(must_wait(&[(grad, false)], &host, &grad), "reading the destination must wait");
        assert!(must_wait(&[(grad, true)], &host, &grad));
        assert!(!must_wait(&[(other, false), (other, true)], &host, &grad));
    }
}
