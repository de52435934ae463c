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
/// shared-memory tiles (each staged tile serves a block's 16 or 64 rows): a
/// quarter of the warp slots, so each of an SM's 4 schedulers has 4 warps to
/// switch between while one waits.
pub const ATTENTION_FLOOR: f64 = 0.25;

/// Blocks one SM holds of an entry whose launch, not its resources, sets
/// that at every shape: a generated kernel with cross-row outputs (one
/// `double` partial per output element and block, added up by its
/// `_finish` kernel) has its grid capped at `CROSS_ROW_BLOCKS_PER_SM` (2)
/// blocks per multiprocessor, `LaunchConfig::grid` over the device's SMs.
/// Such an entry is held to a floor only where its registers or shared
/// memory allow fewer blocks than its grid gives an SM: above that, fewer
/// registers would not put another block on the SM. Its occupancy in the
/// table is the grid's (`limited by: grid`).
pub type GridBlocks<'a> = &'a dyn Fn(&str) -> Option<u32>;

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
        ResourceCheck { ptxas, sm, rows: Vec::new(), failures: Vec::new() }
    }

    /// Assembles `ptx` and records each entry, launched with
    /// `threads_of(entry)` threads per block and no dynamic shared memory.
    pub fn add(&mut self, family: &str, ptx: &str, threads_of: &dyn Fn(&str) -> u32, floor: f64) {
        let found = self.assemble(family, ptx);
        self.record(family, found, threads_of, &|_| None, floor);
    }

    /// What ptxas allocates to each entry of `ptx` (none without ptxas):
    /// the slow half of [`ResourceCheck::add`], callable from many threads.
    pub fn assemble(&self, family: &str, ptx: &str) -> Vec<Resources> {
        let Some(ptxas) = &self.ptxas else { return Vec::new() };
        let found = ptxas.resources(ptx, self.sm.arch).unwrap_or_else(|e| panic!("{family}: {e}"));
        assert!(!found.is_empty(), "{family}: ptxas reported no entry");
        found
    }

    /// Records entries [`ResourceCheck::assemble`] returned, as `add` does;
    /// `grid_blocks(entry)`: the blocks its launch gives an SM where that is
    /// fixed ([`GridBlocks`]).
    pub fn record(
        &mut self,
        family: &str,
        found: Vec<Resources>,
        threads_of: &dyn Fn(&str) -> u32,
        grid_blocks: GridBlocks,
        floor: f64,
    ) {
        for r in found {
            let threads = threads_of(&r.entry);
            let mut o = occupancy(&r, threads, 0, &self.sm);
            if let Some(blocks) = grid_blocks(&r.entry).filter(|&b| b <= o.blocks) {
                let fraction = f64::from(blocks * threads.div_ceil(32)) / f64::from(self.sm.threads / 32);
                o = Occupancy { blocks, fraction, limiter: "grid" };
            }
            let arch = self.sm.arch;
            if r.spill_stores > 0 || r.spill_loads > 0 {
                self.failures.push(format!(
                    "{arch} {family} ({}): spills {} B stored, {} B loaded",
                    r.entry, r.spill_stores, r.spill_loads
                ));
            }
            if o.fraction < floor && o.limiter != "grid" {
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
        let failures = self.failures;
        assert!(failures.is_empty(), "{} kernel resource failures:\n{}", failures.len(), failures.join("\n"));
    }
}
