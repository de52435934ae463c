//! zeroplan's runtime: executes plans on the devices of this machine.
//!
//! Today: discovering those devices — the host (always) and CUDA GPUs (where
//! a driver is found) —, reading and writing weights and batches
//! ([`checkpoint`]: Hugging Face safetensors files), training data ([`data`]),
//! training on the reference interpreter ([`reference`]), a plan's program on
//! a [`runner::Device`] — this CPU ([`host`]) — with data-parallel ranks
//! joined by a [`comm::Communicator`] (threads of this process, or one
//! process per rank over TCP or NCCL), models compiled for the host
//! ([`program`]) from Hugging Face model directories ([`model_dir`]),
//! sentence embeddings on either ([`embed`]), sequence classification
//! ([`classify`]) and the GLUE tasks' metrics ([`metrics`]).

// Public items are not all documented yet: the lint is enforced crate by crate.
#![allow(missing_docs)]

pub mod checkpoint;
pub mod classify;
pub mod comm;
pub mod data;
pub mod embed;
pub mod metrics;
pub mod model_dir;
pub mod program;
pub mod reference;
pub mod runner;

use serde::Serialize;
use zeroplan_backend_cpu::Host;
use zeroplan_backend_cuda::Cuda;

/// A plan's program loaded on the host, with its parameters and state.
pub type HostProgram = runner::Runner<Host>;

/// A plan's program loaded on a GPU.
pub type CudaProgram = runner::Runner<Cuda>;

/// A device a plan can run on.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Device {
    /// The host CPU, through Cranelift-compiled kernels.
    Host { target: String, threads: usize },
    /// A CUDA GPU.
    Cuda { ordinal: usize, name: String, memory_bytes: u64, compute_capability: String },
}

/// What was found, and why CUDA is absent when it is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Devices {
    pub devices: Vec<Device>,
    /// Why no CUDA device is listed, when none is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_note: Option<String>,
}

/// Lists this machine's devices.
pub fn devices() -> Devices {
    let mut devices = Vec::new();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let target = zeroplan_backend_cpu::host_target().map_or_else(|e| format!("unsupported ({e})"), |t| t.triple);
    devices.push(Device::Host { target, threads });
    let cuda_note = match zeroplan_backend_cuda::probe() {
        zeroplan_backend_cuda::Probe::NoDriver => Some("no CUDA driver library found".to_string()),
        zeroplan_backend_cuda::Probe::DriverError(e) => Some(format!("the CUDA driver failed: {e}")),
        zeroplan_backend_cuda::Probe::Gpus(gpus) => {
            let none = gpus.is_empty().then(|| "the CUDA driver reports no GPU".to_string());
            devices.extend(gpus.into_iter().map(|g| Device::Cuda {
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
        assert!(matches!(found.devices[0], super::Device::Host { threads, .. } if threads >= 1));
        let cuda = found.devices.iter().filter(|d| matches!(d, super::Device::Cuda { .. })).count();
        assert_eq!(cuda == 0, found.cuda_note.is_some());
    }
}
