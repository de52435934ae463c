//! The pattern families: which node starts a group, and what a group is
//! called in the statistics.
//!
//! Anchors are tried from the end of the graph backwards, so the last row
//! op of a chain (a LayerNorm, a softmax, an activation, a GLU's product,
//! the backward's scale) grows its group over everything upstream it can
//! hold: bias add → GELU; GLU gating; bias → dropout → residual →
//! LayerNorm; embedding sum → LayerNorm; scale → ALiBi → mask → softmax →
//! dropout (the dropout apart with attention unfused); and the backward
//! chains (dropout → softmax_grad → mask_grad → scale, likewise;
//! gelu_grad …); LayerNorm's backward with its `dy` chain (residual
//! gradient adds, the dropout backward), the dropout backward of its `dx`
//! and that dropout's bias gradient; an activation gradient with its bias
//! gradient. Each `adamw` and `squared_sum` is a kernel of its own.

use rustc_hash::FxHashSet;

use zeroplan_ir::{Graph, NodeIndex, Op, Phase, Shape, Value};

/// The candidate anchors, in the order they are tried: the backward's
/// `layer_norm_grad`s first (last first), so each takes its `dy` chain, the
/// dropout backward of its `dx` and that dropout's bias gradient before a
/// smaller group does; then the other forward and backward nodes, last
/// first. The optimizer's nodes are kernels of their own
/// ([`zeroplan_ir::kernel::lower::optimizer_fusible`]).
pub(super) fn anchors(g: &Graph, order: &[NodeIndex]) -> Vec<NodeIndex> {
    let candidates = order.iter().rev().copied().filter(|&n| g.node(n).phase != Phase::Optimizer);
    let is_ln_grad = |n: &NodeIndex| matches!(g.node(*n).op, Op::LayerNormGrad { .. });
    let (mut first, rest): (Vec<NodeIndex>, Vec<NodeIndex>) = candidates.partition(is_ln_grad);
    first.extend(rest);
    first
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
    let bias_grad = has(&|op| matches!(op, Op::SumTo { .. }));
    if has(&|op| matches!(op, Op::AdamW { .. })) {
        "adamw"
    } else if has(&|op| matches!(op, Op::SquaredSum)) {
        "squared_sum"
    } else if has(&|op| matches!(op, Op::LayerNormGrad { .. })) {
        "layer_norm_grad"
    } else if has(&|op| matches!(op, Op::LayerNorm { .. })) {
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
        if bias_grad { "act_grad_bias_grad" } else { "act_grad" }
    } else if bias_grad {
        "bias_grad"
    } else if has(&|op| matches!(op, Op::Dropout { .. })) {
        "bias_dropout_residual"
    } else {
        "elementwise"
    }
}

/// The matmul node whose output the group reads only through a bias add
/// (a rank-1 bias along the row; maybe followed by an activation): a
/// cuBLASLt backend can fold that add (and GELU) into the GEMM as its
/// epilogue. The matmul output must have the kernel's shape and no other
/// reader. The first such add in group order.
pub(super) fn epilogue(g: &Graph, nodes: &[NodeIndex], exported: &FxHashSet<Value>, kshape: &Shape) -> Option<String> {
    let set: FxHashSet<NodeIndex> = nodes.iter().copied().collect();
    for &n in nodes {
        if g.node(n).op != Op::Add {
            continue;
        }
        let ops = g.operands(n);
        for (mm, bias) in [(ops[0], ops[1]), (ops[1], ops[0])] {
            let outputs = 0..g.node(mm.node).outputs.len() as u32;
            let only_reader = g.users(mm.node) == [n]
                && !outputs.into_iter().any(|output| exported.contains(&Value { node: mm.node, output }));
            let bias_ty = g.value_type(bias);
            let is_bias = !set.contains(&bias.node)
                && bias_ty.shape.rank() == 1
                && bias_ty.shape.dims().last() == kshape.dims().last();
            if matches!(g.node(mm.node).op, Op::MatMul { .. })
                && !set.contains(&mm.node)
                && g.value_type(mm).shape == *kshape
                && only_reader
                && is_bias
            {
                return Some(g.node(mm.node).name.to_string());
            }
        }
    }
    None
}
