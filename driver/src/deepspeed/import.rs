//! A DeepSpeed configuration as what it fixes: ZeRO stage, offload and its
//! tier (CPU or NVMe: ZeRO-Infinity), recomputation, micro-batch,
//! precision, optimizer. What zeroplan cannot plan (optimizer and
//! parameters on different tiers, pipeline parallelism, quantized
//! collectives, static loss scaling…) is an error naming the field; what does
//! not change a plan's memory or time is accepted, with a note where the
//! configuration asks for something zeroplan does differently.

use serde_json::{Map, Value as Json};

use zeroplan_ir::plan::{Offload, OffloadTo};
use zeroplan_ir::spec::{LossScaling, Precision, TrainingSpec};
use zeroplan_passes::planner::Pins;
use zeroplan_passes::recompute::Policy;

use super::ZEROPLAN_KEY;
use super::values::{Problem, Read, count, enabled, flag, join, number, object, string};

/// What a configuration fixes.
#[derive(Debug)]
pub struct Imported {
    /// Stage, offload and recomputation always (DeepSpeed's defaults where
    /// the configuration is silent); the micro-batch where it gives one.
    pub pins: Pins,
    /// The training spec given, with the configuration's optimizer,
    /// schedule, clipping and precision (unless `"auto"`).
    pub train: TrainingSpec,
    /// Sequences per step over all GPUs, where the configuration fixes it.
    pub global_batch: Option<u64>,
    /// Accumulation steps, where given.
    pub accumulation: Option<u64>,
    /// What the configuration states that zeroplan plans differently.
    pub notes: Vec<String>,
}

/// A precision switch (`fp16.enabled`, `bf16.enabled`).
#[derive(Clone, Copy, PartialEq)]
enum Switch {
    Absent,
    Auto,
    On,
    Off,
}

impl Switch {
    fn of(v: Option<bool>) -> Switch {
        match v {
            None => Switch::Auto,
            Some(true) => Switch::On,
            Some(false) => Switch::Off,
        }
    }
}

struct Reader {
    imported: Imported,
    stage: u8,
    /// Where each section offloads to; `None`: not offloaded.
    offload_optimizer: Option<OffloadTo>,
    offload_params: Option<OffloadTo>,
    fp16: Switch,
    bf16: Switch,
    scaling: LossScaling,
    micro_batch: Option<u64>,
}

/// Reads configuration `text` (named `file` in errors) onto `train` for
/// `gpus` GPUs.
pub fn read(text: &str, file: &str, train: TrainingSpec, gpus: u64) -> Result<Imported, String> {
    let json: Json = serde_json::from_str(text).map_err(|e| {
        let (line, column) = (e.line(), e.column());
        let message = e.to_string();
        let message = message.trim_end_matches(&format!(" at line {line} column {column}"));
        format!("{file}:{line}:{column}: error: {message}\n  help: a DeepSpeed configuration is one JSON object")
    })?;
    let mut r = Reader {
        imported: Imported { pins: Pins::default(), train, global_batch: None, accumulation: None, notes: Vec::new() },
        stage: 0,
        offload_optimizer: None,
        offload_params: None,
        fp16: Switch::Absent,
        bf16: Switch::Absent,
        scaling: LossScaling::default(),
        micro_batch: None,
    };
    r.top(&json, gpus).map_err(|p| p.render(text, file))?;
    Ok(r.imported)
}

impl Reader {
    fn note(&mut self, note: String) {
        self.imported.notes.push(note);
    }

    fn unknown(&mut self, path: &str) {
        self.note(format!("`{path}` is not a DeepSpeed field zeroplan knows: ignored (check its spelling)"));
    }

    fn top(&mut self, json: &Json, gpus: u64) -> Read<()> {
        let mut batch = None;
        let mut recompute = None;
        for (key, v) in object(json, "")? {
            let path = key.as_str();
            match path {
                "train_batch_size" => batch = count(v, path)?,
                "train_micro_batch_size_per_gpu" => self.micro_batch = count(v, path)?,
                "gradient_accumulation_steps" => self.imported.accumulation = count(v, path)?,
                "gradient_clipping" => {
                    if let Some(norm) = number(v, path)? {
                        self.imported.train.max_grad_norm = (norm > 0.0).then_some(norm);
                    }
                }
                "optimizer" => self.optimizer(v)?,
                "scheduler" => self.scheduler(v)?,
                "fp16" => self.fp16(v)?,
                "bf16" | "bfloat16" => self.bf16(v, path)?,
                "zero_optimization" => self.zero(v)?,
                "activation_checkpointing" => {
                    self.checkpointing(v)?;
                    recompute.get_or_insert(Policy::Full);
                }
                ZEROPLAN_KEY => {
                    let path = join(ZEROPLAN_KEY, "recompute");
                    let name = object(v, ZEROPLAN_KEY)?.get("recompute").map(|r| string(r, &path)).transpose()?;
                    if let Some(name) = name {
                        let policy = Policy::from_name(name).ok_or_else(|| {
                            Problem::new(
                                &path,
                                format!("`{name}` is not a policy"),
                                "use none, selective, full or optimal:SIZE",
                            )
                        })?;
                        recompute = Some(policy);
                    }
                }
                "amp" | "torch_autocast" if enabled(v) => {
                    return Err(Problem::new(
                        path,
                        "automatic mixed precision is not planned",
                        "use bf16 or fp16 instead",
                    ));
                }
                "pipeline" | "sparse_attention" | "compression_training" | "elasticity" | "progressive_layer_drop"
                    if enabled(v) =>
                {
                    return Err(Problem::new(
                        path,
                        "zeroplan plans data parallelism with ZeRO, not this",
                        format!("remove `{path}` to plan the rest"),
                    ));
                }
                // DeepSpeed's AutoTP training: Megatron-style layers over `autotp_size` GPUs.
                "tensor_parallel" => {
                    let size = v.get("autotp_size").map(|n| count(n, "tensor_parallel.autotp_size")).transpose()?;
                    self.imported.pins.tensor_parallel = size.flatten().or(Some(1));
                }
                "sequence_parallel_size" if count(v, path)?.is_some_and(|n| n > 1) => {
                    return Err(Problem::new(path, "sequence parallelism is not planned", "remove it, or set it to 1"));
                }
                _ if IGNORED.contains(&path) => {}
                _ => self.unknown(path),
            }
        }
        self.imported.pins.recompute = Some(recompute.unwrap_or(Policy::None));
        // A configuration without AutoTP trains every GPU as a data-parallel rank.
        self.imported.pins.tensor_parallel.get_or_insert(1);
        self.offload()?;
        self.precision()?;
        let tensor_parallel = self.imported.pins.tensor_parallel.unwrap_or(1).max(1);
        self.batch(batch, gpus / tensor_parallel)
    }

    /// `train_batch_size` = micro-batch × accumulation × data-parallel GPUs
    /// (all of them without tensor parallelism); DeepSpeed infers any one
    /// of the three from the other two.
    fn batch(&mut self, batch: Option<u64>, gpus: u64) -> Read<()> {
        let (micro, steps) = (self.micro_batch, self.imported.accumulation);
        if let (Some(t), Some(m), Some(g)) = (batch, micro, steps)
            && t != m * g * gpus
        {
            return Err(Problem::new(
                "train_batch_size",
                format!(
                    "{t} is not train_micro_batch_size_per_gpu {m} × gradient_accumulation_steps {g} × {gpus} GPUs"
                ),
                format!("make it {}, or leave one of the three out", m * g * gpus),
            ));
        }
        self.imported.global_batch = batch.or(micro.zip(steps).map(|(m, g)| m * g * gpus));
        self.imported.pins.micro_batch = match (micro, batch, steps) {
            (Some(m), _, _) => Some(m),
            (None, Some(t), Some(g)) if g > 0 && t.is_multiple_of(g * gpus) => Some(t / (g * gpus)),
            (None, Some(t), Some(g)) => {
                return Err(Problem::new(
                    "gradient_accumulation_steps",
                    format!("train_batch_size {t} does not split into {g} accumulation steps on {gpus} GPUs"),
                    "make train_batch_size a multiple of gradient_accumulation_steps × GPUs",
                ));
            }
            _ => None,
        };
        Ok(())
    }

    fn optimizer(&mut self, v: &Json) -> Read<()> {
        let section = object(v, "optimizer")?;
        let kind = section.get("type").map(|t| string(t, "optimizer.type")).transpose()?.unwrap_or("AdamW");
        let adam = kind.eq_ignore_ascii_case("adam");
        if !adam && !kind.eq_ignore_ascii_case("adamw") {
            return Err(Problem::new(
                "optimizer.type",
                format!("`{kind}`: zeroplan plans AdamW (its fp32 moments are in the memory plan)"),
                "use \"AdamW\"",
            ));
        }
        let Some(params) = section.get("params") else { return Ok(()) };
        let train = &mut self.imported.train;
        for (key, v) in object(params, "optimizer.params")? {
            let path = join("optimizer.params", key);
            match key.as_str() {
                "lr" => train.lr = number(v, &path)?.unwrap_or(train.lr),
                "eps" => train.eps = number(v, &path)?.unwrap_or(train.eps),
                "weight_decay" => train.weight_decay = number(v, &path)?.unwrap_or(train.weight_decay),
                "betas" if v.as_str() == Some("auto") => {}
                "betas" => {
                    let pair = v.as_array().filter(|a| a.len() == 2);
                    let pair = pair.and_then(|a| Some((a[0].as_f64()?, a[1].as_f64()?)));
                    train.betas = pair.ok_or_else(|| {
                        Problem::new(&path, format!("{v} is not two numbers"), "write e.g. [0.9, 0.999]")
                    })?;
                }
                "adam_w_mode" if adam && flag(v, &path)? == Some(false) => {
                    return Err(Problem::new(
                        &path,
                        "Adam with L2 regularisation is not AdamW",
                        "set it to true, or use type AdamW",
                    ));
                }
                "amsgrad" if flag(v, &path)? == Some(true) => {
                    return Err(Problem::new(
                        &path,
                        "AMSGrad keeps a third moment zeroplan does not plan",
                        "set it to false",
                    ));
                }
                "adam_w_mode" | "amsgrad" | "torch_adam" | "bias_correction" | "fused" => {}
                _ => self.imported.notes.push(format!("`{path}` is not an AdamW setting zeroplan knows: ignored")),
            }
        }
        Ok(())
    }

    /// The learning-rate schedule: it changes neither memory nor time, so
    /// only DeepSpeed's linear warm-up schedules are read, others noted.
    fn scheduler(&mut self, v: &Json) -> Read<()> {
        let section = object(v, "scheduler")?;
        let kind = section.get("type").map(|t| string(t, "scheduler.type")).transpose()?.unwrap_or("");
        if kind != "WarmupLR" && kind != "WarmupDecayLR" {
            self.note(format!("scheduler `{kind}` is not read: a schedule changes neither memory nor step time"));
            return Ok(());
        }
        let Some(params) = section.get("params") else { return Ok(()) };
        let params = object(params, "scheduler.params")?;
        let get = |key: &str| params.get(key).map(|v| number(v, &join("scheduler.params", key))).transpose();
        let train = &mut self.imported.train;
        if let Some(Some(lr)) = get("warmup_max_lr")? {
            train.lr = lr;
        }
        if let Some(Some(steps)) = get("warmup_num_steps")? {
            train.warmup_steps = steps as u64;
        }
        train.total_steps = match get("total_num_steps")? {
            Some(Some(total)) if kind == "WarmupDecayLR" => Some(total as u64),
            _ => None,
        };
        if get("warmup_min_lr")?.flatten().is_some_and(|lr| lr != 0.0)
            || params.get("warmup_type").and_then(Json::as_str).is_some_and(|t| t != "linear")
        {
            self.note("the schedule's warm-up is read as linear from 0, zeroplan's".into());
        }
        Ok(())
    }

    fn fp16(&mut self, v: &Json) -> Read<()> {
        for (key, v) in object(v, "fp16")? {
            let path = join("fp16", key);
            match key.as_str() {
                "enabled" => self.fp16 = Switch::of(flag(v, &path)?),
                "loss_scale" if number(v, &path)?.is_some_and(|s| s != 0.0) => {
                    return Err(Problem::new(&path, "static loss scaling is not planned", "set it to 0 (dynamic)"));
                }
                "initial_scale_power" => {
                    if let Some(p) = count(v, &path)? {
                        self.scaling.initial_scale = 2f64.powi(p as i32);
                    }
                }
                "loss_scale_window" => {
                    if let Some(w) = count(v, &path)? {
                        self.scaling.growth_interval = w;
                    }
                }
                "fp16_master_weights_and_grads" if flag(v, &path)? == Some(true) => {
                    return Err(Problem::new(&path, "zeroplan keeps fp32 master weights", "set it to false"));
                }
                "hysteresis" if count(v, &path)?.is_some_and(|h| h > 1) => self.note(format!(
                    "`{path}`: zeroplan backs the loss scale off at the first overflow (hysteresis 1); \
                     memory and time do not change"
                )),
                "loss_scale"
                | "hysteresis"
                | "consecutive_hysteresis"
                | "min_loss_scale"
                | "auto_cast"
                | "fp16_master_weights_and_grads" => {}
                _ => self.unknown(&path),
            }
        }
        Ok(())
    }

    fn bf16(&mut self, v: &Json, name: &str) -> Read<()> {
        for (key, v) in object(v, name)? {
            let path = join(name, key);
            match key.as_str() {
                "enabled" => self.bf16 = Switch::of(flag(v, &path)?),
                "bf16_master_weights_and_grads" | "bf16_optimizer_states" if flag(v, &path)? == Some(true) => {
                    return Err(Problem::new(
                        &path,
                        "zeroplan keeps fp32 master weights and moments",
                        "set it to false",
                    ));
                }
                "bf16_master_weights_and_grads" | "bf16_optimizer_states" | "immediate_grad_update" => {}
                _ => self.unknown(&path),
            }
        }
        Ok(())
    }

    fn precision(&mut self) -> Read<()> {
        let train = &mut self.imported.train;
        train.precision = match (self.fp16, self.bf16) {
            (Switch::On, Switch::On) => {
                return Err(Problem::new("bf16.enabled", "fp16 and bf16 are both enabled", "enable one of them"));
            }
            (Switch::On, _) => Precision::F16(self.scaling),
            (_, Switch::On) => Precision::Bf16,
            (Switch::Auto, _) | (_, Switch::Auto) => train.precision,
            _ => Precision::F32,
        };
        Ok(())
    }

    fn zero(&mut self, v: &Json) -> Read<()> {
        let mut buckets = false;
        for (key, v) in object(v, "zero_optimization")? {
            let path = join("zero_optimization", key);
            match key.as_str() {
                "stage" => {
                    self.stage = count(v, &path)?
                        .filter(|s| *s <= 3)
                        .map(|s| s as u8)
                        .ok_or_else(|| Problem::new(&path, format!("{v} is not a ZeRO stage"), "use 0, 1, 2 or 3"))?;
                }
                "offload_optimizer" => self.offload_optimizer = self.offload_device(v, &path)?,
                "offload_param" => self.offload_params = self.offload_device(v, &path)?,
                "cpu_offload" if flag(v, &path)? == Some(true) => self.offload_optimizer = Some(OffloadTo::Cpu),
                "cpu_offload_params" if flag(v, &path)? == Some(true) => self.offload_params = Some(OffloadTo::Cpu),
                "cpu_offload" | "cpu_offload_params" => {}
                "overlap_comm" if flag(v, &path)? == Some(false) => self.note(format!(
                    "`{path}` is false: the plan overlaps collectives with compute, and its predicted time assumes it"
                )),
                "zero_quantized_weights" | "zero_quantized_gradients" | "zero_quantized_nontrainable_weights"
                    if flag(v, &path)? == Some(true) =>
                {
                    return Err(Problem::new(&path, "ZeRO++ quantized collectives are not planned", "set it to false"));
                }
                "zero_hpz_partition_size" | "mics_shard_size" if count(v, &path)?.is_some_and(|n| n > 1) => {
                    return Err(Problem::new(&path, "hierarchical partitioning is not planned", "remove it"));
                }
                "reduce_bucket_size" | "allgather_bucket_size" | "stage3_prefetch_bucket_size" => {
                    count(v, &path)?;
                    buckets = true;
                }
                _ if ZERO_IGNORED.contains(&key.as_str()) => {}
                _ => self.unknown(&path),
            }
        }
        if buckets {
            self.note(
                "zero_optimization's bucket and prefetch sizes are not planned: zeroplan reduces, gathers and \
                 prefetches one flat bucket per layer and decay group"
                    .into(),
            );
        }
        Ok(())
    }

    /// DeepSpeed's rules for offload, and zeroplan's: parameters go to the
    /// host only with the optimizer, and both to the same tier.
    fn offload(&mut self) -> Read<()> {
        let path = "zero_optimization.offload_optimizer";
        if self.offload_optimizer.is_some() && self.stage == 0 {
            return Err(Problem::new(
                path,
                "DeepSpeed offloads the optimizer at ZeRO stages 1–3",
                "set stage to 1, 2 or 3",
            ));
        }
        let path = "zero_optimization.offload_param";
        if self.offload_params.is_some() && self.stage != 3 {
            return Err(Problem::new(path, "parameters are offloaded at ZeRO stage 3 only", "set stage to 3"));
        }
        match (self.offload_optimizer, self.offload_params) {
            (None, Some(tier)) => {
                return Err(Problem::new(
                    path,
                    "zeroplan offloads parameters together with the optimizer",
                    format!("add \"offload_optimizer\": {{\"device\": \"{}\"}}", tier.name()),
                ));
            }
            (Some(optimizer), Some(params)) if optimizer != params => {
                return Err(Problem::new(
                    &join(path, "device"),
                    format!(
                        "the optimizer is offloaded to {} and the parameters to {}: zeroplan plans one tier for both",
                        optimizer.name(),
                        params.name()
                    ),
                    format!("use \"{}\" in both sections", optimizer.name()),
                ));
            }
            _ => {}
        }
        let pins = &mut self.imported.pins;
        pins.zero_stage = Some(self.stage);
        pins.offload = Some(match (self.offload_optimizer, self.offload_params) {
            (Some(_), Some(_)) => Offload::OptimizerAndParams,
            (Some(_), None) => Offload::Optimizer,
            _ => Offload::None,
        });
        pins.offload_to = self.offload_optimizer;
        Ok(())
    }

    /// Where an offload section moves state: `device` `cpu` or `nvme`, or
    /// nowhere (`none`). Its buffer settings change neither memory nor
    /// time as zeroplan plans them; turning the optimizer's pipelining off
    /// does, and is noted.
    fn offload_device(&mut self, v: &Json, path: &str) -> Read<Option<OffloadTo>> {
        let section: &Map<String, Json> = object(v, path)?;
        let device_path = join(path, "device");
        let device = section.get("device").map(|d| string(d, &device_path)).transpose()?.unwrap_or("cpu");
        for (key, v) in section {
            let at = join(path, key);
            match key.as_str() {
                "device" => {}
                "ratio" => {
                    if number(v, &at)?.is_some_and(|ratio| ratio != 1.0) {
                        return Err(Problem::new(&at, "a partial offload is not planned", "remove it, or set it to 1"));
                    }
                }
                "pipeline_read" | "pipeline_write" | "pipeline" if flag(v, &at)? == Some(false) && device == "nvme" => {
                    self.note(format!(
                        "`{at}` is false: the plan's predicted time overlaps the optimizer's NVMe reads and writes \
                         with its CPU work"
                    ))
                }
                "nvme_path" => {
                    string(v, &at)?;
                }
                "pin_memory" | "buffer_count" | "buffer_size" | "max_in_cpu" | "fast_init" | "pipeline_read"
                | "pipeline_write" | "pipeline" => {}
                _ => self.unknown(&at),
            }
        }
        match device {
            "cpu" => Ok(Some(OffloadTo::Cpu)),
            "nvme" if !section.contains_key("nvme_path") => Err(Problem::new(
                &device_path,
                "NVMe offload needs the drives' mount point",
                format!("add \"nvme_path\" to {path} (e.g. \"/local_nvme\"), as DeepSpeed requires"),
            )),
            "nvme" => Ok(Some(OffloadTo::Nvme)),
            "none" => Ok(None),
            other => Err(Problem::new(
                &device_path,
                format!("`{other}` is not a device"),
                "use \"cpu\", \"nvme\" or \"none\"",
            )),
        }
    }

    fn checkpointing(&mut self, v: &Json) -> Read<()> {
        for (key, v) in object(v, "activation_checkpointing")? {
            let path = join("activation_checkpointing", key);
            match key.as_str() {
                "cpu_checkpointing" if flag(v, &path)? == Some(true) => {
                    return Err(Problem::new(&path, "zeroplan keeps checkpoints on the GPU", "set it to false"));
                }
                "partition_activations"
                | "cpu_checkpointing"
                | "contiguous_memory_optimization"
                | "number_checkpoints"
                | "synchronize_checkpoint_boundary"
                | "profile" => {}
                _ => self.unknown(&path),
            }
        }
        Ok(())
    }
}

/// Top-level fields that change neither memory nor time: logging,
/// monitoring, checkpoint I/O, communication data types zeroplan fixes.
const IGNORED: &[&str] = &[
    "steps_per_print",
    "wall_clock_breakdown",
    "dump_state",
    "prescale_gradients",
    "gradient_predivide_factor",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "communication_data_type",
    "memory_breakdown",
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "comms_logger",
    "checkpoint",
    "aio",
    "data_types",
    "dataloader_drop_last",
    "seed",
    "sparse_gradients",
    "timers",
    "tensor_parallel",
    "sequence_parallel_size",
    "amp",
    "torch_autocast",
    "pipeline",
    "sparse_attention",
    "compression_training",
    "elasticity",
    "progressive_layer_drop",
];

/// `zero_optimization` fields that change neither what is sharded nor
/// where it lives.
const ZERO_IGNORED: &[&str] = &[
    "contiguous_gradients",
    "reduce_scatter",
    "allgather_partitions",
    "overlap_comm",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "sub_group_size",
    "stage3_gather_16bit_weights_on_model_save",
    "gather_16bit_weights_on_model_save",
    "round_robin_gradients",
    "load_from_fp32_weights",
    "elastic_checkpoint",
    "ignore_unused_parameters",
    "legacy_stage1",
    "use_multi_rank_bucket_allreduce",
    "log_trace_cache_warnings",
    "parameter_alignment",
    "compute_grad_norm",
    "stage3_module_granularity_threshold",
    "zero_quantized_weights",
    "zero_quantized_gradients",
    "zero_quantized_nontrainable_weights",
    "zero_hpz_partition_size",
    "mics_shard_size",
];
