//! Running CUDA C on the host: g++ against `tests/host/shim.h`, a program
//! that reads its inputs from files in a directory and writes its outputs
//! there (see `tests/host/shim.h` for what the emulation checks).

use std::path::Path;
use std::process::Command;

/// Whether g++ is there (the emulation tests say SKIPPED without it).
pub fn gxx_present() -> bool {
    Command::new("g++").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Compiles `program` (C++ including `shim.h`) in `dir` at g++'s `opt`
/// level (`-O0` for a program of a thousand kernels, where the optimiser
/// costs more than it saves) and runs it with `dir` as its argument; panics
/// with g++'s or the program's errors.
pub fn compile_and_run(dir: &Path, program: &str, opt: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let cpp = dir.join("program.cpp");
    std::fs::write(&cpp, program).unwrap();
    let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/host");
    let exe = dir.join("program");
    let out = Command::new("g++")
        .args(["-std=c++20", opt, "-pthread", "-w", "-I"])
        .arg(&shim)
        .arg(&cpp)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(out.status.success(), "g++ failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).arg(dir).output().unwrap();
    assert!(run.status.success(), "the emulated kernels failed: {}", String::from_utf8_lossy(&run.stderr));
}

/// Closes `program` — C++ defining `run0(dir)` … `run{cases-1}(dir)` —
/// with a `main` that runs each in order, then compiles and runs it
/// ([`compile_and_run`]).
pub fn compile_and_run_cases(dir: &Path, mut program: String, cases: usize, opt: &str) {
    program.push_str("int main(int, char** argv) {\n  const std::string dir = argv[1];\n");
    for i in 0..cases {
        program.push_str(&format!("  run{i}(dir);\n"));
    }
    program.push_str("}\n");
    compile_and_run(dir, &program, opt);
}

/// An `f32` as a C expression with exactly its bits.
pub fn f32_literal(x: f32) -> String {
    format!("__int_as_float(0x{:08x}u)", x.to_bits())
}

/// `values` as little-endian `f32`s.
pub fn f32_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect()
}

/// Little-endian `f32`s back to `f64`s.
pub fn read_f32(path: &Path) -> Vec<f64> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect()
}
