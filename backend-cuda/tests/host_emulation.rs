//! The generated f32 kernels *run*, without a GPU: each source is compiled
//! as C++ by the host's g++ against `tests/host/shim.h` (threads for a
//! block's threads, barriers for `__syncthreads`, memory for warp
//! shuffles) and its outputs compared with the reference interpreter's, as
//! the GPU tests do. This checks the generated code's logic — indexing,
//! vector steps and tails, sweeps, block reductions, cross-row partials
//! and their finish kernel, Philox dropout, ALiBi — but not NVRTC's code,
//! the hardware's warps, or bf16/f16 storage (f32 kernels only).
//! Without g++ the test says SKIPPED and passes.

mod common;

use std::fmt::Write;
use std::path::Path;
use std::process::Command;

use common::{dims, error, from_bytes, fused_kernels, interpret, random_inputs, tiny_models, to_bytes};
use zeroplan_backend_cuda::{DeviceProperties, GeneratedKernel, generate};
use zeroplan_ir::DType;
use zeroplan_ir::spec::Precision;

const F32_TOLERANCE: f64 = 1e-5;
const SEED: u64 = 0x1234_5678_9ABC_DEF0;
const OFFSET: u64 = 3;

fn c_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::BF16 | DType::F16 => unreachable!("f32 training graphs only"),
    }
}

/// Kernel `i`'s source in its own namespace, and a `run{i}(dir)` that
/// reads its inputs from `dir/{i}.in{k}`, launches it and writes `dir/{i}.out{k}`.
fn harness(i: usize, g: &GeneratedKernel) -> String {
    let mut s = String::new();
    let rename = |name: &str| format!("{name}_k{i}");
    let mut source = g.source.replace(&format!("{}(", g.entry), &format!("{}(", rename(&g.entry)));
    if let Some(f) = &g.finish_entry {
        source = source.replace(&format!("{f}("), &format!("{}(", rename(f)));
    }
    let _ = writeln!(s, "namespace k{i} {{\n{source}\n}}");
    let _ = writeln!(s, "static void run{i}(const std::string& dir) {{");
    let mut args = Vec::new();
    for (k, b) in g.inputs.iter().enumerate() {
        let bytes = b.len * b.dtype.size_bytes() as usize;
        let _ = writeln!(s, "  char* in{k} = zp_read(dir + \"/{i}.in{k}\", {bytes});");
        args.push(format!("(const {}*)in{k}", c_type(b.dtype)));
    }
    for (k, b) in g.outputs.iter().enumerate() {
        let _ = writeln!(s, "  char* out{k} = zp_alloc({});", b.len * 4);
        if !b.cross_row {
            args.push(format!("(float*)out{k}"));
        }
    }
    let _ = writeln!(s, "  char* partials = zp_alloc({});", g.launch.scratch_bytes);
    if g.finish_entry.is_some() {
        args.push("(double*)partials".into());
    }
    // Dropout's words, which the kernel reads from memory.
    let _ = writeln!(s, "  static const unsigned long long rng[2] = {{{SEED}ULL, {OFFSET}ULL}};");
    args.push("rng".into());
    let l = &g.launch;
    let _ = writeln!(
        s,
        "  zp_launch({}, {}, [&] {{ k{i}::{}({}); }});",
        l.grid,
        l.block,
        rename(&g.entry),
        args.join(", ")
    );
    if let (Some(f), Some((grid, block))) = (&g.finish_entry, l.finish) {
        let outs: Vec<String> =
            g.outputs.iter().enumerate().filter(|(_, b)| b.cross_row).map(|(k, _)| format!("(float*)out{k}")).collect();
        let _ = writeln!(
            s,
            "  zp_launch({grid}, {block}, [&] {{ k{i}::{}((const double*)partials, {}); }});",
            rename(f),
            outs.join(", ")
        );
    }
    for (k, b) in g.outputs.iter().enumerate() {
        let _ = writeln!(s, "  zp_write(dir + \"/{i}.out{k}\", out{k}, {});", b.len * 4);
    }
    let _ = writeln!(s, "}}");
    s
}

fn compiler_present() -> bool {
    Command::new("g++").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Runs every distinct f32 kernel of every tiny model at `batch × seq` on
/// `device` through g++.
fn check_models(batch: u64, seq: u64, device: &DeviceProperties, dir: &Path) -> usize {
    std::fs::create_dir_all(dir).unwrap();
    let mut program = String::from("#include \"shim.h\"\n");
    let mut cases = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for model in tiny_models() {
        for kernel in fused_kernels(&model, Precision::F32) {
            let d = dims(&kernel, batch, seq);
            let g = generate(&kernel, &d, device).unwrap();
            if !seen.insert(g.source.clone()) {
                continue;
            }
            let i = cases.len();
            let inputs = random_inputs(&kernel, &d, 7 + i as u64);
            for (k, t) in inputs.iter().enumerate() {
                std::fs::write(dir.join(format!("{i}.in{k}")), to_bytes(t)).unwrap();
            }
            program.push_str(&harness(i, &g));
            cases.push((model.clone(), kernel, inputs));
        }
    }
    common::host::compile_and_run_cases(dir, program, cases.len(), "-O0");
    let mut failures = Vec::new();
    let mut worst = 0.0f64;
    for (i, (model, kernel, inputs)) in cases.iter().enumerate() {
        let want = interpret(kernel, inputs, SEED, OFFSET);
        for (k, w) in want.iter().enumerate() {
            let bytes = std::fs::read(dir.join(format!("{i}.out{k}"))).unwrap();
            let e = error(&from_bytes(&bytes, DType::F32), w.floats().unwrap());
            worst = worst.max(e);
            if e > F32_TOLERANCE {
                failures.push(format!(
                    "{}: {} out{k}: error {e:e}\n{}",
                    model.display(),
                    kernel.name,
                    kernel.to_text()
                ));
            }
        }
    }
    println!("{batch}×{seq}: {} f32 kernels run on the host emulation, worst error {worst:e}", cases.len());
    assert!(failures.is_empty(), "{} kernels differ:\n{}", failures.len(), failures.join("\n"));
    cases.len()
}

/// A fresh directory for one test's programs and tensors.
fn scratch(name: &str) -> Option<std::path::PathBuf> {
    if !compiler_present() {
        eprintln!("SKIPPED: no g++ to compile the emulated kernels");
        return None;
    }
    Some(std::env::temp_dir().join(format!("zeroplan-cuda-emulation-{name}-{}", std::process::id())))
}

// Two tests, so the harness runs the two g++ builds side by side.

#[test]
fn every_f32_kernel_runs_correctly_under_host_emulation() {
    let Some(dir) = scratch("2x5") else { return };
    // seq 5: scalar rows and tails.
    let n = check_models(2, 5, &DeviceProperties::H100_SXM, &dir);
    assert!(n > 50, "only {n} kernels");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_f32_kernel_runs_correctly_on_one_multiprocessor() {
    let Some(dir) = scratch("3x8") else { return };
    // seq 8: whole vectors. One multiprocessor: kernels with cross-row
    // outputs get 2 blocks, so a block sums several rows into its partials.
    let small = DeviceProperties { multiprocessors: 1, ..DeviceProperties::H100_SXM };
    check_models(3, 8, &small, &dir);
    std::fs::remove_dir_all(&dir).unwrap();
}
