//! zeroplan's host backend: kernels compiled to native code by Cranelift.
//!
//! - [`host_isa`] / [`host_target`]: the host's code-generation target.
//! - [`kernel`]: fused row kernels ([`zeroplan_ir::kernel::Kernel`]) compiled
//!   to vectorised native code ([`KernelCompiler`], [`CompiledKernel`]),
//!   multithreaded over rows, checked against the reference interpreter.
//!
//! This crate compiles kernels; whole plans (GEMMs, attention and the other
//! host routines, the schedule, the arena) run in `zeroplan-runtime`'s host
//! runtime, which calls it for every kernel. See the crate's README for the
//! design and measured figures.

use cranelift_codegen::settings::{self, Configurable};

pub mod kernel;

pub use kernel::{CodegenError, CompiledKernel, KernelCompiler};

/// The host's instruction set and the vector width kernels can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostTarget {
    /// The target triple, e.g. `x86_64-unknown-linux-gnu`.
    pub triple: String,
    /// Cranelift's SIMD vectors are 128 bits: 4 × f32.
    pub f32_lanes: u32,
}

/// Why the host cannot be targeted.
#[derive(Debug, thiserror::Error)]
#[error("Cranelift cannot generate code for this host: {0}")]
pub struct HostError(String);

/// Builds Cranelift's ISA for this machine, with the CPU features it has.
pub fn host_isa() -> Result<cranelift_codegen::isa::OwnedTargetIsa, HostError> {
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").map_err(|e| HostError(e.to_string()))?;
    let isa = cranelift_native::builder().map_err(|e| HostError(e.to_string()))?;
    isa.finish(settings::Flags::new(flags)).map_err(|e| HostError(e.to_string()))
}

/// Describes the host target.
pub fn host_target() -> Result<HostTarget, HostError> {
    let isa = host_isa()?;
    Ok(HostTarget { triple: isa.triple().to_string(), f32_lanes: 128 / 32 })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_is_a_cranelift_target() {
        let target = super::host_target().unwrap();
        assert!(target.triple.contains(std::env::consts::ARCH), "{}", target.triple);
    }
}
