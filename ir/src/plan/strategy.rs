//! What a plan decided: how the data-parallel ranks share model state, what
//! lives on the host, what the backward recomputes, how big a micro-batch is.

use serde::{Deserialize, Serialize};

/// What ZeRO-Offload moves to host memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Offload {
    #[default]
    None,
    /// fp32 master weights and AdamW moments live on the host; AdamW runs
    /// there on gradients copied over PCIe (Ren et al., ZeRO-Offload, 2021).
    Optimizer,
    /// The optimizer as above, and the 16-bit parameter shards too (stage 3
    /// only): they cross PCIe before every all-gather (ZeRO-Infinity).
    OptimizerAndParams,
}

impl Offload {
    pub fn name(self) -> &'static str {
        match self {
            Offload::None => "none",
            Offload::Optimizer => "optimizer",
            Offload::OptimizerAndParams => "optimizer+params",
        }
    }

    pub fn from_name(name: &str) -> Option<Offload> {
        [Offload::None, Offload::Optimizer, Offload::OptimizerAndParams].into_iter().find(|o| o.name() == name)
    }
}

/// Where offloaded model states live: the tier of ZeRO-Infinity's
/// "infinity offload engine" (Rajbhandari et al., 2021) that holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffloadTo {
    /// Pinned CPU memory (ZeRO-Offload; DeepSpeed's `device: "cpu"`).
    #[default]
    Cpu,
    /// The node's local NVMe drives, streamed through pinned CPU buffers
    /// (DeepSpeed's `device: "nvme"`): what is offloaded lives on the
    /// drives, and CPU memory holds only the chunks in flight.
    Nvme,
}

impl OffloadTo {
    pub fn name(self) -> &'static str {
        match self {
            OffloadTo::Cpu => "cpu",
            OffloadTo::Nvme => "nvme",
        }
    }

    pub fn from_name(name: &str) -> Option<OffloadTo> {
        [OffloadTo::Cpu, OffloadTo::Nvme].into_iter().find(|o| o.name() == name)
    }
}

/// Data parallelism with ZeRO (Rajbhandari et al., 2020): which model states
/// each of `ranks` replicas holds whole and which only its `1/ranks` shard of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DataParallel {
    pub ranks: u64,
    /// 0: everything replicated, gradients all-reduced. 1: optimizer states
    /// sharded. 2: gradients too. 3: parameters too.
    pub zero_stage: u8,
    pub offload: Offload,
}

impl DataParallel {
    /// One rank, nothing sharded or offloaded.
    pub fn single() -> DataParallel {
        DataParallel { ranks: 1, zero_stage: 0, offload: Offload::None }
    }

    /// Shards of the optimizer states (fp32 masters and moments).
    pub fn optimizer_shards(&self) -> u64 {
        if self.zero_stage >= 1 { self.ranks } else { 1 }
    }

    /// Shards of the gradients the optimizer reads.
    pub fn gradient_shards(&self) -> u64 {
        if self.zero_stage >= 2 { self.ranks } else { 1 }
    }

    /// Shards of the 16-bit (or fp32) parameters kept between steps. From
    /// stage 1 on each rank updates only its shard; stages 1–2 gather the
    /// updated shards at the start of the next step's forward (Megatron-LM's
    /// distributed optimizer with `--overlap-param-gather`), where the
    /// gathers run under the layers before, rather than after the update,
    /// where nothing is left to hide them under. Stage 3 gathers again for
    /// every phase that reads them.
    pub fn parameter_shards(&self) -> u64 {
        if self.zero_stage >= 1 { self.ranks } else { 1 }
    }

    /// Whether one gathered copy of the parameters serves the whole step
    /// (stages 1–2: gathered by the forward, read by the backward, freed
    /// after its last reader) rather than a gather per phase (stage 3).
    pub fn gathers_once(&self) -> bool {
        matches!(self.zero_stage, 1 | 2)
    }

    /// Why this combination cannot be planned, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.ranks == 0 {
            return Err("data parallelism needs at least one rank".into());
        }
        if self.zero_stage > 3 {
            return Err(format!("ZeRO has stages 0 to 3, not {}", self.zero_stage));
        }
        if self.offload == Offload::OptimizerAndParams && self.zero_stage != 3 {
            return Err(format!(
                "offloading parameters needs ZeRO stage 3 (parameters sharded), not stage {}",
                self.zero_stage
            ));
        }
        Ok(())
    }
}

/// How a step computes self-attention. The search always fuses; unfused is
/// a pin, for predicting a framework that runs attention as separate
/// kernels (Megatron-LM before FlashAttention, Hugging Face's eager
/// attention) or for comparing the two.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Attention {
    /// One flash-attention kernel per layer and its adjoint (the
    /// `attention` pass): the `[B, H, S, S]` probabilities are never stored.
    #[default]
    Fused,
    /// Scores, softmax, dropout and the two matmuls as separate tensors:
    /// the probabilities and their dropped-out copy are written, read back
    /// and kept for the backward.
    Unfused,
}

impl Attention {
    pub fn name(self) -> &'static str {
        match self {
            Attention::Fused => "fused",
            Attention::Unfused => "unfused",
        }
    }

    pub fn from_name(name: &str) -> Option<Attention> {
        [Attention::Fused, Attention::Unfused].into_iter().find(|a| a.name() == name)
    }

    /// Whether this is the default (plan files leave it out).
    pub fn is_fused(&self) -> bool {
        *self == Attention::Fused
    }
}
