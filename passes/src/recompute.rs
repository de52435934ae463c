//! Activation recomputation (checkpointing): the backward recomputes some
//! forward values instead of keeping them alive from the forward.
//!
//! The pass rebuilds the training graph. Where a backward node reads a
//! forward value the policy recomputes, it reads a clone instead: the
//! region's forward nodes are cloned into the backward phase (named
//! `NAME.recompute`) right before their first backward reader, so the
//! schedule recomputes each region just in time and its original values die
//! in the forward. Dropout clones draw the identical mask — the mask is a
//! function of (seed, stream, offset, element), not stored state — so a
//! recomputed step is bitwise the step without recomputation.
//!
//! Policies:
//! - `none`: keep every activation.
//! - `full`: keep each layer's input; recompute the whole layer (Chen et al.,
//!   2016, per transformer layer as Megatron and DeepSpeed do).
//! - `selective`: recompute only attention's scores → scale → (ALiBi) → mask →
//!   softmax → dropout region, the activations that grow with seq² but cost
//!   few FLOPs (Korthikanti et al., 2022).
//!
//! The 16-bit working copies of the weights are not recomputed: they are
//! model state, counted once.

use std::collections::HashMap;
use zeroplan_ir::{Graph, NodeIndex, Op, Phase, Value};

use crate::manager::{Pass, PassContext, PassError};
use crate::rebuild::{ValueMap, copy_node};

/// Which forward values the backward recomputes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    #[default]
    None,
    Full,
    Selective,
}

impl Policy {
    /// The name `from_name` reads back.
    pub fn name(self) -> String {
        match self {
            Policy::None => "none",
            Policy::Full => "full",
            Policy::Selective => "selective",
        }
        .to_string()
    }

    pub fn from_name(name: &str) -> Option<Policy> {
        match name {
            "none" => Some(Policy::None),
            "full" => Some(Policy::Full),
            "selective" => Some(Policy::Selective),
            _ => None,
        }
    }
}

/// The `recompute` pass.
pub struct Recompute {
    pub policy: Policy,
}

/// The attention region `selective` recomputes, by node-name suffix.
const ATTENTION_REGION: [&str; 6] =
    ["attn.scores", "attn.scaled", "attn.alibi", "attn.masked", "attn.probs", "attn.probs_dropout"];

impl Recompute {
    /// The region (layer index) a forward node belongs to, if the policy recomputes it.
    fn region(&self, graph: &Graph, n: NodeIndex) -> Option<u64> {
        let node = graph.node(n);
        if node.phase != Phase::Forward || node.op.is_source() {
            return None;
        }
        // Working copies of weights are model state, not activations.
        if matches!(node.op, Op::Cast { .. })
            && graph.operands(n).iter().all(|v| matches!(graph.node(v.node).op, Op::Param { .. }))
        {
            return None;
        }
        let rest = node.name.strip_prefix("layer")?;
        let (index, suffix) = rest.split_once('.')?;
        let layer: u64 = index.parse().ok()?;
        match self.policy {
            Policy::None => None,
            Policy::Full => Some(layer),
            Policy::Selective => ATTENTION_REGION.contains(&suffix).then_some(layer),
        }
    }
}

impl Pass for Recompute {
    fn name(&self) -> &'static str {
        "recompute"
    }

    fn run(&self, graph: Graph, cx: &mut PassContext) -> Result<Graph, PassError> {
        if self.policy == Policy::None {
            return Ok(graph);
        }
        let fail = |error| PassError::Graph { pass: "recompute", error };
        let order = graph.topo_order().expect("a verified graph is acyclic");
        let region: HashMap<NodeIndex, u64> =
            order.iter().filter_map(|&n| self.region(&graph, n).map(|r| (n, r))).collect();
        let mut out = Graph::new(graph.name.clone());
        let mut map = ValueMap::new();
        // Per region, the clones' values once made.
        let mut clones: HashMap<u64, ValueMap> = HashMap::new();
        let mut recomputed = 0usize;
        for &n in &order {
            let node = graph.node(n);
            out.phase = node.phase;
            if node.phase == Phase::Backward {
                let needed: Vec<u64> = {
                    let mut r: Vec<u64> =
                        graph.operands(n).iter().filter_map(|v| region.get(&v.node).copied()).collect();
                    r.sort_unstable();
                    r.dedup();
                    r
                };
                for r in needed {
                    if !clones.contains_key(&r) && cx.may_apply() {
                        let made = clone_region(&graph, &order, &region, r, &map, &mut out).map_err(fail)?;
                        recomputed += made.len();
                        clones.insert(r, made);
                    }
                }
                // Read recomputed values where they exist.
                let operands: Vec<Value> = graph
                    .operands(n)
                    .iter()
                    .map(|v| {
                        region
                            .get(&v.node)
                            .and_then(|r| clones.get(r))
                            .and_then(|m| m.get(v))
                            .copied()
                            .unwrap_or(map[v])
                    })
                    .collect();
                let declared = if node.op.is_source() { node.outputs.clone() } else { Vec::new() };
                let copy = out.add_node(node.name.clone(), node.op.clone(), &operands, declared).map_err(fail)?;
                for output in 0..node.outputs.len() as u32 {
                    map.insert(Value { node: n, output }, Value { node: copy, output });
                }
            } else {
                copy_node(&graph, n, &mut out, &mut map).map_err(fail)?;
            }
        }
        for (name, v) in &graph.outputs {
            out.set_output(name.clone(), map[v]);
        }
        for (target, v) in &graph.updates {
            let target = map[&Value { node: *target, output: 0 }].node;
            out.set_update(target, map[v]).map_err(fail)?;
        }
        out.phase = Phase::Forward;
        cx.stat("regions recomputed", clones.len());
        cx.stat("values recomputed", recomputed);
        Ok(out)
    }
}

/// Clones region `r`'s forward nodes into the backward phase, reading the
/// clones of each other and the original values of everything else.
fn clone_region(
    graph: &Graph,
    order: &[NodeIndex],
    region: &HashMap<NodeIndex, u64>,
    r: u64,
    map: &ValueMap,
    out: &mut Graph,
) -> Result<ValueMap, zeroplan_ir::GraphError> {
    let mut made = ValueMap::new();
    for &n in order.iter().filter(|n| region.get(n) == Some(&r)) {
        let node = graph.node(n);
        let operands: Vec<Value> = graph.operands(n).iter().map(|v| made.get(v).copied().unwrap_or(map[v])).collect();
        let copy = out.add_node(format!("{}.recompute", node.name), node.op.clone(), &operands, Vec::new())?;
        for output in 0..node.outputs.len() as u32 {
            made.insert(Value { node: n, output }, Value { node: copy, output });
        }
    }
    Ok(made)
}
