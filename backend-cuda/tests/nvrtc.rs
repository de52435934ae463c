//! Every generated kernel compiled to PTX by NVRTC for Hopper (`compute_90`),
//! without a GPU: NVRTC is a host library (`scripts/fetch-nvrtc.sh` puts it
//! in `fixtures/nvrtc/`). Without it the tests say SKIPPED and pass. The PTX
//! is then assembled by ptxas (the same script fetches it) for `sm_90`, and
//! the attention and AdamW templates for `sm_80` too, and every entry's
//! registers, spills and occupancy checked ([`common::resources`]); the
//! table: `cargo test -p zeroplan-backend-cuda --test nvrtc -- --nocapture`.

mod common;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::resources::{ATTENTION_FLOOR, MEMORY_BOUND_FLOOR, ResourceCheck};
use common::{dims, fused_kernels, nvrtc, precisions, tiny_models};
use zeroplan_backend_cuda::ptxas::SmLimits;
use zeroplan_backend_cuda::{CudaKernelCompiler, DeviceProperties, GeneratedKernel, NvrtcError, PtxCache, generate};

/// Threads per block of `entry`, one of `g`'s two kernels.
fn threads_of(g: &GeneratedKernel) -> impl Fn(&str) -> u32 + '_ {
    |entry| match (&g.finish_entry, g.launch.finish) {
        (Some(finish), Some((_, block))) if entry == finish => block,
        _ => g.launch.block,
    }
}

/// One distinct source of [`every_tiny_model_kernel_compiles_for_hopper`]
/// and what its resources are checked as.
struct Case {
    model: std::path::PathBuf,
    label: &'static str,
    dims: Vec<usize>,
    generated: GeneratedKernel,
    /// The family and occupancy floor its resources are recorded under;
    /// `None`: compiled only.
    checked: Option<(String, f64)>,
}

#[test]
fn every_tiny_model_kernel_compiles_for_hopper() {
    let Some(nvrtc) = nvrtc() else { return };
    let device = DeviceProperties::H100_SXM;
    let arch = device.arch();
    let (mut sources, mut cases) = (BTreeSet::new(), Vec::new());
    let mut kernels = 0;
    // The tiny models at two shapes, and BERT-base in bf16 at seq 128: the
    // widths (768, 3072) the runtime launches in practice.
    let mut models: Vec<_> = tiny_models().into_iter().flat_map(|m| precisions().map(|p| (m.clone(), p))).collect();
    models.push((common::root().join("models/bert-base.ron"), precisions()[1]));
    for (model, (label, precision)) in models {
        let real = !model.starts_with(common::root().join("models/tiny"));
        for kernel in fused_kernels(&model, precision) {
            kernels += 1;
            // 2×5: rows of 5 keys (scalar); 3×8: attention rows of whole vectors.
            let shapes: &[(u64, u64)] = if real { &[(8, 128)] } else { &[(2, 5), (3, 8)] };
            for &(batch, seq) in shapes {
                let d = dims(&kernel, batch, seq);
                let g = generate(&kernel, &d, &device).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
                if !sources.insert(g.source.clone()) {
                    continue;
                }
                // Resources at the vectorised tiny shape (spills) and at
                // BERT-base's width (spills and occupancy: a tiny row's
                // block of 32 threads says nothing about occupancy).
                let checked = (real || (batch, seq) == (3, 8)).then(|| {
                    let pattern = kernel.pattern.as_deref().unwrap_or("elementwise");
                    let at = if real { "bert-base" } else { "tiny" };
                    (format!("{pattern} {label} ({at})"), if real { MEMORY_BOUND_FLOOR } else { 0.0 })
                });
                cases.push(Case { model: model.clone(), label, dims: d, generated: g, checked });
            }
        }
    }
    // NVRTC and ptxas per source on every core: hundreds of compilations;
    // resources are recorded in case order.
    let mut resources = ResourceCheck::new(SmLimits::SM_90);
    let compiled = on_every_core(&cases, |case| {
        let g = &case.generated;
        let ptx = nvrtc
            .compile_ptx(&g.entry, &g.source, &arch)
            .map_err(|e| format!("{} ({}) {:?}: {e}\n{}", case.model.display(), case.label, case.dims, g.source))?;
        for entry in [Some(&g.entry), g.finish_entry.as_ref()].into_iter().flatten() {
            assert!(ptx.contains(&format!(".entry {entry}(")), "{entry} missing from the PTX");
        }
        assert!(ptx.contains(".target sm_90"), "{}", &ptx[..ptx.len().min(400)]);
        Ok(case.checked.as_ref().map(|(family, _)| resources.assemble(family, &ptx)))
    });
    let mut failures: Vec<String> = Vec::new();
    for (case, result) in cases.iter().zip(compiled) {
        let found = match result {
            Ok(Some(found)) => found,
            Ok(None) => continue,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let (family, floor) = case.checked.as_ref().expect("assembled only if checked");
        let g = &case.generated;
        // A cross-row kernel's grid: at most CROSS_ROW_BLOCKS_PER_SM blocks an SM.
        let grid_blocks = |entry: &str| {
            (g.finish_entry.is_some() && entry == g.entry).then(|| g.launch.grid.div_ceil(device.multiprocessors))
        };
        resources.record(family, found, &threads_of(g), &grid_blocks, *floor);
    }
    let (major, minor) = nvrtc.version();
    println!(
        "NVRTC {major}.{minor} compiled {} distinct sources ({kernels} kernels × 2 shapes) for {arch}",
        sources.len() - failures.len()
    );
    assert!(failures.is_empty(), "{} of {} failed:\n{}", failures.len(), sources.len(), failures.join("\n\n"));
    assert!(sources.len() > 300, "only {} sources", sources.len());
    resources.finish();
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

/// Automatic precompiled headers (`--pch`, passed where NVRTC has them)
/// only save parsing: a bf16 attention source compiles to the same PTX
/// with them as without, so they stay out of the PTX cache's key.
#[test]
fn precompiled_headers_leave_the_ptx_unchanged() {
    use zeroplan_backend_cuda::attention::{AttentionKernel, Pass};
    use zeroplan_ir::DType;
    let Some(nvrtc) = nvrtc() else { return };
    let kernel = AttentionKernel {
        head_dim: 64,
        dtype: DType::BF16,
        mask: DType::I64,
        alibi: false,
        dropout: false,
        tensor_cores: true,
    };
    let rendered = kernel.render(Pass::Forward).unwrap();
    let name = &rendered.entries[0].1;
    let arch = DeviceProperties::H100_SXM.arch();
    let options = cudarc::nvrtc::CompileOptions { options: nvrtc.options(&arch), ..Default::default() };
    let plain = cudarc::nvrtc::compile_ptx_with_opts(&rendered.source, options).unwrap().to_src();
    // Twice: the first saves the headers, the second loads them.
    for _ in 0..2 {
        assert_eq!(nvrtc.compile_ptx(name, &rendered.source, &arch).unwrap(), plain);
    }
}

/// `prepare` compiles ahead what `compile` will ask for (on every core):
/// afterwards each kernel is found in memory, named as its own node, with
/// the PTX a compiler that was not prepared gives it.
#[test]
fn prepared_kernels_are_found_compiled() {
    let Some(nvrtc) = nvrtc() else { return };
    let kernels = fused_kernels(&common::tiny_model("tiny-bert"), zeroplan_ir::spec::Precision::F32);
    let wanted: Vec<_> = kernels.iter().take(6).map(|k| (k, dims(k, 2, 8))).collect();
    let distinct: BTreeSet<_> = wanted.iter().map(|(k, d)| (k.to_text(), d.clone())).collect();
    let device = DeviceProperties::H100_SXM;
    let mut prepared = CudaKernelCompiler::new(device, nvrtc.clone(), None);
    prepared.prepare(wanted.iter().map(|(k, d)| (*k, d.clone())));
    assert_eq!(prepared.len(), distinct.len());
    let mut fresh = CudaKernelCompiler::new(device, nvrtc, None);
    for (kernel, d) in &wanted {
        let got = prepared.compile(kernel, d).unwrap();
        assert_eq!(prepared.len(), distinct.len(), "{} compiled again", kernel.name);
        let want = fresh.compile(kernel, d).unwrap();
        assert_eq!((&got.kernel.name, &got.ptx), (&want.kernel.name, &want.ptx));
    }
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

/// The static shared memory of `symbol` in `ptx`: the bytes of the
/// `.shared` arrays declared in its scope (named `_ZZ…{symbol}E…`).
fn shared_bytes_of(ptx: &str, symbol: &str) -> u32 {
    ptx.lines()
        .map(str::trim)
        .filter(|l| l.starts_with(".shared") && l.contains(&format!("{symbol}E")))
        .map(|l| {
            let size = l.rsplit_once('[').and_then(|(_, n)| n.split_once(']')).map(|(n, _)| n);
            size.and_then(|n| n.parse::<u32>().ok()).unwrap_or_else(|| panic!("a sized array: {l}"))
        })
        .sum()
}

/// `f` of every item, on every core (NVRTC and ptxas per source: the slow
/// part), the results in the items' order.
fn on_every_core<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let (next, done) = (AtomicUsize::new(0), Mutex::new(Vec::new()));
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let at = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(at) else { break };
                    let result = f(item);
                    done.lock().unwrap().push((at, result));
                }
            });
        }
    });
    let mut done = done.into_inner().unwrap();
    done.sort_by_key(|&(at, _)| at);
    done.into_iter().map(|(_, result)| result).collect()
}

/// Every attention specialisation, with both passes: CUDA cores at head
/// dims 32/64 over f32/bf16/f16, tensor cores at 32/64/128 over bf16/f16,
/// each with ALiBi and dropout off and on in all four combinations and an
/// i64 mask; and the i32 mask (one typedef) once per CUDA-core dtype.
fn attention_specialisations() -> Vec<(zeroplan_backend_cuda::AttentionKernel, zeroplan_backend_cuda::attention::Pass)>
{
    use zeroplan_backend_cuda::attention::{AttentionKernel, Pass};
    use zeroplan_ir::DType;
    let families: [(bool, &[usize], &[DType]); 2] = [
        (false, &[32, 64], &[DType::F32, DType::BF16, DType::F16]),
        (true, &[32, 64, 128], &[DType::BF16, DType::F16]),
    ];
    let mut kernels = Vec::new();
    for (tensor_cores, head_dims, dtypes) in families {
        for &head_dim in head_dims {
            for &dtype in dtypes {
                for (alibi, dropout) in [(false, false), (true, false), (false, true), (true, true)] {
                    let mask = DType::I64;
                    kernels.push(AttentionKernel { head_dim, dtype, mask, alibi, dropout, tensor_cores });
                }
            }
        }
    }
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let (mask, tensor_cores) = (DType::I32, false);
        kernels.push(AttentionKernel { head_dim: 64, dtype, mask, alibi: true, dropout: true, tensor_cores });
    }
    kernels.into_iter().flat_map(|k| [Pass::Forward, Pass::Backward].map(|pass| (k, pass))).collect()
}

#[test]
fn every_attention_specialisation_compiles_for_hopper() {
    let Some(nvrtc) = nvrtc() else { return };
    let arch = DeviceProperties::H100_SXM.arch();
    let mut resources = ResourceCheck::new(SmLimits::SM_90);
    let sources = attention_specialisations();
    let compiled = on_every_core(&sources, |(kernel, pass)| {
        let rendered = kernel.render(*pass).unwrap();
        let ptx = nvrtc.compile_ptx(&rendered.entries[0].1, &rendered.source, &arch);
        let found = ptx.as_ref().map_or(Vec::new(), |ptx| resources.assemble(&attention_family(kernel, *pass), ptx));
        (rendered, ptx, found)
    });
    let mut failures: Vec<String> = Vec::new();
    for ((kernel, pass), (rendered, ptx, found)) in sources.iter().zip(compiled) {
        match ptx {
            Ok(ptx) => {
                assert!(ptx.contains(".target sm_90"));
                for (entry, symbol) in &rendered.entries {
                    assert!(ptx.contains(&format!(".entry {symbol}(")), "{symbol} missing from the PTX");
                    // The launch shape states the shared memory the source declares.
                    assert_eq!(shared_bytes_of(&ptx, symbol), kernel.shared_bytes(*entry), "{symbol}");
                }
                let threads = |_: &str| zeroplan_backend_cuda::attention::THREADS;
                resources.record(&attention_family(kernel, *pass), found, &threads, &|_| None, ATTENTION_FLOOR);
            }
            Err(e) => failures.push(format!("{kernel:?} {pass:?}: {e}")),
        }
    }
    println!("NVRTC compiled {} fused attention sources for {arch}", sources.len() - failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    resources.finish();
}

fn attention_family(
    k: &zeroplan_backend_cuda::AttentionKernel,
    pass: zeroplan_backend_cuda::attention::Pass,
) -> String {
    let extras = [
        (k.alibi, " alibi"),
        (k.dropout, " dropout"),
        (k.mask == zeroplan_ir::DType::I32, " i32 mask"),
        (k.tensor_cores, " mma"),
    ];
    let extras: String = extras.iter().filter(|(on, _)| *on).map(|(_, s)| *s).collect();
    format!("attention {pass:?} d{} {:?}{extras}", k.head_dim, k.dtype)
}

/// The attention and AdamW templates assembled for Ampere (`sm_80`): less
/// shared memory per SM than Hopper, the same register file.
#[test]
fn attention_and_adamw_fit_ampere() {
    use zeroplan_backend_cuda::adamw::{self, AdamWKernel};
    use zeroplan_backend_cuda::attention;
    use zeroplan_ir::DType;
    let Some(nvrtc) = nvrtc() else { return };
    let mut resources = ResourceCheck::new(SmLimits::SM_80);
    let sources = attention_specialisations();
    let found = on_every_core(&sources, |(kernel, pass)| {
        let r = kernel.render(*pass).unwrap();
        let ptx = nvrtc.compile_ptx(&r.entries[0].1, &r.source, "compute_80").unwrap_or_else(|e| panic!("{e}"));
        resources.assemble(&attention_family(kernel, *pass), &ptx)
    });
    for ((kernel, pass), found) in sources.iter().zip(found) {
        resources.record(&attention_family(kernel, *pass), found, &|_| attention::THREADS, &|_| None, ATTENTION_FLOOR);
    }
    for grad in [DType::F32, DType::BF16, DType::F16] {
        let r = AdamWKernel { grad, working: Some(DType::BF16) }.render().unwrap();
        let ptx = nvrtc.compile_ptx(&r.entry, &r.source, "compute_80").unwrap_or_else(|e| panic!("{e}"));
        resources.add(&format!("adamw {grad:?} → bf16"), &ptx, &|_| adamw::THREADS, MEMORY_BOUND_FLOOR);
    }
    resources.finish();
}

#[test]
fn every_multi_tensor_adamw_specialisation_compiles_for_hopper() {
    use zeroplan_backend_cuda::adamw::AdamWKernel;
    use zeroplan_ir::DType;
    let Some(nvrtc) = nvrtc() else { return };
    let arch = DeviceProperties::H100_SXM.arch();
    let mut compiled = 0;
    let mut resources = ResourceCheck::new(SmLimits::SM_90);
    for grad in [DType::F32, DType::BF16, DType::F16] {
        for working in [None, Some(DType::BF16), Some(DType::F16)] {
            let r = AdamWKernel { grad, working }.render().unwrap();
            let ptx = nvrtc.compile_ptx(&r.entry, &r.source, &arch).unwrap_or_else(|e| panic!("{e}"));
            assert!(ptx.contains(&format!(".entry {}(", r.entry)) && ptx.contains(".target sm_90"));
            // No shared memory: the launch passes none.
            assert!(!ptx.contains(".shared"), "{}", r.entry);
            compiled += 1;
            let family = format!("adamw {grad:?} → {working:?}");
            resources.add(&family, &ptx, &|_| zeroplan_backend_cuda::adamw::THREADS, MEMORY_BOUND_FLOOR);
        }
    }
    println!("NVRTC compiled {compiled} multi-tensor AdamW sources for {arch}");
    resources.finish();
}

/// Every routine specialisation the CUDA device can ask for: units, id and
/// label types, float storage types, every pair of dtypes a cast converts.
fn routine_specialisations() -> Vec<zeroplan_backend_cuda::routines::Routine> {
    use zeroplan_backend_cuda::routines::Routine;
    use zeroplan_ir::DType;
    let floats = [DType::F32, DType::BF16, DType::F16];
    let ints = [DType::I32, DType::I64];
    let mut all = Vec::new();
    for unit in [1, 2, 4, 8, 16] {
        all.push(Routine::Layout { unit });
        all.push(Routine::Fill { unit });
        all.extend(ints.map(|ids| Routine::Embedding { unit, ids }));
    }
    all.extend(DType::ALL.map(|out| Routine::Arange { out }));
    for x in floats {
        for out in floats {
            all.push(Routine::Scale { x, out });
            all.extend(ints.map(|ids| Routine::EmbeddingGrad { dy: x, ids, out }));
        }
        for labels in ints {
            all.push(Routine::CrossEntropy { logits: x, labels });
            all.extend(floats.map(|out| Routine::CrossEntropyGrad { logits: x, labels, dloss: DType::F32, out }));
        }
        for out in floats {
            all.push(Routine::Mse { p: x, t: out, out: DType::F32 });
            all.push(Routine::MseGrad { p: x, t: x, dloss: DType::F32, out });
            all.push(Routine::SumTo { x, out });
            all.push(Routine::AlibiBias { x, out });
            all.extend(floats.map(|b| Routine::Broadcast { a: x, b, out }));
        }
    }
    for x in DType::ALL {
        all.extend(DType::ALL.map(|out| Routine::Cast { x, out }));
    }
    all.push(Routine::Scalars);
    all
}

#[test]
fn every_routine_specialisation_compiles_for_hopper() {
    let Some(nvrtc) = nvrtc() else { return };
    let arch = DeviceProperties::H100_SXM.arch();
    let mut resources = ResourceCheck::new(SmLimits::SM_90);
    let all = routine_specialisations();
    for routine in &all {
        let r = routine.render().unwrap();
        let ptx = nvrtc.compile_ptx(&r.entries[0], &r.source, &arch).unwrap_or_else(|e| panic!("{routine:?}: {e}"));
        for entry in &r.entries {
            assert!(ptx.contains(&format!(".entry {entry}(")), "{entry} missing from the PTX");
        }
        resources.add(&format!("{routine:?}"), &ptx, &|_| zeroplan_backend_cuda::routines::THREADS, MEMORY_BOUND_FLOOR);
    }
    println!("NVRTC compiled {} routine sources for {arch}", all.len());
    resources.finish();
}
