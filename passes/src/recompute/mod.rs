//! Activation recomputation (checkpointing): the backward recomputes some
//! forward values instead of keeping them alive from the forward.
//!
//! The pass rebuilds the training graph. Where a backward node reads a
//! forward value the policy recomputes, it reads a clone instead: the
//! region's forward nodes are cloned into the backward phase (named
//! `NAME.recompute`, [`crate::backward_clones`]) right before their first
//! backward reader, so the
//! schedule recomputes each region just in time and its original values die
//! in the forward. Dropout clones draw the identical mask — the mask is a
//! function of (seed, stream, offset, element), not stored state — so a
//! recomputed step is bitwise the step without recomputation.
//!
//! Policies, as a choice per layer ([`regions`] says what each region is):
//! - `none`: keep every activation.
//! - `full`: keep each layer's input; recompute the rest of the layer (Chen
//!   et al., 2016, per transformer layer as Megatron and DeepSpeed do).
//! - `selective`: recompute only attention's scores → scale → (ALiBi) → mask →
//!   softmax → dropout region, the activations that grow with seq² but cost
//!   few FLOPs (Korthikanti et al., 2022).
//! - `optimal:SIZE`: per layer, keep, recompute attention, the feed-forward,
//!   both, or the layer: the least recompute FLOPs whose stored activations
//!   fit SIZE at the shape hint ([`optimal`]).
//!
//! The 16-bit working copies of the weights are not recomputed: they are
//! model state, counted once.

pub mod optimal;
pub mod regions;

use std::collections::BTreeMap;
use zeroplan_ir::Graph;

use crate::backward_clones::{clone_before_backward, read_by_backward};
use crate::manager::{Pass, PassContext, PassError};
use regions::{Choice, Layers};

/// Which forward values the backward recomputes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    #[default]
    None,
    Full,
    Selective,
    /// The least recompute FLOPs whose stored activations (the forward
    /// values the backward reads, over the whole step at the shape hint)
    /// fit `budget_bytes`; the least-memory choice when nothing fits.
    Optimal {
        budget_bytes: u64,
    },
}

/// The suffix of a recomputed clone's name: `layer3.ffn.up.mm.recompute`.
pub const CLONE_SUFFIX: &str = "recompute";

/// Whether `name` is a clone this pass made.
pub fn is_clone(name: &str) -> bool {
    name.strip_suffix(CLONE_SUFFIX).is_some_and(|rest| rest.ends_with('.'))
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

impl Policy {
    /// The name `from_name` reads back: `none`, `full`, `selective`,
    /// `optimal:4GiB`, `optimal:512MiB`, `optimal:4000000000`.
    pub fn name(self) -> String {
        match self {
            Policy::None => "none".to_string(),
            Policy::Full => "full".to_string(),
            Policy::Selective => "selective".to_string(),
            Policy::Optimal { budget_bytes: b } if b > 0 && b.is_multiple_of(GIB) => format!("optimal:{}GiB", b / GIB),
            Policy::Optimal { budget_bytes: b } if b > 0 && b.is_multiple_of(MIB) => format!("optimal:{}MiB", b / MIB),
            Policy::Optimal { budget_bytes: b } => format!("optimal:{b}"),
        }
    }

    pub fn from_name(name: &str) -> Option<Policy> {
        match name {
            "none" => Some(Policy::None),
            "full" => Some(Policy::Full),
            "selective" => Some(Policy::Selective),
            _ => {
                name.strip_prefix("optimal:").and_then(parse_bytes).map(|budget_bytes| Policy::Optimal { budget_bytes })
            }
        }
    }
}

/// `4GiB`, `512MiB`, `1.5GiB`, `4GB` or plain bytes.
fn parse_bytes(s: &str) -> Option<u64> {
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => MIB,
        "gib" => GIB,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    match number.parse::<u64>() {
        Ok(n) => n.checked_mul(scale),
        Err(_) => {
            let x: f64 = number.parse().ok()?;
            let bytes = (x * scale as f64).round();
            (x.is_finite() && x >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
        }
    }
}

/// The `recompute` pass.
pub struct Recompute {
    pub policy: Policy,
}

impl Recompute {
    /// Each layer's choice under the policy (from `weighed`'s costs where
    /// the step was weighed already); records the optimal policy's decision.
    fn choices(
        &self,
        graph: &Graph,
        layers: &Layers,
        weighed: Option<&optimal::Weighed>,
        cx: &mut PassContext,
    ) -> Result<BTreeMap<u64, Choice>, PassError> {
        let every = |choice| layers.indices().map(|l| (l, choice)).collect();
        Ok(match self.policy {
            Policy::None => BTreeMap::new(),
            Policy::Full => every(Choice::Layer),
            Policy::Selective => every(Choice::Attention),
            Policy::Optimal { budget_bytes } => {
                let bindings = crate::rewrite::hint_bindings(&cx.options.shape_hint);
                let computed;
                let costs = match weighed {
                    Some(weighed) => &weighed.costs,
                    None => {
                        let regathered = regathered(cx);
                        computed =
                            optimal::costs(graph, layers, &bindings, regathered).ok_or_else(|| PassError::Failed {
                                pass: "recompute",
                                message: "a size is unknown at the shape hint: bind batch and seq".to_string(),
                            })?;
                        &computed
                    }
                };
                let decision = optimal::choose(costs, budget_bytes);
                record(budget_bytes, &decision, &bindings, cx);
                decision.choices
            }
        })
    }
}

/// Whether the `regather` pass runs after this one.
fn regathered(cx: &PassContext) -> bool {
    cx.options.sequence_parallel && !cx.options.disabled.contains("regather")
}

/// The weighing the options hand over, where it is of `graph`.
fn weighed(graph: &Graph, cx: &PassContext) -> Option<std::sync::Arc<optimal::Weighed>> {
    let bindings = crate::rewrite::hint_bindings(&cx.options.shape_hint);
    cx.options.weighed.clone().filter(|w| w.weighs(graph, &bindings, regathered(cx)))
}

/// The optimal policy's decision, in the pass's statistics (`--time-passes`)
/// and, per layer, in its explanation (`--explain recompute`).
fn record(budget_bytes: u64, decision: &optimal::Decision, bindings: &zeroplan_ir::Bindings, cx: &mut PassContext) {
    cx.stat("budget bytes", budget_bytes);
    cx.stat("stored bytes", decision.cost.bytes);
    cx.stat("fits", if decision.fits { "yes" } else { "no: the least-memory choice" });
    cx.stat("recompute flops", format!("{:.4e}", decision.cost.flops));
    cx.stat("pareto points", decision.front);
    for choice in Choice::ALL {
        cx.stat(format!("layers {}", choice.name()), decision.choices.values().filter(|&&c| c == choice).count());
    }
    if cx.explains("recompute") {
        let per_layer: Vec<String> = decision.choices.iter().map(|(l, c)| format!("layer{l} {}", c.name())).collect();
        cx.explanations.push(format!(
            "recompute {}: {} stored bytes at {bindings:?}, {:.4e} recompute FLOPs; {}",
            Policy::Optimal { budget_bytes }.name(),
            decision.cost.bytes,
            decision.cost.flops,
            per_layer.join(", ")
        ));
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
        let order = graph.topo_order();
        let weighed = weighed(&graph, cx).filter(|_| matches!(self.policy, Policy::Optimal { .. }));
        let listed;
        let layers = match &weighed {
            Some(weighed) => &weighed.layers,
            None => {
                listed = Layers::of(&graph, &order);
                &listed
            }
        };
        let choices = self.choices(&graph, layers, weighed.as_deref(), cx)?;
        let region = layers.assign(&graph, &choices);
        // No backward node reads a value the policy would recompute (the
        // `attention` pass fused the region `selective` recomputes): the
        // graph stays as it is, so the plan is exactly `none`'s and the
        // planner compiles it once for both.
        if !read_by_backward(&graph, &order, &region) {
            cx.stat("regions recomputed", 0);
            cx.stat("values recomputed", 0);
            return Ok(graph);
        }
        let cloned = clone_before_backward(graph, &region, CLONE_SUFFIX, cx)
            .map_err(|error| PassError::Graph { pass: "recompute", error })?;
        cx.stat("regions recomputed", cloned.groups);
        cx.stat("values recomputed", cloned.nodes);
        Ok(cloned.graph)
    }
}
