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
use zeroplan_ir::shape::TensorType;
use zeroplan_ir::{Graph, GraphError, NodeIndex, Phase, Value};

use crate::manager::PassContext;
use crate::rebuild::{ValueMap, copy_node, copy_node_over, rebuilt};

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
/// group) cloned, with `suffix`, before its first backward reader in
/// `order`; every backward node reads the clones where they exist. Each
/// group cloned counts as one rewrite under `--pass-limit`.
pub fn clone_before_backward<K: Copy + Eq + Hash + Ord>(
    graph: &Graph,
    order: &[NodeIndex],
    group: &FxHashMap<NodeIndex, K>,
    suffix: &str,
    cx: &mut PassContext,
) -> Result<Cloned, GraphError> {
    let (mut out, mut map) = rebuilt(graph, graph.node_count());
    // Each group's members in schedule order, gathered in one walk rather
    // than one per group (312 layers of 190k nodes for the 100T model).
    let mut members: FxHashMap<K, Vec<NodeIndex>> = FxHashMap::default();
    for &n in order {
        if let Some(&g) = group.get(&n) {
            members.entry(g).or_default().push(n);
        }
    }
    // Per group, the clones' values once made.
    let mut clones: FxHashMap<K, Clones> = FxHashMap::default();
    let mut nodes = 0usize;
    for &n in order {
        let node = graph.node(n);
        out.phase = node.phase;
        if node.phase != Phase::Backward {
            copy_node(graph, n, &mut out, &mut map)?;
            continue;
        }
        let mut needed: Vec<K> = graph.operands(n).iter().filter_map(|v| group.get(&v.node).copied()).collect();
        needed.sort_unstable();
        needed.dedup();
        for g in needed {
            if !clones.contains_key(&g) && cx.may_apply() {
                let made = clone_group(graph, &members[&g], &map, suffix, &mut out)?;
                nodes += made.len();
                clones.insert(g, made);
            }
        }
        // Read the clones where they exist.
        let operands: Vec<Value> = graph
            .operands(n)
            .iter()
            .map(|v| group.get(&v.node).and_then(|g| clones.get(g)).and_then(|m| m.get(v)).copied().unwrap_or(map[v]))
            .collect();
        copy_node_over(graph, n, &operands, &mut out, &mut map)?;
    }
    for (name, v) in &graph.outputs {
        out.set_output(name.clone(), map[v]);
    }
    for (target, v) in &graph.updates {
        let target = map[&Value { node: *target, output: 0 }].node;
        out.set_update(target, map[v])?;
    }
    out.phase = Phase::Forward;
    Ok(Cloned { graph: out, groups: clones.len(), nodes })
}

/// One group's clones: the old values they replace to their own. Hashed,
/// not a [`ValueMap`]: a group is a few nodes of a 300k-node step.
type Clones = FxHashMap<Value, Value>;

/// Clones the forward nodes of a group (`members`, in schedule order) that
/// the backward needs into the backward phase, reading the clones of each
/// other and the original values of everything else. A group node no
/// backward node reads, directly or through another clone (a pre-LN
/// layer's last dropout: its gradient needs only the mask, redrawn), is not
/// cloned: its clone would be dead code, computed and given memory for
/// nothing.
fn clone_group(
    graph: &Graph,
    members: &[NodeIndex],
    map: &ValueMap,
    suffix: &str,
    out: &mut Graph,
) -> Result<Clones, GraphError> {
    let mut needed = FxHashSet::default();
    for &n in members.iter().rev() {
        if graph.users(n).iter().any(|u| graph.node(*u).phase == Phase::Backward || needed.contains(u)) {
            needed.insert(n);
        }
    }
    let mut made = Clones::default();
    for &n in members.iter().filter(|n| needed.contains(n)) {
        let node = graph.node(n);
        let reads = graph.operands(n);
        let operands: Vec<Value> = reads.iter().map(|v| made.get(v).copied().unwrap_or(map[v])).collect();
        let was: Vec<&TensorType> = reads.iter().map(|&v| graph.value_type(v)).collect();
        let copy = out.add_copy(format!("{}.{suffix}", node.name), node.op.clone(), &operands, &was, &node.outputs)?;
        for output in 0..node.outputs.len() as u32 {
            made.insert(Value { node: n, output }, Value { node: copy, output });
        }
    }
    Ok(made)
}
