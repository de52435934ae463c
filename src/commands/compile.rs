//! `zeroplan compile SPEC --gpus N --gpu PROFILE --global-batch G`: the
//! planner's search, its plan written atomically and shown.

use crate::cli::{ClusterArgs, CompileArgs, TrainingArgs};
use crate::commands::{compare, inspect};
use crate::output::{emit, write_atomic};
use zeroplan_ir::spec::{self, Cluster, GpuProfile, ModelSpec, Nvme, Precision, TrainingSpec};
use zeroplan_passes::planner::{Pins, Request, plan};

pub fn run(args: &CompileArgs) -> Result<(), String> {
    let model = spec::load(&args.spec).map_err(|e| e.to_string())?;
    let train = training(&args.training)?;
    let cluster = cluster(&args.cluster)?;
    if args.seq == 0 || args.seq > model.max_position {
        return Err(format!(
            "error: --seq {}: {} takes sequences of 1 to {} tokens (its max_position)",
            args.seq, model.name, model.max_position
        ));
    }
    if let Some(config) = &args.deepspeed {
        return compare::run(args, config, &model, train, cluster);
    }
    let global_batch = args.global_batch.ok_or("error: --global-batch is needed (or --deepspeed CONFIG.json)")?;
    let plan = plan(&request(args, &model, train, cluster, global_batch, pins(args)))
        .map_err(|e| format!("{}: error: {e}", args.spec.display()))?;
    if let Some(path) = &args.output {
        write_atomic(path, |file| plan.write_ron(file))?;
    }
    let text = if args.json { inspect::json(&plan) } else { inspect::text(&plan, args.candidates) };
    // The plan of a deep model holds its whole step: freed beside the
    // output rather than before the command returns (0.1 s at 330k nodes).
    std::thread::spawn(move || drop(plan));
    emit(&text, None)
}

/// The training spec `--train` names (bf16 defaults without one), `--precision` overriding it.
pub fn training(args: &TrainingArgs) -> Result<TrainingSpec, String> {
    let mut train = match &args.train {
        Some(path) => TrainingSpec::load(path).map_err(|e| e.to_string())?,
        None => TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() },
    };
    if let Some(precision) = args.precision {
        train.precision = precision;
    }
    Ok(train)
}

/// The cluster `--gpus`, `--nodes`, `--gpu`, `--memory`, `--host-memory`
/// and `--nvme` describe.
pub fn cluster(args: &ClusterArgs) -> Result<Cluster, String> {
    let gpu = crate::gpus::profile(&args.gpu)?;
    if args.gpus == 0 || args.nodes == 0 || !args.gpus.is_multiple_of(args.nodes) {
        return Err(format!(
            "error: --gpus {} over --nodes {}: the GPUs must split evenly over at least one node",
            args.gpus, args.nodes
        ));
    }
    if let Some(memory) = args.memory.filter(|m| *m > gpu.memory_bytes()) {
        return Err(format!(
            "error: --memory {:.1} GiB is more than the {}'s {:.1} GiB: leave --memory out to use the whole card",
            memory as f64 / (1u64 << 30) as f64,
            gpu.name,
            gpu.memory_bytes() as f64 / (1u64 << 30) as f64
        ));
    }
    Ok(Cluster {
        nodes: args.nodes,
        gpus_per_node: args.gpus / args.nodes,
        memory_budget: args.memory,
        host_memory: args.host_memory,
        nvme: nvme(args, &gpu)?,
        gpu,
    })
}

/// The NVMe tier `--nvme` and `--nvme-gbps` give, its bandwidth from the
/// `gpu` profile's node where `--nvme-gbps` is left out.
fn nvme(args: &ClusterArgs, gpu: &GpuProfile) -> Result<Option<Nvme>, String> {
    let Some(bytes) = args.nvme else {
        return match args.nvme_gbps {
            Some(_) => {
                Err("error: --nvme-gbps without --nvme: give the NVMe capacity per node too (--nvme 28TiB)".into())
            }
            None => Ok(None),
        };
    };
    let (read_gbps, write_gbps) = match (args.nvme_gbps, gpu.nvme_read_gbps.zip(gpu.nvme_write_gbps)) {
        (Some(gbps), _) | (None, Some(gbps)) => gbps,
        (None, None) => {
            return Err(format!(
                "error: --nvme: the {} profile names no node NVMe bandwidth: give the drives' aggregate \
                 read and write bandwidth per node with --nvme-gbps READ,WRITE (GB/s, e.g. --nvme-gbps 25,22)",
                gpu.name
            ));
        }
    };
    Ok(Some(Nvme { bytes, read_gbps, write_gbps }))
}

/// What `--tp`, `--zero`, `--offload`, `--offload-to`, `--recompute`, `--micro-batch`, `--tiles` and
/// `--attention` pin.
pub fn pins(args: &CompileArgs) -> Pins {
    Pins {
        tensor_parallel: args.tp,
        sequence_parallel: if args.sp {
            Some(true)
        } else if args.no_sp {
            Some(false)
        } else {
            None
        },
        zero_stage: args.zero,
        offload: args.offload,
        offload_to: args.offload_to,
        recompute: args.recompute,
        micro_batch: args.micro_batch,
        tiles: args.tiles,
        attention: args.attention,
    }
}

pub fn request<'a>(
    args: &CompileArgs,
    model: &'a ModelSpec,
    train: TrainingSpec,
    cluster: Cluster,
    global_batch: u64,
    pins: Pins,
) -> Request<'a> {
    Request {
        model,
        train,
        cluster,
        seq: args.seq,
        global_batch,
        pins,
        extrapolate_depth: !args.whole_depth,
        exhaustive: args.exhaustive,
        shared: Default::default(),
        launches: args.launches(),
    }
}
