//! Loading the multi-tensor AdamW kernel and launching it on device
//! pointers through cudarc's driver API (never called without a driver).

use cudarc::driver::{CudaFunction, CudaStream, PushKernelArg, sys::CUdeviceptr};
use cudarc::nvrtc::Ptx;

use super::{AdamWHyper, AdamWTable, RenderedAdamW};
use crate::driver::{CudaDevice, DeviceError};

/// The device scalars of one step (f32 each): what the graph's
/// `lr_schedule` and `grad_scale` computed, and the step count `t`.
#[derive(Clone, Copy, Debug)]
pub struct AdamWScalars {
    /// The learning rate, from `lr_schedule`.
    pub lr: CUdeviceptr,
    /// The 1-based step `t` the bias correction uses.
    pub step: CUdeviceptr,
    /// What turns the summed, loss-scaled gradient into the clipped mean,
    /// from `grad_scale`.
    pub multiplier: CUdeviceptr,
    /// 1 when the gradients are finite, else 0 (the step leaves every
    /// tensor as it was), from `grad_scale`.
    pub finite: CUdeviceptr,
}

/// The kernel, loaded on one device.
pub struct LoadedAdamW {
    function: CudaFunction,
}

impl LoadedAdamW {
    /// Loads `ptx` (NVRTC's output for `rendered.source`) on `device`.
    pub fn load(device: &CudaDevice, rendered: &RenderedAdamW, ptx: &str) -> Result<LoadedAdamW, DeviceError> {
        let module = device.context().load_module(Ptx::from_src(ptx.to_string()))?;
        Ok(LoadedAdamW { function: module.load_function(&rendered.entry)? })
    }

    /// Queues one step over every tensor of `table`, whose bytes are at
    /// `table_ptr` on the device.
    ///
    /// # Safety
    /// `table_ptr` holds `table.bytes`; every pointer in it addresses its
    /// tensor (of the kernel's dtypes and the length in the table) and the
    /// scalars one f32 each, all on this device and valid until the stream ran it.
    pub unsafe fn launch(
        &self,
        device: &CudaDevice,
        stream: &CudaStream,
        table_ptr: CUdeviceptr,
        table: &AdamWTable,
        scalars: &AdamWScalars,
        hyper: &AdamWHyper,
    ) -> Result<(), DeviceError> {
        let (grid, block) = table.launch(device.properties());
        if grid == 0 {
            return Ok(());
        }
        let mut builder = stream.launch_builder(&self.function);
        builder.arg(&table_ptr).arg(&table.tensors).arg(&table.chunks);
        builder.arg(&scalars.lr).arg(&scalars.step).arg(&scalars.multiplier).arg(&scalars.finite);
        builder.arg(&hyper.beta1).arg(&hyper.beta2).arg(&hyper.eps);
        let config =
            cudarc::driver::LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments follow the kernel's signature; the caller vouches for the pointers.
        unsafe { builder.launch(config) }?;
        Ok(())
    }
}
