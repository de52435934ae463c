//! Every generated kernel compiled to PTX by NVRTC for Hopper (`compute_90`),
//! without a GPU: NVRTC is a host library (`scripts/fetch-nvrtc.sh` puts it
//! in `fixtures/nvrtc/`). Without it the tests say SKIPPED and pass.

mod common;

use std::collections::BTreeSet;

use common::{dims, fused_kernels, nvrtc, precisions, tiny_models};
use zeroplan_backend_cuda::{CudaKernelCompiler, DeviceProperties, NvrtcError, PtxCache, generate};

#[test]
fn every_tiny_model_kernel_compiles_for_hopper() {
    let Some(nvrtc) = nvrtc() else { return };
    let device = DeviceProperties::H100_SXM;
    let arch = device.arch();
    let (mut sources, mut failures) = (BTreeSet::new(), Vec::new());
    let mut kernels = 0;
    for model in tiny_models() {
        for (label, precision) in precisions() {
            for kernel in fused_kernels(&model, precision) {
                kernels += 1;
                // 2×5: rows of 5 keys (scalar); 3×8: attention rows of whole vectors.
                for (batch, seq) in [(2, 5), (3, 8)] {
                    let d = dims(&kernel, batch, seq);
                    let g = generate(&kernel, &d, &device).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
                    if !sources.insert(g.source.clone()) {
                        continue;
                    }
                    match nvrtc.compile_ptx(&g.entry, &g.source, &arch) {
                        Ok(ptx) => {
                            for entry in [Some(&g.entry), g.finish_entry.as_ref()].into_iter().flatten() {
                                assert!(ptx.contains(&format!(".entry {entry}(")), "{entry} missing from the PTX");
                            }
                            assert!(ptx.contains(".target sm_90"), "{}", &ptx[..ptx.len().min(400)]);
                        }
                        Err(e) => failures.push(format!("{} ({label}) {:?}: {e}\n{}", model.display(), d, g.source)),
                    }
                }
            }
        }
    }
    let (major, minor) = nvrtc.version();
    println!(
        "NVRTC {major}.{minor} compiled {} distinct sources ({kernels} kernels × 2 shapes) for {arch}",
        sources.len() - failures.len()
    );
    assert!(failures.is_empty(), "{} of {} failed:\n{}", failures.len(), sources.len(), failures.join("\n\n"));
    assert!(sources.len() > 300, "only {} sources", sources.len());
}

#[test]
fn a_broken_source_returns_nvrtcs_log() {
    let Some(nvrtc) = nvrtc() else { return };
    let source = "extern \"C\" __global__ void broken(float* x) { x[0] = not_declared(x[1]); }\n";
    match nvrtc.compile_ptx("broken", source, "compute_90") {
        Err(NvrtcError::Compile { name, log, options }) => {
            assert_eq!(name, "broken");
            assert!(log.contains("not_declared"), "{log}");
            assert!(options.iter().any(|o| o == "--gpu-architecture=compute_90"), "{options:?}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    assert!(matches!(nvrtc.compile_ptx("nul", "int x;\0", "compute_90"), Err(NvrtcError::Nul(_))));
}

#[test]
fn compiled_ptx_is_cached_on_disk() {
    let Some(nvrtc) = nvrtc() else { return };
    let dir = std::env::temp_dir().join(format!("zeroplan-cuda-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let kernels = fused_kernels(&common::tiny_model("tiny-bert"), zeroplan_ir::spec::Precision::F32);
    let kernel = kernels.iter().find(|k| k.pattern.as_deref() == Some("layer_norm")).unwrap_or(&kernels[0]);
    let d = dims(kernel, 2, 8);
    let device = DeviceProperties::H100_SXM;
    let mut first = CudaKernelCompiler::new(device, nvrtc.clone(), Some(PtxCache::new(&dir)));
    let a = first.compile(kernel, &d).unwrap();
    assert!(!a.cached);
    // The same (kernel, dims) again: the in-memory entry.
    assert!(std::sync::Arc::ptr_eq(&a, &first.compile(kernel, &d).unwrap()));
    // A new compiler (a new process, as far as it knows): from disk.
    let mut second = CudaKernelCompiler::new(device, nvrtc.clone(), Some(PtxCache::new(&dir)));
    let b = second.compile(kernel, &d).unwrap();
    assert!(b.cached);
    assert_eq!(a.ptx, b.ptx);
    // Another architecture is another entry.
    let ampere = DeviceProperties { compute_capability: (8, 0), ..device };
    let c = CudaKernelCompiler::new(ampere, nvrtc, Some(PtxCache::new(&dir))).compile(kernel, &d).unwrap();
    assert!(!c.cached && c.ptx.contains(".target sm_80"));
    std::fs::remove_dir_all(&dir).unwrap();
}
