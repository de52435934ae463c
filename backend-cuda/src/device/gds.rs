//! GPUDirect Storage (cuFile): whether this machine has it, for the NVMe
//! tier's log line.
//!
//! GDS moves bytes between a file and GPU memory without a host bounce
//! buffer. The tier does not use it, present or not: the states it keeps —
//! fp32 masters, AdamW's moments, offloaded parameter shards — are the
//! host-placed ones, read and written by host routines (the host AdamW, the
//! casts into 16-bit shards), so their bytes must be in host memory anyway,
//! and a file→GPU read would skip the one reader that needs them. The path
//! that runs is file → the tier's host slot → pinned staging → GPU
//! ([`super::tier`]). The probe says which machine a log came from, and is
//! where a GDS path for states consumed only on the GPU would start.
//!
//! cudarc's `cufile` loads `libcufile.so` at run time (the workspace's
//! `dynamic-loading`), so the build needs no cuFile; the probe only asks
//! whether the library loads: opening the cuFile driver
//! (`cuFileDriverOpen`) reads `/etc/cufile.json` and starts threads, for
//! nothing this process would use.

use std::sync::OnceLock;

/// What the probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gds {
    /// `libcufile` loads.
    Present,
    /// No `libcufile` on the library path.
    Absent,
}

impl Gds {
    /// Whether `libcufile` loads, asking once per process.
    pub fn probe() -> Gds {
        static FOUND: OnceLock<Gds> = OnceLock::new();
        // SAFETY: loading the library runs its initialisers, as any use would.
        FOUND.get_or_init(|| Gds::from_presence(unsafe { cudarc::cufile::sys::is_culib_present() })).clone()
    }

    fn from_presence(present: bool) -> Gds {
        if present { Gds::Present } else { Gds::Absent }
    }

    /// The tier's log line.
    pub fn describe(&self) -> &'static str {
        match self {
            Gds::Absent => "GPUDirect Storage: absent (no libcufile), reading through pinned host memory",
            Gds::Present => {
                "GPUDirect Storage: libcufile present, not used: the tier's states are read and written by host \
                 routines, so they go through host memory, and to the GPU through pinned staging buffers"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_libcufile_the_tier_reads_through_pinned_host_memory() {
        let absent = Gds::from_presence(false);
        assert_eq!(absent, Gds::Absent);
        assert!(absent.describe().contains("absent"), "{}", absent.describe());
        assert!(absent.describe().contains("pinned host memory"), "{}", absent.describe());
        let present = Gds::from_presence(true);
        assert_eq!(present, Gds::Present);
        assert!(present.describe().contains("not used"), "{}", present.describe());
    }

    #[test]
    fn the_probe_answers_without_a_gpu() {
        // This machine's answer, either way: loading (or not finding)
        // libcufile must neither panic nor need a driver.
        let found = Gds::probe();
        assert_eq!(Gds::probe(), found, "asked once per process");
        eprintln!("{}", found.describe());
    }
}
