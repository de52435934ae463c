//! What a kernel costs the multiprocessor it runs on, known without a GPU.
//!
//! NVRTC stops at PTX, a virtual ISA: registers are unlimited there and the
//! real allocation happens when the driver (or `ptxas`) assembles it for one
//! architecture. `ptxas -v` reports that allocation — registers per thread,
//! bytes spilled to local memory, static shared memory — and with a launch
//! shape those decide how many blocks one SM holds at once, the theoretical
//! occupancy (the CUDA Occupancy Calculator's arithmetic). ptxas is a host
//! program on PyPI (`nvidia-cuda-nvcc`, fetched by `scripts/fetch-nvrtc.sh`),
//! so CI checks every generated kernel for spills and starved SMs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `ptxas`, the PTX assembler of the CUDA toolkit.
#[derive(Clone, Debug)]
pub struct Ptxas {
    path: PathBuf,
}

/// Why ptxas gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum PtxasError {
    /// ptxas could not be started.
    #[error("could not run {path}: {source}")]
    Spawn {
        /// The program.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// ptxas refused the PTX.
    #[error("ptxas {arch} failed: {log}")]
    Assemble {
        /// The target (`sm_90`).
        arch: String,
        /// Its messages.
        log: String,
    },
}

/// One entry point's allocation, as `ptxas -v` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// The kernel's symbol.
    pub entry: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes per thread stored to local memory because registers ran out.
    pub spill_stores: u32,
    /// Bytes per thread loaded back from those spills.
    pub spill_loads: u32,
    /// Per-thread stack frame (local arrays, spills), bytes.
    pub stack_bytes: u32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u32,
}

impl Ptxas {
    /// ptxas from `ZEROPLAN_PTXAS`, else `bin/ptxas` under `nvrtc_dir` (the
    /// fixture `scripts/fetch-nvrtc.sh` fills), else the first on `PATH`.
    pub fn find(nvrtc_dir: &Path) -> Option<Ptxas> {
        if let Some(path) = std::env::var_os("ZEROPLAN_PTXAS") {
            return Some(Ptxas { path: path.into() });
        }
        let beside = nvrtc_dir.join("bin/ptxas");
        if beside.is_file() {
            return Some(Ptxas { path: beside });
        }
        let on_path = std::env::var_os("PATH")?;
        std::env::split_paths(&on_path).map(|d| d.join("ptxas")).find(|p| p.is_file()).map(|path| Ptxas { path })
    }

    /// ptxas's version line (`Cuda compilation tools, release 13.0, V13.0.88`).
    pub fn version(&self) -> Result<String, PtxasError> {
        let out = Command::new(&self.path)
            .arg("--version")
            .output()
            .map_err(|source| PtxasError::Spawn { path: self.path.clone(), source })?;
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.lines().find(|l| l.contains("release")).unwrap_or("unknown").trim().to_string())
    }

    /// Assembles `ptx` for `arch` (`sm_90`) and returns every entry's
    /// allocation, in the order ptxas reports them.
    pub fn resources(&self, ptx: &str, arch: &str) -> Result<Vec<Resources>, PtxasError> {
        let spawn = |source| PtxasError::Spawn { path: self.path.clone(), source };
        let mut child = Command::new(&self.path)
            .args(["-v", &format!("-arch={arch}"), "-o", "/dev/null", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn)?;
        child.stdin.take().expect("piped").write_all(ptx.as_bytes()).map_err(spawn)?;
        let out = child.wait_with_output().map_err(spawn)?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(PtxasError::Assemble { arch: arch.to_string(), log });
        }
        Ok(parse(&log))
    }
}

/// The entries of a `ptxas -v` log. Each function's report is a
/// `Compiling entry function 'NAME'` line, a `Function properties for NAME`
/// block (`N bytes stack frame, N bytes spill stores, N bytes spill loads`),
/// and a `Used N registers, …, N bytes smem, …` line.
pub fn parse(log: &str) -> Vec<Resources> {
    let mut found: Vec<Resources> = Vec::new();
    for line in log.lines() {
        let line = line.trim_start_matches("ptxas info    :").trim();
        if let Some(name) = quoted_after(line, "Compiling entry function ") {
            found.push(Resources { entry: name, ..Resources::default() });
            continue;
        }
        let Some(current) = found.last_mut() else { continue };
        if line.contains("stack frame") {
            current.stack_bytes = number_before(line, "bytes stack frame");
            current.spill_stores = number_before(line, "bytes spill stores");
            current.spill_loads = number_before(line, "bytes spill loads");
        } else if line.starts_with("Used ") {
            current.registers = number_before(line, "registers");
            current.shared_bytes = number_before(line, "bytes smem");
        }
    }
    found
}

fn quoted_after(line: &str, prefix: &str) -> Option<String> {
    let rest = line.strip_prefix(prefix)?.trim_start_matches('\'');
    Some(rest.split('\'').next()?.to_string())
}

/// The integer just before `unit` in `line` (0 when absent).
fn number_before(line: &str, unit: &str) -> u32 {
    line.find(unit).and_then(|at| line[..at].split([' ', ',']).rev().find(|w| !w.is_empty())?.parse().ok()).unwrap_or(0)
}

/// What one SM of an architecture can hold at once: the CUDA C++
/// Programming Guide's "Technical Specifications per Compute Capability"
/// table, and the allocation granularities of NVIDIA's Occupancy
/// Calculator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmLimits {
    /// The architecture ptxas is given (`sm_90`).
    pub arch: &'static str,
    /// 32-bit registers per SM.
    pub registers: u32,
    /// Registers are handed to warps in units of this many.
    pub register_unit: u32,
    /// Resident threads per SM.
    pub threads: u32,
    /// Resident blocks per SM.
    pub blocks: u32,
    /// Shared memory an SM can give its blocks (the largest carveout), bytes.
    pub shared_bytes: u32,
    /// Shared memory the system takes per block (1 KiB since sm_80), bytes.
    pub shared_reserved_per_block: u32,
    /// Shared memory is handed out in units of this many bytes.
    pub shared_unit: u32,
}

impl SmLimits {
    /// Hopper (H100, H200): 64 K registers, 2,048 threads, 32 blocks and
    /// 228 KiB of shared memory per SM.
    pub const SM_90: SmLimits = SmLimits {
        arch: "sm_90",
        registers: 65536,
        register_unit: 256,
        threads: 2048,
        blocks: 32,
        shared_bytes: 228 << 10,
        shared_reserved_per_block: 1 << 10,
        shared_unit: 128,
    };

    /// Ampere A100: as Hopper with 164 KiB of shared memory per SM.
    pub const SM_80: SmLimits = SmLimits { arch: "sm_80", shared_bytes: 164 << 10, ..SmLimits::SM_90 };
}

/// Blocks one SM holds of a kernel, and what stops it holding more.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Occupancy {
    /// Resident blocks per SM.
    pub blocks: u32,
    /// Resident warps over the most an SM can hold (0 to 1).
    pub fraction: f64,
    /// `registers`, `shared memory`, `threads` or `blocks`.
    pub limiter: &'static str,
}

/// The theoretical occupancy of `r` launched with `threads_per_block`
/// threads and `dynamic_shared` bytes of dynamic shared memory.
pub fn occupancy(r: &Resources, threads_per_block: u32, dynamic_shared: u32, sm: &SmLimits) -> Occupancy {
    let warps = threads_per_block.div_ceil(32).max(1);
    let max_warps = sm.threads / 32;
    let registers_per_warp = (r.registers.max(1) * 32).div_ceil(sm.register_unit) * sm.register_unit;
    let shared =
        (r.shared_bytes + dynamic_shared + sm.shared_reserved_per_block).div_ceil(sm.shared_unit) * sm.shared_unit;
    let limits = [
        ("registers", sm.registers / registers_per_warp / warps),
        ("shared memory", sm.shared_bytes / shared),
        ("threads", max_warps / warps),
        ("blocks", sm.blocks),
    ];
    let (limiter, blocks) = limits.into_iter().min_by_key(|&(_, b)| b).expect("four limits");
    Occupancy { blocks, fraction: f64::from(blocks * warps) / f64::from(max_warps), limiter }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_fused_0' for 'sm_90'
ptxas info    : Function properties for k_fused_0
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'k_finish' for 'sm_90'
ptxas info    : Function properties for k_finish
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 0 barriers, 380 bytes cmem[0]
";

    #[test]
    fn parses_every_entry_of_a_verbose_log() {
        let r = parse(LOG);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            Resources {
                entry: "k_fused_0".into(),
                registers: 40,
                spill_stores: 4,
                spill_loads: 12,
                stack_bytes: 8,
                shared_bytes: 128
            }
        );
        assert_eq!((r[1].entry.as_str(), r[1].registers, r[1].shared_bytes), ("k_finish", 16, 0));
    }

    /// Cases worked by hand with the Occupancy Calculator's rules.
    #[test]
    fn occupancy_follows_the_calculator() {
        let at = |registers, shared_bytes| Resources { registers, shared_bytes, ..Resources::default() };
        // 32 registers × 256 threads: 8 K registers a block, 8 blocks by
        // registers and by threads: every warp slot full.
        let full = occupancy(&at(32, 0), 256, 0, &SmLimits::SM_90);
        assert_eq!((full.blocks, full.fraction), (8, 1.0));
        // 128 registers: 4 K per warp, 16 warps an SM: a quarter.
        let heavy = occupancy(&at(128, 0), 128, 0, &SmLimits::SM_90);
        assert_eq!((heavy.blocks, heavy.fraction, heavy.limiter), (4, 0.25, "registers"));
        // 40 KiB static + 1 KiB reserved per block: 5 blocks in 228 KiB,
        // 4 in the A100's 164 KiB.
        let shared = occupancy(&at(32, 40 << 10), 128, 0, &SmLimits::SM_90);
        assert_eq!((shared.blocks, shared.limiter), (5, "shared memory"));
        assert_eq!(occupancy(&at(32, 40 << 10), 128, 0, &SmLimits::SM_80).blocks, 4);
        // 33 registers round up to 40 per thread (256-register units per warp).
        assert_eq!(occupancy(&at(33, 0), 1024, 0, &SmLimits::SM_90).blocks, 1);
        // Tiny blocks: the 32-block cap.
        assert_eq!(occupancy(&at(16, 0), 32, 0, &SmLimits::SM_90).limiter, "blocks");
    }
}
