//! The host runtime's routines as kernels on a CUDA rank.
//!
//! Without this, every instruction that is neither a row kernel nor a GEMM
//! runs through `exec::staged`: both streams waited for, its buffers
//! downloaded, the host routine run, its outputs uploaded — 4.6 s per
//! bert-base step, the `[4096, 30522]` logits crossing PCIe both ways for the
//! loss alone. [`select`] rewrites each routine instruction whose buffers all
//! lie on the device, and which `crate::routines` covers (`plan::supported`), into an
//! [`Instr::Kernel`] holding a [`DeviceRoutine`]: its launches (and
//! device-to-device copies) with their pointers resolved at load, since the
//! arenas never move. The runner's hazards see the same buffers: the
//! routine's reads as the kernel's inputs, its writes as its outputs.
//!
//! Offloaded (host-placed) routines and the instructions no kernel covers
//! keep the staged host routine; [`log_staged`] names them at load.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, result};
use cudarc::nvrtc::Ptx;

use super::memory::GpuMemory;
use super::{Cuda, CudaKernel};
use crate::routines::plan::{self, Arg, Op};
use crate::routines::{Routine, device};
use crate::{CudaDevice, CudaKernelCompiler};
use zeroplan_exec::{Access, Buf, Instr, Rewrites, Step};

/// One thing a routine queues on the compute stream.
enum DeviceOp {
    /// A kernel of `routines::THREADS` threads per block.
    Launch { function: CudaFunction, grid: u32, args: Vec<Arg> },
    /// A device-to-device copy (DMA).
    Memcpy { from: u64, to: u64, bytes: usize },
}

/// A routine instruction as launches on the compute stream, in order.
pub struct DeviceRoutine {
    name: &'static str,
    ops: Vec<DeviceOp>,
}

impl DeviceRoutine {
    /// The instruction's kind (`transpose`, `cross_entropy`, …), as
    /// profiles count it.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// What selection needs: the device pointers, the GPU and its compiler.
pub struct Lower<'a, 'd> {
    pub memory: &'a GpuMemory,
    pub gpu: &'d CudaDevice,
    pub compiler: &'a mut CudaKernelCompiler,
    /// Each specialisation's loaded module.
    pub modules: HashMap<Routine, Arc<CudaModule>>,
    /// The most partials bytes a routine uses.
    pub scratch_bytes: usize,
}

impl Lower<'_, '_> {
    /// Kernel `index` of `routine`, compiled and loaded once per specialisation.
    fn function(&mut self, routine: Routine, index: usize) -> Result<CudaFunction, String> {
        let compiled = self.compiler.compile_routine(&routine).map_err(|e| e.to_string())?;
        let module = match self.modules.get(&routine) {
            Some(m) => Arc::clone(m),
            None => {
                let ptx = Ptx::from_src(compiled.ptx.clone());
                let m = self.gpu.context().load_module(ptx).map_err(|e| format!("{e:?}"))?;
                self.modules.insert(routine, Arc::clone(&m));
                m
            }
        };
        module.load_function(&compiled.rendered.entries[index]).map_err(|e| format!("{e:?}"))
    }

    /// `instr`'s plan with its kernels loaded; `Err` says why it stays staged.
    fn lower(&mut self, instr: &Instr<CudaKernel>) -> Result<Vec<DeviceOp>, String> {
        plan::supported(instr)?;
        let memory = self.memory;
        let planned = plan::plan(instr, &|b: &Buf| memory.device_ptr(*b), self.gpu.properties())?;
        self.scratch_bytes = self.scratch_bytes.max(planned.scratch_bytes);
        let mut ops = Vec::with_capacity(planned.ops.len());
        for op in planned.ops {
            ops.push(match op {
                Op::Launch(l) => {
                    DeviceOp::Launch { function: self.function(l.routine, l.kernel)?, grid: l.grid, args: l.args }
                }
                Op::Memcpy { from, to, bytes } => DeviceOp::Memcpy { from, to, bytes },
            });
        }
        Ok(ops)
    }
}

/// Rewrites every routine step the kernels cover ([`plan::supported`]) into
/// its kernels, each specialisation compiled (NVRTC, disk-cached) and loaded once.
pub fn select(steps: &mut [Step<Instr<CudaKernel>>], cx: &mut Lower) -> Rewrites {
    let mut done = Rewrites::default();
    for (at, step) in steps.iter_mut().enumerate() {
        let Some(instr) = step.instr.as_ref().filter(|i| plan::is_routine(i)) else { continue };
        let ops = match cx.lower(instr) {
            Ok(ops) => ops,
            Err(why) => {
                done.left.push((format!("step {at} ({})", instr.name()), why));
                continue;
            }
        };
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        instr.clone().for_each_buf(
            |b: &mut Buf, access| {
                if access == Access::Write { outputs.push(*b) } else { inputs.push(*b) }
            },
        );
        let kernel = CudaKernel::Routine(Arc::new(DeviceRoutine { name: instr.name(), ops }));
        step.instr = Some(Instr::Kernel { kernel, inputs, outputs });
        done.taken += 1;
    }
    done
}

/// Whether `instr` runs through `exec::staged` on a CUDA rank. Inputs
/// (feeds from the host) and collectives (NCCL's where the communicator is
/// NCCL) are not counted.
fn stages<K>(instr: &Instr<K>) -> bool {
    !matches!(
        instr,
        Instr::Kernel { .. }
            | Instr::MatMul { .. }
            | Instr::Copy { .. }
            | Instr::Input { .. }
            | Instr::AllReduce { .. }
            | Instr::ReduceScatter { .. }
            | Instr::AllGather { .. }
            | Instr::TensorAllReduce { .. }
    )
}

/// What still runs on the host through staging, counted by kind:
/// `"alibi_bias ×2, vocab_shard ×1"`; `None` when nothing does.
pub fn staged_summary<K>(steps: &[Step<Instr<K>>]) -> Option<(usize, String)> {
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for instr in steps.iter().filter_map(|s| s.instr.as_ref()).filter(|i| stages(i)) {
        *kinds.entry(instr.name()).or_default() += 1;
    }
    let total = kinds.values().sum();
    (total > 0).then(|| (total, kinds.iter().map(|(k, n)| format!("{k} ×{n}")).collect::<Vec<_>>().join(", ")))
}

/// Warns, once per load, of the instructions every step still stages (slow:
/// a host round trip each).
pub fn log_staged(steps: &[Step<Instr<CudaKernel>>]) {
    if let Some((total, kinds)) = staged_summary(steps) {
        tracing::warn!("{total} instructions run on the host through staging: {kinds}");
    }
}

/// Queues `r` on the compute stream.
pub fn run(cuda: &Cuda, r: &DeviceRoutine) -> Result<(), String> {
    let driver = |e: cudarc::driver::DriverError| format!("{}: the CUDA driver failed: {e:?}", r.name);
    for op in &r.ops {
        match op {
            DeviceOp::Launch { function, grid, args } => {
                // SAFETY: `plan` built the arguments in the kernel's order and
                // types, over buffers `supported` checked lie on the device at
                // their sizes; the arenas outlive the stream's work, and the
                // partials hold the bytes the plan asked for.
                unsafe { device::launch(&cuda.compute, function, *grid, args, cuda.partials.ptr()) }.map_err(driver)?;
            }
            DeviceOp::Memcpy { from, to, bytes } => {
                // SAFETY: both ranges lie in the device arena and do not overlap
                // (`supported` refused overlapping operands).
                unsafe { result::memcpy_dtod_async(*to, *from, *bytes, cuda.compute.cu_stream()) }.map_err(driver)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
