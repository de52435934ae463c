//! The pass manager: ordered, named passes behind one small trait, with the
//! verifier after each (in the manner of rustc's `MirPass`).
//!
//! A pass takes a verified graph and returns a verified graph. The manager
//! times each pass, verifies its output, writes the text IR after the passes
//! asked for, and skips the passes switched off by name.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use zeroplan_ir::{Graph, GraphError, VerifyError};

/// One transformation of the graph.
pub trait Pass {
    /// The pass's name, as `--disable` and `--dump-after` spell it.
    fn name(&self) -> &'static str;

    /// Transforms `graph`. Statistics and explanations go to `cx`.
    fn run(&self, graph: Graph, cx: &mut PassContext) -> Result<Graph, PassError>;
}

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("pass `{pass}`: {message}")]
    Failed { pass: &'static str, message: String },
    #[error("pass `{pass}` produced an ill-formed graph: {error}")]
    Verify { pass: &'static str, error: VerifyError },
    #[error("pass `{pass}`: {error}")]
    Graph { pass: &'static str, error: GraphError },
    #[error("writing the IR after `{pass}` to {path}: {error}")]
    Dump { pass: &'static str, path: PathBuf, error: std::io::Error },
}

/// Options every pass may read.
#[derive(Clone, Debug, Default)]
pub struct PassOptions {
    /// Passes not to run, by name.
    pub disabled: BTreeSet<String>,
    /// Print the text IR to standard error after these passes.
    pub dump_after: BTreeSet<String>,
    /// Write the text IR after every pass into this directory, as `NN-name.ir`.
    pub dump_dir: Option<PathBuf>,
    /// Stop applying rewrites after this many, to bisect a miscompile.
    pub pass_limit: Option<usize>,
    /// Passes whose decisions to explain (alternatives and their costs).
    pub explain: BTreeSet<String>,
    /// Which activations the backward recomputes (the `recompute` pass).
    pub recompute: crate::recompute::Policy,
    /// Values of the graph's symbols (`batch`, `seq`) that cost models
    /// assume: the per-GPU micro-batch and sequence length being planned.
    pub shape_hint: zeroplan_ir::Bindings,
    /// Data parallelism for the `partition` pass; without it the pass
    /// leaves the per-parameter optimizer as it is.
    pub data_parallel: Option<zeroplan_ir::plan::DataParallel>,
    /// Tensor-parallel ranks the training step is built for (Megatron-LM
    /// layers, [`zeroplan_ir::build`]); `None`: one.
    pub tensor_parallel: Option<u64>,
    /// Megatron's sequence parallelism over those tensor ranks (needs more
    /// than one): LayerNorm, dropout and residual regions on `seq/t`.
    pub sequence_parallel: bool,
    /// How the `collective-matmul` pass cuts sequence-parallel collectives
    /// and their GEMMs into overlapping chunks; `Whole` leaves them.
    pub collective_chunks: crate::collective_matmul::Chunks,
    /// Tiles of the largest gathered operator for the `tiling` pass
    /// (memory-centric tiling); `None`: the pass does not run.
    pub tiles: Option<u64>,
    /// Leave the graph unverified in release builds (debug builds verify
    /// after every pass regardless): the planner's search compiles hundreds
    /// of steps it only measures, where verification took a tenth of the
    /// time, and verifies the one it returns.
    pub skip_verify: bool,
    /// The step the `recompute` pass receives, weighed already (the
    /// planner's `optimal` budget): the pass uses it where it weighs that
    /// graph ([`crate::recompute::optimal::Weighed::weighs`]).
    pub weighed: Option<std::sync::Arc<crate::recompute::optimal::Weighed>>,
}

/// What passes share while a pipeline runs.
#[derive(Debug, Default)]
pub struct PassContext {
    pub options: PassOptions,
    /// Rewrite applications made so far, against `options.pass_limit`.
    pub applications: usize,
    /// Statistics lines of the pass that is running, collected by the manager.
    stats: Vec<(String, String)>,
    /// Explanations asked for with `options.explain`.
    pub explanations: Vec<String>,
}

impl PassContext {
    pub fn new(options: PassOptions) -> PassContext {
        PassContext { options, ..PassContext::default() }
    }

    /// Records a statistic of the running pass (`iterations`, `e-nodes`, …).
    pub fn stat(&mut self, key: impl Into<String>, value: impl ToString) {
        self.stats.push((key.into(), value.to_string()));
    }

    /// Whether another rewrite may be applied under `--pass-limit`; counts it.
    pub fn may_apply(&mut self) -> bool {
        let allowed = self.options.pass_limit.is_none_or(|limit| self.applications < limit);
        if allowed {
            self.applications += 1;
        }
        allowed
    }

    pub fn explains(&self, pass: &str) -> bool {
        self.options.explain.contains(pass)
    }
}

/// What one pass did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PassRecord {
    pub name: &'static str,
    /// False when switched off.
    pub ran: bool,
    #[serde(serialize_with = "as_millis")]
    pub time: Duration,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub stats: Vec<(String, String)>,
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// Runs `passes` in order over `graph`, verifying after each in debug builds
/// (so tests name the pass that broke the graph) and after the last in
/// release builds: verifying after every pass took 17% of a planner search
/// that compiles 1,446 programs (transformer-100t's nothing-fits answer).
pub fn run_passes(
    mut graph: Graph,
    passes: &[&dyn Pass],
    cx: &mut PassContext,
) -> Result<(Graph, Vec<PassRecord>), PassError> {
    let mut records = Vec::with_capacity(passes.len());
    for (index, pass) in passes.iter().enumerate() {
        let name = pass.name();
        let nodes_before = graph.node_count();
        if cx.options.disabled.contains(name) {
            let skipped = PassRecord {
                name,
                ran: false,
                time: Duration::ZERO,
                nodes_before,
                nodes_after: nodes_before,
                stats: Vec::new(),
            };
            records.push(skipped);
            continue;
        }
        let _span = tracing::info_span!("pass", name = %name, nodes = nodes_before).entered();
        let start = Instant::now();
        graph = pass.run(graph, cx)?;
        let time = start.elapsed();
        if cfg!(debug_assertions) {
            graph.verify().map_err(|error| PassError::Verify { pass: name, error })?;
        }
        dump(&graph, index, name, &cx.options)?;
        let stats = std::mem::take(&mut cx.stats);
        records.push(PassRecord { name, ran: true, time, nodes_before, nodes_after: graph.node_count(), stats });
    }
    if !cfg!(debug_assertions)
        && !cx.options.skip_verify
        && let Some(last) = records.iter().rev().find(|r| r.ran)
    {
        graph.verify().map_err(|error| PassError::Verify { pass: last.name, error })?;
    }
    Ok((graph, records))
}

fn dump(graph: &Graph, index: usize, name: &'static str, options: &PassOptions) -> Result<(), PassError> {
    if options.dump_after.contains(name) {
        eprintln!("// after {name}\n{}", graph.to_text());
    }
    if let Some(dir) = &options.dump_dir {
        let path = dir.join(format!("{:02}-{name}.ir", index + 1));
        let write = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, graph.to_text()));
        write.map_err(|error| PassError::Dump { pass: name, path, error })?;
    }
    Ok(())
}
