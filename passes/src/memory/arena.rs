//! Static allocation: every buffer gets an offset in one arena per rank.
//!
//! Greedy by size (Pisarchyk & Lee, "Efficient Memory Management for Deep
//! Neural Net Inference", 2020): buffers are placed largest first, each at
//! the lowest offset where it overlaps no already-placed buffer whose
//! lifetime intersects its own. Persistent tensors live throughout, so they
//! pack at the bottom; activations reuse the space above as they die.

use rayon::slice::ParallelSliceMut;
use smallvec::SmallVec;

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
    place_indexed(intervals, intervals.len() > INDEXED_FROM)
}

/// [`place`], finding each first fit through the lifetime index or not:
/// the same placements either way.
fn place_indexed(intervals: &[Interval], indexed: bool) -> Arena {
    let owners: Vec<usize> =
        (0..intervals.len()).filter(|&i| intervals[i].alias_of.is_none() && intervals[i].bytes > 0).collect();
    let end = owned_ends(intervals);
    // Largest first, then earliest, then in the intervals' order: a total
    // order, so an unstable sort gives the one placement. The keys sit
    // beside each other, not behind an index into the intervals (a
    // million-buffer step's comparisons were cache misses); a large
    // arena's are sorted on every core (the winner's device arena is placed
    // after the other candidates' work is done, with the other cores idle).
    let mut order: Vec<(std::cmp::Reverse<u64>, usize, u32)> = owners
        .iter()
        .enumerate()
        .map(|(k, &i)| (std::cmp::Reverse(aligned(intervals[i].bytes)), intervals[i].start, k as u32))
        .collect();
    if indexed {
        order.par_sort_unstable();
    } else {
        order.sort_unstable();
    }
    let mut live = if indexed {
        let positions = owners.iter().map(|&i| end[i] + 1).max().unwrap_or(0);
        Placed::Indexed(Lifetimes::new(&starts(intervals, &owners, positions), positions))
    } else {
        Placed::ByAddress(Vec::with_capacity(order.len()))
    };
    // By owner, so the placements come out in the intervals' order.
    let mut placed: Vec<Placement> =
        owners.iter().map(|&interval| Placement { interval, offset: 0, bytes: 0, start: 0, end: 0 }).collect();
    let mut size = 0;
    for (_, start, k) in order {
        let p = &mut placed[k as usize];
        let (bytes, stop) = (aligned(intervals[p.interval].bytes), end[p.interval]);
        let offset = live.first_fit(start, stop, bytes);
        size = size.max(offset + bytes);
        live.insert(start, stop, (offset, offset + bytes));
        *p = Placement { offset, bytes: intervals[p.interval].bytes, start, end: stop, ..*p };
    }
    Arena { placements: placed, size, lower_bound: lower_bound(intervals, &end) }
}

/// Each interval's last position, an owner's extended over the lifetimes
/// of the values that reuse its buffer. Aliases are found through a table
/// by node index, not a hash map of every value (a million-buffer step's
/// map cost a cache miss per lookup and its own allocation).
fn owned_ends(intervals: &[Interval]) -> Vec<usize> {
    let mut end: Vec<usize> = intervals.iter().map(|i| i.end).collect();
    let index_of = Interval::indices(intervals);
    for iv in intervals {
        let mut target = iv.alias_of;
        while let Some(t) = target {
            let owner = index_of[&t] as usize;
            end[owner] = end[owner].max(iv.end);
            target = intervals[owner].alias_of;
        }
    }
    end
}

/// The distinct positions `owners` start at, ascending, found by marking
/// each of the `positions` rather than by sorting a million starts.
fn starts(intervals: &[Interval], owners: &[usize], positions: usize) -> Vec<usize> {
    let mut starts_here = vec![false; positions];
    for &i in owners {
        starts_here[intervals[i].start] = true;
    }
    starts_here.iter().enumerate().filter_map(|(p, &s)| s.then_some(p)).collect()
}

/// Buffers past which the placed blocks are indexed by lifetime: below,
/// one walk over every block in address order is faster than collecting
/// and sorting the live ones (the search places thousands of programs of
/// a few thousand buffers); above, the walk and the insertions into the
/// address-ordered list are quadratic in buffers (the search's short
/// stacks of the 100T model's tiled layers, 10–30k nodes each, and its
/// exact plan).
const INDEXED_FROM: usize = 4_096;

/// The blocks placed so far, each an address range `[lo, hi)` live over a
/// span of schedule positions.
enum Placed {
    /// Every block by `(lo, hi, start, stop)`: the first fit walks them in
    /// address order, skipping those not live at the same time.
    ByAddress(Vec<(u64, u64, usize, usize)>),
    Indexed(Lifetimes),
}

impl Placed {
    /// The lowest offset where `bytes` overlap no block live during
    /// `[start, stop]`: both forms give the same.
    fn first_fit(&self, start: usize, stop: usize, bytes: u64) -> u64 {
        let mut offset = 0;
        let mut fit = |lo: u64, hi: u64| {
            if offset + bytes <= lo {
                return false;
            }
            offset = offset.max(hi);
            true
        };
        match self {
            Placed::ByAddress(blocks) => {
                for &(lo, hi, _, _) in blocks.iter().filter(|&&(_, _, s, e)| s <= stop && start <= e) {
                    if !fit(lo, hi) {
                        break;
                    }
                }
            }
            Placed::Indexed(index) => {
                let mut live = index.scratch.take();
                index.overlapping(start, stop, &mut live);
                live.sort_unstable();
                for &(lo, hi) in &live {
                    if !fit(lo, hi) {
                        break;
                    }
                }
                index.scratch.set(live);
            }
        }
        offset
    }

    fn insert(&mut self, start: usize, stop: usize, (lo, hi): (u64, u64)) {
        match self {
            Placed::ByAddress(blocks) => {
                let key = (lo, hi, start, stop);
                blocks.insert(blocks.partition_point(|&k| k < key), key);
            }
            Placed::Indexed(index) => index.insert(start, stop, (lo, hi)),
        }
    }
}

/// The placed blocks' address ranges, indexed by lifetime: which blocks
/// are live at some position of `[start, stop]` costs time in the number
/// of ranges their union makes, not in how many blocks were placed. A
/// block live somewhere in `[start, stop]` is either live at `start` (a
/// stabbing query on a segment tree over schedule positions, each block
/// stored at the O(log n) nodes that tile its lifetime) or starts inside
/// `(start, stop]` (a range query on a second tree, each block stored at
/// the O(log n) ancestors of the position it starts at), never both.
///
/// A first fit needs only the union of the address ranges the query
/// meets, so each node keeps its blocks as a union: sorted, disjoint
/// ranges, merged where they touch or overlap. The offloaded states of a
/// ZeRO-3 model — a hundred thousand host blocks, most live from where
/// they start to the end of the step and stacked end to end — are then a
/// handful of ranges per node, where listing every block that starts
/// later made placing them quadratic.
///
/// The trees' leaves are the positions where some block starts, not every
/// position of the schedule: two lifetimes that each start at one of those
/// positions meet exactly when they meet at one of them, so a lifetime
/// `[start, stop]` is stored as running from its start's leaf to the leaf
/// of the last start at or before `stop`. A million-node step starts its
/// buffers at a fraction of its positions, and each leaf costs four tree
/// nodes of ranges.
struct Lifetimes {
    /// The trees' leaves are the positions blocks start at, ascending; at
    /// each schedule position, the leaf of the last start at or before it
    /// (the first leaf for a position before every start). A table rather
    /// than a binary search over the starts: there are four lookups a
    /// buffer, and over a million-buffer step's starts each search is a
    /// chain of cache misses (`perf`: a sixth of placing it).
    leaf_at: Vec<u32>,
    /// Bottom-up segment tree: node `leaves + l` is leaf `l`. Each
    /// node holds the union of the blocks live over all of its leaves.
    covering: Vec<Ranges>,
    /// The same shape of tree: each node holds the union of the blocks
    /// that start at one of its leaves.
    starting: Vec<Ranges>,
    /// The list [`Lifetimes::overlapping`] fills, kept between first fits:
    /// a step's 300k buffers would otherwise grow one from empty each.
    scratch: std::cell::Cell<Vec<(u64, u64)>>,
}

impl Lifetimes {
    /// An empty index over blocks that start at `starts` (ascending,
    /// distinct) and end before `positions`.
    fn new(starts: &[usize], positions: usize) -> Lifetimes {
        let leaves = starts.len();
        let mut leaf_at = Vec::with_capacity(positions);
        let mut leaf = 0;
        for position in 0..positions {
            while leaf + 1 < leaves && starts[leaf + 1] <= position {
                leaf += 1;
            }
            leaf_at.push(leaf as u32);
        }
        Lifetimes {
            leaf_at,
            covering: vec![Ranges::new(); 2 * leaves],
            starting: vec![Ranges::new(); 2 * leaves],
            scratch: Default::default(),
        }
    }

    fn leaf(&self, position: usize) -> usize {
        self.leaf_at[position] as usize
    }

    /// The trees' leaf count: each tree holds `2 * leaves` nodes.
    fn leaves(&self) -> usize {
        self.covering.len() / 2
    }

    /// Adds the block `range` live over `[start, stop]`, where `start` is
    /// one of the index's starts.
    fn insert(&mut self, start: usize, stop: usize, range: (u64, u64)) {
        let leaves = self.leaves();
        let (start, stop) = (self.leaf(start), self.leaf(stop));
        let (mut lo, mut hi) = (start + leaves, stop + 1 + leaves);
        while lo < hi {
            if lo & 1 == 1 {
                coalesce(&mut self.covering[lo], range);
                lo += 1;
            }
            if hi & 1 == 1 {
                hi -= 1;
                coalesce(&mut self.covering[hi], range);
            }
            lo /= 2;
            hi /= 2;
        }
        let mut node = start + leaves;
        while node > 0 {
            coalesce(&mut self.starting[node], range);
            node /= 2;
        }
    }

    /// The blocks live at some position of `[start, stop]`, in `out`
    /// (emptied first), where `start` is one of the index's starts.
    fn overlapping(&self, start: usize, stop: usize, out: &mut Vec<(u64, u64)>) {
        out.clear();
        let leaves = self.leaves();
        let (start, stop) = (self.leaf(start), self.leaf(stop));
        let mut node = start + leaves;
        while node > 0 {
            out.extend_from_slice(&self.covering[node]);
            node /= 2;
        }
        let (mut lo, mut hi) = (start + 1 + leaves, stop + 1 + leaves);
        while lo < hi {
            if lo & 1 == 1 {
                out.extend_from_slice(&self.starting[lo]);
                lo += 1;
            }
            if hi & 1 == 1 {
                hi -= 1;
                out.extend_from_slice(&self.starting[hi]);
            }
            lo /= 2;
            hi /= 2;
        }
    }
}

/// A union of address ranges, disjoint and sorted. Most of the trees' nodes
/// hold one range: it sits in the node, not in an allocation of its own
/// (a step of 1M buffers has 4M nodes).
type Ranges = SmallVec<[(u64, u64); 1]>;

/// Adds `[lo, hi)` to the union `ranges` (disjoint, sorted), merging it
/// with the ranges it touches or overlaps: a first fit among blocks
/// depends only on the union of their ranges.
fn coalesce(ranges: &mut Ranges, (lo, hi): (u64, u64)) {
    let at = ranges.partition_point(|&(_, h)| h < lo);
    let mut merged = (lo, hi);
    let mut end = at;
    while end < ranges.len() && ranges[end].0 <= hi {
        merged = (merged.0.min(ranges[end].0), merged.1.max(ranges[end].1));
        end += 1;
    }
    if end == at {
        ranges.insert(at, merged);
    } else {
        ranges[at] = merged;
        ranges.drain(at + 1..end);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zeroplan_ir::{NodeIndex, Place, Value};

    use crate::memory::liveness::Category;

    /// Intervals from `(start, length, bytes)`; a length past the end makes
    /// the buffer live to the last position (persistent).
    fn intervals(spans: &[(usize, usize, u64)], positions: usize) -> Vec<Interval> {
        spans
            .iter()
            .enumerate()
            .map(|(i, &(start, len, bytes))| Interval {
                value: Value { node: NodeIndex::new(i), output: 0 },
                bytes,
                start: start.min(positions - 1),
                end: (start + len).min(positions - 1),
                category: Category::Activations,
                alias_of: None,
                place: Place::Device,
            })
            .collect()
    }

    proptest! {
        /// The lifetime index finds the first fit the walk over every block
        /// finds, and no two blocks live at once share a byte.
        #[test]
        fn the_index_places_as_the_walk_does(
            spans in prop::collection::vec((0usize..200, 0usize..260, 1u64..5000), 1..300),
        ) {
            let intervals = intervals(&spans, 200);
            let walked = place_indexed(&intervals, false);
            let indexed = place_indexed(&intervals, true);
            prop_assert_eq!(&walked, &indexed);
            let p = &indexed.placements;
            for (i, a) in p.iter().enumerate() {
                for b in &p[i + 1..] {
                    let live_together = a.start <= b.end && b.start <= a.end;
                    let share = a.offset < b.offset + aligned(b.bytes) && b.offset < a.offset + aligned(a.bytes);
                    prop_assert!(!(live_together && share), "{a:?} and {b:?}");
                }
            }
        }
    }

    #[test]
    fn touching_ranges_merge_and_others_stay_apart() {
        let mut ranges: Ranges = smallvec::smallvec![(0, 256), (1024, 2048)];
        coalesce(&mut ranges, (256, 512));
        assert_eq!(ranges[..], [(0, 512), (1024, 2048)]);
        coalesce(&mut ranges, (512, 1024));
        assert_eq!(ranges[..], [(0, 2048)]);
        coalesce(&mut ranges, (4096, 4352));
        assert_eq!(ranges[..], [(0, 2048), (4096, 4352)]);
    }
}
