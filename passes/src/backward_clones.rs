//! Cloning forward nodes into the backward, each group just before the
//! backward first reads it: what recomputation ([`crate::recompute`]) and
//! sequence-parallel re-gathering ([`crate::regather`]) share.
//!
//! Where a backward node reads a value of a group, the group's forward
//! nodes that the backward needs are cloned into the backward phase (named
//! `NAME.SUFFIX`) right before it, inserted in place
//! ([`zeroplan_ir::Graph::insert_before`]), and
//! every backward reader of the group reads the clones from then on. So the
//! originals die after their forward readers and the clones live only from
//! their first backward reader to their last: the memory planner sees the
//! originals' inputs stored instead of their outputs.

use rustc_hash::{FxHashMap, FxHashSet};
use std::hash::Hash;
use zeroplan_ir::splice;
use zeroplan_ir::{Graph, GraphError, Node, NodeIndex, Phase, Place, Value};

use crate::manager::PassContext;

/// A rebuilt graph and what was cloned.
pub struct Cloned {
    pub graph: Graph,
    /// Groups cloned.
    pub groups: usize,
    /// Values cloned: each output of each node cloned.
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
/// backward node reads the clones where they exist. Each group cloned
/// counts as one rewrite under `--pass-limit`.
///
/// Where the clones go is decided on `graph` as it is, and they are made
/// from it; then they are inserted into its node table in place
/// ([`Graph::insert_before`]): on a tiled 100T step the clones are 5 % of
/// 600k nodes, and copying the rest into a new table was the pass.
pub fn clone_before_backward<K: Copy + Eq + Hash + Ord>(
    graph: Graph,
    group: &FxHashMap<NodeIndex, K>,
    suffix: &str,
    cx: &mut PassContext,
) -> Result<Cloned, GraphError> {
    let before = placed_clones(&graph, group, cx);
    // Each old node's index once the clones are in: up by those before it.
    let cloned = |groups: &Placed<K>| groups.iter().map(|(_, members)| members.len()).sum::<usize>();
    let moved_to = splice::moved_to(graph.node_count(), before.iter().map(|(at, g)| (NodeIndex::new(*at), cloned(g))))
        .expect("the clones are placed in the order of the nodes");
    let renumbered = |v: &Value| Value { node: moved_to[v.node.index()], output: v.output };
    // Per group, its clones: the values they replace to their own.
    let mut clones: FxHashMap<K, Clones> = FxHashMap::default();
    let mut inserted = Vec::with_capacity(before.len());
    let mut nodes = 0;
    for (at, groups) in &before {
        let mut slot = moved_to[*at].index() - cloned(groups);
        let mut here = Vec::new();
        for (g, members) in groups {
            let mut made = Clones::default();
            for &m in members {
                let node = graph.node(m);
                let operands: Vec<Value> =
                    graph.operands(m).iter().map(|v| made.get(v).copied().unwrap_or_else(|| renumbered(v))).collect();
                let name = format!("{}.{suffix}", node.name);
                here.push(Node::new(
                    name,
                    node.op.clone(),
                    node.outputs.clone(),
                    Phase::Backward,
                    Place::Device,
                    &operands,
                ));
                for output in 0..node.outputs.len() as u32 {
                    made.insert(Value { node: m, output }, Value { node: NodeIndex::new(slot), output });
                }
                slot += 1;
            }
            nodes += made.len();
            clones.insert(*g, made);
        }
        inserted.push((NodeIndex::new(*at), here));
    }
    let mut operands: Vec<Value> = Vec::new();
    let graph = graph.insert_before(inserted, |_, node| {
        let backward = node.phase == Phase::Backward;
        operands.clear();
        operands.extend(node.operands().iter().map(|v| {
            let clone = || group.get(&v.node).and_then(|g| clones.get(g)).and_then(|m| m.get(v)).copied();
            if backward { clone().unwrap_or_else(|| renumbered(v)) } else { renumbered(v) }
        }));
        node.set_operands(&operands);
    })?;
    Ok(Cloned { graph, groups: clones.len(), nodes })
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

/// One group's clones: the values they replace to their own. Hashed: a
/// group is a few nodes of a 600k-node step.
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
