//! DAG-aware extraction over the merge candidates.
//!
//! egg's default extractor prices trees: each member of a merged group
//! would pay for the whole merged matmul and the weight concat again, so the
//! merge would never be chosen. Here a selection (one e-node per e-class
//! reached) is priced as a DAG: every e-class reached from the roots is paid
//! for once. The rule builds disjoint groups whose sub-DAGs share only
//! leaves (free), so the DAG cost of a selection is the sum of its groups'
//! costs and choosing per group — all members separate, or all through the
//! merged matmul — is the exact optimum over these choices.

use std::collections::{BTreeMap, HashMap, HashSet};

use egg::{Id, Language};

use super::lang::{RegionGraph, TensorLang};

/// A group of roots that the e-graph can compute through one merged matmul.
#[derive(Clone, Debug, PartialEq)]
pub struct FoundGroup {
    /// Indices into the roots, in concat order.
    pub members: Vec<usize>,
    /// Each root's merged form: its `cols` e-node.
    merged_nodes: Vec<TensorLang>,
    /// Each root's separate form: its `mm_t` e-node.
    separate_nodes: Vec<TensorLang>,
}

/// The groups of `roots` (e-classes of the original matmuls), in the order
/// of their first member.
pub fn groups(egraph: &RegionGraph, roots: &[Id]) -> Vec<FoundGroup> {
    let mut by_merged: BTreeMap<Id, Vec<(i64, usize, TensorLang, TensorLang)>> = BTreeMap::new();
    for (i, &root) in roots.iter().enumerate() {
        let class = &egraph[egraph.find(root)];
        let separate = class.nodes.iter().find(|n| matches!(n, TensorLang::MatMulT(_)));
        for node in &class.nodes {
            let TensorLang::Cols([start, _, merged]) = node else { continue };
            let (Some(start), Some(separate)) = (egraph[*start].data.num(), separate) else { continue };
            by_merged.entry(egraph.find(*merged)).or_default().push((start, i, node.clone(), separate.clone()));
        }
    }
    let mut found: Vec<FoundGroup> = by_merged
        .into_values()
        .filter(|members| members.len() >= 2)
        .map(|mut members| {
            members.sort_by_key(|m| m.0);
            FoundGroup {
                members: members.iter().map(|m| m.1).collect(),
                merged_nodes: members.iter().map(|m| m.2.clone()).collect(),
                separate_nodes: members.iter().map(|m| m.3.clone()).collect(),
            }
        })
        .collect();
    found.sort_by_key(|g| g.members.iter().copied().min());
    found
}

/// The DAG cost of computing `roots` with `selection` (e-class → chosen
/// e-node; e-classes not in it use their first e-node): each e-class
/// reached is priced once.
pub fn dag_cost(
    egraph: &RegionGraph,
    roots: &[Id],
    selection: &HashMap<Id, TensorLang>,
    cost: &dyn Fn(&RegionGraph, &TensorLang) -> f64,
) -> f64 {
    let mut seen = HashSet::new();
    let mut stack: Vec<Id> = roots.iter().map(|r| egraph.find(*r)).collect();
    let mut total = 0.0;
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let node = selection.get(&id).unwrap_or(&egraph[id].nodes[0]);
        total += cost(egraph, node);
        stack.extend(node.children().iter().map(|c| egraph.find(*c)));
    }
    total
}

/// A group's two DAG costs: (all separate, all merged).
pub fn group_costs(
    egraph: &RegionGraph,
    roots: &[Id],
    group: &FoundGroup,
    cost: &dyn Fn(&RegionGraph, &TensorLang) -> f64,
) -> (f64, f64) {
    let members: Vec<Id> = group.members.iter().map(|&i| egraph.find(roots[i])).collect();
    let choose = |nodes: &[TensorLang]| -> HashMap<Id, TensorLang> {
        members.iter().copied().zip(nodes.iter().cloned()).collect()
    };
    let separate = dag_cost(egraph, &members, &choose(&group.separate_nodes), cost);
    let merged = dag_cost(egraph, &members, &choose(&group.merged_nodes), cost);
    (separate, merged)
}
