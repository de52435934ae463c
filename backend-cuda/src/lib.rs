//! zeroplan's CUDA backend: fused row kernels as CUDA C, compiled by NVRTC.
//!
//! - [`codegen`]: kernel IR → CUDA C ([`generate`]) with its launch shape
//!   ([`LaunchConfig`]) for a device ([`DeviceProperties`]); plain text and
//!   data, testable without a GPU.
//! - [`nvrtc`]: CUDA C → PTX with NVRTC ([`Nvrtc`]), a host library.
//! - [`cache`]: PTX on disk by a hash of (source, options, NVRTC version).
//! - [`compiler`]: [`CudaKernelCompiler::compile`]`(&kernel, &dims)`, as the
//!   CPU backend's `KernelCompiler`.
//! - [`gemm`]: row-major batched GEMMs through cuBLAS ([`Blas`], [`Gemm`]),
//!   and through cuBLASLt with bias/GELU epilogues and their backward
//!   ([`BlasLt`], [`LtGemm`], [`Epilogue`]).
//! - [`driver`]: finding GPUs ([`probe`]), loading modules and launching
//!   kernels through cudarc's driver API — never called without a driver.
//! - [`attention`]: fused (FlashAttention-2-style) attention, forward and
//!   backward, a CUDA C template rendered per specialisation
//!   ([`AttentionKernel`]) for the IR's `FlashAttention` op ([`FlashAttention`]).
//! - [`adamw`]: multi-tensor AdamW, one launch over a table of tensors
//!   ([`AdamWKernel`]).
//! - [`routines`]: the host runtime's routines (losses, embeddings, layout
//!   ops, fills) as CUDA C templates ([`routines::Routine`]).
//!
//! - [`device`]: [`Cuda`], the `zeroplan_exec::Device` the runtime drives: a
//!   rank's program on one GPU, with the load-time step passes that put
//!   biases and bias gradients into cuBLASLt epilogues, attention into the
//!   fused kernels and AdamW updates into multi-tensor launches.
//! - [`nccl`]: [`Nccl`], a `zeroplan_exec::Communicator` over NCCL that
//!   takes the device's buffers as device pointers.
//!
//! See the crate's README for what was checked, and how.

pub mod adamw;
pub mod attention;
pub mod cache;
pub mod codegen;
pub mod compiler;
pub mod device;
pub mod driver;
pub mod gemm;
pub mod nccl;
pub mod nvrtc;
pub mod ptxas;
pub mod routines;

pub use adamw::{AdamWError, AdamWKernel};
pub use attention::{AttentionError, AttentionKernel, FlashAttention};
pub use cache::PtxCache;
pub use codegen::{CodegenError, DeviceProperties, GeneratedKernel, LaunchConfig, generate};
pub use compiler::{CompileError, CompiledAdamW, CompiledAttention, CompiledPtx, CompiledRoutine, CudaKernelCompiler};
pub use device::{Cuda, CudaKernel};
pub use driver::{CudaDevice, DeviceError, Gpu, LoadedKernel, Probe, probe};
pub use gemm::{Blas, BlasLt, Epilogue, Gemm, GemmError, LtGemm};
pub use nccl::Nccl;
pub use nvrtc::{Nvrtc, NvrtcError};
