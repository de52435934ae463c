//! Model-state bytes, read from a training graph.
//!
//! Every AdamW node (or the fuse pass's kernel of one) names a parameter (the
//! f32 master, or the f32 weight), the gradient it applies, and the two
//! moments. With the 16-bit working copies (a `cast` of a parameter, or
//! after partitioning the flat 16-bit parameters) and the accumulators, that
//! is the whole model state; the bytes follow from the dtypes and shard
//! sizes the graph states, so the familiar 16 bytes per parameter — and
//! ZeRO's per-rank formulas — are results, not assumptions.

use zeroplan_ir::{DType, Graph, Op, Phase, Value};

/// Bytes of model state by class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ModelStateBytes {
    /// Trained parameters (fp32 master weights under mixed precision).
    pub parameters: u64,
    /// 16-bit working copies of the parameters.
    pub working_copies: u64,
    /// The gradients the optimizer applies (the last micro-batch's, or the accumulators).
    pub gradients: u64,
    /// AdamW's two moments.
    pub optimizer: u64,
    /// Per-micro-batch gradients, when they are accumulated separately.
    pub micro_batch_gradients: u64,
}

impl ModelStateBytes {
    pub fn total(&self) -> u64 {
        self.parameters + self.working_copies + self.gradients + self.optimizer + self.micro_batch_gradients
    }
}

/// Model-state bytes of a training graph (per rank, after the partition
/// pass), and its parameter count.
pub fn model_state_bytes(graph: &Graph) -> (ModelStateBytes, u64) {
    let bytes = |v| graph.value_type(v).size_bytes(&Default::default()).unwrap_or(0);
    let mut total = ModelStateBytes::default();
    for n in graph.node_indices() {
        let out = Value { node: n, output: 0 };
        if let Some(ops) = zeroplan_ir::kernel::adamw_operands(graph, n) {
            // fp32 masters (a state, after partitioning) are parameters; a
            // parameter AdamW updates directly is counted below.
            if matches!(graph.node(ops[0].node).op, Op::State { .. }) {
                total.parameters += bytes(ops[0]);
            }
            total.gradients += bytes(held_gradient(graph, ops[1]));
            total.optimizer += bytes(ops[2]) + bytes(ops[3]);
            // An accumulated gradient: the per-micro-batch one is state too.
            if matches!(graph.node(ops[1].node).op, Op::State { .. }) {
                let param = &graph.node(ops[0].node).name;
                let raw = graph.node_by_name(&format!("{param}.grad_f32")).map(|c| graph.operands(c)[0]);
                total.micro_batch_gradients += raw.map_or(bytes(ops[1]), bytes);
            }
        } else if let Op::Param { .. } = &graph[n].op {
            match graph.value_type(out).dtype {
                DType::F32 => total.parameters += bytes(out),
                _ => total.working_copies += bytes(out),
            }
        } else if let Op::Cast { .. } = &graph[n].op {
            let source = graph.operands(n)[0];
            if matches!(graph.node(source.node).op, Op::Param { .. }) {
                total.working_copies += bytes(out);
            }
        }
    }
    (total, graph.parameter_count())
}

/// The gradient as the backward leaves it for the optimizer: `grad` before
/// the reductions and copies the optimizer phase applies to it (ZeRO-1
/// holds whole gradients and reduce-scatters them only after the backward).
pub(crate) fn held_gradient(graph: &Graph, mut grad: Value) -> Value {
    loop {
        let node = graph.node(grad.node);
        let passes_through = node.op.is_collective() || matches!(node.op, Op::Copy);
        if node.phase != Phase::Optimizer || !passes_through {
            return grad;
        }
        grad = graph.operands(grad.node)[0];
    }
}
