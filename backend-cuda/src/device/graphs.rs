//! CUDA graphs on a rank: which instructions can be recorded, and a
//! capture plan's segment recorded on its first run and replayed after.
//!
//! **Recording** (stream capture, `cuStreamBeginCapture` in thread-local
//! mode on the compute stream): the segment's instructions are run as
//! usual, so their launches, GEMMs and device copies become the graph's
//! nodes. A host↔device copy forks the copy stream into the recording (it
//! waits on an event recorded on the compute stream, `copies.rs`); before
//! the recording ends the compute stream waits for every copy's event,
//! joining the copy stream back, as CUDA requires of a multi-stream
//! capture. Copies pending from before are joined outside the recording,
//! since a recording may wait only on events recorded inside it. The
//! instantiated graph (`cuGraphInstantiate`) is then launched: recording
//! runs nothing.
//!
//! **Replay**: the pending copies joined, dropout's words set for the
//! pass (`rng.rs`; the kernels read them, not launch arguments), one
//! `cuGraphLaunch` on the compute stream. Everything else a recorded
//! launch takes is fixed by the plan: the arena offsets, the shapes, the
//! multi-tensor AdamW's table (its learning rate and step count are read
//! from device buffers the optimizer's scalar kernels write), the cuBLAS
//! and cuBLASLt workspaces (one each, set at load, so no recorded GEMM
//! allocates).
//!
//! **Fallback**: if anything fails while recording — an instruction, the
//! capture itself, instantiation — the recording is ended and discarded,
//! the reason logged (`warn`), and the segment is launched eagerly, now
//! and on every later step.
//!
//! The communication thread must not queue work while a segment records:
//! the runner drains its communication stream before a segment's first
//! run. Not run on a GPU yet (`docs/cuda-device.md`).

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, DriverError};
use zeroplan_exec::graphs::Capture;
use zeroplan_exec::{Ctx, Instr};

use super::memory::by_dma;
use super::{Cuda, CudaKernel, exec};

/// An instantiated graph. cudarc's holds raw driver handles, so it is
/// neither `Send` nor `Sync`; the driver asks that calls on one graph be
/// serialised, which the mutex around every [`Recorded`] does.
struct Graph(CudaGraph);

// SAFETY: only used under `Graphs::recorded`'s lock (see above).
unsafe impl Send for Graph {}

/// What became of a segment's first run.
enum Recorded {
    Graph(Graph),
    /// Recording failed (logged then): launched eagerly from now on.
    Eager,
}

/// The rank's recorded segments by the capture plan's key, and counts for
/// tests and logs.
#[derive(Default)]
pub struct Graphs {
    recorded: Mutex<HashMap<usize, Recorded>>,
    counts: Mutex<GraphCounts>,
}

/// How segments ran so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphCounts {
    /// Segments recorded and instantiated.
    pub recorded: usize,
    /// Launches of a recorded graph after the run that recorded it.
    pub replayed: usize,
    /// Segments whose recording failed (launched eagerly since).
    pub refused: usize,
}

impl Graphs {
    pub fn counts(&self) -> GraphCounts {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops every recorded graph (the plan's keys change meaning).
    pub fn forget(&mut self) {
        self.recorded.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn count(&self, f: impl FnOnce(&mut GraphCounts)) {
        f(&mut self.counts.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// Whether `instr` can be recorded: asynchronous work on the compute or
/// copy stream alone. What the CPU runs or waits for cannot.
pub fn capture(instr: &Instr<CudaKernel>) -> Capture {
    verdict(instr, |kernel| match kernel {
        CudaKernel::Gpu(k) => Capture::Recordable { draws_masks: k.generated().uses_dropout },
        CudaKernel::Attention(a) => Capture::Recordable { draws_masks: a.draws_masks() },
        CudaKernel::Gemm(_) | CudaKernel::AdamW(_) | CudaKernel::Routine(_) => {
            Capture::Recordable { draws_masks: false }
        }
        CudaKernel::Host(_) => {
            Capture::Breaks("a Cranelift kernel on the pinned arena: the CPU runs it after both streams".into())
        }
    })
}

/// [`capture`] over any kernel type, `kernel` judging the kernels (so the
/// rest is tested on plans selected without a GPU).
fn verdict<K>(instr: &Instr<K>, kernel: impl Fn(&K) -> Capture) -> Capture {
    let no = |why: &str| Capture::Breaks(why.into());
    match instr {
        Instr::Kernel { kernel: k, .. } => kernel(k),
        Instr::MatMul { .. } => Capture::Recordable { draws_masks: false },
        Instr::Copy { from, to } if by_dma(*from, *to) => Capture::Recordable { draws_masks: false },
        Instr::Copy { .. } => no("a copy through the CPU (host to host, or overlapping)"),
        Instr::AllReduce { .. }
        | Instr::ReduceScatter { .. }
        | Instr::AllGather { .. }
        | Instr::TensorAllReduce { .. }
        | Instr::SequenceAllGather { .. }
        | Instr::SequenceReduceScatter { .. } => {
            no("a collective: issued through the communicator from the host (staged, or NCCL's, not recorded)")
        }
        Instr::Input { .. } => no("a feed from the host"),
        _ => no("a host routine on a staging copy"),
    }
}

/// Runs `instrs` (segment `key`): replays its graph, records it on its
/// first run, or launches eagerly where recording failed.
pub fn run_segment(cuda: &Cuda, key: usize, instrs: &[&Instr<CudaKernel>], cx: &Ctx) -> Result<(), (usize, String)> {
    let whole = |e: String| (0, e);
    cuda.gpu.context().bind_to_thread().map_err(|e| whole(driver(e)))?;
    let mut recorded = cuda.graphs.recorded.lock().unwrap_or_else(|e| e.into_inner());
    match recorded.get(&key) {
        Some(Recorded::Graph(g)) => {
            ready(cuda, cx).map_err(whole)?;
            g.0.launch().map_err(|e| whole(format!("launching a CUDA graph: {e:?}")))?;
            cuda.graphs.count(|c| c.replayed += 1);
            return Ok(());
        }
        Some(Recorded::Eager) => return eager(cuda, instrs, cx),
        None => {}
    }
    ready(cuda, cx).map_err(whole)?;
    match record(cuda, instrs, cx) {
        Ok(graph) => {
            graph.launch().map_err(|e| whole(format!("launching a CUDA graph: {e:?}")))?;
            recorded.insert(key, Recorded::Graph(Graph(graph)));
            cuda.graphs.count(|c| c.recorded += 1);
            Ok(())
        }
        Err(why) => {
            tracing::warn!("CUDA graph of {} instructions not recorded, launched eagerly: {why}", instrs.len());
            recorded.insert(key, Recorded::Eager);
            cuda.graphs.count(|c| c.refused += 1);
            eager(cuda, instrs, cx)
        }
    }
}

/// What a recording and a replay start from: no copy pending, dropout's
/// words the pass's.
fn ready(cuda: &Cuda, cx: &Ctx) -> Result<(), String> {
    cuda.copies.join(&cuda.compute).map_err(driver)?;
    cuda.rng.set(&cuda.compute, cx.seed, cx.offset)
}

/// Records `instrs` into an instantiated graph, or says why not. The
/// recording is always ended, so the streams leave capture mode.
fn record(cuda: &Cuda, instrs: &[&Instr<CudaKernel>], cx: &Ctx) -> Result<CudaGraph, String> {
    cuda.compute
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| format!("beginning the capture: {e:?}"))?;
    cuda.rng.recording(true);
    cuda.copies.recording(true);
    let mut failed = None;
    for (i, instr) in instrs.iter().enumerate() {
        if let Err(e) = exec::run(cuda, instr, cx) {
            failed = Some(format!("instruction {i} ({}): {e}", zeroplan_exec::Instruction::kind(*instr)));
            break;
        }
    }
    // The copy stream's recorded work joins back, even after a failure
    // (an unjoined fork fails the end of the capture).
    let joined = cuda.copies.join(&cuda.compute);
    let ended = cuda.compute.end_capture(CUgraphInstantiate_flags(0));
    cuda.rng.recording(false);
    cuda.copies.recording(false);
    if let Some(why) = failed {
        return Err(why);
    }
    joined.map_err(|e| format!("joining the copy stream: {e:?}"))?;
    match ended {
        Ok(Some(graph)) => Ok(graph),
        Ok(None) => Err("the capture recorded nothing".into()),
        Err(e) => Err(format!("ending the capture or instantiating the graph: {e:?}")),
    }
}

/// Launches each instruction as usual.
fn eager(cuda: &Cuda, instrs: &[&Instr<CudaKernel>], cx: &Ctx) -> Result<(), (usize, String)> {
    instrs.iter().enumerate().try_for_each(|(i, instr)| exec::run(cuda, instr, cx).map_err(|e| (i, e)))
}

fn driver(e: DriverError) -> String {
    format!("the CUDA driver failed: {e:?}")
}

#[cfg(test)]
mod tests;
