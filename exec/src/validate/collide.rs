//! Refuses two storages of one arena whose bytes overlap while both are
//! live ([`super::lives`]): one would overwrite the other's contents while
//! they are still needed, and the step would train on the wrong numbers.
//!
//! A sweep over the schedule, not a comparison of every pair (a plan holds
//! up to ~100k values): storages enter in order of their first position and
//! leave after their last, and the live ones are kept by start address. As
//! long as no two overlap, the live ones are disjoint, so a newcomer can
//! only overlap its neighbours by address — the live storage that starts at
//! or before it, and the one that starts at or after it. Two lookups in an
//! ordered map each: `O(n log n)` for `n` storages.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use zeroplan_ir::{Graph, NodeIndex, Place};

use super::lives::{Life, Storage};
use super::{invalid, place_name};
use crate::buffers::SelectError;

/// Refuses the first two of `storages` that share a byte of one arena at a
/// position where both are live, naming them, their bytes and the
/// instructions where both are live.
pub(super) fn refuse_collisions(g: &Graph, order: &[NodeIndex], storages: &[Storage]) -> Result<(), SelectError> {
    for place in [Place::Device, Place::Host] {
        let mut entering: Vec<usize> = (0..storages.len()).filter(|&s| storages[s].place == place).collect();
        entering.sort_by_key(|&s| storages[s].life.first);
        // The live storages by start address, and by their last position (to leave).
        let mut live: BTreeMap<usize, usize> = BTreeMap::new();
        let mut leaving: BinaryHeap<Reverse<(usize, usize)>> = BinaryHeap::new();
        for s in entering {
            let new = &storages[s];
            while let Some(&Reverse((last, gone))) = leaving.peek()
                && last < new.life.first
            {
                leaving.pop();
                live.remove(&storages[gone].start);
            }
            let before = live.range(..=new.start).next_back().map(|(_, &o)| o).filter(|&o| storages[o].end > new.start);
            let after = live.range(new.start..).next().map(|(_, &o)| o).filter(|&o| storages[o].start < new.end);
            if let Some(other) = before.or(after) {
                return Err(collision(g, order, &storages[other], new));
            }
            live.insert(new.start, s);
            leaving.push(Reverse((new.life.last, s)));
        }
    }
    Ok(())
}

/// The refusal of `a` and `b`, which overlap and are live at once (named
/// in address order).
fn collision<'s>(g: &Graph, order: &[NodeIndex], mut a: &'s Storage, mut b: &'s Storage) -> SelectError {
    if (b.start, b.end) < (a.start, a.end) {
        std::mem::swap(&mut a, &mut b);
    }
    let both = Life { first: a.life.first.max(b.life.first), last: a.life.last.min(b.life.last) };
    let (x, y) = (name(g, a, both), name(g, b, both));
    let node = |p: usize| &g.node(order[p]).name;
    invalid(
        format!("the buffers of `{x}` and `{y}`"),
        format!(
            "`{x}` (bytes {}..{} of the {} arena) and `{y}` (bytes {}..{}) overlap, and both are live from \
             instruction {} (`{}`) to {} (`{}`): one would overwrite the other while it is still needed",
            a.start,
            a.end,
            place_name(a.place),
            b.start,
            b.end,
            both.first,
            node(both.first),
            both.last,
            node(both.last),
        ),
    )
}

/// The value to name for `s` while `both` lasts: a member live then, the
/// widest (the base of views) where several are.
fn name(g: &Graph, s: &Storage, both: Life) -> String {
    let live = s.members.iter().filter(|(_, _, life)| life.meets(both));
    let widest = live.max_by_key(|(v, buf, _)| (buf.bytes(), Reverse(*v)));
    widest.or(s.members.first()).map(|(v, _, _)| g.value_ref(*v)).unwrap_or_default()
}
