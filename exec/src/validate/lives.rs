//! When each value's bytes hold contents the step still needs, derived from
//! the program itself: the plan file's own liveness (its `alias_of` links,
//! its offsets) is what a crafted file would lie about, so none of it is
//! read here. [`super::collide`] then refuses two values live at once on
//! the same bytes.
//!
//! Positions are those of the schedule the runtime executes (`order`). A
//! value is live from the instruction that writes it to the last one that
//! needs its contents, both included:
//!
//! - a parameter or optimizer state (and any update's target) carries its
//!   contents from one step to the next: live throughout;
//! - a graph output is read when its micro-batch or the step ends: live to
//!   the end;
//! - an update not made in place is copied into its target when its phase
//!   ends: live to the micro-batch's last instruction, or the step's end;
//! - a value an optimizer instruction writes and a micro-batch instruction
//!   reads is read by the next step's micro-batches before it is written
//!   again: live throughout;
//! - a constant update no node reads (an accumulator's zeroing) is written
//!   into its target when its phase ends; its own buffer is never touched,
//!   so it has no life.
//!
//! Values that share bytes by design make one [`Storage`], live over all
//! its members' lives: a view (reshape, leading-axis slice, ZeRO shard,
//! tensor copy) on its base's place *is* its base's bytes, so its readers
//! read the base; and an update whose buffer is its target's is written over
//! the target (the runtime takes exactly that for an update made in place).
//! The target's previous contents must then be dead when it is written:
//! [`storages`] refuses an in-place update that a later instruction's read
//! of the old contents comes after — except an optimizer instruction reading
//! a micro-batch update's target, which wants the updated contents.
//!
//! Micro-batches run the schedule again with the optimizer's instructions
//! left out but on the last: every value of the micro-batch phases is
//! written again before it is read, so one pass over the order covers them,
//! and what crosses from one micro-batch to the next is persistent (above).
//! Collectives in flight need no extension: the runtime waits for one
//! before any instruction whose bytes overlap its own (docs/runtime.md), so
//! they take effect in schedule order.

use std::collections::{BTreeMap, HashMap};

use zeroplan_ir::{Graph, NodeIndex, Op, Phase, Place, Value};

use super::invalid;
use crate::buffers::{Buf, SelectError, constant_update};

/// Schedule positions `first..=last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Life {
    pub first: usize,
    pub last: usize,
}

impl Life {
    fn cover(self, other: Life) -> Life {
        Life { first: self.first.min(other.first), last: self.last.max(other.last) }
    }

    /// Whether the two share a position.
    pub fn meets(self, other: Life) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// Bytes of one arena, and the values that share them by design.
#[derive(Clone, Debug)]
pub(super) struct Storage {
    pub place: Place,
    /// The members' bytes together, `start..end` (a base's, holding its views).
    pub start: usize,
    pub end: usize,
    /// Its members' lives together.
    pub life: Life,
    /// Each member, its buffer and its own life.
    pub members: Vec<(Value, Buf, Life)>,
}

/// Every storage of the rank's step that holds bytes and is live at some
/// position, from `bufs` (each value's validated buffer); an in-place
/// update that overwrites contents still to be read is refused.
pub(super) fn storages(
    g: &Graph,
    order: &[NodeIndex],
    bufs: &HashMap<Value, Buf>,
) -> Result<Vec<Storage>, SelectError> {
    let Some(end) = order.len().checked_sub(1) else { return Ok(Vec::new()) };
    // Node indices are below this (`order` holds every node).
    let bound = order.iter().map(|n| n.index() + 1).max().unwrap_or(0);
    let mut position = vec![usize::MAX; bound];
    for (p, &n) in order.iter().enumerate() {
        position[n.index()] = p;
    }
    let at = |n: NodeIndex| position[n.index()];
    // The runtime skips these on every micro-batch but the last.
    let optimizer = |n: NodeIndex| g.node(n).phase == Phase::Optimizer && g.node(n).op != Op::Input;
    let micro_end = order.iter().rposition(|&n| !optimizer(n)).unwrap_or(end);

    let mut values = Vec::new();
    let mut id: HashMap<Value, usize> = HashMap::new();
    for &n in order {
        for output in 0..g.node(n).outputs.len() as u32 {
            let v = Value { node: n, output };
            id.insert(v, values.len());
            values.push(v);
        }
    }
    let operands: Vec<Vec<Value>> = order.iter().map(|&n| g.operands(n)).collect();
    let view = |p: usize| {
        let n = order[p];
        g.node(n).op.is_view() && bufs[&Value { node: n, output: 0 }].place == bufs[&operands[p][0]].place
    };
    let views: Vec<bool> = (0..order.len()).map(view).collect();

    // The last instruction that reads each value, and the last of the
    // micro-batch phases that does (`None`: none). A view on its base's
    // place reads nothing itself: its readers read the base's bytes.
    let mut read: Vec<Option<usize>> = vec![None; values.len()];
    let mut read_micro: Vec<Option<usize>> = vec![None; values.len()];
    for (p, &n) in order.iter().enumerate().filter(|&(p, _)| !views[p]) {
        for v in &operands[p] {
            let i = id[v];
            read[i] = read[i].max(Some(p));
            if !optimizer(n) {
                read_micro[i] = read_micro[i].max(Some(p));
            }
        }
    }
    // In reverse, so a view of a view passes its reads on first.
    for p in (0..order.len()).rev().filter(|&p| views[p]) {
        let (w, base) = (id[&Value { node: order[p], output: 0 }], id[&operands[p][0]]);
        read[base] = read[base].max(read[w]);
        read_micro[base] = read_micro[base].max(read_micro[w]);
    }

    let mut target = vec![false; bound];
    let mut copied_until: Vec<Option<usize>> = vec![None; values.len()];
    let mut in_place: BTreeMap<Value, Vec<Value>> = BTreeMap::new();
    for &(t, v) in &g.updates {
        target[t.index()] = true;
        if constant_update(g, v.node).is_some() {
            continue;
        }
        let old = Value { node: t, output: 0 };
        if bufs[&v] == bufs[&old] {
            in_place.entry(old).or_default().push(v);
        } else {
            copied_until[id[&v]] = Some(if optimizer(v.node) { end } else { micro_end });
        }
    }
    let mut output = vec![false; values.len()];
    for (_, v) in &g.outputs {
        output[id[v]] = true;
    }
    let persistent = |n: NodeIndex| matches!(g.node(n).op, Op::Param { .. } | Op::State { .. }) || target[n.index()];
    let life = |i: usize| -> Option<Life> {
        let n = values[i].node;
        if constant_update(g, n).is_some() {
            return None;
        }
        if persistent(n) || (optimizer(n) && read_micro[i].is_some()) {
            return Some(Life { first: 0, last: end });
        }
        let first = at(n);
        let last =
            if output[i] { end } else { first.max(read[i].unwrap_or(first)).max(copied_until[i].unwrap_or(first)) };
        Some(Life { first, last })
    };

    for (old, updates) in &in_place {
        for v in updates {
            let p = at(v.node);
            // The target's readers, and those of its updates written in place before this one.
            let mut late = if optimizer(v.node) { read[id[old]] } else { read_micro[id[old]] }.map(|r| (*old, r));
            for earlier in updates.iter().filter(|e| at(e.node) < p) {
                let i = id[earlier];
                let need = if output[i] { Some(end) } else { read[i] };
                if let Some(r) = need.filter(|&r| late.is_none_or(|(_, l)| r > l)) {
                    late = Some((*earlier, r));
                }
            }
            if let Some((overwritten, r)) = late.filter(|&(_, r)| r > p) {
                let (v_name, old_name) = (g.value_ref(*v), g.value_ref(overwritten));
                let reader = if r == end && output[id[&overwritten]] {
                    "the step's outputs".to_string()
                } else {
                    format!("`{}`", g.node(order[r]).name)
                };
                return Err(invalid(
                    format!("the buffer of `{v_name}`"),
                    format!(
                        "it is `{old_name}`'s bytes, written in place at instruction {p} (`{}`), but {reader} reads \
                         `{old_name}` after that, at instruction {r}: it would read the update instead",
                        g.node(v.node).name
                    ),
                ));
            }
        }
    }

    // Values sharing bytes by design, joined.
    let mut parent: Vec<usize> = (0..values.len()).collect();
    for p in (0..order.len()).filter(|&p| views[p]) {
        union(&mut parent, id[&Value { node: order[p], output: 0 }], id[&operands[p][0]]);
    }
    for (old, updates) in &in_place {
        for v in updates {
            union(&mut parent, id[v], id[old]);
        }
    }
    let mut by_root: Vec<Option<Storage>> = vec![None; values.len()];
    for (i, &v) in values.iter().enumerate() {
        let buf = bufs[&v];
        let Some(own) = life(i).filter(|_| buf.bytes() > 0) else { continue };
        let (start, stop) = (buf.offset, buf.offset + buf.bytes());
        let root = find(&mut parent, i);
        let storage =
            by_root[root].get_or_insert(Storage { place: buf.place, start, end: stop, life: own, members: Vec::new() });
        storage.start = storage.start.min(start);
        storage.end = storage.end.max(stop);
        storage.life = storage.life.cover(own);
        storage.members.push((v, buf, own));
    }
    Ok(by_root.into_iter().flatten().collect())
}

/// The representative of `i`'s set, halving the path to it.
fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

fn union(parent: &mut [usize], a: usize, b: usize) {
    let (a, b) = (find(parent, a), find(parent, b));
    parent[a] = b;
}
