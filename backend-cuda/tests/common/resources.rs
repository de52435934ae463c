//! The kernel resource check: PTX the tests compiled, assembled by ptxas for
//! a real architecture, each entry's registers, spills, shared memory and
//! theoretical occupancy recorded; a spill or an occupancy under its floor
//! fails, and the table is printed (`--nocapture`).

use std::collections::BTreeMap;

use zeroplan_backend_cuda::ptxas::{Occupancy, Ptxas, Resources, SmLimits, occupancy};

use super::root;

/// The least occupancy a memory-bound kernel (the generated kernels, AdamW)
/// may have. By Little's law an H100 keeps its 3.35 TB/s busy only with
/// ~3.35 TB/s × ~0.6 µs ≈ 2 MB of loads in flight, ~15 KiB per SM: at one
/// 16-byte vector load per thread, ~1,000 threads, half of the 2,048 an SM
/// holds.
pub const MEMORY_BOUND_FLOOR: f64 = 0.5;
/// The least for fused attention, which is bound by its arithmetic on
/// shared-memory tiles (each K/V tile serves 16 query rows): a quarter of
/// the warp slots, so each of an SM's 4 schedulers has 4 warps to switch
/// between while one waits.
pub const ATTENTION_FLOOR: f64 = 0.25;

/// Findings ptxas reports today that are not fixed yet, each `(arch, a part
/// of the entry's name, what)`: listed so the check fails on anything new, and on a
/// listed finding that went away (then delete its line). Open work under
/// the GPU-readiness issue.
const KNOWN: &[(&str, &str, &str)] = &[
    // Head dim 32: ptxas on sm_90 spills 4–36 bytes per thread at 56–80
    // registers, far under the 255 the launch bounds allow; unrolling the
    // dot products whole moves the spills to other specialisations.
    ("sm_90", "zp_flash_attention_fwd_d32_", "spills"),
    ("sm_90", "zp_flash_attention_bwd_dq_d32_", "spills"),
    ("sm_90", "zp_flash_attention_bwd_dkdv_d32_", "spills"),
    // Head dim 64 backward: 42–44 KiB of static shared memory a block, 3
    // blocks in the A100's 164 KiB: 19% of the warp slots.
    ("sm_80", "zp_flash_attention_bwd_dq_d64_", "occupancy"),
    ("sm_80", "zp_flash_attention_bwd_dkdv_d64_", "occupancy"),
    // Tensor-core backward at head dim 128: two 64-row operands of 136
    // bf16/f16 a row and two 16-row tiles, 43–44 KiB a block, 3 blocks in
    // the A100's 164 KiB: 19% (25% on sm_90). Fewer own rows a block would
    // need warps sharing an m16 tile's rows.
    ("sm_80", "zp_flash_attention_mma_bwd_dq_d128_", "occupancy"),
    ("sm_80", "zp_flash_attention_mma_bwd_dkdv_d128_", "occupancy"),
    // LayerNorm backward at BERT-base's width (768: 96 threads of 8-wide
    // vectors a row): 60–72 registers, 42–47% of the warp slots.
    ("sm_90", "_norm_back0_fused", "occupancy"),
];

struct Row {
    family: String,
    entry: String,
    threads: u32,
    resources: Resources,
    occupancy: Occupancy,
}

/// Rows gathered for one architecture, and what failed.
pub struct ResourceCheck {
    ptxas: Option<Ptxas>,
    sm: SmLimits,
    rows: Vec<Row>,
    failures: Vec<String>,
    /// Indices into [`KNOWN`] that matched a finding.
    seen: std::collections::BTreeSet<usize>,
}

impl ResourceCheck {
    /// A check for `sm`; without ptxas (`scripts/fetch-nvrtc.sh`, or
    /// `ZEROPLAN_PTXAS`) it says SKIPPED once and checks nothing.
    pub fn new(sm: SmLimits) -> ResourceCheck {
        let ptxas = Ptxas::find(&root().join("fixtures/nvrtc"));
        match &ptxas {
            Some(p) => println!("ptxas: {}", p.version().unwrap_or_else(|e| panic!("{e}"))),
            None => eprintln!("SKIPPED (resources): no ptxas: run scripts/fetch-nvrtc.sh or set ZEROPLAN_PTXAS"),
        }
        ResourceCheck { ptxas, sm, rows: Vec::new(), failures: Vec::new(), seen: Default::default() }
    }

    /// Assembles `ptx` and records each entry, launched with
    /// `threads_of(entry)` threads per block and no dynamic shared memory.
    pub fn add(&mut self, family: &str, ptx: &str, threads_of: &dyn Fn(&str) -> u32, floor: f64) {
        let found = self.assemble(family, ptx);
        self.record(family, found, threads_of, floor);
    }

    /// What ptxas allocates to each entry of `ptx` (none without ptxas):
    /// the slow half of [`ResourceCheck::add`], callable from many threads.
    pub fn assemble(&self, family: &str, ptx: &str) -> Vec<Resources> {
        let Some(ptxas) = &self.ptxas else { return Vec::new() };
        let found = ptxas.resources(ptx, self.sm.arch).unwrap_or_else(|e| panic!("{family}: {e}"));
        assert!(!found.is_empty(), "{family}: ptxas reported no entry");
        found
    }

    /// Records entries [`ResourceCheck::assemble`] returned, as `add` does.
    pub fn record(&mut self, family: &str, found: Vec<Resources>, threads_of: &dyn Fn(&str) -> u32, floor: f64) {
        for r in found {
            let threads = threads_of(&r.entry);
            let o = occupancy(&r, threads, 0, &self.sm);
            let arch = self.sm.arch;
            if (r.spill_stores > 0 || r.spill_loads > 0) && !self.known(&r.entry, "spills") {
                self.failures.push(format!(
                    "{arch} {family} ({}): spills {} B stored, {} B loaded",
                    r.entry, r.spill_stores, r.spill_loads
                ));
            }
            if o.fraction < floor && !self.known(&r.entry, "occupancy") {
                self.failures.push(format!(
                    "{arch} {family} ({}): occupancy {:.0}% under {:.0}% ({} registers × {threads} threads, {} B \
                     shared; limited by {})",
                    r.entry,
                    100.0 * o.fraction,
                    100.0 * floor,
                    r.registers,
                    r.shared_bytes,
                    o.limiter
                ));
            }
            self.rows.push(Row {
                family: family.to_string(),
                entry: r.entry.clone(),
                threads,
                resources: r,
                occupancy: o,
            });
        }
    }

    /// Whether `entry`'s finding `what` is listed in [`KNOWN`] (and marks it seen).
    fn known(&mut self, entry: &str, what: &str) -> bool {
        let arch = self.sm.arch;
        let at = KNOWN.iter().position(|&(a, part, w)| a == arch && entry.contains(part) && w == what);
        if let Some(i) = at {
            self.seen.insert(i);
        }
        at.is_some()
    }

    /// Prints the table (per family, the entry with the most registers)
    /// and fails on any spill or occupancy under its floor.
    pub fn finish(self) {
        if self.ptxas.is_none() {
            return;
        }
        let mut worst: BTreeMap<&str, &Row> = BTreeMap::new();
        for row in &self.rows {
            let slot = worst.entry(&row.family).or_insert(row);
            if row.resources.registers > slot.resources.registers {
                *slot = row;
            }
        }
        println!(
            "\n{}: {} entries assembled; per kernel family, the entry with the most registers:",
            self.sm.arch,
            self.rows.len()
        );
        println!(
            "| kernel | entry | threads | registers | spills (st/ld B) | smem B | blocks/SM | occupancy | limited by |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for row in worst.values() {
            let (r, o) = (&row.resources, &row.occupancy);
            println!(
                "| {} | `{}` | {} | {} | {}/{} | {} | {} | {:.0}% | {} |",
                row.family,
                row.entry,
                row.threads,
                r.registers,
                r.spill_stores,
                r.spill_loads,
                r.shared_bytes,
                o.blocks,
                100.0 * o.fraction,
                o.limiter
            );
        }
        let mut failures = self.failures;
        for (i, (arch, part, what)) in KNOWN.iter().enumerate() {
            let checked = *arch == self.sm.arch && self.rows.iter().any(|r| r.entry.contains(part));
            if checked && !self.seen.contains(&i) {
                failures.push(format!("{arch} *{part}*: the known {what} finding is gone: delete it from KNOWN"));
            }
        }
        assert!(failures.is_empty(), "{} kernel resource failures:\n{}", failures.len(), failures.join("\n"));
    }
}
