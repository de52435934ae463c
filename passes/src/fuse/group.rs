//! Growing a group of fusible nodes around an anchor, and the convexity
//! check that keeps the fused graph acyclic.

use rustc_hash::FxHashSet;

use zeroplan_ir::{Graph, NodeIndex, Op, Value};

use zeroplan_ir::kernel::lower::{fusible, sum_to_axes};

/// Parts of a gradient sum one kernel may read. Fusing a sum reads all its
/// parts at once, so each stays live until the last is computed; a value
/// read by many (an activation read by every tile of a tiled matmul) would
/// hold a full-size gradient per reader. Past this many the sum runs in
/// kernels of this many parts, each adding to the partial sum before it, so
/// at most this many are live. Four covers the sums of an untiled layer
/// (an activation read by the query, key and value projections and the
/// residual).
const MAX_SUM_PARTS: usize = 4;

/// Whether `n` adds two gradients of the kernel's shape in the backward:
/// one step of a sum autodiff builds.
fn sums_gradients(g: &Graph, n: NodeIndex, kshape: &zeroplan_ir::Shape) -> bool {
    let node = g.node(n);
    node.phase == zeroplan_ir::Phase::Backward
        && node.op == Op::Add
        && g.operands(n).iter().all(|v| g.value_type(*v).shape == *kshape)
}

/// Each node's place in the schedule, by node index.
pub(super) type Position = [usize];

/// Whether `consumer` reading `producer` is a kernel boundary: with
/// attention unfused, the attention-probability dropout runs as a kernel of
/// its own, as Megatron-LM runs torch's dropout after its fused
/// scale-mask-softmax and Hugging Face's eager attention `nn.Dropout` after
/// the softmax: in the forward a dropout reading a softmax, in the backward
/// a softmax gradient reading the dropout backward (the same `dropout` op on
/// the incoming gradient). No mask is written: each kernel redraws it from
/// its stream.
fn apart(g: &Graph, producer: NodeIndex, consumer: NodeIndex, unfused_attention: bool) -> bool {
    unfused_attention
        && matches!(
            (&g.node(producer).op, &g.node(consumer).op),
            (Op::Softmax, Op::Dropout { .. }) | (Op::Dropout { .. }, Op::SoftmaxGrad)
        )
}

/// The group grown from `anchor`: producers are absorbed while every user of
/// theirs in the anchor's phase is already in the group (users in later
/// phases read the stored value); then dropouts reading a group value are
/// absorbed, then `sum_to`s of a group value down to a trailing suffix of
/// the kernel shape (bias gradients, as cross-row outputs). No edge
/// [`apart`] joins two members. Returns the group in topological order (by
/// `position`), or `None` when it would not be convex.
pub(super) fn grow(
    g: &Graph,
    anchor: NodeIndex,
    taken: &[bool],
    position: &Position,
    unfused_attention: bool,
) -> Option<Vec<NodeIndex>> {
    let kshape = g.node(anchor).outputs[0].shape.clone();
    // A group runs in one phase, on one side of PCIe.
    let (phase, place) = (g.node(anchor).phase, g.node(anchor).place);
    let eligible = |n: NodeIndex, set: &FxHashSet<NodeIndex>| {
        !taken[n.index()]
            && !set.contains(&n)
            && g.node(n).phase == phase
            && g.node(n).place == place
            && fusible(g, n, &kshape)
    };
    let mut set: FxHashSet<NodeIndex> = FxHashSet::from_iter([anchor]);
    let mut sums = usize::from(sums_gradients(g, anchor, &kshape));
    loop {
        let mut grew = false;
        let members: Vec<NodeIndex> = set.iter().copied().collect();
        for m in members {
            for v in g.operands(m).iter().copied() {
                let p = v.node;
                if !eligible(p, &set) || apart(g, p, m, unfused_attention) {
                    continue;
                }
                let sum = sums_gradients(g, p, &kshape);
                if sum && sums + 1 >= MAX_SUM_PARTS {
                    continue;
                }
                let all_inside = g.users(p).iter().all(|u| set.contains(u) || g.node(*u).phase > phase);
                if all_inside {
                    set.insert(p);
                    sums += usize::from(sum);
                    grew = true;
                }
            }
        }
        if !grew {
            break;
        }
    }
    let members: Vec<NodeIndex> = set.iter().copied().collect();
    for m in members {
        for &u in g.users(m) {
            if matches!(g.node(u).op, Op::Dropout { .. }) && eligible(u, &set) && !apart(g, m, u, unfused_attention) {
                set.insert(u);
            }
        }
    }
    let members: Vec<NodeIndex> = set.iter().copied().collect();
    for m in members {
        for &u in g.users(m) {
            let reads_group = g.operands(u).iter().all(|v| set.contains(&v.node));
            if !taken[u.index()]
                && !set.contains(&u)
                && g.node(u).phase == phase
                && reads_group
                && sum_to_axes(g, u, &kshape).is_some()
            {
                set.insert(u);
            }
        }
    }
    if set.len() < 2 || !convex(g, &set, position) {
        return None;
    }
    let mut nodes: Vec<NodeIndex> = set.into_iter().collect();
    nodes.sort_by_key(|n| position[n.index()]);
    Some(nodes)
}

/// No path leaves the group and comes back: no operand of a group node is
/// produced downstream of the group. A path only moves forward in
/// topological order, so the walk stops past the group's last node: it
/// visits the window the group spans, not the rest of the graph (which
/// made fusion quadratic in the model's depth).
fn convex(g: &Graph, set: &FxHashSet<NodeIndex>, position: &Position) -> bool {
    let last = set.iter().map(|n| position[n.index()]).max().unwrap_or(0);
    let mut seen: FxHashSet<NodeIndex> = FxHashSet::default();
    let mut stack: Vec<NodeIndex> =
        set.iter().flat_map(|&m| g.users(m).iter().copied()).filter(|u| !set.contains(u)).collect();
    while let Some(n) = stack.pop() {
        if set.contains(&n) {
            return false;
        }
        if position[n.index()] < last && seen.insert(n) {
            stack.extend(g.users(n).iter().copied());
        }
    }
    true
}

/// The values the graph itself reads: its outputs and its updates.
pub(super) fn exported(g: &Graph) -> FxHashSet<Value> {
    g.outputs.iter().map(|(_, v)| *v).chain(g.updates.iter().map(|(_, v)| *v)).collect()
}

/// The group's values read outside it: by a later node, or `exported` (a
/// graph output or an update), in group order (a node's outputs in order).
pub(super) fn outputs(g: &Graph, nodes: &[NodeIndex], exported: &FxHashSet<Value>) -> Vec<Value> {
    let set: FxHashSet<NodeIndex> = nodes.iter().copied().collect();
    let mut out = Vec::new();
    for &n in nodes {
        let outside: Vec<NodeIndex> = g.users(n).iter().copied().filter(|u| !set.contains(u)).collect();
        for output in 0..g.node(n).outputs.len() as u32 {
            let v = Value { node: n, output };
            let read = outside.iter().any(|&u| g.operands(u).contains(&v)) || exported.contains(&v);
            if read {
                out.push(v);
            }
        }
    }
    out
}
