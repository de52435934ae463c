//! Reverse-mode automatic differentiation.
//!
//! [`backward`] appends to a graph the gradient of one scalar (the loss)
//! with respect to every parameter, as ordinary ops in the backward phase.
//! It walks the nodes in reverse topological order; each node's output
//! gradients are the sum of what its consumers sent back, and its VJP rule
//! ([`vjp`]) sends gradients on to those of its operands that depend on a
//! parameter. A weight used in several places (ALBERT's shared layers, the
//! MLM decoder tied to the word embeddings) gets the sum of every use.
//! The sum runs as the parts arrive, so one partial sum is live rather than
//! every part: a value read by many (an activation read by each tile of a
//! tiled matmul) would otherwise hold a full-size gradient per reader.
//!
//! Names: the gradient that consumer `C` sends to its operand `i` is
//! `C.back{i}` (helper nodes `C.back{i}.…`); a sum of several is
//! `grad.VALUE`. A parameter read through a 16-bit working copy (mixed
//! precision) gets the working copy's gradient as is, in 16 bits: the
//! optimizer reads it directly, so no f32 copy of the gradients exists.

mod vjp;

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;
use zeroplan_ir::{Graph, GraphError, NodeIndex, Op, Phase, Value};

/// Why a graph could not be differentiated.
#[derive(Debug, thiserror::Error)]
pub enum AutodiffError {
    #[error("node `{node}` ({op}) cannot be differentiated: {why}")]
    NotDifferentiable { node: String, op: &'static str, why: String },
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// Appends the backward phase for `loss` to `graph`, seeded with `seed`
/// (dloss; the loss scale under fp16). Returns each parameter's gradient;
/// parameters the loss does not depend on are absent.
pub fn backward(graph: &mut Graph, loss: Value, seed: Value) -> Result<BTreeMap<NodeIndex, Value>, AutodiffError> {
    let order = graph.topo_order();
    let depends = depends_on_params(graph, &order);
    let previous_phase = std::mem::replace(&mut graph.phase, Phase::Backward);
    let mut pending: FxHashMap<Value, Sum> = FxHashMap::default();
    pending.insert(loss, Sum { total: seed, parts: 1 });
    let mut param_grads = BTreeMap::new();
    for &n in order.iter().rev() {
        let outputs = graph.node(n).outputs.len() as u32;
        let mut dys = Vec::with_capacity(outputs as usize);
        for output in 0..outputs {
            let v = Value { node: n, output };
            dys.push(match pending.remove(&v) {
                Some(sum) => Some(sum.finish(graph, v)?),
                None => None,
            });
        }
        if dys.iter().all(Option::is_none) {
            continue;
        }
        if matches!(graph.node(n).op, Op::Param { .. }) {
            param_grads.insert(n, dys[0].expect("a parameter has one output"));
            continue;
        }
        let operands = graph.operands(n).to_vec();
        let wanted: Vec<bool> = operands.iter().map(|v| depends.contains(&v.node)).collect();
        let grads = vjp::vjp(graph, n, &dys, &wanted)?;
        for ((operand, grad), want) in operands.into_iter().zip(grads).zip(wanted) {
            if let (Some(grad), true) = (grad, want) {
                match pending.get_mut(&operand) {
                    Some(sum) => sum.add(graph, operand, grad)?,
                    None => {
                        pending.insert(operand, Sum { total: grad, parts: 1 });
                    }
                }
            }
        }
    }
    graph.phase = previous_phase;
    Ok(param_grads)
}

/// The nodes whose value depends on some parameter.
fn depends_on_params(graph: &Graph, order: &[NodeIndex]) -> FxHashSet<NodeIndex> {
    let mut depends = FxHashSet::default();
    for &n in order {
        let is_param = matches!(graph.node(n).op, Op::Param { .. });
        if is_param || graph.operands(n).iter().any(|v| depends.contains(&v.node)) {
            depends.insert(n);
        }
    }
    depends
}

/// The running sum of the gradients sent to one value, in the order they
/// were sent: partial sums `grad.V.1`, `grad.V.2`, …; the last is renamed
/// `grad.V` when the value's own node is reached.
struct Sum {
    total: Value,
    parts: usize,
}

impl Sum {
    fn add(&mut self, graph: &mut Graph, v: Value, part: Value) -> Result<(), GraphError> {
        let name = format!("grad.{}.{}", graph.value_ref(v), self.parts);
        self.total = graph.add(name, Op::Add, &[self.total, part])?;
        self.parts += 1;
        Ok(())
    }

    fn finish(self, graph: &mut Graph, v: Value) -> Result<Value, GraphError> {
        if self.parts > 1 {
            graph.rename(self.total.node, format!("grad.{}", graph.value_ref(v)))?;
        }
        Ok(self.total)
    }
}
