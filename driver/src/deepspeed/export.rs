//! A plan as a DeepSpeed configuration.

use serde::Serialize;
use serde_json::{Value as Json, json};

use zeroplan_ir::Op;
use zeroplan_ir::plan::{Offload, OffloadTo, Plan};
use zeroplan_ir::spec::{LossScaling, Precision};

use super::ZEROPLAN_KEY;

/// DeepSpeed's top level, in the order its reference lists the fields.
#[derive(Serialize)]
struct Config {
    train_batch_size: u64,
    train_micro_batch_size_per_gpu: u64,
    gradient_accumulation_steps: u64,
    /// 0 turns clipping off.
    gradient_clipping: f64,
    optimizer: Json,
    #[serde(skip_serializing_if = "Option::is_none")]
    scheduler: Option<Json>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bf16: Option<Json>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fp16: Option<Json>,
    zero_optimization: Json,
    /// The asynchronous I/O engine that swaps to NVMe.
    #[serde(skip_serializing_if = "Option::is_none")]
    aio: Option<Json>,
    /// DeepSpeed's AutoTP training: Megatron-style layers over `autotp_size` GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    tensor_parallel: Option<Json>,
    #[serde(skip_serializing_if = "Option::is_none")]
    activation_checkpointing: Option<Json>,
    #[serde(rename = "zeroplan", skip_serializing_if = "Option::is_none")]
    extra: Option<Json>,
}

/// The DeepSpeed configuration that trains as `plan` does (pretty JSON),
/// and notes on what DeepSpeed states differently.
pub fn config(plan: &Plan) -> Result<(String, Vec<String>), String> {
    let train = plan.train.as_ref().ok_or(
        "error: the plan does not record its training spec (it was written by an older zeroplan): compile it again",
    )?;
    let s = &plan.strategy;
    let mut notes = Vec::new();
    let (bf16, fp16) = match train.precision {
        Precision::F32 => (None, None),
        Precision::Bf16 => (Some(json!({ "enabled": true })), None),
        Precision::F16(scaling) => (None, Some(fp16(scaling, &mut notes))),
    };
    let recompute = s.recompute.as_str();
    let extra = match recompute {
        "none" | "full" => None,
        policy => {
            notes.push(format!(
                "DeepSpeed has no `{policy}` recomputation: the configuration checkpoints every layer \
                 (activation_checkpointing), which stores less; `{ZEROPLAN_KEY}.recompute` keeps the plan's policy \
                 for `zeroplan compile --deepspeed`"
            ));
            Some(json!({ "recompute": policy }))
        }
    };
    if train.decay_norms_and_biases {
        notes.push(
            "the plan decays biases and LayerNorm weights too: DeepSpeed decays what the training script's \
             parameter groups say (Hugging Face's Trainer leaves them out)"
                .into(),
        );
    }
    let config = Config {
        train_batch_size: plan.workload.global_batch,
        train_micro_batch_size_per_gpu: s.micro_batch,
        gradient_accumulation_steps: s.micro_batches,
        gradient_clipping: train.max_grad_norm.unwrap_or(0.0),
        optimizer: json!({
            "type": "AdamW",
            "params": {
                "lr": train.lr,
                "betas": [train.betas.0, train.betas.1],
                "eps": train.eps,
                "weight_decay": train.weight_decay,
            }
        }),
        scheduler: scheduler(train),
        bf16,
        fp16,
        zero_optimization: zero(plan, &mut notes),
        aio: (s.offload_to == OffloadTo::Nvme && s.offload != Offload::None).then(aio),
        tensor_parallel: (s.tensor_parallel > 1).then(|| json!({ "autotp_size": s.tensor_parallel })),
        activation_checkpointing: (recompute != "none").then(|| {
            json!({ "partition_activations": false, "cpu_checkpointing": false, "contiguous_memory_optimization": false })
        }),
        extra,
    };
    Ok((serde_json::to_string_pretty(&config).expect("configurations serialise") + "\n", notes))
}

/// DeepSpeed's dynamic loss scaler: it grows by 2 and backs off by half,
/// and with `hysteresis` 1 it backs off at the first overflow, as zeroplan does.
fn fp16(scaling: LossScaling, notes: &mut Vec<String>) -> Json {
    let power = scaling.initial_scale.log2().round();
    if 2f64.powf(power) != scaling.initial_scale {
        notes.push(format!(
            "DeepSpeed's initial loss scale is a power of two: {} is written as 2^{power}",
            scaling.initial_scale
        ));
    }
    if scaling.growth != 2.0 || scaling.backoff != 0.5 {
        notes.push(format!(
            "DeepSpeed's loss scale grows ×2 and backs off ×0.5, the plan's ×{} and ×{}",
            scaling.growth, scaling.backoff
        ));
    }
    json!({
        "enabled": true,
        "loss_scale": 0,
        "initial_scale_power": power as i64,
        "loss_scale_window": scaling.growth_interval,
        "hysteresis": 1,
        "min_loss_scale": 1,
    })
}

/// DeepSpeed's `aio` block at its documented defaults (1 MiB blocks, 8
/// requests in flight, one thread, completions overlapped): the sequential
/// streaming the plan's NVMe figures assume.
fn aio() -> Json {
    json!({
        "block_size": 1_048_576,
        "queue_depth": 8,
        "thread_count": 1,
        "single_submit": false,
        "overlap_events": true,
    })
}

/// Linear warm-up from 0, then constant (`WarmupLR`) or linear decay to 0
/// (`WarmupDecayLR`); `None` for a constant rate.
fn scheduler(train: &zeroplan_ir::spec::TrainingSpec) -> Option<Json> {
    let mut params = json!({
        "warmup_min_lr": 0,
        "warmup_max_lr": train.lr,
        "warmup_num_steps": train.warmup_steps,
        "warmup_type": "linear",
    });
    let kind = match train.total_steps {
        Some(total) => {
            params["total_num_steps"] = total.into();
            "WarmupDecayLR"
        }
        None if train.warmup_steps > 0 => "WarmupLR",
        None => return None,
    };
    Some(json!({ "type": kind, "params": params }))
}

/// Where the exported configuration says the NVMe drives are mounted: a
/// plan does not know; DeepSpeed's examples use this path.
const NVME_PATH: &str = "/local_nvme";

/// The ZeRO section: stage, offload and its tier, and the plan's buckets
/// (the largest, in elements: zeroplan reduces, gathers and prefetches one
/// flat bucket per layer and decay group at a time, and partitions every
/// parameter).
fn zero(plan: &Plan, notes: &mut Vec<String>) -> Json {
    let s = &plan.strategy;
    let mut z = json!({
        "stage": s.zero_stage,
        "overlap_comm": true,
        "contiguous_gradients": true,
        "reduce_scatter": s.zero_stage >= 1,
    });
    let g = &plan.program.graph;
    let bucket = g.nodes().filter_map(|n| if let Op::Flatten { len } = n.op { Some(len) } else { None }).max();
    let nvme = s.offload_to == OffloadTo::Nvme && s.offload != Offload::None;
    let mut optimizer = json!({ "device": s.offload_to.name(), "pin_memory": true });
    let mut params = optimizer.clone();
    if nvme {
        notes.push(format!(
            "`nvme_path` is a placeholder ({NVME_PATH}): set it to the mount point of each node's local NVMe \
             (zeroplan train --nvme-dir takes the same directory)"
        ));
        // The plan streams the optimizer's states overlapped, in as many
        // buffers as DeepSpeed's pipelined swapper uses by default.
        optimizer["nvme_path"] = NVME_PATH.into();
        optimizer["buffer_count"] = 4.into();
        optimizer["pipeline_read"] = true.into();
        optimizer["pipeline_write"] = true.into();
        // DeepSpeed swaps whole parameters through its buffers: each must
        // hold the largest (here a flat bucket) and at least its default.
        params["nvme_path"] = NVME_PATH.into();
        params["buffer_count"] = 5.into();
        params["buffer_size"] = bucket.unwrap_or(0).max(100_000_000).into();
        params["max_in_cpu"] = 0.into();
    }
    if s.offload != Offload::None {
        z["offload_optimizer"] = optimizer;
    }
    if s.offload == Offload::OptimizerAndParams {
        z["offload_param"] = params;
    }
    if let Some(bucket) = bucket {
        z["reduce_bucket_size"] = bucket.into();
        z["allgather_bucket_size"] = bucket.into();
        if s.zero_stage == 3 {
            z["stage3_prefetch_bucket_size"] = bucket.into();
            z["stage3_param_persistence_threshold"] = 0.into();
        }
    }
    z
}
