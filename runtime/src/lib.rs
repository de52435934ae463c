//! zeroplan's runtime: runs a plan's program, one rank at a time, on a
//! backend's device.
//!
//! - [`runner`]: a rank's schedule — micro-batches, the optimizer phase,
//!   deferred updates, collectives on a communication stream — on any
//!   `zeroplan_exec::Device` ([`HostProgram`] on this CPU, [`CudaProgram`]
//!   on a GPU);
//! - [`comm`]: the groups a rank belongs to and the host communicators
//!   (threads of this process, processes over TCP met through a rendezvous
//!   store; NCCL is the CUDA backend's);
//! - [`checkpoint`]: Hugging Face safetensors weights and batches, and
//!   sharded training checkpoints that reshard across ranks;
//! - [`reference`]: training steps on the reference interpreter, the oracle
//!   the devices are checked against;
//! - [`devices`]: the devices of this machine.
//!
//! Compiling a model for it, data, metrics and the training loops are the
//! driver's (`zeroplan-driver`).

// Public items are not all documented yet: the lint is enforced crate by crate.
#![allow(missing_docs)]

pub mod checkpoint;
pub mod comm;
pub mod reference;
pub mod runner;

use serde::Serialize;
use zeroplan_backend_cpu::Host;
use zeroplan_backend_cuda::Cuda;

/// A plan's program loaded on the host, with its parameters and state.
pub type HostProgram = runner::Runner<Host>;

/// A plan's program loaded on a GPU.
pub type CudaProgram = runner::Runner<Cuda>;

/// A device of this machine a plan can run on, as `zeroplan devices` lists it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum FoundDevice {
    /// The host CPU, through Cranelift-compiled kernels.
    Host { target: String, threads: usize },
    /// A CUDA GPU.
    Cuda { ordinal: usize, name: String, memory_bytes: u64, compute_capability: String },
}

/// What was found, and why CUDA is absent when it is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Devices {
    pub devices: Vec<FoundDevice>,
    /// Why no CUDA device is listed, when none is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_note: Option<String>,
}

/// Lists this machine's devices.
pub fn devices() -> Devices {
    let mut devices = Vec::new();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let target = zeroplan_backend_cpu::host_target().map_or_else(|e| format!("unsupported ({e})"), |t| t.triple);
    devices.push(FoundDevice::Host { target, threads });
    let cuda_note = match zeroplan_backend_cuda::probe() {
        zeroplan_backend_cuda::Probe::NoDriver => Some("no CUDA driver library found".to_string()),
        zeroplan_backend_cuda::Probe::DriverError(e) => Some(format!("the CUDA driver failed: {e}")),
        zeroplan_backend_cuda::Probe::Gpus(gpus) => {
            let none = gpus.is_empty().then(|| "the CUDA driver reports no GPU".to_string());
            devices.extend(gpus.into_iter().map(|g| FoundDevice::Cuda {
                ordinal: g.ordinal,
                name: g.name,
                memory_bytes: g.memory_bytes,
                compute_capability: format!("{}.{}", g.compute_capability.0, g.compute_capability.1),
            }));
            none
        }
    };
    Devices { devices, cuda_note }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_is_always_a_device() {
        let found = super::devices();
        assert!(matches!(found.devices[0], super::FoundDevice::Host { threads, .. } if threads >= 1));
        let cuda = found.devices.iter().filter(|d| matches!(d, super::FoundDevice::Cuda { .. })).count();
        assert_eq!(cuda == 0, found.cuda_note.is_some());
    }
}
