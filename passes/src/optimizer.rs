//! The optimizer phase: gradient accumulation, global-norm clipping, the
//! learning-rate schedule, AdamW and dynamic loss scaling, as graph ops.
//!
//! State (persistent, f32): per parameter the AdamW moments `P.adam_m`,
//! `P.adam_v` and, with several micro-batches, the accumulator `P.grad_acc`;
//! per step `train.step` (completed steps) and, under fp16,
//! `train.loss_scale` and `train.good_steps`.

use std::collections::BTreeMap;
use zeroplan_ir::spec::{Precision, TrainingSpec};
use zeroplan_ir::{DType, Graph, GraphError, Init, NodeIndex, Op, Phase, Shape, TensorType, Value};

use crate::names::dotted;

/// Steering scalars shared by the backward and optimizer phases.
pub struct LossScale {
    /// dloss: the loss scale under fp16, else the constant 1.
    pub seed: Value,
    /// The loss-scale state (fp16 only).
    state: Option<(Value, Value)>,
}

fn scalar() -> TensorType {
    TensorType::new(Shape::scalar(), DType::F32)
}

/// Creates the loss-scale seed of the backward phase.
pub fn loss_scale(graph: &mut Graph, train: &TrainingSpec) -> Result<LossScale, GraphError> {
    graph.phase = Phase::Backward;
    Ok(match train.precision {
        Precision::F16(s) => {
            let scale = graph.source(
                "train.loss_scale",
                Op::State { init: Init::Constant { value: s.initial_scale } },
                scalar(),
            )?;
            let good = graph.source("train.good_steps", Op::State { init: Init::Zeros }, scalar())?;
            LossScale { seed: scale, state: Some((scale, good)) }
        }
        Precision::F32 | Precision::Bf16 => {
            LossScale { seed: graph.source("train.dloss", Op::Fill { value: 1.0 }, scalar())?, state: None }
        }
    })
}

/// Biases and LayerNorm parameters, which Hugging Face does not decay.
fn is_norm_or_bias(name: &str) -> bool {
    name.ends_with(".bias") || name.ends_with(".gamma") || name.ends_with(".beta")
}

/// This tensor rank's share of a squared norm `sq` of gradients of a
/// parameter initialised as `init`: all of it for a tensor shard, `1/t` of
/// it for a parameter every one of the `t` tensor ranks holds whole (their
/// gradients are equal), so that [`tensor_sum`] counts each element once.
pub(crate) fn norm_share(graph: &mut Graph, name: &str, sq: Value, init: Init, t: u64) -> Result<Value, GraphError> {
    if t == 1 || init.tensor_shard_ranks().is_some() {
        return Ok(sq);
    }
    graph.add(dotted(&[name, "tensor_share"]), Op::Scale { factor: 1.0 / t as f64 }, &[sq])
}

/// The sum of `x` over the `t` tensor-parallel ranks (itself with one).
pub(crate) fn tensor_sum(graph: &mut Graph, name: &str, x: Value, t: u64) -> Result<Value, GraphError> {
    if t == 1 {
        return Ok(x);
    }
    graph.add(dotted(&[name, "tensor_all_reduce"]), Op::TensorAllReduce { ranks: t }, &[x])
}

/// Appends accumulation (backward phase) and the optimizer phase for
/// `grads`, the gradient of each parameter.
pub fn optimizer(
    graph: &mut Graph,
    train: &TrainingSpec,
    grads: &BTreeMap<NodeIndex, Value>,
    scale: &LossScale,
) -> Result<(), GraphError> {
    let params = graph.params();
    // With several micro-batches each gradient is summed into an f32
    // accumulator after every micro-batch; the optimizer reads that.
    let mut applied: Vec<(NodeIndex, Value)> = Vec::with_capacity(params.len());
    for &p in &params {
        let name = graph.node(p).name.clone();
        let ty = graph.node(p).outputs[0].clone();
        graph.phase = Phase::Backward;
        let grad = match grads.get(&p) {
            Some(grad) => *grad,
            None => graph.source(dotted(&[&name, "grad_zero"]), Op::Fill { value: 0.0 }, ty.clone())?,
        };
        if train.micro_batches == 1 {
            applied.push((p, grad));
            continue;
        }
        let acc_ty = TensorType::new(ty.shape.clone(), DType::F32);
        let acc = graph.source(dotted(&[&name, "grad_acc"]), Op::State { init: Init::Zeros }, acc_ty.clone())?;
        let grad32 = if graph.value_type(grad).dtype == DType::F32 {
            grad
        } else {
            graph.add(dotted(&[&name, "grad_f32"]), Op::Cast { to: DType::F32 }, &[grad])?
        };
        let sum = graph.add(dotted(&[&name, "grad_acc.next"]), Op::Add, &[acc, grad32])?;
        graph.set_update(acc.node, sum)?;
        graph.phase = Phase::Optimizer;
        let zero = graph.source(dotted(&[&name, "grad_acc.zero"]), Op::Fill { value: 0.0 }, acc_ty)?;
        graph.set_update(acc.node, zero)?;
        applied.push((p, acc));
    }

    graph.phase = Phase::Optimizer;
    let tensor_ranks = graph.tensor_parallel();
    let mut squared: Option<Value> = None;
    for (p, grad) in &applied {
        let name = dotted(&[&graph.node(*p).name, "grad_sq"]);
        let sq = graph.add(name.clone(), Op::SquaredSum, &[*grad])?;
        let Op::Param { init } = &graph.node(*p).op else { unreachable!("params() holds parameters") };
        let sq = norm_share(graph, &name, sq, init.clone(), tensor_ranks)?;
        squared = Some(match squared {
            None => sq,
            Some(total) => graph.add(dotted(&["train.grad_sq", &graph.node(*p).name]), Op::Add, &[total, sq])?,
        });
    }
    let Some(squared) = squared else { return Ok(()) };
    let squared = tensor_sum(graph, "train.grad_sq", squared, tensor_ranks)?;
    let one = || Op::Fill { value: 1.0 };
    let loss_scale = match scale.state {
        Some((s, _)) => s,
        None => graph.source("train.unscaled", one(), scalar())?,
    };
    let clip = Op::GradScale { max_norm: train.max_grad_norm, micro_batches: train.micro_batches };
    let steer = graph.add_multi("train.grad_scale", clip, &[squared, loss_scale])?;
    let (multiplier, finite) = (steer[0], steer[1]);
    let step = graph.source("train.step", Op::State { init: Init::Zeros }, scalar())?;
    let schedule = Op::LrSchedule { peak: train.lr, warmup_steps: train.warmup_steps, total_steps: train.total_steps };
    let lr = graph.add("train.lr", schedule, &[step])?;
    let next_step = graph.add("train.step.next", Op::Add, &[step, finite])?;
    graph.set_update(step.node, next_step)?;
    for (p, grad) in applied {
        let name = graph.node(p).name.clone();
        let ty = graph.node(p).outputs[0].clone();
        let m = graph.source(dotted(&[&name, "adam_m"]), Op::State { init: Init::Zeros }, ty.clone())?;
        let v = graph.source(dotted(&[&name, "adam_v"]), Op::State { init: Init::Zeros }, ty)?;
        let decay = if train.decay_norms_and_biases || !is_norm_or_bias(&name) { train.weight_decay } else { 0.0 };
        let adamw = Op::AdamW { beta1: train.betas.0, beta2: train.betas.1, eps: train.eps, weight_decay: decay };
        let param = Value { node: p, output: 0 };
        let out = graph.add_multi(
            dotted(&[&name, "adamw"]),
            adamw,
            &[param, grad, m, v, lr, next_step, multiplier, finite],
        )?;
        graph.set_update(p, out[0])?;
        graph.set_update(m.node, out[1])?;
        graph.set_update(v.node, out[2])?;
    }
    if let (Some((s, good)), Precision::F16(cfg)) = (scale.state, train.precision) {
        let update =
            Op::LossScaleUpdate { growth_interval: cfg.growth_interval, growth: cfg.growth, backoff: cfg.backoff };
        let next = graph.add_multi("train.loss_scale.next", update, &[s, good, finite])?;
        graph.set_update(s.node, next[0])?;
        graph.set_update(good.node, next[1])?;
        graph.set_output("loss_scale", s);
    }
    graph.set_output("lr", lr);
    graph.set_output("grad_sq", squared);
    graph.set_output("finite", finite);
    Ok(())
}
