//! The whole training step as one graph: forward, loss, backward, optimizer.
//!
//! Two passes: [`MixedPrecision`] (f32 master weights behind 16-bit working
//! copies) and [`TrainingStep`] (loss scaling, autodiff, optimizer).
//! [`training_graph`] runs them on a freshly built forward graph; the
//! optimising pipeline (`crate::pipeline`) puts the rewrite pass before them
//! and fusion after.

use zeroplan_ir::build::{self, BuildError, BuildOptions};
use zeroplan_ir::spec::{ModelSpec, Precision, TrainingSpec};
use zeroplan_ir::{DType, Graph, GraphError, VerifyError};

use crate::autodiff::{AutodiffError, backward};
use crate::manager::{Pass, PassContext, PassError, PassOptions, run_passes};
use crate::{mixed_precision, optimizer};

/// Why a training graph could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Autodiff(#[from] AutodiffError),
    #[error("the training graph does not verify: {0}")]
    Verify(#[from] VerifyError),
    #[error("the training spec is invalid: {0}")]
    Spec(String),
    #[error("the model has no loss: its head is the bare encoder; use an MLM or classification head")]
    NoLoss,
    #[error(transparent)]
    Pass(Box<PassError>),
}

/// The forward graph of `model` built for training under `train`: its
/// dropout overridden, in the compute dtype of `train`'s precision, one
/// rank's of `tensor_parallel` (with Megatron's sequence parallelism when
/// `sequence_parallel`). A model without a loss (the bare encoder) cannot
/// be trained.
pub fn training_forward(
    model: &ModelSpec,
    train: &TrainingSpec,
    tensor_parallel: u64,
    sequence_parallel: bool,
) -> Result<Graph, TrainError> {
    train.validate().map_err(|problems| {
        TrainError::Spec(problems.iter().map(|p| format!("{}: {}", p.field, p.message)).collect::<Vec<_>>().join("; "))
    })?;
    let mut model = model.clone();
    if let Some(p) = train.dropout {
        model.hidden_dropout = p;
        model.attention_dropout = p;
    }
    let dtype = match train.precision {
        Precision::F32 => DType::F32,
        Precision::Bf16 => DType::BF16,
        Precision::F16(_) => DType::F16,
    };
    let forward = build::forward(&model, &BuildOptions { dtype, tensor_parallel, sequence_parallel })?;
    if !forward.outputs.iter().any(|(name, _)| name == "loss") {
        return Err(TrainError::NoLoss);
    }
    Ok(forward)
}

/// The training-step graph of `model` under `train`, verified, without
/// the optimising passes.
pub fn training_graph(model: &ModelSpec, train: &TrainingSpec) -> Result<Graph, TrainError> {
    let forward = training_forward(model, train, 1, false)?;
    let step = TrainingStep { train: train.clone() };
    let mut cx = PassContext::new(PassOptions::default());
    let (graph, _) =
        run_passes(forward, &[&MixedPrecision, &step], &mut cx).map_err(|e| TrainError::Pass(Box::new(e)))?;
    Ok(graph)
}

/// f32 master weights behind 16-bit working copies ([`mixed_precision`]).
pub struct MixedPrecision;

impl Pass for MixedPrecision {
    fn name(&self) -> &'static str {
        "mixed-precision"
    }

    fn run(&self, graph: Graph, _: &mut PassContext) -> Result<Graph, PassError> {
        mixed_precision::master_weights(&graph).map_err(|error| PassError::Graph { pass: self.name(), error })
    }
}

/// Loss scaling, the backward phase and the optimizer phase, appended to a
/// forward graph with a `loss` output.
pub struct TrainingStep {
    pub train: TrainingSpec,
}

impl Pass for TrainingStep {
    fn name(&self) -> &'static str {
        "training-step"
    }

    fn run(&self, mut graph: Graph, cx: &mut PassContext) -> Result<Graph, PassError> {
        let fail = |message: String| PassError::Failed { pass: "training-step", message };
        let loss = graph
            .outputs
            .iter()
            .find(|(name, _)| name == "loss")
            .map(|(_, v)| *v)
            .ok_or_else(|| fail(TrainError::NoLoss.to_string()))?;
        let graph_error = |error| PassError::Graph { pass: "training-step", error };
        // The backward and the optimizer make the step 5.4–5.5 times the
        // forward's nodes (bert-large, and transformer-100t's tiled step):
        // room for that up front, so the node table is not moved as it grows.
        graph.reserve(graph.node_count() * 5);
        let scale = optimizer::loss_scale(&mut graph, &self.train).map_err(graph_error)?;
        let grads = backward(&mut graph, loss, scale.seed).map_err(|e| fail(e.to_string()))?;
        optimizer::optimizer(&mut graph, &self.train, &grads, &scale).map_err(graph_error)?;
        graph.phase = zeroplan_ir::Phase::Forward;
        cx.stat("parameters with gradients", grads.len());
        Ok(graph)
    }
}
