//! The CUDA device's step passes: after the selection every device shares,
//! each rewrites the steps a GPU runs better another way, in this order:
//!
//! 1. [`FusedAttention`]: `flash_attention` and its adjoint as the backend's
//!    FlashAttention-2-style kernels ([`super::attention`]);
//! 2. [`BiasEpilogues`]: a matmul and its bias-epilogue kernel as one
//!    cuBLASLt product ([`super::epilogue`]);
//! 3. [`BiasGradients`]: a weight gradient and its bias gradient as one
//!    cuBLASLt product with a `BGRAD` epilogue ([`super::bias_grad`]);
//! 4. [`MultiTensorAdamW`]: runs of AdamW updates as one launch
//!    ([`super::adamw`]);
//! 5. [`RoutineKernels`]: the host routines the GPU has kernels for
//!    (losses, embeddings, layout ops, fills) as those kernels
//!    ([`super::routines`]), so they leave the staged host path.
//!
//! The epilogue passes run before AdamW grouping so that the updates they
//! leave in place are the ones grouped; each is an optimisation, so what a
//! pass leaves runs as selected, and [`load`] logs why.

use std::collections::HashMap;

use zeroplan_exec::{Buf, Instr, Rank, Rewrites, SelectError, Step, StepPass};
use zeroplan_ir::{Bindings, Graph, Value};

use super::kernels::Kernels;
use super::memory::{DeviceArena, GpuMemory};
use super::{CudaKernel, adamw, attention, bias_grad, epilogue, routines};
use crate::BlasLt;

/// A step of a CUDA rank's schedule.
type CudaStep = Step<Instr<CudaKernel>>;

/// What the device lends its step passes while it loads a program.
pub struct Load<'a, 'd> {
    /// The program's dimensions, which bind the kernels' shapes.
    pub bindings: &'a Bindings,
    /// Each value's buffer, as the plan placed it.
    pub bufs: &'a HashMap<Value, Buf>,
    /// This rank among the ranks (ALiBi's heads in fused attention).
    pub rank: Rank,
    /// The rank's arenas on the GPU, where buffers become device pointers.
    pub memory: &'a GpuMemory,
    /// cuBLASLt, where the library loaded: without it no epilogue is taken.
    pub lt: Option<&'a BlasLt>,
    /// The GPU and its compilers, for the kernels a pass writes anew.
    pub kernels: &'a mut Kernels<'d>,
    /// The multi-tensor AdamW launches' tables, once [`MultiTensorAdamW`] ran.
    pub tables: Option<DeviceArena>,
}

/// A pass over a CUDA rank's steps.
type CudaPass = dyn for<'a, 'd> StepPass<Instr<CudaKernel>, Load<'a, 'd>>;

/// The passes, in the order they run.
const PASSES: [&CudaPass; 5] = [&FusedAttention, &BiasEpilogues, &BiasGradients, &MultiTensorAdamW, &RoutineKernels];

/// Runs every pass over `steps`, logging what each took and left.
pub fn load(graph: &Graph, steps: &mut [CudaStep], cx: &mut Load) -> Result<(), SelectError> {
    for pass in PASSES {
        let done = pass.run(graph, steps, cx)?;
        tracing::debug!(pass = pass.name(), taken = done.taken, left = done.left.len(), "step pass");
        for (what, why) in &done.left {
            tracing::debug!("{}: `{what}` keeps its steps: {why}", pass.name());
        }
    }
    Ok(())
}

/// [`super::attention`]: fused attention on the device.
pub struct FusedAttention;

impl StepPass<Instr<CudaKernel>, Load<'_, '_>> for FusedAttention {
    fn name(&self) -> &'static str {
        "fused-attention"
    }

    fn run(&self, graph: &Graph, steps: &mut [CudaStep], cx: &mut Load) -> Result<Rewrites, SelectError> {
        let gpu = cx.kernels.gpu;
        attention::select(graph, steps, cx.rank, gpu, &mut cx.kernels.nvrtc)
    }
}

/// [`super::epilogue`]: biases (and tanh GELU) in the GEMM's epilogue.
pub struct BiasEpilogues;

impl StepPass<Instr<CudaKernel>, Load<'_, '_>> for BiasEpilogues {
    fn name(&self) -> &'static str {
        "bias-epilogues"
    }

    fn run(&self, graph: &Graph, steps: &mut [CudaStep], cx: &mut Load) -> Result<Rewrites, SelectError> {
        let Some(lt) = cx.lt else { return Ok(Rewrites::default()) };
        let fused = epilogue::select(graph, steps, cx.bindings, cx.memory, lt, cx.kernels)?;
        tracing::debug!("cuBLASLt epilogues: {} kernels whole, {} biases only", fused.whole, fused.bias_only);
        Ok(Rewrites { taken: fused.whole + fused.bias_only, left: fused.left })
    }
}

/// [`super::bias_grad`]: bias gradients summed in the weight gradient's GEMM.
pub struct BiasGradients;

impl StepPass<Instr<CudaKernel>, Load<'_, '_>> for BiasGradients {
    fn name(&self) -> &'static str {
        "bias-gradients"
    }

    fn run(&self, graph: &Graph, steps: &mut [CudaStep], cx: &mut Load) -> Result<Rewrites, SelectError> {
        let Some(lt) = cx.lt else { return Ok(Rewrites::default()) };
        let summed = bias_grad::select(graph, steps, cx.bindings, cx.memory, lt, cx.kernels);
        Ok(Rewrites { taken: summed.taken, left: summed.left })
    }
}

/// [`super::adamw`]: consecutive AdamW updates as one launch.
pub struct MultiTensorAdamW;

impl StepPass<Instr<CudaKernel>, Load<'_, '_>> for MultiTensorAdamW {
    fn name(&self) -> &'static str {
        "multi-tensor-adamw"
    }

    fn run(&self, graph: &Graph, steps: &mut [CudaStep], cx: &mut Load) -> Result<Rewrites, SelectError> {
        let gpu = cx.kernels.gpu;
        let grouped = adamw::select(graph, steps, cx.bufs, cx.memory, gpu, &mut cx.kernels.nvrtc)
            .map_err(|e| SelectError::Device(format!("multi-tensor AdamW: {e}")))?;
        tracing::debug!("multi-tensor AdamW: {} launches for {} parameter updates", grouped.launches, grouped.updates);
        cx.tables = Some(grouped.tables);
        Ok(Rewrites { taken: grouped.launches, left: Vec::new() })
    }
}

/// [`super::routines`]: host routines as kernels on the compute stream.
pub struct RoutineKernels;

impl StepPass<Instr<CudaKernel>, Load<'_, '_>> for RoutineKernels {
    fn name(&self) -> &'static str {
        "routine-kernels"
    }

    fn run(&self, _: &Graph, steps: &mut [CudaStep], cx: &mut Load) -> Result<Rewrites, SelectError> {
        let kernels = &mut *cx.kernels;
        let mut lower = routines::Lower {
            memory: cx.memory,
            gpu: kernels.gpu,
            compiler: &mut kernels.nvrtc,
            modules: HashMap::new(),
            scratch_bytes: 0,
        };
        let done = routines::select(steps, &mut lower);
        kernels.scratch_bytes = kernels.scratch_bytes.max(lower.scratch_bytes);
        Ok(done)
    }
}
