//! The pattern families: which node starts a group, and what a group is
//! called in the statistics.
//!
//! Anchors are tried from the end of the graph backwards, so the last row
//! op of a chain (a LayerNorm, a softmax, an activation, a GLU's product,
//! the backward's scale) grows its group over everything upstream it can
//! hold: bias add → GELU; GLU gating; bias → dropout → residual →
//! LayerNorm; embedding sum → LayerNorm; scale → ALiBi → mask → softmax →
//! dropout; and the backward chains (dropout → softmax_grad → mask_grad →
//! scale, gelu_grad …).

use zeroplan_ir::{Graph, NodeIndex, Op, Phase};

/// The candidate anchors, in the order they are tried: forward and backward
/// nodes, last first.
pub(super) fn anchors(g: &Graph, order: &[NodeIndex]) -> Vec<NodeIndex> {
    order.iter().rev().copied().filter(|&n| g.node(n).phase != Phase::Optimizer).collect()
}

fn is_activation(op: &Op) -> bool {
    matches!(op, Op::Gelu { .. } | Op::Silu | Op::Relu | Op::Tanh)
}

/// The pattern family of a group, for `pattern.NAME` statistics.
pub(super) fn classify(g: &Graph, nodes: &[NodeIndex]) -> &'static str {
    let ops: Vec<&Op> = nodes.iter().map(|&n| &g.node(n).op).collect();
    let has = |f: &dyn Fn(&Op) -> bool| ops.iter().any(|op| f(op));
    let reads_embedding =
        nodes.iter().any(|&n| g.operands(n).iter().any(|v| matches!(g.node(v.node).op, Op::Embedding)));
    let glu = nodes
        .iter()
        .any(|&n| g.node(n).op == Op::Mul && g.operands(n).iter().any(|v| is_activation(&g.node(v.node).op)));
    if has(&|op| matches!(op, Op::LayerNorm { .. })) {
        if reads_embedding {
            "embedding_layer_norm"
        } else if has(&|op| matches!(op, Op::Dropout { .. })) {
            "bias_dropout_residual_layer_norm"
        } else if has(&|op| is_activation(op)) {
            "bias_act_layer_norm"
        } else {
            "layer_norm"
        }
    } else if has(&|op| matches!(op, Op::Softmax)) {
        "attention_softmax"
    } else if has(&|op| matches!(op, Op::SoftmaxGrad)) {
        "attention_softmax_grad"
    } else if glu {
        "glu"
    } else if has(&|op| is_activation(op)) {
        "bias_act"
    } else if has(&|op| matches!(op, Op::GeluGrad { .. } | Op::SiluGrad | Op::ReluGrad | Op::TanhGrad)) {
        "act_grad"
    } else if has(&|op| matches!(op, Op::Dropout { .. })) {
        "bias_dropout_residual"
    } else {
        "elementwise"
    }
}
