//! Recognising an AdamW update, fused or not: the planner's accounting, the
//! memory plan's liveness and a GPU's multi-tensor AdamW all ask which node
//! updates which parameter with which moments.

use crate::{Graph, NodeIndex, Op, Value};

/// The operands `(param, grad, m, v, lr, step, multiplier, finite)` of an
/// AdamW update at node `n`: an `adamw` node, or the kernel the `fuse` pass
/// makes of one (pattern `adamw`: a lone `adamw` node, whose operands the
/// kernel keeps in order).
pub fn adamw_operands(graph: &Graph, n: NodeIndex) -> Option<&[Value]> {
    match &graph.node(n).op {
        Op::AdamW { .. } => Some(graph.operands(n)),
        Op::Fused { kernel } if kernel.pattern.as_deref() == Some("adamw") => Some(graph.operands(n)),
        _ => None,
    }
}
