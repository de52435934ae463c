//! Reading the per-parameter optimizer the `training-step` pass built: for
//! each AdamW node, the parameter, its working copy, the raw gradient the
//! backward computes, and every node the partition pass replaces.

use rustc_hash::{FxHashMap, FxHashSet};
use zeroplan_ir::{Graph, NodeIndex, Op, Phase, Value};

/// One parameter's place in the per-parameter optimizer.
pub(super) struct Slot {
    pub param: NodeIndex,
    /// The 16-bit working copy (`P.bf16`) under mixed precision.
    pub working: Option<NodeIndex>,
    /// The gradient as the backward computes it, once per micro-batch.
    pub raw_grad: Value,
    pub weight_decay: f64,
}

/// The optimizer of a training graph, read back.
pub(super) struct Step {
    pub slots: Vec<Slot>,
    /// `(beta1, beta2, eps)`, shared by every AdamW node.
    pub betas_eps: (f64, f64, f64),
    /// `lr, step, multiplier, finite`: AdamW's steering scalars.
    pub scalars: [Value; 4],
    /// The `grad_scale` node whose first operand is the squared global norm.
    pub grad_scale: NodeIndex,
    /// Nodes the partition pass replaces.
    pub replaced: FxHashSet<NodeIndex>,
}

/// The optimizer of `graph`, or `None` when it has none (a forward graph).
pub(super) fn read(graph: &Graph) -> Result<Option<Step>, String> {
    let order = graph.topo_order();
    let mut slots = Vec::new();
    let mut replaced = FxHashSet::default();
    let mut shared = None;
    // The gradients AdamW applies: what the squared global norm sums.
    let mut applied: FxHashSet<Value> = FxHashSet::default();
    // Each state's updates, in the graph's order: an accumulator's are
    // looked up once per parameter.
    let mut updates: FxHashMap<NodeIndex, Vec<Value>> = FxHashMap::default();
    for (target, v) in &graph.updates {
        updates.entry(*target).or_default().push(*v);
    }
    for &n in &order {
        let Op::AdamW { beta1, beta2, eps, weight_decay } = graph.node(n).op else { continue };
        let ops = graph.operands(n);
        let param = ops[0].node;
        if !matches!(graph.node(param).op, Op::Param { .. }) {
            return Err(format!("`{}` does not update a parameter", graph.node(n).name));
        }
        let scalars = [ops[4], ops[5], ops[6], ops[7]];
        match shared {
            None => shared = Some(((beta1, beta2, eps), scalars)),
            Some((b, s)) if b == (beta1, beta2, eps) && s == scalars => {}
            Some(_) => return Err("AdamW nodes with different betas, eps or steering scalars".into()),
        }
        replaced.extend([n, param, ops[2].node, ops[3].node]);
        let working = graph.users(param).iter().copied().find(|&u| matches!(graph.node(u).op, Op::Cast { .. }));
        replaced.extend(working);
        applied.insert(ops[1]);
        let raw_grad = raw_gradient(graph, ops[1], &updates, &mut replaced)?;
        slots.push(Slot { param, working, raw_grad, weight_decay });
    }
    let Some(((beta1, beta2, eps), scalars)) = shared else { return Ok(None) };
    let grad_scale = scalars[2].node;
    // The squared global norm: a squared_sum per gradient, the adds that
    // total them and, with tensor parallelism, the shares of replicated
    // parameters and the sum over the tensor ranks.
    for &n in &order {
        let node = graph.node(n);
        let operands = graph.operands(n);
        let of_replaced = || node.phase == Phase::Optimizer && operands.iter().all(|v| replaced.contains(&v.node));
        let total = match node.op {
            Op::SquaredSum => applied.contains(&operands[0]),
            Op::Add | Op::Scale { .. } | Op::TensorAllReduce { .. } => of_replaced(),
            _ => false,
        };
        if total {
            replaced.insert(n);
        }
    }
    if !replaced.contains(&graph.operands(grad_scale)[0].node) {
        return Err("the squared gradient norm is not a sum of squared_sum nodes".into());
    }
    Ok(Some(Step { slots, betas_eps: (beta1, beta2, eps), scalars, grad_scale, replaced }))
}

/// The gradient as computed once per micro-batch: `grad` itself, or, when
/// `grad` is an accumulator, what the backward adds into it (the raw
/// gradient before its cast to f32). Accumulator nodes join `replaced`.
fn raw_gradient(
    graph: &Graph,
    grad: Value,
    updates: &FxHashMap<NodeIndex, Vec<Value>>,
    replaced: &mut FxHashSet<NodeIndex>,
) -> Result<Value, String> {
    if !matches!(graph.node(grad.node).op, Op::State { .. }) {
        return Ok(grad);
    }
    replaced.insert(grad.node);
    let mut raw = None;
    for v in updates.get(&grad.node).into_iter().flatten() {
        replaced.insert(v.node);
        if graph.node(v.node).phase == Phase::Backward {
            let added = graph.operands(v.node).iter().copied().find(|o| o.node != grad.node);
            let added = added.ok_or_else(|| format!("accumulator `{}` adds nothing", graph.node(grad.node).name))?;
            raw = Some(match graph.node(added.node).op {
                Op::Cast { .. } => {
                    replaced.insert(added.node);
                    graph.operands(added.node)[0]
                }
                _ => added,
            });
        }
    }
    raw.ok_or_else(|| format!("accumulator `{}` has no backward update", graph.node(grad.node).name))
}
