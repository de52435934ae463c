//! `zeroplan train SPEC`: run training steps and log them.

use std::collections::BTreeMap;

use crate::cli::{Backend, TrainArgs};
use zeroplan_backend_cpu::Host;
use zeroplan_backend_cuda::Cuda;
use zeroplan_backend_cuda::device as cuda;
use zeroplan_ir::interp::{Feeds, Rounding};
use zeroplan_ir::spec::{self, Head, ModelSpec, TrainingSpec};
use zeroplan_ir::{DType, Tensor};
use zeroplan_passes::training::training_graph;
use zeroplan_runtime::checkpoint;
use zeroplan_runtime::reference::ReferenceTrainer;

pub fn run(args: &TrainArgs) -> Result<(), String> {
    if args.backend == Backend::Cuda {
        // Before anything is compiled: a machine without a GPU learns it at once.
        cuda::available().map_err(|e| format!("error: --backend cuda: {e}"))?;
    }
    // A rank of a launched run (WORLD_SIZE set) runs only itself.
    let mut launched = super::launched::from_env(args.backend)?;
    let launched = launched.as_mut();
    if super::train_host::is_plan(&args.spec) {
        match args.backend {
            Backend::Cpu => return super::train_host::run_plan::<Host>(args, launched),
            Backend::Cuda => return super::train_host::run_plan::<Cuda>(args, launched),
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
        Backend::Cpu => return super::train_host::run::<Host>(args, &model, &train, launched),
        Backend::Cuda => return super::train_host::run::<Cuda>(args, &model, &train, launched),
        Backend::Reference => {}
    }
    if args.data_parallel.ranks.is_some_and(|r| r > 1) || args.tp.is_some_and(|t| t > 1) {
        return Err(context("the reference interpreter runs one rank: train several with --backend cpu".into()));
    }
    if args.profile.is_some() {
        return Err(context("--profile times the host runtime's instructions: add --backend cpu".into()));
    }
    let checkpoint_dir = args.save.as_ref().filter(|p| !super::checkpoints::is_weights_file(p));
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

/// A seeded synthetic batch: random tokens, every seventh position labelled
/// for MLM (its original token), random class labels or targets otherwise.
pub(super) fn synthetic_batch(model: &ModelSpec, batch: usize, seq: usize, seed: u64) -> Result<Feeds, String> {
    if batch == 0 || seq == 0 || seq as u64 > model.max_position {
        return Err(format!(
            "error: a synthetic batch of {batch}×{seq} does not fit `{}` (max_position {})",
            model.name, model.max_position
        ));
    }
    Ok(synthetic_feeds(&model.head, model.vocab_size, batch, seq, seed))
}

/// [`synthetic_batch`] for a head and vocabulary (a plan's, which has no
/// spec), at a shape known to fit.
pub(super) fn synthetic_feeds(head: &Head, vocab_size: u64, batch: usize, seq: usize, seed: u64) -> Feeds {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let tokens = batch * seq;
    let ids: Vec<i64> = (0..tokens).map(|_| next(vocab_size) as i64).collect();
    let int = |v: Vec<i64>, shape: Vec<usize>| Tensor::int(shape, DType::I64, v).expect("consistent");
    let labels = match *head {
        Head::Mlm => {
            int(ids.iter().enumerate().map(|(i, id)| if i % 7 == 3 { *id } else { -100 }).collect(), vec![batch, seq])
        }
        Head::Classification { num_labels: 1 } => {
            let targets = (0..batch).map(|_| next(500) as f64 / 100.0).collect();
            Tensor::float(vec![batch], DType::F32, targets).expect("consistent")
        }
        Head::Classification { num_labels } => int((0..batch).map(|_| next(num_labels) as i64).collect(), vec![batch]),
        Head::Pooler => int(Vec::new(), vec![0]),
    };
    let mut feeds = BTreeMap::new();
    feeds.insert("input_ids".to_string(), int(ids, vec![batch, seq]));
    feeds.insert("token_type_ids".to_string(), int(vec![0; tokens], vec![batch, seq]));
    feeds.insert("attention_mask".to_string(), int(vec![1; tokens], vec![batch, seq]));
    feeds.insert("labels".to_string(), labels);
    feeds
}
