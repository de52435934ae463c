//! Ranks as processes on GPUs: a [`Communicator`] over NCCL (cudarc's
//! bindings, the library loaded at run time).
//!
//! One NCCL communicator per group ([`Nccl::grid`] makes the data and
//! tensor groups of tensor × data parallelism, as the runtime's `Tcp::grid`
//! does): the group's rank 0 draws the unique id (`ncclGetUniqueId`) and
//! publishes it in the rendezvous store under `nccl/GROUP`, and every
//! member calls `ncclCommInitRank` with it. (`ncclCommSplit` would derive
//! the groups from one world communicator, but cudarc exposes it only for
//! CUDA 12.2–12.5; a communicator per group works on every NCCL 2.x.)
//!
//! The CUDA device hands NCCL its device buffers ([`Nccl::all_reduce_device`]
//! and the others, through [`Communicator::device_collectives`]): the collective waits
//! for the compute stream's work so far (an event, not a host
//! synchronisation), runs on the communicator's own stream, and returns
//! once it is done, so the runner's hazards between its compute and
//! communication threads hold as on the host. The [`Communicator`] methods
//! on host slices copy through a device scratch buffer.
//!
//! Sums are NCCL's (ring or tree order, in the buffer's type): **not** the
//! bits the runtime's `InProcess` gives; f32 agrees to rounding, 16-bit types to
//! their precision. A collective polls its completion and NCCL's
//! asynchronous error, so a peer that dies (NCCL reports a remote error)
//! or [`Communicator::abort`] ends the wait with an error instead of a hang.
//!
//! Run on a GPU only as a group of one (`bench/RESULTS.md`); never across
//! GPUs or nodes (see `docs/processes.md`).

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream, DriverError, result as driver};
use cudarc::nccl::{result, sys};
use zeroplan_ir::DType;

use zeroplan_exec::{CommError, Communicator, Rendezvous};

/// Why NCCL cannot be used here, in words for the user.
pub const NOT_FOUND: &str = "NCCL was not found: libnccl.so.2 could not be loaded. Install NCCL (the `nvidia-nccl-cu13` \
     wheel or the system package) and put its lib/ directory on LD_LIBRARY_PATH, or set ZEROPLAN_COMM=tcp to run \
     the collectives over TCP through host memory";

/// NCCL's version (`2.27.3`), or why it cannot be used.
pub fn probe() -> Result<String, String> {
    // SAFETY: only tries to open the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(NOT_FOUND.to_string());
    }
    let v = result::get_nccl_version().map_err(|e| format!("NCCL loaded but failed: {}", describe(&e)))?;
    Ok(format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100))
}

/// NCCL's words for an error.
fn describe(e: &result::NcclError) -> String {
    // SAFETY: NCCL returns a static string for any result code.
    let text = unsafe { sys::ncclGetErrorString(e.0) };
    if text.is_null() {
        format!("{:?}", e.0)
    } else {
        // SAFETY: non-null and NUL-terminated, per NCCL's documentation.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    }
}

/// An NCCL communicator handle (NCCL's calls on one are serialised by the
/// lock around it).
struct Raw(sys::ncclComm_t);

// SAFETY: the handle is used from one thread at a time (the lock in `Nccl`).
unsafe impl Send for Raw {}

/// Device memory for the host-slice collectives, grown on demand.
struct Scratch {
    ptr: u64,
    bytes: usize,
}

/// One rank's handle on an NCCL communicator.
pub struct Nccl {
    rank: usize,
    ranks: usize,
    /// `None` once aborted.
    comm: Mutex<Option<Raw>>,
    context: Arc<CudaContext>,
    /// Where the collectives run.
    stream: Arc<CudaStream>,
    scratch: Mutex<Scratch>,
    failed: AtomicBool,
}

/// NCCL's type for a buffer's.
fn nccl_type(dtype: DType) -> Option<sys::ncclDataType_t> {
    match dtype {
        DType::F32 => Some(sys::ncclDataType_t::ncclFloat32),
        DType::BF16 => Some(sys::ncclDataType_t::ncclBfloat16),
        DType::F16 => Some(sys::ncclDataType_t::ncclFloat16),
        DType::I32 | DType::I64 => None,
    }
}

impl Nccl {
    /// Joins group `group` as rank `rank` of `ranks` on GPU `ordinal`: the
    /// unique id through the store, then `ncclCommInitRank` (which waits
    /// for every member).
    pub fn join(
        store: &dyn Rendezvous,
        group: &str,
        rank: usize,
        ranks: usize,
        ordinal: usize,
    ) -> Result<Nccl, CommError> {
        let fail = |message: String| CommError::Join { group: group.to_string(), rank, message };
        probe().map_err(fail)?;
        let driver = |e: DriverError| fail(format!("GPU {ordinal}: the CUDA driver failed: {e:?}"));
        let context = CudaContext::new(ordinal).map_err(driver)?;
        context.bind_to_thread().map_err(driver)?;
        let key = format!("nccl/{group}");
        let id = if rank == 0 {
            let id = result::get_uniqueid().map_err(|e| fail(format!("ncclGetUniqueId: {}", describe(&e))))?;
            let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
            store.set(&key, &bytes).map_err(fail)?;
            id
        } else {
            let bytes = store.get(&key).map_err(fail)?;
            let internal: [std::ffi::c_char; 128] = std::array::from_fn(|i| bytes.get(i).copied().unwrap_or(0) as _);
            if bytes.len() != internal.len() {
                return Err(fail(format!("`{key}` in the store holds {} bytes, not an NCCL id", bytes.len())));
            }
            sys::ncclUniqueId { internal }
        };
        let mut comm = MaybeUninit::uninit();
        // SAFETY: `comm` is written by NCCL on success; the id is the group's.
        unsafe { result::comm_init_rank(comm.as_mut_ptr(), ranks as i32, id, rank as i32) }.map_err(|e| {
            fail(format!(
                "ncclCommInitRank: {} (NCCL refuses two ranks on one GPU: give each rank its own, LOCAL_RANK picks it)",
                describe(&e)
            ))
        })?;
        // SAFETY: initialised by the successful call above.
        let comm = unsafe { comm.assume_init() };
        let stream = context.new_stream().map_err(driver)?;
        Ok(Nccl {
            rank,
            ranks,
            comm: Mutex::new(Some(Raw(comm))),
            context,
            stream,
            scratch: Mutex::new(Scratch { ptr: 0, bytes: 0 }),
            failed: AtomicBool::new(false),
        })
    }

    /// Global rank `global` of `data_ranks × tensor_ranks` processes on GPU
    /// `ordinal`: its data-parallel group's communicator and its tensor
    /// group's, laid out as the runtime's `InProcess::grid` lays out threads
    /// (global rank `data_rank·t + tensor_rank`).
    pub fn grid(
        store: &dyn Rendezvous,
        global: usize,
        data_ranks: usize,
        tensor_ranks: usize,
        ordinal: usize,
    ) -> Result<(Nccl, Nccl), CommError> {
        let (d, t) = (data_ranks.max(1), tensor_ranks.max(1));
        let data = Nccl::join(store, &format!("data{}", global % t), global / t, d, ordinal)?;
        let tensor = Nccl::join(store, &format!("tensor{}", global / t), global % t, t, ordinal)?;
        Ok((data, tensor))
    }

    /// Queues `enqueue` on the communicator's stream after the work queued
    /// on `after` so far, and waits for it, watching for NCCL's
    /// asynchronous errors and an [`Communicator::abort`].
    fn run(
        &self,
        op: &'static str,
        after: Option<&CudaStream>,
        enqueue: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> Result<result::NcclStatus, result::NcclError>,
    ) -> Result<(), CommError> {
        let mut guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Raw(comm)) = guard.as_ref().map(|r| Raw(r.0)) else { return Err(CommError::PeerFailed { op }) };
        let cuda = |e: DriverError| CommError::Nccl { op, message: format!("the CUDA driver failed: {e:?}") };
        self.context.bind_to_thread().map_err(cuda)?;
        if let Some(after) = after {
            self.stream.join(after).map_err(cuda)?;
        }
        enqueue(comm, self.stream.cu_stream() as sys::cudaStream_t)
            .map_err(|e| CommError::Nccl { op, message: describe(&e) })?;
        let done = self.stream.record_event(None).map_err(cuda)?;
        loop {
            if done.try_is_complete().map_err(cuda)? {
                return Ok(());
            }
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: `comm` is live while the lock is held.
            unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
            let broken = !matches!(state, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress);
            if broken || self.failed.load(Ordering::SeqCst) {
                // SAFETY: aborting frees the communicator; it is dropped from the lock.
                unsafe {
                    let _ = result::comm_abort(comm);
                }
                *guard = None;
                return Err(if broken {
                    CommError::Nccl { op, message: describe(&result::NcclError(state)) }
                } else {
                    CommError::PeerFailed { op }
                });
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// `count` elements of `dtype` at `x` summed over the group into `out`
    /// (the same pointer: in place), after `after`'s queued work.
    ///
    /// # Safety
    /// `x` and `out` are device allocations of this GPU's context holding
    /// `count` elements; they are equal or do not overlap.
    pub unsafe fn all_reduce_device(
        &self,
        x: u64,
        out: u64,
        count: usize,
        dtype: DType,
        after: &CudaStream,
    ) -> Result<(), CommError> {
        let op = "all_reduce";
        let t = nccl_type(dtype).ok_or(CommError::Nccl { op, message: format!("a {dtype:?} payload") })?;
        self.run(op, Some(after), |comm, s| unsafe {
            result::all_reduce(x as _, out as _, count, t, sys::ncclRedOp_t::ncclSum, comm, s)
        })
    }

    /// The group's `x` (`count · ranks` elements each) summed; this rank's
    /// `count`-element slice of the sum into `out`.
    ///
    /// # Safety
    /// As [`Nccl::all_reduce_device`]; in place means `out == x + rank·count`.
    pub unsafe fn reduce_scatter_device(
        &self,
        x: u64,
        out: u64,
        count: usize,
        dtype: DType,
        after: &CudaStream,
    ) -> Result<(), CommError> {
        let op = "reduce_scatter";
        let t = nccl_type(dtype).ok_or(CommError::Nccl { op, message: format!("a {dtype:?} payload") })?;
        self.run(op, Some(after), |comm, s| unsafe {
            result::reduce_scatter(x as _, out as _, count, t, sys::ncclRedOp_t::ncclSum, comm, s)
        })
    }

    /// Every rank's `count` elements at `x`, in rank order, into `out`.
    ///
    /// # Safety
    /// As [`Nccl::all_reduce_device`]; in place means `x == out + rank·count`.
    pub unsafe fn all_gather_device(
        &self,
        x: u64,
        out: u64,
        count: usize,
        dtype: DType,
        after: &CudaStream,
    ) -> Result<(), CommError> {
        let op = "all_gather";
        let t = nccl_type(dtype).ok_or(CommError::Nccl { op, message: format!("a {dtype:?} payload") })?;
        self.run(op, Some(after), |comm, s| unsafe { result::all_gather(x as _, out as _, count, t, comm, s) })
    }

    /// Runs a collective on host slices: `input` copied into the scratch
    /// buffer's start, the collective from there into the `output_len`
    /// elements after it, the result copied into `output`.
    fn staged(
        &self,
        op: &'static str,
        input: &[f32],
        output: &mut [f32],
        collective: impl FnOnce(
            u64,
            u64,
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> Result<result::NcclStatus, result::NcclError>,
    ) -> Result<(), CommError> {
        let cuda = |e: DriverError| CommError::Nccl { op, message: format!("the CUDA driver failed: {e:?}") };
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = (input.len() + output.len()).max(1) * 4;
        self.context.bind_to_thread().map_err(cuda)?;
        if scratch.bytes < bytes {
            // SAFETY: the old allocation is ours and idle (its last use was waited for).
            unsafe {
                if scratch.bytes > 0 {
                    driver::free_sync(scratch.ptr).map_err(cuda)?;
                    scratch.bytes = 0;
                }
                scratch.ptr = driver::malloc_sync(bytes).map_err(cuda)?;
            }
            scratch.bytes = bytes;
        }
        let (x, out) = (scratch.ptr, scratch.ptr + 4 * input.len() as u64);
        // SAFETY: both ranges lie in the scratch allocation.
        unsafe { driver::memcpy_htod_sync(x, input) }.map_err(cuda)?;
        self.run(op, None, |comm, s| collective(x, out, comm, s))?;
        self.context.bind_to_thread().map_err(cuda)?;
        // SAFETY: as above; the collective has finished.
        unsafe { driver::memcpy_dtoh_sync(output, out) }.map_err(cuda)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        let _ = self.context.bind_to_thread();
        if let Some(Raw(comm)) = self.comm.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            // SAFETY: no collective is in flight (we hold `&mut self`).
            unsafe {
                let _ = result::comm_destroy(comm);
            }
        }
        let scratch = self.scratch.get_mut().unwrap_or_else(|e| e.into_inner());
        if scratch.bytes > 0 {
            // SAFETY: allocated by `staged`, idle.
            let _ = unsafe { driver::free_sync(scratch.ptr) };
        }
    }
}

const F32: sys::ncclDataType_t = sys::ncclDataType_t::ncclFloat32;
const SUM: sys::ncclRedOp_t = sys::ncclRedOp_t::ncclSum;

impl Communicator for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn all_reduce(&self, data: &mut [f32]) -> Result<(), CommError> {
        let input = data.to_vec();
        let n = data.len();
        self.staged("all_reduce", &input, data, |x, out, comm, s| unsafe {
            result::all_reduce(x as _, out as _, n, F32, SUM, comm, s)
        })
    }

    fn reduce_scatter(&self, data: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        let (op, n) = ("reduce_scatter", self.ranks);
        if !data.len().is_multiple_of(n) || out.len() != data.len() / n {
            return Err(CommError::Uneven { op, len: data.len(), ranks: n });
        }
        let count = out.len();
        self.staged(op, data, out, |x, o, comm, s| unsafe {
            result::reduce_scatter(x as _, o as _, count, F32, SUM, comm, s)
        })
    }

    fn all_gather(&self, part: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        let (op, n) = ("all_gather", self.ranks);
        if out.len() != part.len() * n {
            return Err(CommError::Uneven { op, len: out.len(), ranks: n });
        }
        let count = part.len();
        self.staged(op, part, out, |x, o, comm, s| unsafe { result::all_gather(x as _, o as _, count, F32, comm, s) })
    }

    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<(), CommError> {
        let (op, n) = ("broadcast", self.ranks);
        if root >= n {
            return Err(CommError::NoRoot { op, root, ranks: n });
        }
        let input = data.to_vec();
        let count = data.len();
        self.staged(op, &input, data, |x, o, comm, s| unsafe {
            result::broadcast(x as _, o as _, count, F32, root as i32, comm, s)
        })
    }

    /// NCCL has no barrier: a one-element all-reduce is one.
    fn barrier(&self) -> Result<(), CommError> {
        self.staged("barrier", &[0.0], &mut [0.0], |x, o, comm, s| unsafe {
            result::all_reduce(x as _, o as _, 1, F32, SUM, comm, s)
        })
    }

    fn abort(&self) {
        self.failed.store(true, Ordering::SeqCst);
        // Idle: abort now. Busy: the collective in flight aborts at its next poll.
        if let Ok(mut guard) = self.comm.try_lock()
            && let Some(Raw(comm)) = guard.take()
        {
            let _ = self.context.bind_to_thread();
            // SAFETY: no collective holds the communicator.
            unsafe {
                let _ = result::comm_abort(comm);
            }
        }
    }

    fn device_collectives(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
