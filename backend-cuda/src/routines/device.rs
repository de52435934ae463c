//! Launching a planned routine through cudarc's driver API (never called
//! without a driver): one launch ([`launch`]), and a whole instruction on a
//! copy of host bytes ([`run_host`]), for checks against the host routine.

use cudarc::driver::{CudaFunction, CudaStream, DevicePtr, DriverError, LaunchConfig, PushKernelArg, result};
use cudarc::nvrtc::Ptx;

use super::THREADS;
use super::plan::{Arg, Op, plan, supported};
use crate::{CudaDevice, CudaKernelCompiler};
use zeroplan_exec::{Buf, Instr};

/// Queues `function` over `grid` blocks with `args`, partials at `scratch`.
///
/// # Safety
/// `args` follow the kernel's parameters (as [`plan`] builds them); every
/// address lies on this stream's device, valid until the stream has run it,
/// and `scratch` holds the plan's partials bytes.
pub unsafe fn launch(
    stream: &CudaStream,
    function: &CudaFunction,
    grid: u32,
    args: &[Arg],
    scratch: u64,
) -> Result<(), DriverError> {
    let at: Vec<u64> = args.iter().map(|a| if let Arg::Scratch(b) = a { scratch + b } else { 0 }).collect();
    let mut builder = stream.launch_builder(function);
    for (a, at) in args.iter().zip(&at) {
        match a {
            Arg::Ptr(v) | Arg::U64(v) => builder.arg(v),
            Arg::I64(v) => builder.arg(v),
            Arg::F64(v) => builder.arg(v),
            Arg::Scratch(_) => builder.arg(at),
            Arg::Strided(d) => builder.arg(d),
            Arg::Tiled(d) => builder.arg(d),
            Arg::Slopes(m) => builder.arg(m),
        };
    }
    let config = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the caller vouches for the arguments and addresses.
    unsafe { builder.launch(config) }.map(|_| ())
}

/// Runs `instr`, whose buffers are offsets into `arena` (`Place::Device`),
/// on a copy of `arena` on the GPU; returns the arena after it.
pub fn run_host<K: Clone>(
    device: &CudaDevice,
    compiler: &mut CudaKernelCompiler,
    instr: &Instr<K>,
    arena: &[u8],
) -> Result<Vec<u8>, String> {
    let driver = |e: DriverError| format!("the CUDA driver failed: {e:?}");
    supported(instr)?;
    let stream = device.context().default_stream();
    let mut memory = stream.alloc_zeros::<u8>(arena.len().max(1)).map_err(driver)?;
    stream.memcpy_htod(arena, &mut memory).map_err(driver)?;
    let base = memory.device_ptr(&stream).0;
    let planned = plan(instr, &|b: &Buf| base + b.offset as u64, device.properties())?;
    let scratch = stream.alloc_zeros::<u8>(planned.scratch_bytes.max(1)).map_err(driver)?;
    let scratch_ptr = scratch.device_ptr(&stream).0;
    for op in &planned.ops {
        match op {
            Op::Launch(l) => {
                let compiled = compiler.compile_routine(&l.routine).map_err(|e| e.to_string())?;
                let module = device.context().load_module(Ptx::from_src(compiled.ptx.clone())).map_err(driver)?;
                let function = module.load_function(&compiled.rendered.entries[l.kernel]).map_err(driver)?;
                // SAFETY: the plan's addresses lie in `memory` and `scratch`,
                // which outlive the synchronisation below.
                unsafe { launch(&stream, &function, l.grid, &l.args, scratch_ptr) }.map_err(driver)?;
            }
            Op::Memcpy { from, to, bytes } => {
                // SAFETY: both ranges lie in `memory` and do not overlap.
                unsafe { result::memcpy_dtod_async(*to, *from, *bytes, stream.cu_stream()) }.map_err(driver)?;
            }
        }
    }
    stream.synchronize().map_err(driver)?;
    let mut out = vec![0u8; arena.len()];
    stream.memcpy_dtoh(&memory, &mut out).map_err(driver)?;
    Ok(out)
}
