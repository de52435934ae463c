//! The CUDA device: a rank's program on one GPU.
//!
//! [`Cuda`] is a [`Device`] for the runtime's `Runner`: one `cuMemAlloc`
//! arena at the plan's device size and one pinned (`cuMemHostAlloc`) arena
//! at its host size ([`memory`]); instruction selection is every device's
//! (`zeroplan_exec::select`) with this device's kernels ([`kernels`]: NVRTC
//! on device buffers, Cranelift on the pinned arena), then the device's
//! step passes ([`passes`], each a `zeroplan_exec::StepPass`) that replace
//! groups of instructions with device-specific ones:
//!
//! - fused attention as the backend's FlashAttention-2-style kernels
//!   ([`attention`]);
//! - a matmul and its bias-epilogue kernel as one cuBLASLt product with the
//!   `BIAS` / `GELU_BIAS` / `GELU_AUX_BIAS` epilogue, or the bias alone in
//!   the product and the rest of the kernel rewritten without it
//!   ([`epilogue`]); a weight gradient and its bias gradient (the column
//!   sum of the same dY) as one product with the `BGRADA` / `BGRADB`
//!   epilogue ([`bias_grad`]);
//! - runs of AdamW updates as one multi-tensor launch ([`adamw`]);
//! - the host routines a training step runs — losses, embeddings and their
//!   gradients, layout ops, fills — as the backend's routine kernels
//!   (`routines`), where their buffers lie on the device.
//!
//! Matmuls the passes leave run through cuBLAS. Host↔device copies run on a copy stream ordered by events ([`copies`]);
//! device copies on the compute stream. Every other instruction — routines
//! over offloaded buffers or without a kernel (casts, the optimizer's
//! scalars, …; loading warns with their count) and collectives through a
//! host `Communicator` — is the host backend's routine
//! (`zeroplan_backend_cpu::device::exec`) run on a staging copy of its buffers ([`exec`]): slow (a round
//! trip over PCIe each), but the same code and the same answers. Under an NCCL
//! communicator (one process per GPU, `zeroplan launch`), collectives on
//! device buffers go to NCCL as device pointers ([`collective`]).
//!
//! With an NVMe tier (`--nvme-dir`, [`Device::attach_tier`]) the host-placed
//! params and states live in the tier's slots, reached by the host routines
//! there and copied to and from the device through pinned staging buffers
//! ([`tier`]); the host arena stays pinned around them.
//!
//! Runs of the schedule the runner's capture plan marks
//! (`zeroplan_exec::graphs`) are recorded once as CUDA graphs and replayed
//! on later steps ([`graphs`]); dropout's counter word is read from device
//! memory ([`rng`]) so replays draw each step's masks.
//!
//! Run on one H100 (`bench/RESULTS.md`); what that run covered and what it
//! did not: `docs/cuda-device.md`.

pub mod adamw;
mod attention;
pub mod bias_grad;
mod collective;
mod copies;
pub mod epilogue;
mod exec;
mod gds;
mod graphs;
mod kernels;
mod memory;
pub mod passes;
mod rng;
mod routines;
pub mod schedule;
#[cfg(test)]
mod testing;
mod tier;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::{Blas, BlasLt, CudaDevice, CudaKernelCompiler, Gemm, Nvrtc, Probe, PtxCache, probe};
use cudarc::driver::CudaStream;
use zeroplan_ir::plan::Program;
use zeroplan_ir::{Bindings, DType, NodeIndex, Place, Tensor, Value};

pub use graphs::GraphCounts;
pub use kernels::CudaKernel;
use memory::{DeviceArena, GpuMemory, PinnedArena};

use zeroplan_exec::graphs::Capture;
use zeroplan_exec::nvme::Tier;
use zeroplan_exec::{Buf, Ctx, Device, Instr, Loaded, Rank, SelectError, select};

/// Where NVRTC is looked for first: a directory holding `lib/libnvrtc.so.13`
/// and `include/` (the layout `scripts/fetch-nvrtc.sh` writes); else the
/// library search path and the CUDA toolkit's headers.
pub const NVRTC_DIR_VAR: &str = "ZEROPLAN_NVRTC_DIR";

/// Which GPU every rank of this process opens (default: `LOCAL_RANK` in a
/// launched run, one GPU per process; else 0, N threads' ranks on one GPU).
pub const DEVICE_VAR: &str = "ZEROPLAN_CUDA_DEVICE";

/// The GPU this process's ranks open: [`DEVICE_VAR`], else `LOCAL_RANK`
/// (torchrun's convention, which the runtime's launcher sets), else 0.
pub fn ordinal() -> Result<usize, String> {
    for var in [DEVICE_VAR, "LOCAL_RANK"] {
        if let Ok(v) = std::env::var(var) {
            return v.trim().parse::<usize>().map_err(|_| format!("{var}={v} is not a GPU ordinal"));
        }
    }
    Ok(0)
}

/// Why there is no GPU to run on, in words for the user; `Ok` with the
/// ordinal to open when there is one.
pub fn available() -> Result<usize, String> {
    let ordinal = ordinal()?;
    match probe() {
        Probe::NoDriver => Err("no CUDA driver found: libcuda could not be loaded (is an NVIDIA driver installed, \
                                and this a machine with a GPU?)"
            .into()),
        Probe::DriverError(e) => Err(format!("the CUDA driver failed to start: {e}")),
        Probe::Gpus(gpus) if gpus.is_empty() => {
            Err("no CUDA driver found: the driver loaded but reports no GPU".into())
        }
        Probe::Gpus(gpus) if ordinal >= gpus.len() => Err(format!(
            "GPU {ordinal} ({DEVICE_VAR}, else LOCAL_RANK), but the driver reports {} GPU(s): launch at most that \
             many ranks per node",
            gpus.len()
        )),
        Probe::Gpus(_) => Ok(ordinal),
    }
}

/// NVRTC from [`NVRTC_DIR_VAR`], else the system's.
fn nvrtc() -> Result<Nvrtc, String> {
    let found = match std::env::var_os(NVRTC_DIR_VAR).map(PathBuf::from) {
        Some(dir) => {
            let include = dir.join("include");
            Nvrtc::from_dir(&dir.join("lib"), include.join("cuda_bf16.h").is_file().then_some(include))
        }
        None => Nvrtc::system(None),
    };
    found.map_err(|e| format!("{e} (set {NVRTC_DIR_VAR} to a directory scripts/fetch-nvrtc.sh fills)"))
}

/// One GPU and one rank's memory on it.
pub struct Cuda {
    memory: GpuMemory,
    /// Cross-row partials of the GPU kernels (one kernel at a time uses them).
    partials: DeviceArena,
    blas: Blas,
    /// cuBLASLt, for the products with epilogues (`None` without libcublasLt:
    /// then none is selected).
    lt: Option<BlasLt>,
    /// Kernels, GEMMs and device copies, in schedule order.
    compute: Arc<CudaStream>,
    /// Host↔device copies, ordered against `compute` by events.
    copies: copies::CopyStream,
    /// The multi-tensor AdamW launches' tables.
    tables: DeviceArena,
    /// Dropout's seed and counter word, which the kernels read ([`rng`]).
    rng: rng::RngWords,
    /// The recorded CUDA graphs ([`graphs`]).
    graphs: graphs::Graphs,
    gpu: CudaDevice,
}

impl Cuda {
    /// How the capture plan's segments ran so far (CUDA graphs recorded,
    /// replayed, refused).
    pub fn graph_counts(&self) -> GraphCounts {
        self.graphs.counts()
    }
}

impl Device for Cuda {
    type Instr = Instr<CudaKernel>;

    fn load(
        program: &Program,
        order: &[NodeIndex],
        bufs: &HashMap<Value, Buf>,
        bindings: &Bindings,
        rank: Rank,
    ) -> Result<Loaded<Cuda>, SelectError> {
        let fail = |message: String| SelectError::Device(message);
        let ordinal = available().map_err(fail)?;
        let gpu = CudaDevice::open(ordinal).map_err(|e| fail(e.to_string()))?;
        let mut nvrtc = CudaKernelCompiler::new(
            *gpu.properties(),
            nvrtc().map_err(fail)?,
            PtxCache::default_dir().map(PtxCache::new),
        );
        nvrtc.prepare(kernels::on_device(&program.graph, order, bufs, bindings));
        let mut compilers = kernels::Kernels { gpu: &gpu, nvrtc, host: None, loaded: HashMap::new(), scratch_bytes: 0 };
        let mut steps = select(&program.graph, order, bufs, bindings, rank, &mut compilers)?;
        for step in &steps {
            if let Some(Instr::MatMul { shape, a, b, out }) = &step.instr {
                let node = program.graph.node(step.node);
                let unsupported =
                    |message: String| SelectError::Node { node: node.name.to_string(), op: node.op.name(), message };
                check_matmul(shape, *a, *b, *out).map_err(unsupported)?;
            }
        }
        let context = gpu.context();
        let size = |n: u64| usize::try_from(n).map_err(|_| fail(format!("{n} bytes do not fit this host")));
        let driver = |e: cudarc::driver::DriverError| fail(format!("allocating the plan's arenas: {e:?}"));
        let memory = GpuMemory {
            device: DeviceArena::new(context, size(program.arena_bytes)?).map_err(driver)?,
            host: PinnedArena::new(context, size(program.host_arena_bytes)?).map_err(driver)?,
            nvme: None,
        };
        let stream = |what: &str| {
            context.new_stream().map_err(|e| SelectError::Device(format!("creating the {what} stream: {e:?}")))
        };
        let (compute, copy) = (stream("compute")?, stream("copy")?);
        let blas = Blas::new(Arc::clone(&compute)).map_err(|e| fail(e.to_string()))?;
        // cuBLASLt is an optimisation: without it the plain GEMMs run.
        let lt = BlasLt::new(Arc::clone(&compute)).inspect_err(|e| tracing::debug!("no GEMM epilogues: {e}")).ok();
        let mut cx = passes::Load {
            bindings,
            bufs,
            rank,
            memory: &memory,
            lt: lt.as_ref(),
            kernels: &mut compilers,
            tables: None,
        };
        passes::load(&program.graph, &mut steps, &mut cx)?;
        routines::log_staged(&steps);
        let tables = cx.tables.take().ok_or_else(|| fail("the multi-tensor AdamW pass did not run".into()))?;
        let partials = DeviceArena::new(context, compilers.scratch_bytes).map_err(driver)?;
        let copies = copies::CopyStream::new(copy);
        let rng = rng::RngWords::new(context).map_err(driver)?;
        let graphs = graphs::Graphs::default();
        Ok((Cuda { memory, partials, blas, lt, compute, copies, tables, rng, graphs, gpu }, steps))
    }

    fn run(&self, instr: &Self::Instr, cx: &Ctx) -> Result<(), String> {
        exec::run(self, instr, cx)
    }

    fn synchronize(&self) -> Result<(), String> {
        exec::settle(self)
    }

    /// One thread for both groups: NCCL does not promise that kernels of
    /// two communicators in flight at once both progress (its guide,
    /// "Using multiple NCCL communicators concurrently"), and this has not
    /// been run on GPUs with both groups yet.
    fn concurrent_groups(&self) -> bool {
        false
    }

    fn capture(&self, instr: &Self::Instr) -> Capture {
        graphs::capture(instr)
    }

    fn run_segment(&self, key: usize, instrs: &[&Self::Instr], cx: &Ctx) -> Result<(), (usize, String)> {
        graphs::run_segment(self, key, instrs, cx)
    }

    fn forget_graphs(&mut self) {
        // No replay may still be running when its executable graph goes.
        if let Err(e) = exec::settle(self) {
            tracing::warn!("waiting for the GPU before dropping its CUDA graphs: {e}");
        }
        self.graphs.forget();
    }

    fn read(&self, buf: Buf, shape: Vec<usize>) -> Tensor {
        self.held(&[(buf, false)], || exec::read(self, buf, shape))
            .unwrap_or_else(|e| panic!("reading a buffer back from the GPU: {e}"))
    }

    fn write(&self, buf: Buf, t: &Tensor) {
        self.held(&[(buf, true)], || exec::write(self, buf, t))
            .unwrap_or_else(|e| panic!("writing a buffer to the GPU: {e}"))
    }

    fn copy(&self, from: Buf, to: Buf) {
        self.held(&[(from, false), (to, true)], || exec::copy(self, from, to))
            .unwrap_or_else(|e| panic!("copying a buffer on the GPU: {e}"))
    }

    fn fill(&self, buf: Buf, value: f64) {
        self.held(&[(buf, true)], || exec::fill(self, buf, value))
            .unwrap_or_else(|e| panic!("filling a buffer on the GPU: {e}"))
    }

    /// Keeps the host-placed params and states in `tier`'s slots
    /// ([`tier`]): the pinned host arena is remade page-locked only outside
    /// the slots (so their planned bytes take no RAM), and copies to and
    /// from the slots go through pinned staging buffers.
    fn attach_tier(&mut self, tier: Tier) -> Result<(), String> {
        // Nothing queued may still use the pinned arena this replaces.
        exec::settle(self)?;
        let slots: Vec<Buf> = tier.slots().iter().map(|s| s.buf).collect();
        let context = self.gpu.context();
        let len = self.memory.host.len();
        let ranges = tier::pinned_ranges(len, &slots, tier::page_size());
        let host = PinnedArena::registered(context, len, &ranges).map_err(|e| format!("--nvme-dir: {e}"))?;
        let staging = tier::Staging::new(context).map_err(|e| {
            format!("--nvme-dir: allocating {} pinned staging buffers of {} bytes: {e:?}", tier::STAGES, tier::CHUNK)
        })?;
        tracing::info!("{}", gds::Gds::probe().describe());
        self.memory.host = host;
        self.memory.nvme = Some(tier::OnNvme { tier, staging });
        Ok(())
    }

    fn tier(&self) -> Option<&Tier> {
        self.memory.nvme.as_ref().map(|n| &n.tier)
    }
}

impl Cuda {
    /// Runs `access` with the NVMe tier slots its buffers overlap resident
    /// (`(buffer, written)`): the runner's reads and writes outside the
    /// step's schedule reach the states in the file.
    fn held<T>(&self, bufs: &[(Buf, bool)], access: impl FnOnce() -> T) -> T {
        match self.tier() {
            Some(tier) => tier.held(bufs, access),
            None => access(),
        }
    }
}

/// What cuBLAS cannot take of a matmul the host runtime runs: operands off
/// the device or of mixed types.
fn check_matmul(shape: &zeroplan_exec::MatMulShape, a: Buf, b: Buf, out: Buf) -> Result<(), String> {
    if [a, b, out].iter().any(|x| x.place != Place::Device) {
        return Err("not supported on CUDA yet: a matmul over host (offloaded) buffers".into());
    }
    if a.dtype != b.dtype || a.dtype != out.dtype {
        return Err(format!(
            "not supported on CUDA yet: a matmul of {:?} × {:?} into {:?} (cuBLAS takes one type)",
            a.dtype, b.dtype, out.dtype
        ));
    }
    gemm(shape, a.dtype).check().map(|_| ()).map_err(|e| e.to_string())
}

/// The cuBLAS call of a host matmul shape on operands of `dtype`.
fn gemm(shape: &zeroplan_exec::MatMulShape, dtype: DType) -> Gemm<'_> {
    Gemm {
        m: shape.m,
        n: shape.n,
        k: shape.k,
        transpose_a: shape.transpose_a,
        transpose_b: shape.transpose_b,
        batches: &shape.batches,
        dtype,
    }
}
