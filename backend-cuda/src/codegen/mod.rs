//! Fused row kernels ([`zeroplan_ir::kernel::Kernel`]) → CUDA C.
//!
//! [`generate`] binds a kernel's shape to concrete `dims` and writes one
//! `extern "C" __global__` function for it (plus a `…_finish` kernel when it
//! has cross-row outputs), with the [`LaunchConfig`] to run it with on a
//! device described by [`DeviceProperties`]. Nothing here touches CUDA: the
//! source is plain text, compiled by NVRTC in [`crate::nvrtc`].
//!
//! Shape binding, expression classes and sweeps come from
//! [`zeroplan_ir::kernel::layout`]. Files: `vector.rs` (16-byte vector
//! steps), `launch.rs` (grid, block, shared memory, scratch), `emit.rs` (the
//! kernel's text), `expr.rs` (one expression as C), `prelude.rs` (the C
//! helpers: math, bf16/f16 storage, block reductions, Philox).
//!
//! **Semantics** are the interpreter's (`zeroplan_ir::interp`): per-element
//! arithmetic in `float`, launch-uniform values in `double`, reductions
//! propagate NaN, dropout draws exactly the interpreter's mask, cross-row
//! outputs are sums in `double` over the omitted axes.

mod emit;
pub(crate) mod expr;
mod launch;
pub(crate) mod prelude;
mod vector;

pub use launch::{DeviceProperties, LaunchConfig};
use zeroplan_ir::DType;
use zeroplan_ir::kernel::layout::{ArgLayout, Layout};
use zeroplan_ir::kernel::{Expr, Kernel};

/// Why a kernel cannot be turned into CUDA C.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodegenError {
    /// The kernel fails [`Kernel::check`].
    #[error("kernel `{kernel}` is malformed: {message}")]
    Invalid {
        /// The kernel's name.
        kernel: String,
        /// What the check found.
        message: String,
    },
    /// `dims` do not fit the kernel's shape.
    #[error("kernel `{kernel}`: {message}")]
    Dims {
        /// The kernel's name.
        kernel: String,
        /// Which dim does not fit, and how.
        message: String,
    },
    /// The device cannot run the kernel as generated.
    #[error("kernel `{kernel}` cannot run on this device: {message}")]
    Device {
        /// The kernel's name.
        kernel: String,
        /// Which of the device's limits the kernel passes.
        message: String,
    },
}

/// One operand's buffer as the generated kernel reads or writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// The element type the kernel loads or stores.
    pub dtype: DType,
    /// Elements (the operand's own shape, bound).
    pub len: usize,
    /// The byte alignment its pointer needs (16-byte vector accesses need
    /// `vector · size`; else the element size).
    pub alignment: usize,
    /// A cross-row output: written by the `…_finish` kernel, not the main one.
    pub cross_row: bool,
}

/// The CUDA C of one (kernel, dims) and how to launch it.
///
/// The main kernel's parameters, in order: one pointer per input (its
/// dtype: `float`, `__nv_bfloat16`, `__half`, `int`, `long long`), one per
/// output that is not cross-row, `double* partials` (the scratch, when
/// there are cross-row outputs), `const unsigned long long* zp_rng`
/// (dropout's Philox key and counter word, read from device memory when the
/// kernel runs, so a replayed CUDA graph draws each step's masks). The finish
/// kernel's: `const double* partials`, then one pointer per cross-row output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedKernel {
    /// The kernel IR's name.
    pub name: String,
    /// The concrete shape the kernel was generated for.
    pub dims: Vec<usize>,
    /// The CUDA C NVRTC compiles.
    pub source: String,
    /// The main kernel's symbol.
    pub entry: String,
    /// The symbol of the kernel adding up cross-row partials, if any.
    pub finish_entry: Option<String>,
    /// The grid, block and scratch to launch it with.
    pub launch: LaunchConfig,
    /// Each input's buffer, in the kernel's operand order.
    pub inputs: Vec<Buffer>,
    /// Each output's buffer, in order.
    pub outputs: Vec<Buffer>,
    /// Whether the kernel draws dropout masks.
    pub uses_dropout: bool,
}

/// CUDA C for `kernel` with its shape bound to `dims`, for `device`.
pub fn generate(kernel: &Kernel, dims: &[usize], device: &DeviceProperties) -> Result<GeneratedKernel, CodegenError> {
    let name = kernel.name.clone();
    kernel.check().map_err(|message| CodegenError::Invalid { kernel: name.clone(), message })?;
    let split = launch::split_long_rows(kernel, dims, device);
    let (kernel, bound) = split.as_ref().map_or((kernel, dims), |(k, d)| (k, d.as_slice()));
    let layout = Layout::bind(kernel, bound).map_err(|message| CodegenError::Dims { kernel: name.clone(), message })?;
    let has_reduction = kernel.body.iter().any(|e| matches!(e, Expr::ReduceSum(_) | Expr::ReduceMax(_)));
    let vectors = vector::VectorSteps::of(&layout);
    let launch = launch::launch_config(&layout, vectors, device, has_reduction)
        .map_err(|launch::LaunchError::Device(message)| CodegenError::Device { kernel: name.clone(), message })?;
    let source = emit::source(kernel, &layout, vectors, &launch);
    let entries = emit::entries(kernel, &layout);
    let buffer = |a: &ArgLayout| {
        let size = a.dtype.size_bytes() as usize;
        let vectorised = vector::vectorised(a) && vectors.main > 0;
        Buffer {
            dtype: a.dtype,
            len: a.len,
            alignment: if vectorised { size * vectors.columns } else { size },
            cross_row: a.cross_row,
        }
    };
    Ok(GeneratedKernel {
        name,
        dims: dims.to_vec(),
        source,
        entry: entries.main,
        finish_entry: entries.finish,
        inputs: layout.inputs.iter().map(buffer).collect(),
        outputs: layout.outputs.iter().map(buffer).collect(),
        launch,
        uses_dropout: kernel.body.iter().any(|e| matches!(e, Expr::Keep { .. })),
    })
}

#[cfg(test)]
mod tests;
