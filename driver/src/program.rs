//! A model compiled for the host: the pass pipeline, the memory plan and the
//! program for one batch × sequence length, loaded on the host runtime — what
//! the embedder, the classifier and fine-tuning run.

use std::collections::BTreeSet;

use zeroplan_ir::interp::State;
use zeroplan_ir::plan::Program;
use zeroplan_ir::spec::ModelSpec;
use zeroplan_ir::{Bindings, DType};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};

use zeroplan_runtime::HostProgram;

/// `model` compiled for `target` with every pass on and planned for `batch` × `seq`.
pub fn plan(model: &ModelSpec, target: &Target, batch: usize, seq: usize) -> Result<Program, String> {
    let bindings: Bindings = [("batch".to_string(), batch as u64), ("seq".to_string(), seq as u64)].into();
    let options = PassOptions { shape_hint: bindings.clone(), ..PassOptions::default() };
    let graph = compile(model, target, options).map_err(|e| e.to_string())?.graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).map_err(|e| e.to_string())?;
    Ok(zeroplan_passes::planner::program::program(graph, &memory, batch as u64, seq as u64))
}

/// `model`'s f32 forward for `batch` × `seq` on the host, its parameters set
/// from `weights`, reading back only `outputs`.
///
/// `weights` must name exactly the program's parameters. The passes keep
/// parameters as they are (a merged Q/K/V matmul concatenates the separate
/// weights each step), so a forward graph's names are the program's; a
/// parameter not set here would silently keep its random initial value.
pub fn forward(
    model: &ModelSpec,
    batch: usize,
    seq: usize,
    weights: &State,
    outputs: &[&str],
) -> Result<HostProgram, String> {
    let program = plan(model, &Target::Forward(DType::F32), batch, seq)?;
    let graph = &program.graph;
    let ours: BTreeSet<&str> = graph.params().into_iter().map(|n| &*graph.node(n).name).collect();
    let given: BTreeSet<&str> = weights.keys().map(String::as_str).collect();
    if ours != given {
        let list = |a: &BTreeSet<&str>, b: &BTreeSet<&str>| a.difference(b).copied().collect::<Vec<_>>().join(", ");
        return Err(format!(
            "the compiled program's parameters are not the weights': only the program has [{}], only the weights \
             [{}]",
            list(&ours, &given),
            list(&given, &ours)
        ));
    }
    let mut host = HostProgram::load_with(program, 0, weights).map_err(|e| e.to_string())?;
    host.fetch(outputs).map_err(|e| e.to_string())?;
    Ok(host)
}
