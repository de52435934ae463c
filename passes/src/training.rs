//! The whole training step as one graph: forward, loss, backward, optimizer.

use zeroplan_ir::build::{self, BuildError, BuildOptions};
use zeroplan_ir::spec::{ModelSpec, Precision, TrainingSpec};
use zeroplan_ir::{DType, Graph, GraphError, VerifyError};

use crate::autodiff::{AutodiffError, backward};
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
}

/// The training-step graph of `model` under `train`, verified.
///
/// Forward nodes run once per micro-batch, then backward (accumulating into
/// `P.grad_acc` when `micro_batches > 1`), then the optimizer once.
pub fn training_graph(model: &ModelSpec, train: &TrainingSpec) -> Result<Graph, TrainError> {
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
    let forward = build::forward(&model, &BuildOptions { dtype })?;
    let mut graph = mixed_precision::master_weights(&forward)?;
    let loss = graph.outputs.iter().find(|(name, _)| name == "loss").map(|(_, v)| *v).ok_or(TrainError::NoLoss)?;
    let scale = optimizer::loss_scale(&mut graph, train)?;
    let grads = backward(&mut graph, loss, scale.seed)?;
    optimizer::optimizer(&mut graph, train, &grads, &scale)?;
    graph.phase = zeroplan_ir::Phase::Forward;
    graph.verify()?;
    Ok(graph)
}
