//! Where recomputation may cut: each layer's forward nodes, and the regions
//! of them a policy recomputes.
//!
//! A layer is the forward nodes named `layerN.…`. Two kinds of them are
//! never recomputed:
//! - working copies of the weights (casts of parameters): model state,
//!   counted once;
//! - the layer's *boundary*, the values that other layers' forward nodes
//!   read: its output (the next layer's input) and anything shared with
//!   other layers. These are Chen et al. (2016)'s checkpoints at layer
//!   boundaries; keeping them means a layer's recomputation starts from its
//!   input and never pulls another layer's clones forward.
//!
//! What is left are the layer's *internal* nodes (the last layer's output
//! among them: only the head reads it, and the head is not recomputed).
//! Only the layer's own forward nodes, the head and the backward read them,
//! so the bytes a layer stores depend on that layer's choice alone — the
//! property the dynamic program of [`super::optimal`] relies on.
//!
//! The regions of a layer:
//! - attention: what feeds the context matmul, back to the scores matmul —
//!   scores → scale → (ALiBi) → mask → softmax → dropout, the values that
//!   grow with seq² but cost few FLOPs (Korthikanti et al., 2022, "selective");
//! - feed-forward: what feeds the down projection, back to the up (and gate)
//!   matmuls — the intermediate-width products and the activation, for GLU
//!   the gate/up products and the gated product;
//! - layer: every internal node (Chen et al., 2016, per transformer layer as
//!   Megatron and DeepSpeed do: "full").

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;
use zeroplan_ir::{Graph, NodeIndex, Op, Phase};

/// A part of a layer that is cloned as one, just before the backward first
/// reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    Attention,
    FeedForward,
    Layer,
}

/// One recomputed region: a part of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId {
    pub layer: u64,
    pub part: Part,
}

/// What one layer recomputes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Choice {
    Keep,
    Attention,
    FeedForward,
    AttentionAndFeedForward,
    Layer,
}

impl Choice {
    pub const ALL: [Choice; 5] =
        [Choice::Keep, Choice::Attention, Choice::FeedForward, Choice::AttentionAndFeedForward, Choice::Layer];

    pub fn name(self) -> &'static str {
        match self {
            Choice::Keep => "keep",
            Choice::Attention => "attention",
            Choice::FeedForward => "feed-forward",
            Choice::AttentionAndFeedForward => "attention+feed-forward",
            Choice::Layer => "layer",
        }
    }

    fn parts(self) -> &'static [Part] {
        match self {
            Choice::Keep => &[],
            Choice::Attention => &[Part::Attention],
            Choice::FeedForward => &[Part::FeedForward],
            Choice::AttentionAndFeedForward => &[Part::Attention, Part::FeedForward],
            Choice::Layer => &[Part::Layer],
        }
    }
}

/// The matmul each part's region feeds (its first operand), by suffix, the
/// first that names a matmul; the down projection is `ffn.down.mm` when it
/// has a bias.
const ENDS: [(Part, &[&str]); 2] =
    [(Part::Attention, &["attn.context"]), (Part::FeedForward, &["ffn.down.mm", "ffn.down"])];

/// The layers of a training step's forward: each layer's internal nodes.
pub struct Layers {
    /// Per layer, its internal nodes in schedule order.
    internal: BTreeMap<u64, Vec<NodeIndex>>,
    /// Per layer and part, the matmul its region feeds, and the place of its
    /// suffix in [`ENDS`]. Found as the layers are, not by name: indexing
    /// a tiled step's names for these few lookups would cost a third of the
    /// pass.
    ends: FxHashMap<(u64, Part), (usize, NodeIndex)>,
}

impl Layers {
    pub fn of(graph: &Graph, order: &[NodeIndex]) -> Layers {
        let mut internal: BTreeMap<u64, Vec<NodeIndex>> = BTreeMap::new();
        let mut ends = FxHashMap::default();
        for &n in order {
            let Some((layer, rest)) = layer_and_rest(&graph.node(n).name) else { continue };
            if matches!(graph.node(n).op, Op::MatMul { .. }) {
                for &(part, suffixes) in &ENDS {
                    if let Some(rank) = suffixes.iter().position(|&s| s == rest) {
                        let end = ends.entry((layer, part)).or_insert((rank, n));
                        *end = (*end).min((rank, n));
                    }
                }
            }
            if !is_activation(graph, n) {
                continue;
            }
            let boundary = graph.users(n).iter().copied().any(|m| {
                graph.node(m).phase == Phase::Forward && layer_of(graph, m).is_some_and(|other| other != layer)
            });
            if !boundary {
                internal.entry(layer).or_default().push(n);
            }
        }
        Layers { internal, ends }
    }

    /// The layers' indices, ascending.
    pub fn indices(&self) -> impl Iterator<Item = u64> + '_ {
        self.internal.keys().copied()
    }

    /// `layer`'s internal nodes, in schedule order.
    pub fn internal(&self, layer: u64) -> &[NodeIndex] {
        self.internal.get(&layer).map_or(&[], Vec::as_slice)
    }

    /// Every layer's internal nodes.
    pub fn all_internal(&self) -> FxHashSet<NodeIndex> {
        self.internal.values().flatten().copied().collect()
    }

    /// The regions of `layer` under `choice`: each recomputed node and its region.
    pub fn region(&self, graph: &Graph, layer: u64, choice: Choice) -> FxHashMap<NodeIndex, RegionId> {
        let mut out = FxHashMap::default();
        for &part in choice.parts() {
            let id = RegionId { layer, part };
            match part {
                Part::Layer => out.extend(self.internal(layer).iter().map(|&n| (n, id))),
                _ => out.extend(self.feeding(graph, layer, part).into_iter().map(|n| (n, id))),
            }
        }
        out
    }

    /// The regions of every layer under its choice.
    pub fn assign(&self, graph: &Graph, choices: &BTreeMap<u64, Choice>) -> FxHashMap<NodeIndex, RegionId> {
        choices.iter().flat_map(|(&layer, &choice)| self.region(graph, layer, choice)).collect()
    }

    /// The internal nodes of `layer` that feed the first operand of the
    /// matmul `part` ends at, walking back to and including the first
    /// matmuls met.
    fn feeding(&self, graph: &Graph, layer: u64, part: Part) -> FxHashSet<NodeIndex> {
        let internal: FxHashSet<NodeIndex> = self.internal(layer).iter().copied().collect();
        let end = self.ends.get(&(layer, part)).map(|&(_, n)| n);
        let mut found = FxHashSet::default();
        let mut stack: Vec<NodeIndex> = end.map(|n| graph.operands(n)[0].node).into_iter().collect();
        while let Some(n) = stack.pop() {
            if !internal.contains(&n) || !found.insert(n) {
                continue;
            }
            if !matches!(graph.node(n).op, Op::MatMul { .. }) {
                stack.extend(graph.operands(n).iter().map(|v| v.node));
            }
        }
        found
    }
}

/// The layer index of a node named `layerN.…`.
pub fn layer_of(graph: &Graph, n: NodeIndex) -> Option<u64> {
    layer_and_rest(&graph.node(n).name).map(|(layer, _)| layer)
}

/// `N` and the rest of a name `layerN.rest`.
fn layer_and_rest(name: &str) -> Option<(u64, &str)> {
    let (index, rest) = name.strip_prefix("layer")?.split_once('.')?;
    Some((index.parse().ok()?, rest))
}

/// A value the forward computes from the batch: not a source, not a working
/// copy of weights (a cast of parameters, or the `tensor_copy` through which
/// sequence parallelism reads one).
pub fn is_activation(graph: &Graph, n: NodeIndex) -> bool {
    let node = graph.node(n);
    node.phase == Phase::Forward && !node.op.is_source() && !is_weight(graph, n)
}

/// A parameter, or a cast or tensor copy of weights.
fn is_weight(graph: &Graph, n: NodeIndex) -> bool {
    match graph.node(n).op {
        Op::Param { .. } => true,
        Op::Cast { .. } | Op::TensorCopy { .. } => graph.operands(n).iter().all(|v| is_weight(graph, v.node)),
        _ => false,
    }
}
