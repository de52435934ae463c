//! Helpers for the CUDA backend's tests: the backend-agnostic half shared
//! with the CPU backend's tests (real kernels from the fuse pass on the tiny
//! models, random operands, the interpreter's answer; included by path),
//! NVRTC from the fixture, and the ptxas resource check.
// Each test binary uses part of this module.
#![allow(dead_code)]

#[path = "../../../backend-cpu/tests/common/kernels.rs"]
mod kernels;
pub use kernels::*;

pub mod adamw;
pub mod attention;
pub mod host;
pub mod resources;
pub mod routine_arith;
pub mod routines;

use std::path::PathBuf;

use zeroplan_backend_cuda::Nvrtc;
use zeroplan_ir::spec;

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The tiny model `name` (`tiny-bert`, …).
pub fn tiny_model(name: &str) -> PathBuf {
    let path = root().join("models/tiny").join(format!("{name}.ron"));
    assert!(path.is_file(), "{} exists", path.display());
    path
}

/// The training precisions kernels are generated for.
pub fn precisions() -> [(&'static str, spec::Precision); 3] {
    [("f32", spec::Precision::F32), ("bf16", spec::Precision::Bf16), ("f16", spec::Precision::F16(Default::default()))]
}

/// NVRTC from `fixtures/nvrtc/` (`scripts/fetch-nvrtc.sh`), else from the
/// system; `None` (the caller says SKIPPED) when neither has it.
pub fn nvrtc() -> Option<Nvrtc> {
    let fixture = root().join("fixtures/nvrtc");
    let include = fixture.join("include");
    let include = include.join("cuda_bf16.h").is_file().then_some(include);
    let found = if fixture.join("lib").is_dir() {
        Nvrtc::from_dir(&fixture.join("lib"), include)
    } else {
        Nvrtc::system(include)
    };
    match found {
        Ok(nvrtc) => Some(nvrtc),
        Err(e) => {
            eprintln!("SKIPPED: run scripts/fetch-nvrtc.sh ({e})");
            None
        }
    }
}
