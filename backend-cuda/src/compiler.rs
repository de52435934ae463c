//! Kernels to PTX when a plan is loaded: CUDA C from [`crate::codegen`],
//! compiled by NVRTC for the device's architecture, cached in memory by
//! (kernel text, dims) and on disk by (source, options, NVRTC version).
//! Mirrors the CPU backend's `KernelCompiler::compile(&kernel, &dims)`.
//! The fused attention passes ([`CudaKernelCompiler::compile_attention`]),
//! the multi-tensor AdamW ([`CudaKernelCompiler::compile_adamw`]) and the
//! routine kernels ([`CudaKernelCompiler::compile_routine`]) share the caches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use zeroplan_ir::kernel::Kernel;

use crate::adamw::{AdamWError, AdamWKernel, RenderedAdamW};
use crate::attention::{AttentionError, AttentionKernel, Pass, RenderedAttention};
use crate::cache::PtxCache;
use crate::codegen::{self, CodegenError, DeviceProperties, GeneratedKernel};
use crate::nvrtc::{Nvrtc, NvrtcError};
use crate::routines::{RenderedRoutine, Routine, RoutineError};

/// A row kernel's entry in the in-memory cache: its text and the dims its
/// shape is bound to.
type MemoryKey = (String, Vec<usize>);

/// Why a kernel could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The row kernel could not be turned into CUDA C.
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    /// NVRTC could not be loaded, or refused the source.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// The fused attention cannot be rendered for this specialisation.
    #[error(transparent)]
    Attention(#[from] AttentionError),
    /// The multi-tensor AdamW cannot be rendered for these dtypes.
    #[error(transparent)]
    AdamW(#[from] AdamWError),
    /// The routine kernel cannot be rendered for these dtypes.
    #[error(transparent)]
    Routine(#[from] RoutineError),
    /// The PTX could not be written to the disk cache.
    #[error("cannot write the PTX cache in {dir}: {source}")]
    Cache {
        /// The cache's directory.
        dir: String,
        /// The file system's error.
        source: std::io::Error,
    },
}

/// A kernel's CUDA C and its PTX.
#[derive(Clone, Debug)]
pub struct CompiledPtx {
    /// The generated CUDA C, its symbols and how to launch it.
    pub kernel: GeneratedKernel,
    /// NVRTC's PTX for the device's architecture, which the driver loads.
    pub ptx: String,
    /// Whether the PTX came from the disk cache rather than NVRTC.
    pub cached: bool,
}

/// A fused attention pass's CUDA C and its PTX.
#[derive(Clone, Debug)]
pub struct CompiledAttention {
    /// The rendered CUDA C and its kernels' symbols.
    pub rendered: RenderedAttention,
    /// NVRTC's PTX for the device's architecture, which the driver loads.
    pub ptx: String,
    /// Whether the PTX came from the disk cache rather than NVRTC.
    pub cached: bool,
}

/// The multi-tensor AdamW's CUDA C and its PTX.
#[derive(Clone, Debug)]
pub struct CompiledAdamW {
    /// The rendered CUDA C and its symbol.
    pub rendered: RenderedAdamW,
    /// NVRTC's PTX for the device's architecture, which the driver loads.
    pub ptx: String,
    /// Whether the PTX came from the disk cache rather than NVRTC.
    pub cached: bool,
}

/// A routine kernel's CUDA C and its PTX.
#[derive(Clone, Debug)]
pub struct CompiledRoutine {
    /// The rendered CUDA C and its kernels' symbols.
    pub rendered: RenderedRoutine,
    /// NVRTC's PTX for the device's architecture, which the driver loads.
    pub ptx: String,
    /// Whether the PTX came from the disk cache rather than NVRTC.
    pub cached: bool,
}

/// Compiles kernels for one device, once each.
pub struct CudaKernelCompiler {
    device: DeviceProperties,
    nvrtc: Nvrtc,
    disk: Option<PtxCache>,
    /// `(kernel text, dims)` → its PTX.
    memory: HashMap<MemoryKey, Arc<CompiledPtx>>,
    attention: HashMap<(AttentionKernel, Pass), Arc<CompiledAttention>>,
    adamw: HashMap<AdamWKernel, Arc<CompiledAdamW>>,
    routines: HashMap<Routine, Arc<CompiledRoutine>>,
}

impl CudaKernelCompiler {
    /// A compiler for `device`; `disk`, when given, keeps PTX across processes.
    pub fn new(device: DeviceProperties, nvrtc: Nvrtc, disk: Option<PtxCache>) -> CudaKernelCompiler {
        CudaKernelCompiler {
            device,
            nvrtc,
            disk,
            memory: HashMap::new(),
            attention: HashMap::new(),
            adamw: HashMap::new(),
            routines: HashMap::new(),
        }
    }

    /// The device the kernels are generated and compiled for.
    pub fn device(&self) -> &DeviceProperties {
        &self.device
    }

    /// The PTX of `kernel` with its shape bound to `dims`.
    pub fn compile(&mut self, kernel: &Kernel, dims: &[usize]) -> Result<Arc<CompiledPtx>, CompileError> {
        let key = (kernel.to_text(), dims.to_vec());
        if let Some(done) = self.memory.get(&key) {
            return Ok(Arc::clone(done));
        }
        let generated = codegen::generate(kernel, dims, &self.device)?;
        let (ptx, cached) = self.ptx(&generated.entry, &generated.source)?;
        let compiled = Arc::new(CompiledPtx { kernel: generated, ptx, cached });
        self.memory.insert(key, Arc::clone(&compiled));
        Ok(compiled)
    }

    /// Compiles every `(kernel, dims)` not compiled yet ahead of the
    /// [`CudaKernelCompiler::compile`] calls that will ask for them, each
    /// distinct source once and the sources on every core: a plan's row
    /// kernels are hundreds of NVRTC compilations, one after another the
    /// longest part of loading it (45 s for bert-base on an H100's host).
    /// One that fails is left out: its `compile` fails again and says so,
    /// naming the node.
    pub fn prepare<'k>(&mut self, wanted: impl IntoIterator<Item = (&'k Kernel, Vec<usize>)>) {
        // Each layer's copy of a kernel is its own key (its own name, for
        // profiles) and the same source.
        let mut by_source: HashMap<String, Vec<(MemoryKey, GeneratedKernel)>> = HashMap::new();
        for (kernel, dims) in wanted {
            let key = (kernel.to_text(), dims);
            if self.memory.contains_key(&key) {
                continue;
            }
            let Ok(generated) = codegen::generate(kernel, &key.1, &self.device) else { continue };
            let copies = by_source.entry(generated.source.clone()).or_default();
            if copies.iter().all(|(k, _)| *k != key) {
                copies.push((key, generated));
            }
        }
        let sources: Vec<_> = by_source.into_values().collect();
        let next = AtomicUsize::new(0);
        let compiled = Mutex::new(HashMap::new());
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(sources.len());
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    while let Some(copies) = sources.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let generated = &copies[0].1;
                        if let Ok(done) = self.ptx(&generated.entry, &generated.source) {
                            compiled.lock().unwrap_or_else(|e| e.into_inner()).insert(generated.source.clone(), done);
                        }
                    }
                });
            }
        });
        let compiled = compiled.into_inner().unwrap_or_else(|e| e.into_inner());
        for (key, generated) in sources.into_iter().flatten() {
            if let Some((ptx, cached)) = compiled.get(&generated.source) {
                let done = CompiledPtx { kernel: generated, ptx: ptx.clone(), cached: *cached };
                self.memory.insert(key, Arc::new(done));
            }
        }
    }

    /// The PTX of one fused attention pass (one module: its entries).
    pub fn compile_attention(
        &mut self,
        kernel: &AttentionKernel,
        pass: Pass,
    ) -> Result<Arc<CompiledAttention>, CompileError> {
        if let Some(done) = self.attention.get(&(*kernel, pass)) {
            return Ok(Arc::clone(done));
        }
        let rendered = kernel.render(pass)?;
        let (ptx, cached) = self.ptx(&rendered.entries[0].1, &rendered.source)?;
        let compiled = Arc::new(CompiledAttention { rendered, ptx, cached });
        self.attention.insert((*kernel, pass), Arc::clone(&compiled));
        Ok(compiled)
    }

    /// The PTX of one multi-tensor AdamW specialisation.
    pub fn compile_adamw(&mut self, kernel: &AdamWKernel) -> Result<Arc<CompiledAdamW>, CompileError> {
        if let Some(done) = self.adamw.get(kernel) {
            return Ok(Arc::clone(done));
        }
        let rendered = kernel.render()?;
        let (ptx, cached) = self.ptx(&rendered.entry, &rendered.source)?;
        let compiled = Arc::new(CompiledAdamW { rendered, ptx, cached });
        self.adamw.insert(*kernel, Arc::clone(&compiled));
        Ok(compiled)
    }

    /// The PTX of one routine specialisation (one module: its kernels).
    pub fn compile_routine(&mut self, routine: &Routine) -> Result<Arc<CompiledRoutine>, CompileError> {
        if let Some(done) = self.routines.get(routine) {
            return Ok(Arc::clone(done));
        }
        let rendered = routine.render()?;
        let (ptx, cached) = self.ptx(&rendered.entries[0], &rendered.source)?;
        let compiled = Arc::new(CompiledRoutine { rendered, ptx, cached });
        self.routines.insert(*routine, Arc::clone(&compiled));
        Ok(compiled)
    }

    /// `source`'s PTX for this device, from the disk cache or NVRTC (then
    /// cached); whether it was a cache hit.
    fn ptx(&self, name: &str, source: &str) -> Result<(String, bool), CompileError> {
        let arch = self.device.arch();
        let (major, minor) = self.nvrtc.version();
        let options = format!("nvrtc {major}.{minor} {}", self.nvrtc.options(&arch).join(" "));
        if let Some(ptx) = self.disk.as_ref().and_then(|d| d.get(&options, source)) {
            return Ok((ptx, true));
        }
        let ptx = self.nvrtc.compile_ptx(name, source, &arch)?;
        if let Some(disk) = &self.disk {
            disk.put(&options, source, &ptx)
                .map_err(|source| CompileError::Cache { dir: disk.dir().display().to_string(), source })?;
        }
        Ok((ptx, false))
    }

    /// How many distinct (kernel, dims), attention passes, AdamW and routine
    /// specialisations are compiled.
    pub fn len(&self) -> usize {
        self.memory.len() + self.attention.len() + self.adamw.len() + self.routines.len()
    }

    /// Whether nothing is compiled yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
