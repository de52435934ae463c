//! Row kernels for a CUDA rank: on device buffers, CUDA C from
//! `zeroplan-backend-cuda` compiled by NVRTC and loaded on the GPU; on the
//! pinned host arena (an offloaded optimizer's AdamW), the host runtime's
//! Cranelift kernels, run by the CPU where the data lies.

use std::collections::HashMap;
use std::sync::Arc;

use crate::{CudaDevice, CudaKernelCompiler, LoadedKernel};
use zeroplan_backend_cpu::{CompiledKernel, KernelCompiler};
use zeroplan_ir::kernel::Kernel;
use zeroplan_ir::{Bindings, Graph, NodeIndex, Op, Place, Value};

use zeroplan_exec::Buf;
use zeroplan_exec::buffers::concrete;
use zeroplan_exec::{KernelCompile, Named};

/// A row kernel as a CUDA rank runs it.
#[derive(Clone)]
pub enum CudaKernel {
    /// Launched on the compute stream over device pointers.
    Gpu(Arc<LoadedKernel>),
    /// Run by the CPU over the pinned host arena.
    Host(Arc<CompiledKernel>),
    /// A fused attention's kernels on the compute stream ([`super::attention`]).
    Attention(Arc<super::attention::DeviceAttention>),
    /// A matmul with its bias epilogue, one cuBLASLt product ([`super::epilogue`]).
    Gemm(Arc<super::epilogue::DeviceGemm>),
    /// One launch stepping many parameters ([`super::adamw`]).
    AdamW(Arc<super::adamw::DeviceAdamW>),
    /// A host routine's kernels on the compute stream ([`super::routines`]).
    Routine(Arc<super::routines::DeviceRoutine>),
}

impl Named for CudaKernel {
    fn name(&self) -> &str {
        match self {
            CudaKernel::Gpu(k) => &k.generated().name,
            CudaKernel::Host(k) => k.name(),
            CudaKernel::Attention(a) => a.name(),
            CudaKernel::Gemm(g) => &g.name,
            CudaKernel::AdamW(a) => a.name(),
            CudaKernel::Routine(r) => r.name(),
        }
    }

    fn flops(&self) -> f64 {
        match self {
            CudaKernel::Gemm(g) => g.flops(),
            _ => 0.0,
        }
    }
}

/// Compiles each kernel where its buffers lie, once per distinct source.
pub struct Kernels<'d> {
    pub gpu: &'d CudaDevice,
    pub nvrtc: CudaKernelCompiler,
    /// Made on the first host kernel (plans without offload need none).
    pub host: Option<KernelCompiler>,
    /// CUDA C → its loaded module (every layer's copy of a kernel is one source).
    pub loaded: HashMap<String, Arc<LoadedKernel>>,
    /// The most cross-row scratch any GPU kernel needs.
    pub scratch_bytes: usize,
}

impl KernelCompile for Kernels<'_> {
    type Kernel = CudaKernel;

    fn compile(&mut self, kernel: &Kernel, dims: &[usize], buffers: &[Buf]) -> Result<CudaKernel, String> {
        let on = |place: Place| buffers.iter().all(|b| b.place == place);
        if on(Place::Host) {
            let host = match &mut self.host {
                Some(h) => h,
                None => self.host.insert(KernelCompiler::new().map_err(|e| e.to_string())?),
            };
            return host.compile(kernel, dims).map(CudaKernel::Host).map_err(|e| e.to_string());
        }
        if !on(Place::Device) {
            return Err("not supported on CUDA yet: a kernel over both device and host buffers".into());
        }
        let compiled = self.nvrtc.compile(kernel, dims).map_err(|e| e.to_string())?;
        let generated = &compiled.kernel;
        let operands = generated.inputs.iter().chain(&generated.outputs);
        for (b, need) in buffers.iter().zip(operands) {
            if b.offset % need.alignment != 0 {
                return Err(format!(
                    "not supported on CUDA yet: an operand at byte {} of the arena, where the generated kernel \
                     needs {}-byte alignment",
                    b.offset, need.alignment
                ));
            }
        }
        self.scratch_bytes = self.scratch_bytes.max(generated.launch.scratch_bytes);
        if let Some(done) = self.loaded.get(&generated.source) {
            return Ok(CudaKernel::Gpu(Arc::clone(done)));
        }
        let loaded = Arc::new(self.gpu.load(&compiled).map_err(|e| e.to_string())?);
        self.loaded.insert(generated.source.clone(), Arc::clone(&loaded));
        Ok(CudaKernel::Gpu(loaded))
    }
}

/// The fused kernels of `order` whose outputs lie on the device, at their
/// bound shapes: what [`Kernels::compile`] will send to NVRTC, for
/// [`crate::CudaKernelCompiler::prepare`] to compile on every core first.
pub fn on_device<'g>(
    g: &'g Graph,
    order: &'g [NodeIndex],
    bufs: &'g HashMap<Value, Buf>,
    bindings: &'g Bindings,
) -> impl Iterator<Item = (&'g Kernel, Vec<usize>)> + 'g {
    order.iter().filter_map(move |&n| {
        let Op::Fused { kernel } = &g.node(n).op else { return None };
        let value = Value { node: n, output: 0 };
        if bufs.get(&value)?.place != Place::Device {
            return None;
        }
        Some((&**kernel, concrete(&kernel.shape, bindings)?))
    })
}
