//! The `reference` backend: training steps run by the reference interpreter.
//!
//! Slow and exact: it is the oracle the compiled backends are compared
//! with, and it lets every plan's numerics be checked on any machine.

use std::collections::BTreeMap;
use zeroplan_ir::interp::{Feeds, InterpError, Interpreter, Rounding, State, StepOutputs};
use zeroplan_ir::{Graph, Op, Tensor};

/// What one optimizer step reports.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepLog {
    /// 1-based count of steps run, skipped ones included.
    pub step: u64,
    /// Mean loss over the step's micro-batches.
    pub loss: f64,
    /// The learning rate this step applied.
    pub lr: f64,
    /// Global L2 norm of the mean gradient, before clipping.
    pub grad_norm: f64,
    /// The fp16 loss scale this step ran with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// The step was skipped: its gradients overflowed.
    pub skipped: bool,
}

/// The log line `zeroplan train` prints for a step (one format for every
/// backend, so logs of a run and of its reference diff line by line).
impl std::fmt::Display for StepLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {:>4}  loss {:.6}  lr {:.3e}  grad norm {:.4}", self.step, self.loss, self.lr, self.grad_norm)?;
        if let Some(scale) = self.loss_scale {
            write!(f, "  loss scale {scale}")?;
        }
        if self.skipped {
            write!(f, "  (skipped: gradients overflowed)")?;
        }
        Ok(())
    }
}

/// A training graph and its state, stepped by the interpreter.
pub struct ReferenceTrainer {
    graph: Graph,
    interpreter: Interpreter,
    state: State,
    micro_batches: u64,
    steps: u64,
}

/// Why a training step failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainStepError {
    #[error(transparent)]
    Interp(#[from] InterpError),
    #[error("step {step}: the graph output `{name}` is missing or not a scalar")]
    MissingOutput { step: u64, name: &'static str },
    #[error("step {step}: {count} micro-batches given, the graph accumulates {expected}")]
    MicroBatches { step: u64, count: usize, expected: u64 },
}

impl ReferenceTrainer {
    /// Initialises every parameter and state of `graph` from `seed`.
    /// `Rounding::Native` rounds every value to its dtype, as hardware would.
    pub fn new(graph: Graph, seed: u64, rounding: Rounding) -> Result<ReferenceTrainer, InterpError> {
        let interpreter = Interpreter { rounding, seed };
        let state = interpreter.init_state(&graph)?;
        let micro_batches = micro_batches(&graph);
        Ok(ReferenceTrainer { graph, interpreter, state, micro_batches, steps: 0 })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Parameters and optimizer state, by node name.
    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn state_mut(&mut self) -> &mut State {
        &mut self.state
    }

    /// The parameters alone, by name.
    pub fn weights(&self) -> BTreeMap<String, Tensor> {
        self.graph
            .params()
            .into_iter()
            .map(|p| self.graph.node(p).name.to_string())
            .filter_map(|name| self.state.get(&name).map(|t| (name, t.clone())))
            .collect()
    }

    /// Overwrites parameters by name (e.g. from a checkpoint).
    pub fn set_weights(&mut self, weights: BTreeMap<String, Tensor>) {
        self.state.extend(weights);
    }

    /// `feeds` with float tensors rounded to the dtype their input declares
    /// (f32 regression targets feed a bf16 graph).
    fn conform(&self, feeds: &Feeds) -> Feeds {
        feeds
            .iter()
            .map(|(name, t)| {
                let declared = self.graph.node_by_name(name).map(|n| self.graph.node(n).outputs[0].dtype);
                let t = match declared {
                    Some(d) if d != t.dtype() && d.is_float() && t.dtype().is_float() => t.cast(d),
                    _ => t.clone(),
                };
                (name.clone(), t)
            })
            .collect()
    }

    /// One optimizer step over `micro_batches` (as many as the graph accumulates).
    pub fn step(&mut self, micro_batches: &[Feeds]) -> Result<StepLog, TrainStepError> {
        let step = self.steps + 1;
        if micro_batches.len() as u64 != self.micro_batches {
            return Err(TrainStepError::MicroBatches {
                step,
                count: micro_batches.len(),
                expected: self.micro_batches,
            });
        }
        let conformed: Vec<Feeds> = micro_batches.iter().map(|feeds| self.conform(feeds)).collect();
        let out = self.interpreter.step(&self.graph, &mut self.state, &conformed, self.steps)?;
        self.steps = step;
        StepLog::from_outputs(step, &out)
    }
}

/// The micro-batches a training graph accumulates per step on each rank
/// (its `grad_scale` averages over micro-batches × data-parallel ranks; 1
/// for a graph without one, such as a forward graph).
pub fn micro_batches(graph: &Graph) -> u64 {
    let averaged = graph
        .nodes()
        .find_map(|n| match n.op {
            Op::GradScale { micro_batches, .. } => Some(micro_batches),
            _ => None,
        })
        .unwrap_or(1);
    (averaged / data_parallel_ranks(graph)).max(1)
}

/// The data-parallel ranks a graph's collectives and shards span (1 when
/// it has none).
pub fn data_parallel_ranks(graph: &Graph) -> u64 {
    graph
        .nodes()
        .filter_map(|n| match n.op {
            Op::AllReduce { ranks } | Op::ReduceScatter { ranks } | Op::AllGather { ranks } => Some(ranks),
            _ => None,
        })
        .max()
        .unwrap_or(1)
}

/// The tensor-parallel ranks a program was built for (1 without tensor
/// parallelism): the ranks of its Megatron-LM ops.
pub fn tensor_parallel_ranks(graph: &Graph) -> u64 {
    graph.nodes().filter_map(|n| n.op.tensor_ranks()).max().unwrap_or(1)
}

impl StepLog {
    /// The outputs [`StepLog::from_outputs`] reads (`loss_scale` only
    /// where the program scales the loss).
    pub const OUTPUTS: [&'static str; 5] = ["loss", "loss_scale", "finite", "grad_sq", "lr"];

    /// The log of step `step` (1-based) from what the step's graph outputs
    /// gave: `loss` per micro-batch, `lr`, `grad_sq` and `finite` once, and
    /// `loss_scale` under fp16.
    pub fn from_outputs(step: u64, out: &StepOutputs) -> Result<StepLog, TrainStepError> {
        StepLog::from_rank_outputs(step, out, 1)
    }

    /// As [`StepLog::from_outputs`], for one rank of `ranks` data-parallel
    /// ranks: the loss is this rank's; `grad_sq` is of the gradient summed
    /// over every rank's micro-batches, so the norm of the mean divides by
    /// micro-batches × ranks.
    pub fn from_rank_outputs(step: u64, out: &StepOutputs, ranks: u64) -> Result<StepLog, TrainStepError> {
        let scalar = |map: &BTreeMap<String, Tensor>, name: &'static str| {
            map.get(name).and_then(Tensor::item).ok_or(TrainStepError::MissingOutput { step, name })
        };
        let k = out.micro_batches.len().max(1);
        let mut loss = 0.0;
        for outputs in &out.micro_batches {
            loss += scalar(outputs, "loss")?;
        }
        loss /= k as f64;
        // The loss scale is read in the backward phase: a per-micro-batch output.
        let loss_scale = out.micro_batches.first().and_then(|m| m.get("loss_scale")).and_then(Tensor::item);
        let finite = scalar(&out.optimizer, "finite")? == 1.0;
        let raw_norm = scalar(&out.optimizer, "grad_sq")?.sqrt();
        Ok(StepLog {
            step,
            loss,
            lr: scalar(&out.optimizer, "lr")?,
            grad_norm: raw_norm / (loss_scale.unwrap_or(1.0) * (k as u64 * ranks.max(1)) as f64),
            loss_scale,
            skipped: !finite,
        })
    }
}
