//! ZeRO-Infinity's NVMe tier (Rajbhandari et al., 2021): a rank's
//! host-placed persistent states — fp32 masters, AdamW's moments,
//! offloaded 16-bit parameter shards — kept in a file on a fast drive and
//! brought into memory only around their uses, so host memory holds a
//! window of them rather than all.
//!
//! Which buffers go there is the runtime's choice at load (`train
//! --nvme-dir DIR`), not the plan's: every host-placed param and state
//! ([`persistent_host_buffers`]). The device keeps their bytes in the
//! tier's slots ([`Tier`]); the runner moves slots in and out along their
//! [`schedule::windows`].

pub mod file;
pub mod schedule;
mod tier;

use std::collections::HashMap;
use std::path::PathBuf;

use zeroplan_ir::{Graph, Op, Place, Value};

pub use file::{BLOCK, Io, StateFile, Transfer};
pub use schedule::{Touches, Windows, windows};
pub use tier::{Slot, Tier};

use crate::buffers::{Buf, Rank};

/// Where a run keeps its NVMe tier: `train --nvme-dir DIR`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nvme {
    /// The directory of the state files, one per rank (on the drive).
    pub dir: PathBuf,
}

impl Nvme {
    /// The state file of `rank` of this process: the process id keeps two
    /// runs sharing a directory apart.
    pub fn file_name(&self, rank: Rank) -> String {
        format!("zeroplan-{}-rank-{:05}-tp-{:03}.states", std::process::id(), rank.index, rank.tensor)
    }
}

/// The buffers of the params and states the plan placed on the host
/// (views excluded: they lie inside what they view).
pub fn persistent_host_buffers(g: &Graph, bufs: &HashMap<Value, Buf>) -> Vec<Buf> {
    let mut out: Vec<Buf> = g
        .node_indices()
        .filter(|&n| matches!(g.node(n).op, Op::Param { .. } | Op::State { .. }))
        .filter_map(|n| bufs.get(&Value { node: n, output: 0 }).copied())
        .filter(|b| b.place == Place::Host)
        .collect();
    out.sort_by_key(|b| b.offset);
    out.dedup();
    out
}

#[cfg(test)]
mod tests;
