//! When each NVMe-tier slot must be in memory during a step: its *window*,
//! from the first scheduled instruction that touches it to the last.
//!
//! Computed once per program from what each step reads and writes (its
//! operands and outputs, and whatever its instruction touches), so it holds
//! for every device. The runner fetches a slot before its window opens —
//! one slot ahead, in the order the windows open, so a read overlaps the
//! compute before it (double buffering) — and evicts it after its window
//! closes. Optimizer steps run in the last micro-batch only; a slot a
//! micro-batch step touches (an offloaded parameter shard that every
//! micro-batch gathers) stays resident from its first micro-batch to its
//! last, rather than being read again for each.

use crate::buffers::Buf;

/// Each slot's window over one schedule, as per-step lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Windows {
    /// Per step: the slots whose window opens there (they must be resident
    /// before it runs).
    pub opens: Vec<Vec<usize>>,
    /// Per step: the slots whose window closes there (evicted after it).
    pub closes: Vec<Vec<usize>>,
    /// Per step: the slots it writes (so written back when evicted).
    pub writes: Vec<Vec<usize>>,
    /// Per slot: the slot whose window opens next, fetched ahead when this
    /// one's opens.
    pub next: Vec<Option<usize>>,
    /// The slot whose window opens first: fetched when a step starts.
    pub first: Option<usize>,
    /// Per slot: whether a micro-batch (not optimizer) step touches it, so
    /// its window spans the micro-batches.
    pub micro_batch: Vec<bool>,
}

/// What one scheduled step touches.
#[derive(Clone, Debug, Default)]
pub struct Touches {
    /// Buffers it reads.
    pub reads: Vec<Buf>,
    /// Buffers it writes.
    pub writes: Vec<Buf>,
    /// Runs in the optimizer phase (the last micro-batch only).
    pub optimizer: bool,
}

/// The windows of `slots` over `steps`. A slot no step touches has none
/// (it stays in the file).
pub fn windows(slots: &[Buf], steps: &[Touches]) -> Windows {
    let n = slots.len();
    let mut first = vec![None; n];
    let mut last = vec![None; n];
    let mut w = Windows {
        opens: vec![Vec::new(); steps.len()],
        closes: vec![Vec::new(); steps.len()],
        writes: vec![Vec::new(); steps.len()],
        next: vec![None; n],
        first: None,
        micro_batch: vec![false; n],
    };
    for (at, step) in steps.iter().enumerate() {
        for (s, slot) in slots.iter().enumerate() {
            let written = step.writes.iter().any(|b| b.overlaps(slot));
            if !written && !step.reads.iter().any(|b| b.overlaps(slot)) {
                continue;
            }
            first[s].get_or_insert(at);
            last[s] = Some(at);
            w.micro_batch[s] |= !step.optimizer;
            if written {
                w.writes[at].push(s);
            }
        }
    }
    let mut by_opening: Vec<(usize, usize)> = (0..n).filter_map(|s| first[s].map(|at| (at, s))).collect();
    by_opening.sort();
    for pair in by_opening.windows(2) {
        w.next[pair[0].1] = Some(pair[1].1);
    }
    w.first = by_opening.first().map(|&(_, s)| s);
    for s in 0..n {
        if let (Some(a), Some(b)) = (first[s], last[s]) {
            w.opens[a].push(s);
            w.closes[b].push(s);
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use zeroplan_ir::{DType, Place};

    use super::*;

    fn host(offset: usize, len: usize) -> Buf {
        Buf { place: Place::Host, offset, len, dtype: DType::F32 }
    }

    fn step(reads: &[Buf], writes: &[Buf], optimizer: bool) -> Touches {
        Touches { reads: reads.to_vec(), writes: writes.to_vec(), optimizer }
    }

    /// Three ZeRO-3 offload buckets: a parameter shard gathered in the
    /// forward and backward, and a master and moments the optimizer updates
    /// bucket after bucket.
    #[test]
    fn windows_open_at_first_use_close_at_last_and_prefetch_in_order() {
        let (shard, master, m) = (host(0, 64), host(256, 64), host(512, 64));
        let device = Buf { place: Place::Device, offset: 0, len: 1 << 20, dtype: DType::F32 };
        let view = host(16 * 4, 16); // a view inside the shard
        let steps = vec![
            step(&[device], &[device], false),      // 0: touches no slot
            step(&[view], &[device], false),        // 1: gather (reads the shard through a view)
            step(&[device], &[device], false),      // 2
            step(&[shard], &[device], false),       // 3: gather again in the backward
            step(&[master, m], &[master, m], true), // 4: AdamW, bucket's master and moment
            step(&[master], &[shard], true),        // 5: the new shard from the master
        ];
        let w = windows(&[shard, master, m], &steps);
        assert_eq!(w.opens, vec![vec![], vec![0], vec![], vec![], vec![1, 2], vec![]]);
        assert_eq!(w.closes, vec![vec![], vec![], vec![], vec![], vec![2], vec![0, 1]]);
        assert_eq!(w.writes, vec![vec![], vec![], vec![], vec![], vec![1, 2], vec![0]]);
        assert_eq!(w.first, Some(0));
        assert_eq!(w.next, vec![Some(1), Some(2), None]);
        assert_eq!(w.micro_batch, vec![true, false, false]);
    }

    #[test]
    fn an_untouched_slot_has_no_window_and_a_device_buffer_at_the_same_offset_is_not_a_use() {
        let slot = host(0, 64);
        let same_offset_on_device = Buf { place: Place::Device, ..slot };
        let w = windows(&[slot], &[step(&[same_offset_on_device], &[same_offset_on_device], false)]);
        assert_eq!(
            w,
            Windows {
                opens: vec![vec![]],
                closes: vec![vec![]],
                writes: vec![vec![]],
                next: vec![None],
                first: None,
                micro_batch: vec![false]
            }
        );
    }
}
