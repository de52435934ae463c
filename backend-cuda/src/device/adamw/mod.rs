//! Multi-tensor AdamW on a CUDA rank: runs of AdamW updates as one launch
//! of the backend's multi-tensor kernel (`crate::adamw`)
//! instead of one generated kernel per parameter.
//!
//! Selection ([`select`]) recognises each update the kernel can run
//! ([`grouping::update`]: device buffers, in place, f32 state; the fused
//! kernel's β₁, β₂, ε and weight decay read back from its IR and checked,
//! [`hyper`]), and groups consecutive ones that share their hyper-parameters
//! (but the weight decay, which the table holds per tensor), gradient dtype
//! and scalars ([`grouping::groups`]). A group never crosses an
//! instruction that touches its buffers: a reduce-scatter still producing a
//! gradient, a host step —
//! on the compute thread or the communication stream — closes it, since the
//! launch runs at the group's last update and every other update moves
//! past what lies between. Host-placed (offloaded) updates keep the host's
//! Cranelift kernel; groups of one their own generated kernel.
//!
//! Each launch's table (pointers, lengths, weight decays) is built once at
//! load and uploaded to a device buffer of its own: the arenas never move.
//! The launch's instruction lists every gradient and scalar as read and
//! every parameter, `m` and `v` as written, so the runner's hazards (the
//! communication stream's waits) see all of them.
//!
//! The mixed-precision working copy the kernel can write is not used: the
//! plan's `cast` of the new master weights stays its own instruction. The
//! other members' steps are left empty and marked written at the launch's
//! step ([`Written::At`]), so `Runner::set_finite_checks` checks every
//! member's outputs right after the launch (and a capture reads them there).
//!
//! From ZeRO-1 on a rank updates its flat shards in place (the next step's
//! forward gathers them), and they group.

pub mod grouping;
pub mod hyper;

use std::collections::HashMap;
use std::sync::Arc;

use crate::adamw::{AdamWHyper, AdamWScalars, AdamWTable, AdamWTensor, LoadedAdamW};
use crate::{AdamWKernel, CudaDevice, CudaKernelCompiler};
use zeroplan_ir::{Graph, Value};

use super::memory::{DeviceArena, GpuMemory};
use super::{Cuda, CudaKernel, schedule};
use grouping::Update;
use zeroplan_exec::Instr;
use zeroplan_exec::{Buf, Step, Written};

/// Where each launch's table starts in the tables' buffer.
const TABLE_ALIGN: usize = 256;

/// One multi-tensor AdamW launch. Its instruction's inputs are the
/// gradients then `lr, step, multiplier, finite`; its outputs the
/// parameters, then the `m`s, then the `v`s.
pub struct DeviceAdamW {
    loaded: Arc<LoadedAdamW>,
    table: AdamWTable,
    /// Byte offset of the table in [`Cuda`]'s tables buffer.
    table_offset: usize,
    hyper: AdamWHyper,
    scalars: [Buf; 4],
    name: String,
}

impl DeviceAdamW {
    /// `multi_tensor_adamw_{grad dtype}[{updates}]`: the launch as profiles
    /// count it.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// What [`select`] made: the launches' count, the updates they took, and
/// the buffer holding their tables.
pub struct Grouped {
    /// The multi-tensor launches that replaced groups of updates.
    pub launches: usize,
    /// The AdamW updates those launches took over.
    pub updates: usize,
    /// Every launch's table, each at its offset, uploaded once: the device
    /// keeps it for the program's life.
    pub tables: DeviceArena,
}

/// Replaces every group of AdamW updates with one multi-tensor launch at
/// its last step (the others' steps left empty). A group whose kernel does
/// not compile or load keeps its per-parameter kernels.
pub fn select(
    graph: &Graph,
    steps: &mut [Step<Instr<CudaKernel>>],
    bufs: &HashMap<Value, Buf>,
    memory: &GpuMemory,
    gpu: &CudaDevice,
    compiler: &mut CudaKernelCompiler,
) -> Result<Grouped, String> {
    let on_gpu = |k: &CudaKernel| matches!(k, CudaKernel::Gpu(_));
    let updates: Vec<Update> =
        (0..steps.len()).filter_map(|at| grouping::update(graph, steps, at, bufs, on_gpu)).collect();
    let touched = schedule::touches(steps);
    let optimizer: Vec<bool> = steps.iter().map(|s| s.optimizer).collect();
    let groups = grouping::groups(&updates, &touched, &optimizer);
    let mut loaded: HashMap<AdamWKernel, Arc<LoadedAdamW>> = HashMap::new();
    let mut bytes = Vec::new();
    let mut launches = Vec::new();
    for group in groups {
        let key = group[0].key;
        let kernel = AdamWKernel { grad: key.grad, working: None };
        let module = match loaded.get(&kernel) {
            Some(done) => Arc::clone(done),
            None => {
                let compiled = compiler.compile_adamw(&kernel).map_err(|e| e.to_string());
                let module = compiled
                    .and_then(|c| LoadedAdamW::load(gpu, &c.rendered, &c.ptx).map_err(|e| e.to_string()).map(Arc::new));
                match module {
                    Ok(m) => {
                        loaded.insert(kernel, Arc::clone(&m));
                        m
                    }
                    Err(e) => {
                        tracing::debug!("multi-tensor AdamW ({:?} gradients) not used: {e}", key.grad);
                        continue;
                    }
                }
            }
        };
        let ptr = |b: Buf| memory.device_ptr(b);
        let tensors: Vec<AdamWTensor> = group
            .iter()
            .map(|u| AdamWTensor {
                param: ptr(u.param),
                grad: ptr(u.grad),
                m: ptr(u.m),
                v: ptr(u.v),
                working: None,
                len: u.param.len,
                weight_decay: u.weight_decay,
            })
            .collect();
        let table = kernel.table(&tensors).map_err(|e| e.to_string())?;
        let table_offset = bytes.len().div_ceil(TABLE_ALIGN) * TABLE_ALIGN;
        bytes.resize(table_offset, 0);
        bytes.extend_from_slice(&table.bytes);
        let name = format!("multi_tensor_adamw_{}[{}]", key.grad.name(), group.len());
        let launch = DeviceAdamW {
            loaded: module,
            table,
            table_offset,
            hyper: AdamWHyper { beta1: key.beta1, beta2: key.beta2, eps: key.eps },
            scalars: key.scalars,
            name,
        };
        launches.push((group, launch));
    }
    let tables = DeviceArena::new(gpu.context(), bytes.len()).map_err(|e| format!("{e:?}"))?;
    tables.upload(0, &bytes).map_err(|e| format!("uploading the AdamW tables: {e:?}"))?;
    let (count, mut updates) = (launches.len(), 0);
    for (group, launch) in launches {
        updates += group.len();
        let inputs: Vec<Buf> = group.iter().map(|u| u.grad).chain(launch.scalars).collect();
        let outputs: Vec<Buf> = [|u: &Update| u.param, |u: &Update| u.m, |u: &Update| u.v]
            .iter()
            .flat_map(|f| group.iter().map(f))
            .collect();
        let last = group.last().expect("groups hold two updates or more").step;
        for u in &group {
            steps[u.step].instr = None;
            steps[u.step].written = Written::At(last);
        }
        steps[last].written = Written::Here;
        let kernel = CudaKernel::AdamW(Arc::new(launch));
        steps[last].instr = Some(Instr::Kernel { kernel, inputs, outputs });
    }
    Ok(Grouped { launches: count, updates, tables })
}

/// Queues one launch on the compute stream.
pub fn run(cuda: &Cuda, a: &DeviceAdamW) -> Result<(), String> {
    let ptr = |b: Buf| cuda.memory.device_ptr(b);
    let [lr, step, multiplier, finite] = a.scalars.map(ptr);
    let scalars = AdamWScalars { lr, step, multiplier, finite };
    let table = cuda.tables.ptr() + a.table_offset as u64;
    // SAFETY: the table was uploaded at load from the device arena's
    // pointers, which do not move; selection checked every tensor lies on
    // the device, f32 (the gradient of the kernel's dtype) at its length.
    unsafe { a.loaded.launch(&cuda.gpu, &cuda.compute, table, &a.table, &scalars, &a.hyper) }.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
