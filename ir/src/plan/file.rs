//! The plan file: what `zeroplan compile` writes and `inspect` and the
//! runtime read.
//!
//! One program serves every data-parallel rank (they differ only in which
//! shard a `shard` view selects). Its graph lists nodes in schedule order;
//! every tensor has a buffer at a fixed offset in its place's arena.

use serde::{Deserialize, Serialize};

use super::strategy::{Attention, Offload, OffloadTo};
use super::summary::{CommSummary, MemorySummary, Predicted};
use crate::graph::{Graph, Place};

/// The version of the plan file's layout; readers reject others.
pub const PLAN_FORMAT: u32 = 1;

/// A compiled, memory-planned training step and the reasons for it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    pub format: u32,
    /// The model spec's name.
    pub model: String,
    /// Parameters (Ψ).
    pub params: u64,
    pub cluster: ClusterDescription,
    pub workload: Workload,
    /// The training spec the step was compiled from (optimizer, schedule,
    /// clipping, precision; `micro_batches` the strategy's), so a plan can
    /// be stated in other terms, e.g. as a DeepSpeed configuration. `None`
    /// in plans written before it was recorded.
    #[serde(default)]
    pub train: Option<crate::spec::TrainingSpec>,
    pub strategy: Strategy,
    pub memory: MemorySummary,
    pub comm: CommSummary,
    pub predicted: Predicted,
    /// The best plan of another strategy, and why it lost.
    pub runner_up: Option<RunnerUp>,
    /// Every strategy the search considered, best first.
    pub candidates: Vec<Candidate>,
    pub program: Program,
}

/// Where the plan runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterDescription {
    /// The GPU profile the plan was made for, whole, so the plan can be
    /// re-timed and inspected without the profile's file.
    pub gpu: crate::spec::GpuProfile,
    pub nodes: u64,
    pub gpus_per_node: u64,
    pub budget_bytes: u64,
    /// Host bytes per node the plan was allowed (`--host-memory`); absent: unchecked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory_bytes: Option<u64>,
    /// Each node's NVMe (`--nvme`); absent: no NVMe tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme: Option<crate::spec::Nvme>,
}

/// What is trained per step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub seq: u64,
    /// Sequences per optimizer step over all ranks.
    pub global_batch: u64,
    /// `f32`, `bf16` or `f16`.
    pub precision: String,
    /// How attention runs (`compile --attention`); absent: fused.
    #[serde(default, skip_serializing_if = "Attention::is_fused")]
    pub attention: Attention,
}

/// The choices the search made. The cluster's `world = ranks ×
/// tensor_parallel` GPUs form `ranks` data-parallel replicas of
/// `tensor_parallel` tensor ranks each (a replica's tensor ranks are
/// consecutive, so inside a node where they fit).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Strategy {
    /// Data-parallel ranks: what ZeRO partitions over.
    pub ranks: u64,
    /// Tensor-parallel ranks per replica (Megatron-LM layers); 1: none.
    #[serde(default = "one")]
    pub tensor_parallel: u64,
    /// Megatron's sequence parallelism over the tensor ranks (Korthikanti
    /// et al., 2022); plans written before it have none.
    #[serde(default)]
    pub sequence_parallel: bool,
    pub zero_stage: u8,
    pub offload: Offload,
    /// Where what `offload` moves lives: CPU memory or the node's NVMe
    /// (plans written before the NVMe tier offload to the CPU).
    #[serde(default)]
    pub offload_to: OffloadTo,
    /// The recomputation policy's name (`none`, `selective`, `full`, …).
    pub recompute: String,
    /// Sequences per micro-batch per rank.
    pub micro_batch: u64,
    /// Micro-batches accumulated per optimizer step.
    pub micro_batches: u64,
    /// Tiles of the largest gathered operator (ZeRO-Infinity's
    /// memory-centric tiling, `passes::tiling`); 1: none.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tiles: u64,
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

/// Plans written before tensor parallelism have none.
fn one() -> u64 {
    1
}

impl Strategy {
    /// GPUs the strategy runs on.
    pub fn world(&self) -> u64 {
        self.ranks * self.tensor_parallel
    }

    /// What is offloaded and, for the NVMe tier, where: `optimizer`,
    /// `optimizer+params@nvme`.
    pub fn offload_label(&self) -> String {
        offload_label(self.offload, self.offload_to)
    }
}

/// `offload` with its tier where that is not the CPU: `none`,
/// `optimizer`, `optimizer+params@nvme`.
pub fn offload_label(offload: Offload, to: OffloadTo) -> String {
    match (offload, to) {
        (Offload::None, _) | (_, OffloadTo::Cpu) => offload.name().to_string(),
        (_, OffloadTo::Nvme) => format!("{}@nvme", offload.name()),
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.tensor_parallel > 1 {
            let sp = if self.sequence_parallel { "+SP" } else { "" };
            write!(f, "TP-{}{sp} ", self.tensor_parallel)?;
        }
        write!(
            f,
            "ZeRO-{} offload {} recompute {} micro-batch {}×{}",
            self.zero_stage,
            self.offload_label(),
            self.recompute,
            self.micro_batch,
            self.micro_batches
        )?;
        if self.tiles > 1 {
            write!(f, " tiles {}", self.tiles)?;
        }
        Ok(())
    }
}

/// The runner-up strategy and the reason it lost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunnerUp {
    pub strategy: Strategy,
    pub peak_bytes: u64,
    pub step_seconds: f64,
    pub tokens_per_second: f64,
    pub reason: String,
}

/// One strategy the search evaluated (its best micro-batch).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub strategy: Strategy,
    /// Its peak per GPU; 0 where `dominated_by` (not compiled).
    pub peak_bytes: u64,
    /// The least memory this strategy needs (micro-batch 1); 0 where
    /// `dominated_by`.
    pub min_peak_bytes: u64,
    /// A micro-batch was found to fit (none was looked for where
    /// `dominated_by`).
    pub fits: bool,
    /// For strategies that fit.
    pub tokens_per_second: Option<f64>,
    /// Not compiled: its model states alone (with its checkpoints, under
    /// full recomputation) exceed this capacity, and both peaks are what
    /// they need on the GPU (a lower bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub states_exceed: Option<StatesExceed>,
    /// Not compiled: this cheaper twin (the same strategy without
    /// recomputation, or on CPU memory rather than NVMe) fits every
    /// micro-batch this one could use and is at least as fast at each
    /// (`passes/src/planner/dominance.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dominated_by: Option<Strategy>,
    /// Not compiled whole: this `optimal` twin, planned whole at the same
    /// micro-batch, recomputes less and is otherwise the same strategy, so
    /// this one's whole plan is at best as fast as the twin's exact
    /// figure; `tokens_per_second` is the search's estimate, which may lie
    /// above it (`passes/src/planner/dominance.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recomputes_more_than: Option<Strategy>,
}

/// The capacity a strategy's model states alone exceed
/// (`passes/src/planner/floor.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatesExceed {
    /// The per-GPU budget.
    Gpu,
    /// The per-GPU budget, with the layer inputs full recomputation keeps
    /// for the backward beside the states.
    Checkpoints,
    /// `--host-memory`, with the offloaded states on the host.
    Host,
    /// The node's NVMe (`--nvme`), with the offloaded states on it.
    Nvme,
}

/// The executable part: the scheduled graph and its buffers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Program {
    /// Nodes in schedule order; symbols `batch` and `seq` bound below.
    pub graph: Graph,
    pub batch: u64,
    pub seq: u64,
    pub arena_bytes: u64,
    pub host_arena_bytes: u64,
    pub buffers: Vec<Buffer>,
}

/// One tensor's storage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// The value, as the text form writes it (`name` or `name#i`).
    pub value: String,
    pub place: Place,
    /// Byte offset in its place's arena (for an alias: the buffer it shares).
    pub offset: u64,
    pub bytes: u64,
    /// The value whose buffer this one reuses (in-place update or view).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias_of: Option<String>,
}

/// Why a plan file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PlanFileError {
    #[error("{0}")]
    Syntax(#[from] ron::error::SpannedError),
    #[error("plan format {found}, but this zeroplan reads format {PLAN_FORMAT}: compile the plan again")]
    Format { found: u32 },
}

impl PlanFileError {
    /// The error in the CLI's convention, `FILE:LINE:COLUMN: error: …` and a
    /// `help:` line, for the plan file named `file`.
    pub fn report(&self, file: &str) -> String {
        match self {
            PlanFileError::Syntax(e) => format!(
                "{file}:{}:{}: error: {}\n  help: plan files are written by `zeroplan compile -o`: compile the plan again",
                e.span.start.line, e.span.start.col, e.code
            ),
            PlanFileError::Format { .. } => format!("{file}: error: {self}"),
        }
    }
}

impl Plan {
    pub fn to_ron(&self) -> String {
        ron::ser::to_string_pretty(self, Self::pretty()).expect("plans serialise")
    }

    /// The plan's RON, the text [`Plan::to_ron`] returns, streamed into
    /// `writer`: a deep model's plan runs to hundreds of megabytes (711 MB
    /// for a 100T model's 1.1M-node step), which need not be held whole.
    pub fn write_ron(&self, writer: impl std::io::Write) -> std::io::Result<()> {
        ron::Options::default().to_io_writer_pretty(writer, self, Self::pretty()).map_err(|e| match e {
            ron::Error::Io(message) => std::io::Error::other(message),
            other => std::io::Error::other(format!("the plan did not serialise: {other}")),
        })
    }

    /// Structures nested deeper than the program's kernels on one line each,
    /// arrays of numbers on one line.
    fn pretty() -> ron::ser::PrettyConfig {
        ron::ser::PrettyConfig::default().depth_limit(4).compact_arrays(true)
    }

    pub fn from_ron(text: &str) -> Result<Plan, PlanFileError> {
        let plan: Plan = ron::from_str(text)?;
        if plan.format != PLAN_FORMAT {
            return Err(PlanFileError::Format { found: plan.format });
        }
        Ok(plan)
    }
}
