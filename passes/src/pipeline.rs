//! The standard pipeline: which passes run, in which order.
//!
//! Forward graphs: `rewrite`, `attention`, `fuse`. Training steps:
//! `rewrite` (on the forward graph, so merged weights get their gradients
//! split back by autodiff), `attention` (also on the forward graph, so
//! autodiff differentiates the fused op whole), `mixed-precision`,
//! `training-step`, `recompute`, `partition` (only when data parallelism is
//! asked for), `fuse`.

use zeroplan_ir::build::{self, BuildOptions};
use zeroplan_ir::spec::{ModelSpec, TrainingSpec};
use zeroplan_ir::{DType, Graph};

use crate::attention::Attention;
use crate::fuse::Fuse;
use crate::manager::{Pass, PassContext, PassOptions, PassRecord, run_passes};
use crate::partition::Partition;
use crate::recompute::Recompute;
use crate::rewrite::Rewrite;
use crate::training::{MixedPrecision, TrainError, TrainingStep, training_forward};

/// The result of a pipeline run.
pub struct Compiled {
    pub graph: Graph,
    /// One record per pass, in order, disabled ones included.
    pub records: Vec<PassRecord>,
    /// What `--explain PASS` asked for.
    pub explanations: Vec<String>,
}

/// What to compile: a forward graph in a dtype, or a training step.
pub enum Target<'a> {
    Forward(DType),
    Training(&'a TrainingSpec),
}

/// The names of the passes a target runs, in order.
pub fn pass_names(target: &Target) -> Vec<&'static str> {
    match target {
        Target::Forward(_) => vec!["rewrite", "attention", "fuse"],
        Target::Training(_) => {
            vec!["rewrite", "attention", "mixed-precision", "training-step", "recompute", "partition", "fuse"]
        }
    }
}

/// Builds `model`'s graph for `target` and runs the standard passes.
pub fn compile(model: &ModelSpec, target: &Target, options: PassOptions) -> Result<Compiled, TrainError> {
    let known = pass_names(target);
    let unknown: Vec<&str> = options
        .disabled
        .iter()
        .chain(&options.dump_after)
        .chain(&options.explain)
        .map(String::as_str)
        .filter(|name| !known.contains(name))
        .collect();
    if !unknown.is_empty() {
        return Err(TrainError::Spec(format!(
            "unknown pass {}: the passes are {}",
            unknown.join(", "),
            known.join(", ")
        )));
    }
    let mut cx = PassContext::new(options);
    let (graph, records) = match target {
        Target::Forward(dtype) => {
            let forward = build::forward(model, &BuildOptions::new(*dtype))?;
            run_passes(forward, &[&Rewrite, &Attention, &Fuse], &mut cx)
        }
        Target::Training(train) => {
            let (t, sp) = (cx.options.tensor_parallel.unwrap_or(1), cx.options.sequence_parallel);
            let forward = training_forward(model, train, t, sp)?;
            let step = TrainingStep { train: (*train).clone() };
            let recompute = Recompute { policy: cx.options.recompute };
            let mut passes: Vec<&dyn Pass> = vec![&Rewrite, &Attention, &MixedPrecision, &step, &recompute];
            let partition = cx.options.data_parallel.map(|data_parallel| Partition { data_parallel });
            if let Some(partition) = &partition {
                passes.push(partition);
            }
            passes.push(&Fuse);
            run_passes(forward, &passes, &mut cx)
        }
    }
    .map_err(|e| TrainError::Pass(Box::new(e)))?;
    Ok(Compiled { graph, records, explanations: cx.explanations })
}
