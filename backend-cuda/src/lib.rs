//! zeroplan's CUDA backend.
//!
//! Today: finding the GPUs. cudarc loads the CUDA driver at run time
//! (`dynamic-loading`), so this crate builds and its callers run on machines
//! without CUDA; [`probe`] looks for the driver library before making any
//! CUDA call, since cudarc's calls panic when the library is missing.
//! NVRTC kernels and cuBLASLt GEMMs come with the CUDA-backend issue.

use cudarc::driver::{result, sys};

/// One GPU as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub ordinal: usize,
    pub name: String,
    pub memory_bytes: u64,
    /// `(major, minor)`: `(9, 0)` is Hopper.
    pub compute_capability: (i32, i32),
}

/// What the probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// No CUDA driver library could be loaded.
    NoDriver,
    /// The driver loaded but failed to initialise or enumerate (the message says why).
    DriverError(String),
    Gpus(Vec<Gpu>),
}

/// Looks for CUDA GPUs without ever panicking on a machine without CUDA.
pub fn probe() -> Probe {
    // SAFETY: `is_culib_present` only tries to open the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Probe::NoDriver;
    }
    match enumerate() {
        Ok(gpus) => Probe::Gpus(gpus),
        Err(e) => Probe::DriverError(format!("{e:?}")),
    }
}

fn enumerate() -> Result<Vec<Gpu>, cudarc::driver::DriverError> {
    result::init()?;
    let count = result::device::get_count()?;
    (0..count)
        .map(|ordinal| {
            let dev = result::device::get(ordinal)?;
            let attribute = |a| unsafe { result::device::get_attribute(dev, a) };
            Ok(Gpu {
                ordinal: ordinal as usize,
                name: result::device::get_name(dev)?,
                // SAFETY: `dev` is a device handle the driver just returned.
                memory_bytes: unsafe { result::device::total_mem(dev)? } as u64,
                compute_capability: (
                    attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                    attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_never_panics() {
        // Without CUDA this is NoDriver; on a GPU machine it lists the GPUs.
        match probe() {
            Probe::Gpus(gpus) => assert!(gpus.iter().all(|g| g.memory_bytes > 0 && g.compute_capability.0 > 0)),
            Probe::NoDriver | Probe::DriverError(_) => {}
        }
    }
}
