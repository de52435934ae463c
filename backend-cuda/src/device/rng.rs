//! Dropout's Philox seed and counter word in device memory.
//!
//! The dropout kernels (generated row kernels, fused attention) read the
//! two words from a 16-byte device buffer when they run, not from their
//! launch arguments: a CUDA graph freezes a launch's arguments, and the
//! counter word changes every micro-batch. The words are written on the
//! compute stream (`cuMemsetD32Async` of each half, values passed by value,
//! so stream order alone keeps each kernel's words its own) only when they
//! change — once per pass, not per kernel — and before a graph's replay.
//! This is PyTorch's answer for graphs and dropout too (its Philox state
//! holds device pointers to the seed and offset while capturing).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{CudaContext, CudaStream, DriverError, sys};

use super::memory::DeviceArena;

/// The words, and what the compute stream last queued into them.
pub struct RngWords {
    words: DeviceArena,
    /// `(seed, offset)` as the compute stream will have written them by
    /// the next kernel queued; `None` before the first.
    queued: Mutex<Option<(u64, u64)>>,
    /// A graph is being recorded: a write now would be frozen into it.
    recording: AtomicBool,
}

impl RngWords {
    pub fn new(context: &std::sync::Arc<CudaContext>) -> Result<RngWords, DriverError> {
        Ok(RngWords {
            words: DeviceArena::new(context, 16)?,
            queued: Mutex::new(None),
            recording: AtomicBool::new(false),
        })
    }

    /// The device pointer the kernels are given.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.words.ptr()
    }

    /// Queues `(seed, offset)` on `stream` unless they are already the
    /// words its next kernel reads. While a graph is being recorded a
    /// change is refused (the write would be replayed with this value).
    pub fn set(&self, stream: &CudaStream, seed: u64, offset: u64) -> Result<(), String> {
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        if *queued == Some((seed, offset)) {
            return Ok(());
        }
        if self.recording.load(Ordering::Acquire) {
            return Err(format!(
                "dropout's counter word {offset} differs from the one the graph is recorded with: it would be frozen \
                 into the graph"
            ));
        }
        let halves = [seed as u32, (seed >> 32) as u32, offset as u32, (offset >> 32) as u32];
        for (i, half) in halves.into_iter().enumerate() {
            // SAFETY: the 16-byte buffer holds four 32-bit words; the value
            // is passed by value, so the call needs nothing to outlive it.
            unsafe { sys::cuMemsetD32Async(self.ptr() + 4 * i as u64, half, 1, stream.cu_stream()).result() }
                .map_err(|e| format!("writing dropout's counter word: {e:?}"))?;
        }
        *queued = Some((seed, offset));
        Ok(())
    }

    /// Marks a graph's recording as started or ended.
    pub fn recording(&self, on: bool) {
        self.recording.store(on, Ordering::Release);
    }
}
