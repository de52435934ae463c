//! The standard pipeline: which passes run, in which order.
//!
//! Forward graphs: `rewrite`, `attention`, `fuse`. Training steps:
//! `rewrite` (on the forward graph, so merged weights get their gradients
//! split back by autodiff), `attention` (also on the forward graph, so
//! autodiff differentiates the fused op whole), `tiling` (only when tiles
//! are asked for; on the forward graph, so autodiff tiles the backward
//! too), `mixed-precision`,
//! `training-step`, `recompute`, `regather` and `collective-matmul`
//! (only with sequence parallelism), `partition` (only when data
//! parallelism is asked for), `fuse`.

use zeroplan_ir::build::{self, BuildOptions};
use zeroplan_ir::plan::DataParallel;
use zeroplan_ir::spec::{ModelSpec, TrainingSpec};
use zeroplan_ir::{DType, Graph};

use crate::attention::Attention;
use crate::collective_matmul::CollectiveMatmul;
use crate::fuse::Fuse;
use crate::manager::{Pass, PassContext, PassOptions, PassRecord, run_passes};
use crate::partition::Partition;
use crate::recompute::Recompute;
use crate::regather::Regather;
use crate::rewrite::Rewrite;
use crate::tiling::Tiling;
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

/// The standard passes for `target`, in order, as `options` configure
/// them: the one list, so names, order and configuration cannot drift
/// apart. `partition` is built only when data parallelism is asked for,
/// `tiling` only when tiles are, `regather` and `collective-matmul` only
/// with sequence parallelism.
fn passes(target: &Target, options: &PassOptions) -> Vec<Box<dyn Pass>> {
    match target {
        Target::Forward(_) => vec![Box::new(Rewrite), Box::new(Attention), Box::new(Fuse)],
        Target::Training(train) => {
            let mut passes: Vec<Box<dyn Pass>> = vec![Box::new(Rewrite), Box::new(Attention)];
            passes.extend(options.tiles.map(|tiles| Box::new(Tiling { tiles }) as _));
            passes.extend::<[Box<dyn Pass>; 3]>([
                Box::new(MixedPrecision),
                Box::new(TrainingStep { train: (*train).clone() }),
                Box::new(Recompute { policy: options.recompute }),
            ]);
            if options.sequence_parallel {
                passes.push(Box::new(Regather));
                passes.push(Box::new(CollectiveMatmul));
            }
            passes.extend(options.data_parallel.map(|data_parallel| Box::new(Partition { data_parallel }) as _));
            passes.push(Box::new(Fuse));
            passes
        }
    }
}

/// The names of the passes a target can run, in order (`tiling`,
/// `regather`, `collective-matmul` and `partition` among them, though they
/// run only when asked for).
pub fn pass_names(target: &Target) -> Vec<&'static str> {
    let every = PassOptions {
        data_parallel: Some(DataParallel::single()),
        tiles: Some(1),
        sequence_parallel: true,
        ..PassOptions::default()
    };
    passes(target, &every).iter().map(|pass| pass.name()).collect()
}

/// Builds `model`'s graph for `target` and runs the standard passes.
pub fn compile(model: &ModelSpec, target: &Target, options: PassOptions) -> Result<Compiled, TrainError> {
    compile_between(model, target, options, Resume::Build, None)
}

/// Where [`compile_between`] starts.
pub enum Resume {
    /// From the model: build its graph, then run the first pass.
    Build,
    /// From `graph`, which the passes up to and including `after` made.
    After { graph: Box<Graph>, after: &'static str },
}

/// Runs the standard passes of `target` from `from` through the pass named
/// `through` (to the last where `None`). The planner compiles the part of
/// a step its choices share once ([`crate::planner::shared`]) and resumes
/// from it for each choice.
pub fn compile_between(
    model: &ModelSpec,
    target: &Target,
    options: PassOptions,
    from: Resume,
    through: Option<&str>,
) -> Result<Compiled, TrainError> {
    let known = pass_names(target);
    let unknown: Vec<&str> = options
        .disabled
        .iter()
        .chain(&options.dump_after)
        .chain(&options.explain)
        .map(String::as_str)
        .chain(through)
        .chain(match &from {
            Resume::Build => None,
            Resume::After { after, .. } => Some(*after),
        })
        .filter(|name| !known.contains(name))
        .collect();
    if !unknown.is_empty() {
        return Err(TrainError::Spec(format!(
            "unknown pass {}: the passes are {}",
            unknown.join(", "),
            known.join(", ")
        )));
    }
    let passes = passes(target, &options);
    let passes: Vec<&dyn Pass> = passes.iter().map(Box::as_ref).collect();
    let position = |name: &str| passes.iter().position(|p| p.name() == name);
    let mut cx = PassContext::new(options);
    let (graph, first) = match from {
        Resume::Build => {
            let graph = match target {
                Target::Forward(dtype) => build::forward(model, &BuildOptions::new(*dtype))?,
                Target::Training(train) => training_forward(
                    model,
                    train,
                    cx.options.tensor_parallel.unwrap_or(1),
                    cx.options.sequence_parallel,
                )?,
            };
            (graph, 0)
        }
        Resume::After { graph, after } => {
            let at = position(after).ok_or_else(|| TrainError::Spec(format!("pass {after} does not run here")))?;
            (*graph, at + 1)
        }
    };
    let last = match through {
        Some(name) => position(name).ok_or_else(|| TrainError::Spec(format!("pass {name} does not run here")))? + 1,
        None => passes.len(),
    };
    let (graph, records) =
        run_passes(graph, &passes[first..last.max(first)], &mut cx).map_err(|e| TrainError::Pass(Box::new(e)))?;
    Ok(Compiled { graph, records, explanations: cx.explanations })
}
