//! Static allocation: every buffer gets an offset in one arena per rank.
//!
//! Greedy by size (Pisarchyk & Lee, "Efficient Memory Management for Deep
//! Neural Net Inference", 2020): buffers are placed largest first, each at
//! the lowest offset where it overlaps no already-placed buffer whose
//! lifetime intersects its own. Persistent tensors live throughout, so they
//! pack at the bottom; activations reuse the space above as they die.

use super::liveness::Interval;

/// Offsets are multiples of this (what CUDA allocations guarantee).
pub const ALIGNMENT: u64 = 256;

/// A placed buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Index into the intervals the plan was made from.
    pub interval: usize,
    pub offset: u64,
    pub bytes: u64,
    /// Schedule positions the buffer is held, `[start, end]`: its value's
    /// lifetime extended over the values that reuse it in place.
    pub start: usize,
    pub end: usize,
}

/// The arena: offsets, its size, and how tight it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Arena {
    pub placements: Vec<Placement>,
    /// Bytes the arena needs: the peak.
    pub size: u64,
    /// The most bytes live at any one schedule position: no allocator can do
    /// better than this.
    pub lower_bound: u64,
}

impl Arena {
    /// `size / lower_bound − 1`: the space lost to fragmentation.
    pub fn fragmentation(&self) -> f64 {
        if self.lower_bound == 0 { 0.0 } else { self.size as f64 / self.lower_bound as f64 - 1.0 }
    }
}

fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Places every interval that owns a buffer (aliases take their target's).
pub fn place(intervals: &[Interval]) -> Arena {
    let owners: Vec<usize> =
        (0..intervals.len()).filter(|&i| intervals[i].alias_of.is_none() && intervals[i].bytes > 0).collect();
    // An owner's lifetime extends over the lifetimes of its aliases.
    let mut end: Vec<usize> = intervals.iter().map(|i| i.end).collect();
    let index_of: rustc_hash::FxHashMap<_, usize> = intervals.iter().enumerate().map(|(i, iv)| (iv.value, i)).collect();
    for iv in intervals {
        let mut target = iv.alias_of;
        while let Some(t) = target {
            let owner = index_of[&t];
            end[owner] = end[owner].max(iv.end);
            target = intervals[owner].alias_of;
        }
    }
    let mut order = owners.clone();
    order.sort_by_key(|&i| (std::cmp::Reverse(aligned(intervals[i].bytes)), intervals[i].start, i));
    let mut placed: Vec<Placement> = Vec::with_capacity(order.len());
    // `placed` by (offset, offset + aligned bytes): the first fit walks the
    // blocks live at the same time in address order without sorting them
    // for every buffer (the planner places thousands of programs).
    // Each entry carries its block's lifetime, so the walk reads one array.
    let mut by_address: Vec<(u64, u64, usize, usize)> = Vec::with_capacity(order.len());
    let mut size = 0;
    for i in order {
        let bytes = aligned(intervals[i].bytes);
        let (start, stop) = (intervals[i].start, end[i]);
        let mut offset = 0;
        for &(lo, hi, p_start, p_end) in &by_address {
            if !(p_start <= stop && start <= p_end) {
                continue;
            }
            if offset + bytes <= lo {
                break;
            }
            offset = offset.max(hi);
        }
        size = size.max(offset + bytes);
        let key = (offset, offset + bytes, start, stop);
        by_address.insert(by_address.partition_point(|&k| k < key), key);
        placed.push(Placement { interval: i, offset, bytes: intervals[i].bytes, start, end: stop });
    }
    placed.sort_by_key(|p| p.interval);
    Arena { placements: placed, size, lower_bound: lower_bound(intervals, &end) }
}

/// The most aligned bytes live at once, over the schedule.
fn lower_bound(intervals: &[Interval], end: &[usize]) -> u64 {
    let positions = intervals.iter().map(|i| i.end.max(i.start) + 1).max().unwrap_or(0);
    let mut delta = vec![0i128; positions + 1];
    for (i, iv) in intervals.iter().enumerate() {
        if iv.alias_of.is_none() && iv.bytes > 0 {
            delta[iv.start] += aligned(iv.bytes) as i128;
            delta[end[i] + 1] -= aligned(iv.bytes) as i128;
        }
    }
    let mut live = 0i128;
    let mut most = 0i128;
    for d in delta {
        live += d;
        most = most.max(live);
    }
    most as u64
}
