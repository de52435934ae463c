//! The numbers a plan stands on: memory per rank, communication, predicted
//! speed. Per rank; where ranks differ, the largest rank's.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Device memory of one rank at its peak, and host memory.
///
/// `peak_bytes` = `reserve_bytes` + the arena; the arena's bytes live at the
/// peak split into `params_bytes` + `grads_bytes` + `optimizer_bytes` +
/// `activations_bytes`, and the arena exceeds their sum by its
/// fragmentation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySummary {
    /// Everything the process holds on the GPU at the step's peak.
    pub peak_bytes: u64,
    /// What the plan may use per GPU.
    pub budget_bytes: u64,
    /// The arena: every tensor of the step at a fixed offset.
    pub arena_bytes: u64,
    /// The most tensor bytes live at once: no allocator needs less.
    pub lower_bound_bytes: u64,
    /// Outside the arena: CUDA context, GEMM workspace, NCCL buffers.
    pub reserve: Reserve,
    pub reserve_bytes: u64,
    /// Live at the peak: parameters, working copies, gathered parameters.
    pub params_bytes: u64,
    /// Live at the peak: gradients and gradient buckets.
    pub grads_bytes: u64,
    /// Live at the peak: AdamW moments, accumulators, optimizer scalars.
    pub optimizer_bytes: u64,
    /// Live at the peak: activations, inputs and every other step tensor.
    pub activations_bytes: u64,
    /// Host memory per rank (ZeRO-Offload; with the NVMe tier, the
    /// pinned buffers the offloaded states stream through).
    pub host_bytes: u64,
    /// What the node's GPUs together keep on its NVMe (ZeRO-Infinity's
    /// NVMe tier), bytes per node; 0 when nothing is offloaded there.
    #[serde(default)]
    pub nvme_bytes: u64,
}

/// Device memory a process holds outside the arena.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reserve {
    pub cuda_context: u64,
    pub gemm_workspace: u64,
    pub nccl: u64,
}

impl Reserve {
    pub fn total(&self) -> u64 {
        self.cuda_context + self.gemm_workspace + self.nccl
    }
}

/// One collective kind's traffic per rank per step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CollectiveTraffic {
    /// Launches per step.
    pub count: u64,
    /// Bytes each rank sends per step.
    pub bytes: f64,
}

/// What each rank sends per step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommSummary {
    pub bytes_per_step: f64,
    /// Per collective kind (`all_gather`, `reduce_scatter`, `all_reduce`).
    pub by_collective: BTreeMap<String, CollectiveTraffic>,
    /// Bytes each rank copies between host and device per step.
    pub host_copy_bytes: f64,
}

/// What the cost model predicts for one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    pub step_seconds: f64,
    /// Tokens the whole cluster trains on per second.
    pub tokens_per_second: f64,
    /// Model FLOPs utilisation: forward and backward FLOPs without
    /// recomputation, over the step time and the GPU's dense peak.
    pub mfu: f64,
    /// Model FLOPs per rank per step (recomputation excluded).
    pub model_flops: f64,
    /// FLOPs per rank per step the GPU runs (recomputation included).
    pub hardware_flops: f64,
    /// Seconds each stream (`compute`, `comm`, `copy`, `host`) is busy.
    pub busy_seconds: BTreeMap<String, f64>,
    /// Step time in which the compute stream idles, waiting on
    /// communication, copies or the host: what overlap failed to hide.
    pub stalled_seconds: f64,
    /// How the prediction launches device instructions (eager unless the
    /// plan was compiled for CUDA graphs; absent from eager plans' files).
    #[serde(default, skip_serializing_if = "Launches::is_eager")]
    pub launches: Launches,
}

/// How a rank's device instructions are launched, which the cost model's
/// launch term follows (`zeroplan_passes::cost::time`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Launches {
    /// One launch per kernel, GEMM or copy.
    #[default]
    Eager,
    /// Recorded once as CUDA graphs and replayed (`train --cuda-graphs`).
    Graphs,
}

impl Launches {
    pub fn is_eager(&self) -> bool {
        *self == Launches::Eager
    }
}
