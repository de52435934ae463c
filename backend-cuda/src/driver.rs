//! The GPU side: finding GPUs, their properties, loading PTX modules and
//! launching generated kernels through cudarc's driver API.
//!
//! cudarc loads the CUDA driver at run time (`dynamic-loading`), so this
//! crate builds and its callers run on machines without CUDA; every entry
//! point here looks for the driver library ([`probe`]) before making any
//! CUDA call, since cudarc's calls panic when the library is missing.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, PushKernelArg, result, sys,
};
use cudarc::nvrtc::Ptx;

use crate::codegen::{DeviceProperties, GeneratedKernel};
use crate::compiler::CompiledPtx;

/// One GPU as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Its index among the driver's devices, as [`CudaDevice::open`] takes it.
    pub ordinal: usize,
    /// The product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Its total memory, in bytes.
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
    /// The GPUs the driver enumerated (none, on a machine with a driver
    /// but no GPU).
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

fn enumerate() -> Result<Vec<Gpu>, DriverError> {
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

/// Why a GPU could not be used or a kernel run.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// No CUDA driver library could be loaded.
    #[error("no CUDA driver library found")]
    NoDriver,
    /// A driver call failed.
    #[error("the CUDA driver failed: {0:?}")]
    Driver(#[from] DriverError),
    /// The buffers handed to a kernel do not match its operands.
    #[error("kernel `{kernel}`: {message}")]
    Buffers {
        /// The kernel's name (a fused attention's: its first entry's symbol).
        kernel: String,
        /// Which buffer does not match, and how.
        message: String,
    },
}

/// One GPU, ready to load modules: its context, a stream, its properties.
pub struct CudaDevice {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    properties: DeviceProperties,
}

impl CudaDevice {
    /// Opens GPU `ordinal` (never panics without a driver).
    pub fn open(ordinal: usize) -> Result<CudaDevice, DeviceError> {
        // SAFETY: only tries to open the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err(DeviceError::NoDriver);
        }
        let context = CudaContext::new(ordinal)?;
        use sys::CUdevice_attribute as A;
        let attribute = |a| context.attribute(a).map(|v| v.max(0) as u32);
        let properties = DeviceProperties {
            compute_capability: context.compute_capability()?,
            multiprocessors: attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            max_threads_per_block: attribute(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            shared_memory_per_block: attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
            max_grid_x: attribute(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            warp_size: attribute(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
        };
        let stream = context.default_stream();
        Ok(CudaDevice { context, stream, properties })
    }

    /// What the code generator needs to know of this GPU, as the driver
    /// reports it.
    pub fn properties(&self) -> &DeviceProperties {
        &self.properties
    }

    /// The context every module, stream and allocation of this GPU lives in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// Loads a compiled kernel's module and finds its entry points.
    pub fn load(&self, compiled: &CompiledPtx) -> Result<LoadedKernel, DeviceError> {
        let module = self.context.load_module(Ptx::from_src(compiled.ptx.clone()))?;
        let main = module.load_function(&compiled.kernel.entry)?;
        let finish = compiled.kernel.finish_entry.as_deref().map(|f| module.load_function(f)).transpose()?;
        Ok(LoadedKernel { kernel: compiled.kernel.clone(), main, finish })
    }
}

/// A kernel's functions in a loaded module.
pub struct LoadedKernel {
    kernel: GeneratedKernel,
    main: CudaFunction,
    finish: Option<CudaFunction>,
}

/// `(grid, block)` as cudarc's launch configuration (static shared memory only).
fn config(grid: u32, block: u32) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

impl LoadedKernel {
    /// The generated kernel: its operands and launch shape.
    pub fn generated(&self) -> &GeneratedKernel {
        &self.kernel
    }

    /// Queues the kernel (and its finish kernel) on `stream` over device
    /// pointers: `inputs` and `outputs` in the kernel's operand order,
    /// `partials` at least `launch.scratch_bytes` (cross-row outputs only),
    /// `rng` two `u64`s, dropout's Philox seed and counter word, which the
    /// kernel reads when it runs (so a recorded CUDA graph draws each
    /// replay's masks).
    ///
    /// # Safety
    /// Each pointer addresses its operand's bytes on this kernel's device,
    /// suitably aligned (`Buffer::alignment`), and stays valid until the
    /// stream has run the kernel; outputs alias inputs only in place.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        inputs: &[sys::CUdeviceptr],
        outputs: &[sys::CUdeviceptr],
        partials: sys::CUdeviceptr,
        rng: sys::CUdeviceptr,
    ) -> Result<(), DeviceError> {
        let k = &self.kernel;
        if inputs.len() != k.inputs.len() || outputs.len() != k.outputs.len() {
            return Err(DeviceError::Buffers {
                kernel: k.name.clone(),
                message: format!(
                    "{} inputs and {} outputs for {} and {} operands",
                    inputs.len(),
                    outputs.len(),
                    k.inputs.len(),
                    k.outputs.len()
                ),
            });
        }
        if k.launch.grid > 0 {
            let mut launch = stream.launch_builder(&self.main);
            for p in inputs {
                launch.arg(p);
            }
            for (p, b) in outputs.iter().zip(&k.outputs) {
                if !b.cross_row {
                    launch.arg(p);
                }
            }
            if k.outputs.iter().any(|b| b.cross_row) {
                launch.arg(&partials);
            }
            launch.arg(&rng);
            // SAFETY: the arguments match the generated signature (see
            // `GeneratedKernel`); the caller vouches for the pointers.
            unsafe { launch.launch(config(k.launch.grid, k.launch.block)) }?;
        }
        if let (Some(finish), Some((grid, block))) = (&self.finish, k.launch.finish) {
            let mut launch = stream.launch_builder(finish);
            launch.arg(&partials);
            for (p, b) in outputs.iter().zip(&k.outputs) {
                if b.cross_row {
                    launch.arg(p);
                }
            }
            // SAFETY: as above, for the finish kernel's signature.
            unsafe { launch.launch(config(grid, block)) }?;
        }
        Ok(())
    }

    /// Runs the kernel on host buffers (copied to the GPU and back): the
    /// storage bytes of each input; returns each output's bytes. For checks
    /// against the CPU backend, not for training (which keeps data on the GPU).
    pub fn run_host(
        &self,
        device: &CudaDevice,
        inputs: &[&[u8]],
        seed: u64,
        offset: u64,
    ) -> Result<Vec<Vec<u8>>, DeviceError> {
        let k = &self.kernel;
        let bytes = |b: &crate::codegen::Buffer| b.len * b.dtype.size_bytes() as usize;
        if inputs.len() != k.inputs.len() {
            return Err(DeviceError::Buffers {
                kernel: k.name.clone(),
                message: format!("{} inputs for {} operands", inputs.len(), k.inputs.len()),
            });
        }
        for (i, (data, b)) in inputs.iter().zip(&k.inputs).enumerate() {
            if data.len() != bytes(b) {
                return Err(DeviceError::Buffers {
                    kernel: k.name.clone(),
                    message: format!("input {i} has {} bytes, not {}", data.len(), bytes(b)),
                });
            }
        }
        let stream = &device.stream;
        // Never a zero-byte allocation (the driver refuses them).
        let upload = |data: &[u8]| -> Result<CudaSlice<u8>, DriverError> {
            let mut slice = stream.alloc_zeros::<u8>(data.len().max(1))?;
            if !data.is_empty() {
                stream.memcpy_htod(data, &mut slice)?;
            }
            Ok(slice)
        };
        let ins: Vec<CudaSlice<u8>> = inputs.iter().map(|d| upload(d)).collect::<Result<_, _>>()?;
        let outs: Vec<CudaSlice<u8>> =
            k.outputs.iter().map(|b| stream.alloc_zeros::<u8>(bytes(b).max(1))).collect::<Result<_, _>>()?;
        let partials = stream.alloc_zeros::<u8>(k.launch.scratch_bytes.max(8))?;
        let rng = stream.clone_htod(&[seed, offset])?;
        {
            let (ins, _i): (Vec<_>, Vec<_>) = ins.iter().map(|s| s.device_ptr(stream)).unzip();
            let (outs, _o): (Vec<_>, Vec<_>) = outs.iter().map(|s| s.device_ptr(stream)).unzip();
            let (partials, _p) = partials.device_ptr(stream);
            let (rng, _r) = rng.device_ptr(stream);
            // SAFETY: every buffer was allocated above at its operand's size.
            unsafe { self.launch(stream, &ins, &outs, partials, rng) }?;
        }
        let mut results = Vec::with_capacity(outs.len());
        for (s, b) in outs.iter().zip(&k.outputs) {
            let mut host = stream.clone_dtoh(s)?;
            host.truncate(bytes(b));
            results.push(host);
        }
        Ok(results)
    }
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

    #[test]
    fn opening_a_gpu_without_a_driver_is_an_error() {
        if probe() == Probe::NoDriver {
            assert!(matches!(CudaDevice::open(0), Err(DeviceError::NoDriver)));
        }
    }
}
