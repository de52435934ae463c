//! `zeroplan train SPEC|PLAN`: run training steps and log them — on the
//! reference interpreter here, or the planned program on a device
//! ([`planned`]).

mod planned;

use crate::cli::{Backend, TrainArgs};
use zeroplan_backend_cpu::Host;
use zeroplan_backend_cuda::Cuda;
use zeroplan_backend_cuda::device as cuda;
use zeroplan_driver::train::batches::synthetic_batch;
use zeroplan_driver::train::checkpoints::is_weights_file;
use zeroplan_driver::train::plan_file::is_plan;
use zeroplan_driver::train::process::{self, DeviceKind};
use zeroplan_ir::interp::{Feeds, Rounding};
use zeroplan_ir::spec::{self, TrainingSpec};
use zeroplan_passes::training::training_graph;
use zeroplan_runtime::checkpoint;
use zeroplan_runtime::comm::World;
use zeroplan_runtime::reference::ReferenceTrainer;

pub fn run(args: &TrainArgs) -> Result<(), String> {
    if args.backend == Backend::Cuda {
        // Before anything is compiled: a machine without a GPU learns it at once.
        cuda::available().map_err(|e| format!("error: --backend cuda: {e}"))?;
    }
    // One rank of several processes (WORLD_SIZE set) runs only itself.
    let process = match args.backend {
        Backend::Reference => match World::from_env().map_err(|e| format!("error: {e}"))? {
            Some(world) => {
                return Err(format!(
                    "error: WORLD_SIZE={} asks for one rank per process, but the reference interpreter runs one \
                     rank: add --backend cpu (or cuda)",
                    world.world_size
                ));
            }
            None => None,
        },
        Backend::Cpu => process::from_env(DeviceKind::Host)?,
        Backend::Cuda => process::from_env(DeviceKind::Cuda)?,
    };
    if is_plan(&args.spec) {
        match args.backend {
            Backend::Cpu => return planned::run_plan::<Host>(args, process),
            Backend::Cuda => return planned::run_plan::<Cuda>(args, process),
            Backend::Reference => {}
        }
    }
    let mut model = spec::load(&args.spec).map_err(|e| e.to_string())?;
    if let Some(head) = args.head {
        model.head = head;
    }
    let train = training_spec(args)?;
    let context = |e: String| format!("{}: error: {e}", args.spec.display());
    match args.backend {
        Backend::Cpu => return planned::run::<Host>(args, &model, &train, process),
        Backend::Cuda => return planned::run::<Cuda>(args, &model, &train, process),
        Backend::Reference => {}
    }
    if args.data_parallel.ranks.is_some_and(|r| r > 1) || args.tp.is_some_and(|t| t > 1) {
        return Err(context("the reference interpreter runs one rank: train several with --backend cpu".into()));
    }
    if args.profile.is_some() {
        return Err(context("--profile times the host runtime's instructions: add --backend cpu".into()));
    }
    if args.nvme_dir.is_some() || args.offload_to.is_some() {
        return Err(context(
            "--offload-to and --nvme-dir place the host runtime's offloaded states: add --backend cpu".into(),
        ));
    }
    let checkpoint_dir = args.save.as_ref().filter(|p| !is_weights_file(p));
    if checkpoint_dir.is_some() || args.resume.is_some() {
        return Err(context(
            "training checkpoints (--save DIR, --resume) are written by the host runtime: add --backend cpu, or \
             save the weights with --save FILE.safetensors"
                .into(),
        ));
    }
    let graph = training_graph(&model, &train).map_err(|e| context(e.to_string()))?;
    let mut trainer = ReferenceTrainer::new(graph, args.seed, Rounding::Native).map_err(|e| context(e.to_string()))?;
    if let Some(path) = &args.weights {
        let mut weights = trainer.weights();
        let report =
            checkpoint::load_weights(path, &model, trainer.graph(), &mut weights).map_err(|e| e.to_string())?;
        if !report.initialised.is_empty() {
            eprintln!("note: not in {}, initialised: {}", path.display(), report.initialised.join(", "));
        }
        trainer.set_weights(weights);
    }
    let batch = match &args.batch {
        Some(path) => checkpoint::load_batch(path).map_err(|e| e.to_string())?,
        None => synthetic_batch(&model, args.batch_size, args.seq_len, args.seed)?,
    };
    let micro_batches: Vec<Feeds> = vec![batch; train.micro_batches as usize];
    for step in 1..=args.steps {
        let _span = tracing::info_span!("step", step).entered();
        let log = trainer.step(&micro_batches).map_err(|e| context(e.to_string()))?;
        if args.log_json {
            println!("{}", serde_json::to_string(&log).expect("serialisable"));
        } else {
            println!("{log}");
        }
        if !log.loss.is_finite() {
            return Err(context(format!("step {}: the loss is {}; stopping", log.step, log.loss)));
        }
    }
    if let Some(path) = &args.save {
        checkpoint::save_weights(path, &model, trainer.graph(), &trainer.weights()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The training spec file (or defaults), overridden by the flags.
pub(super) fn training_spec(args: &TrainArgs) -> Result<TrainingSpec, String> {
    let mut t = match &args.train {
        Some(path) => TrainingSpec::load(path).map_err(|e| e.to_string())?,
        None => TrainingSpec::default(),
    };
    t.lr = args.lr.unwrap_or(t.lr);
    t.betas = args.betas.unwrap_or(t.betas);
    t.eps = args.eps.unwrap_or(t.eps);
    t.weight_decay = args.weight_decay.unwrap_or(t.weight_decay);
    t.warmup_steps = args.warmup.unwrap_or(t.warmup_steps);
    t.micro_batches = args.micro_batches.unwrap_or(t.micro_batches);
    t.precision = args.precision.unwrap_or(t.precision);
    t.dropout = args.dropout.or(t.dropout);
    t.validate().map_err(|problems| {
        let lines: Vec<String> = problems.iter().map(|p| format!("error: {}\n  help: {}", p.message, p.help)).collect();
        lines.join("\n")
    })?;
    Ok(t)
}
