//! The runner's side of the NVMe tier: attaching it at load, and moving its
//! slots along their windows during a step (`zeroplan_exec::nvme`).
//!
//! Before a step runs, the slots whose window opens there are made
//! resident (usually already read: each slot's read is issued when the
//! previous slot's window opens) and the slots it writes are marked dirty;
//! after it, the slots whose window closes there are written back if dirty
//! and released — once the communication stream is done with them, since
//! a collective may still be reading a parameter shard.

use std::collections::HashMap;

use zeroplan_exec::nvme::{self, Io, Nvme, Tier, Touches, Windows};
use zeroplan_exec::{Buf, Device, Rank, Step};
use zeroplan_ir::{Graph, Value};

use super::RunError;
use super::stream::Access;

/// Moves the host-placed params and states of `g` to a tier in `nvme`'s
/// directory and gives their windows over `steps`; `None` when the plan
/// places none on the host (nothing to move).
pub fn attach<D: Device>(
    device: &mut D,
    nvme: &Nvme,
    rank: Rank,
    g: &Graph,
    bufs: &HashMap<Value, Buf>,
    steps: &[Step<D::Instr>],
    access: &[Access],
) -> Result<Option<Windows>, RunError> {
    let slots = nvme::persistent_host_buffers(g, bufs);
    if slots.is_empty() {
        tracing::warn!(
            "--nvme-dir {}: the plan places no parameter or optimizer state on the host (offload none), so nothing \
             goes to NVMe: offload the optimizer (and parameters) to put them there",
            nvme.dir.display()
        );
        return Ok(None);
    }
    let tier = Tier::open(&nvme.dir, &nvme.file_name(rank), &slots, Io::default()).map_err(RunError::Tier)?;
    let slots: Vec<Buf> = tier.slots().iter().map(|s| s.buf).collect();
    device.attach_tier(tier).map_err(RunError::Tier)?;
    let touches: Vec<Touches> = steps
        .iter()
        .zip(access)
        .map(|(s, a)| Touches { reads: a.reads.clone(), writes: a.writes.clone(), optimizer: s.optimizer })
        .collect();
    Ok(Some(nvme::windows(&slots, &touches)))
}

/// A micro-batch starts: read the first window's slot ahead.
pub fn start(tier: &Tier, w: &Windows) {
    if let Some(s) = w.first {
        tier.fetch(s);
    }
}

/// Before step `at`: its slots resident (the next window's read issued),
/// those it writes marked dirty.
pub fn open(tier: &Tier, w: &Windows, at: usize) -> Result<(), String> {
    for &s in &w.opens[at] {
        tier.ready(s)?;
        if let Some(next) = w.next[s] {
            tier.fetch(next);
        }
    }
    for &s in &w.writes[at] {
        tier.mark_dirty(s);
    }
    Ok(())
}

/// After step `at`: the slots whose window closes there. A slot a
/// micro-batch step touches stays until the last micro-batch.
pub fn closing(w: &Windows, at: usize, last: bool) -> Vec<usize> {
    w.closes[at].iter().copied().filter(|&s| last || !w.micro_batch[s]).collect()
}
