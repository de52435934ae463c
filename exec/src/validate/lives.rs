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
    if order.is_empty() {
        return Ok(Vec::new());
    }
    let step = Step::new(g, order, bufs);
    step.in_place_updates_overwrite_nothing_read()?;
    Ok(step.storages())
}

/// The schedule with every value numbered, and what the lives are made of.
struct Step<'a> {
    g: &'a Graph,
    order: &'a [NodeIndex],
    bufs: &'a HashMap<Value, Buf>,
    /// The last position, and the last the micro-batches run.
    end: usize,
    micro_end: usize,
    /// Each node's position, by node index.
    position: Vec<usize>,
    /// Every value in schedule order, and its number.
    values: Vec<Value>,
    id: HashMap<Value, usize>,
    /// Each position's operands, and whether it is a view on its base's place.
    operands: Vec<&'a [Value]>,
    views: Vec<bool>,
    /// The last position that reads each value, and the last of the
    /// micro-batch phases that does (`None`: none).
    read: Vec<Option<usize>>,
    read_micro: Vec<Option<usize>>,
    /// Nodes whose contents carry over to the next step, by node index.
    persistent: Vec<bool>,
    /// Where an update not made in place is copied into its target.
    copied_until: Vec<Option<usize>>,
    /// Values the step's outputs read at its end.
    output: Vec<bool>,
    /// Each target's updates written over it in place.
    in_place: BTreeMap<Value, Vec<Value>>,
}

impl<'a> Step<'a> {
    fn new(g: &'a Graph, order: &'a [NodeIndex], bufs: &'a HashMap<Value, Buf>) -> Step<'a> {
        // Node indices are below this (`order` holds every node).
        let bound = order.iter().map(|n| n.index() + 1).max().unwrap_or(0);
        let mut position = vec![usize::MAX; bound];
        let mut values = Vec::new();
        let mut id = HashMap::new();
        for (p, &n) in order.iter().enumerate() {
            position[n.index()] = p;
            for output in 0..g.node(n).outputs.len() as u32 {
                id.insert(Value { node: n, output }, values.len());
                values.push(Value { node: n, output });
            }
        }
        let operands: Vec<&[Value]> = order.iter().map(|&n| g.operands(n)).collect();
        let views = order
            .iter()
            .zip(&operands)
            .map(|(&n, x)| g.node(n).op.is_view() && bufs[&Value { node: n, output: 0 }].place == bufs[&x[0]].place)
            .collect();
        let end = order.len() - 1;
        let count = values.len();
        let mut step = Step {
            g,
            order,
            bufs,
            end,
            micro_end: end,
            position,
            values,
            id,
            operands,
            views,
            read: vec![None; count],
            read_micro: vec![None; count],
            persistent: vec![false; bound],
            copied_until: vec![None; count],
            output: vec![false; count],
            in_place: BTreeMap::new(),
        };
        step.micro_end = order.iter().rposition(|&n| !step.optimizer(n)).unwrap_or(end);
        step.find_reads();
        step.find_updates();
        for (_, v) in &g.outputs {
            step.output[step.id[v]] = true;
        }
        step
    }

    /// Whether the runtime skips `n` on every micro-batch but the last.
    fn optimizer(&self, n: NodeIndex) -> bool {
        self.g.node(n).phase == Phase::Optimizer && self.g.node(n).op != Op::Input
    }

    fn at(&self, n: NodeIndex) -> usize {
        self.position[n.index()]
    }

    /// Fills `read` and `read_micro`. A view on its base's place reads
    /// nothing itself: its readers read the base's bytes.
    fn find_reads(&mut self) {
        for p in (0..self.order.len()).filter(|&p| !self.views[p]) {
            let micro = !self.optimizer(self.order[p]);
            for v in self.operands[p] {
                let i = self.id[v];
                self.read[i] = self.read[i].max(Some(p));
                if micro {
                    self.read_micro[i] = self.read_micro[i].max(Some(p));
                }
            }
        }
        // In reverse, so a view of a view passes its reads on first.
        for p in (0..self.order.len()).rev().filter(|&p| self.views[p]) {
            let (w, base) = (self.id[&Value { node: self.order[p], output: 0 }], self.id[&self.operands[p][0]]);
            self.read[base] = self.read[base].max(self.read[w]);
            self.read_micro[base] = self.read_micro[base].max(self.read_micro[w]);
        }
    }

    /// Fills `persistent`, `copied_until` and `in_place`: an update whose
    /// buffer is its target's is made in place (as the runtime takes it).
    fn find_updates(&mut self) {
        for &n in self.order {
            self.persistent[n.index()] = matches!(self.g.node(n).op, Op::Param { .. } | Op::State { .. });
        }
        for &(t, v) in &self.g.updates {
            self.persistent[t.index()] = true;
            if constant_update(self.g, v.node).is_some() {
                continue;
            }
            let old = Value { node: t, output: 0 };
            if self.bufs[&v] == self.bufs[&old] {
                self.in_place.entry(old).or_default().push(v);
            } else {
                let until = if self.optimizer(v.node) { self.end } else { self.micro_end };
                self.copied_until[self.id[&v]] = Some(until);
            }
        }
    }

    /// Value `i`'s life; `None` for a constant update, which holds nothing.
    fn life(&self, i: usize) -> Option<Life> {
        let n = self.values[i].node;
        if constant_update(self.g, n).is_some() {
            return None;
        }
        if self.persistent[n.index()] || (self.optimizer(n) && self.read_micro[i].is_some()) {
            return Some(Life { first: 0, last: self.end });
        }
        let first = self.at(n);
        let read = self.read[i].unwrap_or(first).max(self.copied_until[i].unwrap_or(first));
        Some(Life { first, last: if self.output[i] { self.end } else { first.max(read) } })
    }

    /// Refuses an update written over its target in place before a read of
    /// the target's previous contents (or of an update written over it
    /// earlier), but an optimizer read of a micro-batch update's target.
    fn in_place_updates_overwrite_nothing_read(&self) -> Result<(), SelectError> {
        for (old, updates) in &self.in_place {
            for v in updates {
                let p = self.at(v.node);
                let of_target =
                    if self.optimizer(v.node) { self.read[self.id[old]] } else { self.read_micro[self.id[old]] };
                let mut late = of_target.map(|r| (*old, r));
                for earlier in updates.iter().filter(|e| self.at(e.node) < p) {
                    let i = self.id[earlier];
                    let need = if self.output[i] { Some(self.end) } else { self.read[i] };
                    if let Some(r) = need.filter(|&r| late.is_none_or(|(_, l)| r > l)) {
                        late = Some((*earlier, r));
                    }
                }
                if let Some((overwritten, r)) = late.filter(|&(_, r)| r > p) {
                    return Err(self.overwritten(*v, overwritten, r));
                }
            }
        }
        Ok(())
    }

    /// The refusal of `v`, written in place over `old` before position `r` reads it.
    fn overwritten(&self, v: Value, old: Value, r: usize) -> SelectError {
        let g = self.g;
        let (v_name, old_name) = (g.value_ref(v), g.value_ref(old));
        let reader = if r == self.end && self.output[self.id[&old]] {
            "the step's outputs".to_string()
        } else {
            format!("`{}`", g.node(self.order[r]).name)
        };
        invalid(
            format!("the buffer of `{v_name}`"),
            format!(
                "it is `{old_name}`'s bytes, written in place at instruction {} (`{}`), but {reader} reads \
                 `{old_name}` after that, at instruction {r}: it would read the update instead",
                self.at(v.node),
                g.node(v.node).name
            ),
        )
    }

    /// The values that share bytes by design joined into storages: views
    /// with their bases, in-place updates with their targets.
    fn storages(&self) -> Vec<Storage> {
        let mut parent: Vec<usize> = (0..self.values.len()).collect();
        for p in (0..self.order.len()).filter(|&p| self.views[p]) {
            union(&mut parent, self.id[&Value { node: self.order[p], output: 0 }], self.id[&self.operands[p][0]]);
        }
        for (old, updates) in &self.in_place {
            for v in updates {
                union(&mut parent, self.id[v], self.id[old]);
            }
        }
        let mut by_root: Vec<Option<Storage>> = vec![None; self.values.len()];
        for (i, &v) in self.values.iter().enumerate() {
            let buf = self.bufs[&v];
            let Some(own) = self.life(i).filter(|_| buf.bytes() > 0) else { continue };
            let (start, end) = (buf.offset, buf.offset + buf.bytes());
            let root = find(&mut parent, i);
            let storage =
                by_root[root].get_or_insert(Storage { place: buf.place, start, end, life: own, members: Vec::new() });
            storage.start = storage.start.min(start);
            storage.end = storage.end.max(end);
            storage.life = storage.life.cover(own);
            storage.members.push((v, buf, own));
        }
        by_root.into_iter().flatten().collect()
    }
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
