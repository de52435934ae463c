//! Cloning forward nodes into the backward, each group just before the
//! backward first reads it: what recomputation ([`crate::recompute`]) and
//! sequence-parallel re-gathering ([`crate::regather`]) share.
//!
//! The graph is rebuilt in schedule order. Where a backward node reads a
//! value of a group, the group's forward nodes that the backward needs are
//! cloned into the backward phase (named `NAME.SUFFIX`) right before it, and
//! every backward reader of the group reads the clones from then on. So the
//! originals die after their forward readers and the clones live only from
//! their first backward reader to their last: the memory planner sees the
//! originals' inputs stored instead of their outputs.

use rustc_hash::{FxHashMap, FxHashSet};
use std::hash::Hash;
use zeroplan_ir::splice::Splice;
use zeroplan_ir::{Graph, GraphError, Node, NodeIndex, Phase, Place, Value};

use crate::manager::PassContext;

/// A rebuilt graph and what was cloned.
pub struct Cloned {
    pub graph: Graph,
    /// Groups cloned.
    pub groups: usize,
    /// Nodes cloned.
    pub nodes: usize,
}

/// Whether a backward node of `graph` reads a node of `group`.
pub fn read_by_backward<K>(graph: &Graph, order: &[NodeIndex], group: &FxHashMap<NodeIndex, K>) -> bool {
    order.iter().any(|&n| {
        graph.node(n).phase == Phase::Backward && graph.operands(n).iter().any(|v| group.contains_key(&v.node))
    })
}

/// `graph` rebuilt with each group of `group` (forward nodes and their
/// group) cloned, with `suffix`, before its first backward reader; every
/// backward node reads the clones where they exist. Each
/// group cloned counts as one rewrite under `--pass-limit`.
///
/// Where the clones go is decided on `graph` as it is; then its nodes are
/// moved, in order, into the new graph ([`Splice`]), the clones spliced in:
/// on a tiled 100T step the clones are 5 % of 600k nodes, and copying the
/// rest was the pass.
pub fn clone_before_backward<K: Copy + Eq + Hash + Ord>(
    graph: Graph,
    group: &FxHashMap<NodeIndex, K>,
    suffix: &str,
    cx: &mut PassContext,
) -> Result<Cloned, GraphError> {
    let before = placed_clones(&graph, group, cx);
    let mut nodes = 0usize;
    let (mut splice, outputs, updates) =
        Splice::new(graph, before.iter().flat_map(|(_, groups)| groups).map(|(_, m)| m.len()).sum());
    // Each old node's index in the new graph (outputs keep their numbers).
    let mut map: Vec<NodeIndex> = Vec::with_capacity(splice.input_len());
    let renumbered = |map: &[NodeIndex], v: Value| Value { node: map[v.node.index()], output: v.output };
    // Per group, its clones: the new graph's original values to theirs.
    let mut clones: FxHashMap<K, Clones> = FxHashMap::default();
    let mut next = before.iter().peekable();
    let mut operands: Vec<Value> = Vec::new();
    let mut at = 0;
    while let Some(mut node) = splice.next_input() {
        while let Some((_, groups)) = next.next_if(|(place, _)| *place == at) {
            for (g, members) in groups {
                let Some(members) = members.iter().map(|m| map.get(m.index()).copied()).collect::<Option<Vec<_>>>()
                else {
                    let message = "a forward node of its group comes after it".into();
                    return Err(GraphError { node: node.name.to_string(), op: node.op.name(), message });
                };
                let made = clone_group(&mut splice, members.into_iter(), suffix)?;
                nodes += made.len();
                clones.insert(*g, made);
            }
        }
        operands.clear();
        operands.extend(node.operands().iter().map(|&v| {
            let new = renumbered(&map, v);
            let clone = || group.get(&v.node).and_then(|g| clones.get(g)).and_then(|m| m.get(&new)).copied();
            if node.phase == Phase::Backward { clone().unwrap_or(new) } else { new }
        }));
        node.set_operands(&operands);
        map.push(splice.push(node)?);
        at += 1;
    }
    let outputs = outputs.into_iter().map(|(name, v)| (name, renumbered(&map, v))).collect();
    let updates = updates.into_iter().map(|(target, v)| (map[target.index()], renumbered(&map, v))).collect();
    Ok(Cloned { graph: splice.finish(outputs, updates), groups: clones.len(), nodes })
}

/// The groups cloned before one node, each with the members cloned.
type Placed<K> = Vec<(K, Vec<NodeIndex>)>;

/// The groups each backward node first reads, by its index, with the
/// members the backward needs: where [`clone_before_backward`] puts their
/// clones, asking `--pass-limit` for each group as the node that first
/// needs it comes.
fn placed_clones<K: Copy + Eq + Hash + Ord>(
    graph: &Graph,
    group: &FxHashMap<NodeIndex, K>,
    cx: &mut PassContext,
) -> Vec<(usize, Placed<K>)> {
    // Each group's members in schedule order, gathered in one walk rather
    // than one per group (312 layers of 190k nodes for the 100T model).
    let mut members: FxHashMap<K, Vec<NodeIndex>> = FxHashMap::default();
    for n in graph.node_indices() {
        if let Some(&g) = group.get(&n) {
            members.entry(g).or_default().push(n);
        }
    }
    let mut cloned: FxHashSet<K> = FxHashSet::default();
    let mut before = Vec::new();
    for n in graph.node_indices() {
        if graph.node(n).phase != Phase::Backward {
            continue;
        }
        let mut needed: Vec<K> = graph.operands(n).iter().filter_map(|v| group.get(&v.node).copied()).collect();
        needed.sort_unstable();
        needed.dedup();
        let mut here = Vec::new();
        for g in needed {
            if !cloned.contains(&g) && cx.may_apply() {
                cloned.insert(g);
                here.push((g, needed_members(graph, &members[&g])));
            }
        }
        if !here.is_empty() {
            before.push((n.index(), here));
        }
    }
    before
}

/// One group's clones: the values they replace, in the new graph, to their
/// own. Hashed: a group is a few nodes of a 600k-node step.
type Clones = FxHashMap<Value, Value>;

/// The forward nodes of a group (`members`, in schedule order) that the
/// backward needs. A group node no backward node reads, directly or
/// through another clone (a pre-LN layer's last dropout: its gradient
/// needs only the mask, redrawn), is not cloned: its clone would be dead
/// code, computed and given memory for nothing.
fn needed_members(graph: &Graph, members: &[NodeIndex]) -> Vec<NodeIndex> {
    let mut needed = FxHashSet::default();
    for &n in members.iter().rev() {
        if graph.users(n).iter().any(|u| graph.node(*u).phase == Phase::Backward || needed.contains(u)) {
            needed.insert(n);
        }
    }
    members.iter().copied().filter(|n| needed.contains(n)).collect()
}

/// Clones `members` (nodes of the new graph, in schedule order) into the
/// backward phase, on the device, each reading the clones of the others
/// and the original values of everything else.
fn clone_group(
    splice: &mut Splice,
    members: impl Iterator<Item = NodeIndex>,
    suffix: &str,
) -> Result<Clones, GraphError> {
    let mut made = Clones::default();
    for n in members {
        let node = splice.node(n);
        let operands: Vec<Value> = node.operands().iter().map(|v| made.get(v).copied().unwrap_or(*v)).collect();
        let name = format!("{}.{suffix}", node.name);
        let clone = Node::new(name, node.op.clone(), node.outputs.clone(), Phase::Backward, Place::Device, &operands);
        let outputs = clone.outputs.len() as u32;
        let copy = splice.push(clone)?;
        for output in 0..outputs {
            made.insert(Value { node: n, output }, Value { node: copy, output });
        }
    }
    Ok(made)
}
