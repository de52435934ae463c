//! `zeroplan train SPEC|PLAN --backend cpu|cuda`: the planned program run
//! by the runtime on a device (the host's Cranelift kernels and GEMMs, or a
//! GPU), on a synthetic batch, a batch file, or `--data` (MLM text or a
//! GLUE TSV): the flags turned into a [`Trainer`], its steps drawn as a
//! progress bar or logged as lines.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cli::{DataParallelArgs, TrainArgs};
use crate::output::emit;
use zeroplan_driver::train::batches::{self, Batches};
use zeroplan_driver::train::checkpoints::{self, Saver};
use zeroplan_driver::train::divergence::diverges;
use zeroplan_driver::train::plan_file::head_of;
use zeroplan_driver::train::process::ProcessRank;
use zeroplan_driver::train::{Stepped, Trainer};
use zeroplan_ir::Bindings;
use zeroplan_ir::plan::{DataParallel, Offload, OffloadTo, Plan, Program};
use zeroplan_ir::spec::{ModelSpec, TrainingSpec};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::checkpoint;
use zeroplan_runtime::reference::{data_parallel_ranks, tensor_parallel_ranks};
use zeroplan_runtime::runner::{Device, Nvme};

/// Seconds before the first step, as the first `--log-json` line reports
/// them: a benchmark sets them against a framework's first (compiling) step.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
struct Setup {
    /// The passes, the memory plan and the program (`None`: a plan file,
    /// compiled by `zeroplan compile` beforehand).
    compile_seconds: Option<f64>,
    /// Loading the program on the device: instruction selection and kernel
    /// compilation (Cranelift; NVRTC on CUDA, less what its PTX cache
    /// holds), the arenas, and the parameters' initialisation.
    load_seconds: f64,
}

/// Trains `model` under `train`: its program planned for this host at
/// `--batch-size` × `--seq-len` (or the batch file's shape); every rank as
/// a thread of this process, or (`process`) only this process's rank.
pub fn run<D: Device<Instr: Send> + Send>(
    args: &TrainArgs,
    model: &ModelSpec,
    train: &TrainingSpec,
    process: Option<ProcessRank>,
) -> Result<(), String> {
    let context = |e: String| format!("{}: error: {e}", args.spec.display());
    let fixed = match &args.batch {
        Some(path) => Some(checkpoint::load_batch(path).map_err(|e| e.to_string())?),
        None => None,
    };
    let (batch, seq) = match fixed.as_ref().and_then(|f| f.get("input_ids")) {
        Some(ids) if ids.shape().len() == 2 => (ids.shape()[0], ids.shape()[1]),
        Some(ids) => return Err(format!("error: `input_ids` must be [batch, seq], got {:?}", ids.shape())),
        None => (args.batch_size, args.seq_len),
    };
    let bindings: Bindings = [("batch".to_string(), batch as u64), ("seq".to_string(), seq as u64)].into();
    let data_parallel = match &process {
        Some(p) => process_data_parallel(args, p.world.world_size)?,
        None => args.data_parallel.strategy(),
    };
    if process.is_some() {
        refuse_under_launch(args)?;
    }
    let options = PassOptions {
        shape_hint: bindings.clone(),
        data_parallel,
        tensor_parallel: args.tp,
        sequence_parallel: args.sp,
        ..PassOptions::default()
    };
    let compiling = Instant::now();
    let graph = compile(model, &Target::Training(train), options).map_err(|e| context(e.to_string()))?.graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).map_err(|e| context(e.to_string()))?;
    let program = zeroplan_passes::planner::program::program(graph, &memory, batch as u64, seq as u64);
    let compile_seconds = Some(compiling.elapsed().as_secs_f64());
    let layout = checkpoints::layout(&program, model)?;
    // Every rank of the run: the data-parallel replicas' tensor ranks.
    let world = (data_parallel_ranks(&program.graph) * tensor_parallel_ranks(&program.graph)) as usize;
    let own_rank = process.as_ref().map(|p| p.world.rank);
    let resumed = match &args.resume {
        Some(dir) => Some(checkpoints::resume(dir, model, &layout, world, own_rank)?),
        None => None,
    };
    let seed = match &resumed {
        Some(r) if r.seed != args.seed => {
            eprintln!("note: continuing with the saved run's seed {} (not --seed {})", r.seed, args.seed);
            r.seed
        }
        Some(r) => r.seed,
        None => args.seed,
    };
    if args.weights.is_some() && resumed.is_some() {
        return Err(context("--weights starts a run, --resume continues one: pass one of them".into()));
    }
    let batches = match (fixed, &args.data) {
        (Some(f), _) => Batches::Fixed(f),
        (None, Some(data)) => {
            let tokenizer = tokenizer_path(args)?;
            Batches::Data(batches::dataset(data, &tokenizer, &model.head, model.vocab_size, seq, seed)?)
        }
        (None, None) => Batches::Fixed(batches::synthetic_batch(model, batch, seq, seed)?),
    };
    let loading = Instant::now();
    let (states, at) = match resumed {
        Some(r) => (Some(r.states), Some((r.step, r.data))),
        None => (None, None),
    };
    let nvme = nvme_tier(args, data_parallel.map(|d| d.offload))?;
    let mut trainer = Trainer::<D>::load(program, seed, process, states, batches, nvme.as_ref()).map_err(context)?;
    let setup = Setup { compile_seconds, load_seconds: loading.elapsed().as_secs_f64() };
    if let Some(path) = &args.weights {
        checkpoints::load_weights(path, model, &layout, trainer.ranks_mut(), own_rank.unwrap_or(0))?;
    }
    if let Some((step, data)) = at
        && !trainer.resume_at(step, data)
    {
        eprintln!("note: the save has no data position; --data starts from its top");
    }
    let saver = match &args.save {
        Some(dir) if !checkpoints::is_weights_file(dir) => Some(Saver {
            dir: dir.clone(),
            every: args.save_every,
            keep: args.keep as usize,
            model: model.clone(),
            data_parallel,
            seed,
            layout: layout.clone(),
        }),
        _ => None,
    };
    if let Some(saver) = &saver {
        std::fs::create_dir_all(&saver.dir)
            .map_err(|e| format!("error: could not create {}: {e}", saver.dir.display()))?;
    }
    train_loop(args, &mut trainer, saver.as_ref(), setup)?;
    if let Some(path) = args.save.as_ref().filter(|p| checkpoints::is_weights_file(p)) {
        checkpoints::save_weights(path, model, &layout, trainer.ranks())?;
    }
    Ok(())
}

/// The NVMe tier `--offload-to nvme --nvme-dir DIR` asks for, given the
/// run's offload: refused without states on the host to put there.
fn nvme_tier(args: &TrainArgs, offload: Option<Offload>) -> Result<Option<Nvme>, String> {
    let dir = match (args.offload_to, &args.nvme_dir) {
        (Some(OffloadTo::Nvme), None) => {
            return Err("error: --offload-to nvme needs --nvme-dir DIR: a directory on the NVMe drive for the \
                        states"
                .into());
        }
        (Some(OffloadTo::Cpu), Some(dir)) => {
            return Err(format!(
                "error: --offload-to cpu keeps the states in host memory, but --nvme-dir {} asks for files: pass one \
                 of them",
                dir.display()
            ));
        }
        (_, None) => return Ok(None),
        (_, Some(dir)) => dir,
    };
    if offload.is_none_or(|o| o == Offload::None) {
        return Err(format!(
            "error: --nvme-dir {} holds the states --offload puts on the host, and this run offloads none: add \
             --ranks N --offload optimizer (or optimizer+params)",
            dir.display()
        ));
    }
    Ok(Some(Nvme { dir: dir.clone() }))
}

/// The data parallelism of a process's rank: `--ranks` if given, else the
/// launch's `WORLD_SIZE / --tp` ranks (with `--zero` and `--offload`).
fn process_data_parallel(args: &TrainArgs, world: usize) -> Result<Option<DataParallel>, String> {
    let t = args.tp.unwrap_or(1);
    let world = world as u64;
    if !world.is_multiple_of(t) {
        return Err(format!(
            "error: the launch has WORLD_SIZE={world} ranks, which --tp {t} does not divide into model replicas: \
             launch a multiple of {t} ranks"
        ));
    }
    let d = args.data_parallel.ranks.unwrap_or(world / t);
    if d * t != world {
        return Err(format!(
            "error: --ranks {d} × --tp {t} = {} ranks, but the launch has WORLD_SIZE={world}: make them equal, or \
             leave --ranks out (under launch it is WORLD_SIZE / --tp)",
            d * t
        ));
    }
    let DataParallelArgs { zero, offload, .. } = args.data_parallel;
    Ok((args.data_parallel.ranks.is_some() || d > 1).then_some(DataParallel { ranks: d, zero_stage: zero, offload }))
}

/// What one process per rank cannot do yet: each holds only its own
/// rank's state, and a weights file and a profile join every rank's. (A
/// checkpoint directory is written a file per rank and read back per rank,
/// and `--weights` is cut per rank.)
fn refuse_under_launch(args: &TrainArgs) -> Result<(), String> {
    if args.save.as_deref().is_some_and(checkpoints::is_weights_file) {
        return Err("error: --save FILE.safetensors joins every rank's shards in one process, and under launch each \
                    process holds only its own: save a checkpoint directory (--save DIR), then `zeroplan export DIR \
                    -o FILE.safetensors`"
            .into());
    }
    if args.profile.is_some() {
        return Err("error: --profile is not supported with one process per rank yet (each process holds only its \
                    own rank's timings): run the ranks as threads of one process instead (`zeroplan train … --backend \
                    cpu --ranks N`)"
            .into());
    }
    Ok(())
}

/// Trains the program of a plan file, with its batch and sequence length.
pub fn run_plan<D: Device<Instr: Send> + Send>(args: &TrainArgs, process: Option<ProcessRank>) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.spec).map_err(|e| format!("{}: error: {e}", args.spec.display()))?;
    let context = |e: String| format!("{}: error: {e}", args.spec.display());
    let plan = Plan::from_ron(&text).map_err(|e| e.report(&args.spec.display().to_string()))?;
    if args.weights.is_some() || args.save.is_some() || args.resume.is_some() {
        return Err(context(
            "--weights, --save and --resume name tensors by the model spec's layout: train the spec itself \
             (`zeroplan train SPEC --backend cpu`)"
                .into(),
        ));
    }
    let Program { batch, seq, .. } = plan.program;
    let (head, vocab) = head_of(&plan.program.graph).ok_or_else(|| context("the plan has no training head".into()))?;
    let batches = match (&args.batch, &args.data) {
        (Some(path), _) => Batches::Fixed(checkpoint::load_batch(path).map_err(|e| e.to_string())?),
        (None, Some(data)) => {
            Batches::Data(batches::dataset(data, &tokenizer_path(args)?, &head, vocab, seq as usize, args.seed)?)
        }
        // The plan's own shape, seeded as `train SPEC` draws it.
        (None, None) => Batches::Fixed(batches::synthetic_feeds(&head, vocab, batch as usize, seq as usize, args.seed)),
    };
    if process.is_some() {
        refuse_under_launch(args)?;
    }
    let loading = Instant::now();
    if plan.strategy.offload_to == OffloadTo::Nvme && args.nvme_dir.is_none() {
        return Err(context(format!(
            "the plan keeps its offloaded states on NVMe (offload {}): give --nvme-dir DIR, a directory on the \
             node's NVMe drive",
            plan.strategy.offload_label()
        )));
    }
    let offload = Some(plan.strategy.offload);
    let nvme = nvme_tier(args, offload)?;
    let mut trainer =
        Trainer::<D>::load(plan.program, args.seed, process, None, batches, nvme.as_ref()).map_err(context)?;
    let setup = Setup { compile_seconds: None, load_seconds: loading.elapsed().as_secs_f64() };
    train_loop(args, &mut trainer, None, setup)
}

fn tokenizer_path(args: &TrainArgs) -> Result<PathBuf, String> {
    if let Some(t) = &args.tokenizer {
        return Ok(t.clone());
    }
    let dir =
        if args.spec.is_dir() { args.spec.clone() } else { args.spec.parent().unwrap_or(Path::new(".")).to_path_buf() };
    let beside = dir.join("tokenizer.json");
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(format!("error: --data needs a tokenizer: pass --tokenizer tokenizer.json (none at {})", beside.display()))
    }
}

/// Steps up to `--steps` (from where a resumed run stands) with a progress
/// bar (loss, tokens/s), or JSON lines with `--log-json`: the step's log,
/// `step_seconds` and `tokens_per_s` (wall time of the ranks' step, batch
/// drawing excluded), `arena_high_water_bytes` (rank 0's device arena as far
/// as the steps have written it: the plan's arena, less the last buffer's
/// rounding to 256 bytes, once every tensor has been written), and on the
/// first line `setup`. The log shows the ranks' mean loss; with one process
/// per rank, only rank 0 logs. `saver` checkpoints when due.
fn train_loop<D: Device<Instr: Send> + Send>(
    args: &TrainArgs,
    trainer: &mut Trainer<D>,
    saver: Option<&Saver>,
    setup: Setup,
) -> Result<(), String> {
    let logs_here = trainer.first_rank() == 0;
    let first = trainer.steps_done();
    if first >= args.steps {
        eprintln!("note: the run is at step {first} already, --steps {}: nothing to do", args.steps);
        return Ok(());
    }
    // The bar where someone watches; else (a file, a pipe, a scheduler's
    // log) a line per step, as the reference backend prints.
    let watched = std::io::stderr().is_terminal();
    let bar = (!args.log_json && logs_here && watched).then(|| {
        let bar = indicatif::ProgressBar::new(args.steps);
        bar.set_position(first);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  [{elapsed} < {eta}]")
                .expect("a valid template"),
        );
        bar
    });
    trainer.prepare(args.profile.is_some(), args.cuda_graphs)?;
    // With more than one step to profile, the first warms up and is left out.
    let warm_up = args.profile.is_some() && args.steps > first + 1;
    for step in first..args.steps {
        let _span = tracing::info_span!("step", step = step + 1).entered();
        let Stepped { log, seconds, tokens_per_s } = trainer.step()?;
        match &bar {
            None if !logs_here => {}
            None if !args.log_json => println!("{log}  {tokens_per_s:.0} tok/s"),
            None => {
                let mut line = serde_json::to_value(&log).expect("serialisable");
                line["step_seconds"] = seconds.into();
                line["tokens_per_s"] = tokens_per_s.into();
                line["arena_high_water_bytes"] = trainer.ranks()[0].high_water_bytes().into();
                if step == first {
                    line["setup"] = serde_json::to_value(setup).expect("serialisable");
                }
                println!("{line}");
            }
            Some(bar) => {
                bar.set_message(format!("loss {:.4}  lr {:.2e}  {:.0} tok/s", log.loss, log.lr, tokens_per_s));
                bar.inc(1);
            }
        }
        if warm_up && step == first {
            trainer.restart_profiles();
        }
        if diverges(&log) {
            if let Some(bar) = &bar {
                bar.abandon();
            }
            return Err(trainer.diagnose(&log, saver));
        }
        if let Some(saver) = saver.filter(|s| s.due(log.step, args.steps)) {
            let at = trainer.save(saver)?;
            match &bar {
                Some(bar) => bar.println(format!("saved {}", at.display())),
                None if logs_here && !args.log_json => eprintln!("saved {}", at.display()),
                None => {}
            }
        }
    }
    if let Some(bar) = bar {
        bar.finish();
    }
    if let Some(path) = &args.profile {
        let ranks = trainer.ranks();
        let profiles: Vec<_> = ranks.iter().filter_map(|rank| rank.profile()).collect();
        emit(&crate::trace::measured(ranks[0].program(), &profiles)?.to_json(), Some(path))?;
        if let Some(rank0) = profiles.first() {
            eprint!("{}", slowest_kinds(rank0, PROFILE_ROWS, warm_up));
        }
    }
    Ok(())
}

/// How many instruction kinds `train --profile` prints.
const PROFILE_ROWS: usize = 20;

/// Rank 0's slowest instruction kinds over the profiled steps: where a speed
/// hunt starts (the trace file has every instruction). With more than one
/// step, the first warms up and is left out (`warm_up`): on CUDA it loads
/// library kernels lazily and runs cuBLASLt's heuristics, and one of its
/// products measured 83 ms against 0.05 ms in later steps (bert-base, H100).
fn slowest_kinds(profile: &zeroplan_runtime::runner::Profile, rows: usize, warm_up: bool) -> String {
    let total = profile.total_seconds().max(f64::MIN_POSITIVE);
    let steps = if warm_up { "the steps after the first (a warm-up)" } else { "the steps run" };
    let mut out = format!("profile (rank 0): {total:.3} s in instructions over {steps}; the slowest kinds:\n");
    out += &format!("{:>10} {:>6} {:>7} {:>9}  kind\n", "seconds", "%", "calls", "TFLOP/s");
    for (kind, e) in profile.by_kind().into_iter().take(rows) {
        let rate = if e.flops > 0.0 { format!("{:.1}", e.flops / e.seconds.max(1e-12) / 1e12) } else { "-".into() };
        out += &format!("{:>10.4} {:>6.1} {:>7} {:>9}  {kind}\n", e.seconds, 100.0 * e.seconds / total, e.calls, rate);
    }
    out
}
