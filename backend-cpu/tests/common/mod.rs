//! Helpers for the kernel tests: the backend-agnostic half in
//! [`kernels`] (real kernels from the fuse pass, random operands, the
//! interpreter's answer), and running the JIT's kernels.
// Each test binary uses part of this module.
#![allow(dead_code)]

mod kernels;
pub use kernels::*;

use zeroplan_backend_cpu::CompiledKernel;
use zeroplan_ir::Tensor;
use zeroplan_ir::kernel::Kernel;

/// Output buffers of `compiled` (filled with a NaN-like pattern, so an
/// element never written shows).
pub fn output_buffers(kernel: &Kernel, compiled: &CompiledKernel) -> Vec<Vec<u8>> {
    kernel
        .outputs
        .iter()
        .zip(compiled.output_lens())
        .map(|(o, n)| vec![0xFF; n * o.ty.dtype.size_bytes() as usize])
        .collect()
}

/// Runs `compiled` on `inputs`; the outputs as `f64`s.
pub fn run(kernel: &Kernel, compiled: &CompiledKernel, inputs: &[Tensor], seed: u64, offset: u64) -> Vec<Vec<f64>> {
    let in_bytes: Vec<Vec<u8>> = inputs.iter().map(to_bytes).collect();
    let mut outs = output_buffers(kernel, compiled);
    let in_ptrs: Vec<*const u8> = in_bytes.iter().map(|b| b.as_ptr()).collect();
    let out_ptrs: Vec<*mut u8> = outs.iter_mut().map(|b| b.as_mut_ptr()).collect();
    // SAFETY: every buffer has its operand's size.
    unsafe { compiled.launch(&in_ptrs, &out_ptrs, seed, offset) };
    kernel.outputs.iter().zip(&outs).map(|(o, b)| from_bytes(b, o.ty.dtype)).collect()
}
