//! Kernels to PTX when a plan is loaded: CUDA C from [`crate::codegen`],
//! compiled by NVRTC for the device's architecture, cached in memory by
//! (kernel text, dims) and on disk by (source, options, NVRTC version).
//! Mirrors the CPU backend's `KernelCompiler::compile(&kernel, &dims)`.

use std::collections::HashMap;
use std::sync::Arc;

use zeroplan_ir::kernel::Kernel;

use crate::cache::PtxCache;
use crate::codegen::{self, CodegenError, DeviceProperties, GeneratedKernel};
use crate::nvrtc::{Nvrtc, NvrtcError};

/// Why a kernel could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// The PTX could not be written to the disk cache.
    #[error("cannot write the PTX cache in {dir}: {source}")]
    Cache { dir: String, source: std::io::Error },
}

/// A kernel's CUDA C and its PTX.
#[derive(Clone, Debug)]
pub struct CompiledPtx {
    pub kernel: GeneratedKernel,
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
    memory: HashMap<(String, Vec<usize>), Arc<CompiledPtx>>,
}

impl CudaKernelCompiler {
    /// A compiler for `device`; `disk`, when given, keeps PTX across processes.
    pub fn new(device: DeviceProperties, nvrtc: Nvrtc, disk: Option<PtxCache>) -> CudaKernelCompiler {
        CudaKernelCompiler { device, nvrtc, disk, memory: HashMap::new() }
    }

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
        let arch = self.device.arch();
        let (major, minor) = self.nvrtc.version();
        let options = format!("nvrtc {major}.{minor} {}", self.nvrtc.options(&arch).join(" "));
        let hit = self.disk.as_ref().and_then(|d| d.get(&options, &generated.source));
        let cached = hit.is_some();
        let ptx = match hit {
            Some(ptx) => ptx,
            None => {
                let ptx = self.nvrtc.compile_ptx(&generated.entry, &generated.source, &arch)?;
                if let Some(disk) = &self.disk {
                    disk.put(&options, &generated.source, &ptx)
                        .map_err(|source| CompileError::Cache { dir: disk.dir().display().to_string(), source })?;
                }
                ptx
            }
        };
        let compiled = Arc::new(CompiledPtx { kernel: generated, ptx, cached });
        self.memory.insert(key, Arc::clone(&compiled));
        Ok(compiled)
    }

    /// How many distinct (kernel, dims) are compiled.
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }
}
