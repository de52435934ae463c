//! `zeroplan train SPEC|PLAN --backend cpu`: the planned program run by the
//! host runtime (Cranelift kernels, GEMMs, the plan's arena), on a
//! synthetic batch, a batch file, or `--data` (MLM text or a GLUE TSV).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::checkpoints;
use super::launched::Launched;
use crate::cli::{DataParallelArgs, TrainArgs};
use crate::output::emit;
use zeroplan_driver::data::{Dataset, Tokenizer, glue, mlm};
use zeroplan_ir::interp::{Feeds, State};
use zeroplan_ir::plan::{DataParallel, Plan, Program};
use zeroplan_ir::spec::{Head, ModelSpec, TrainingSpec};
use zeroplan_ir::{Bindings, Graph, Op};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::checkpoint;
use zeroplan_runtime::comm::InProcess;
use zeroplan_runtime::reference::{StepLog, data_parallel_ranks, tensor_parallel_ranks};
use zeroplan_runtime::runner::RunError;
use zeroplan_runtime::runner::{Device, Runner};

/// Whether `path` is a plan file (as `zeroplan compile -o` writes them).
pub fn is_plan(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.contains("program:") && t.contains("buffers:"))
}

/// Where batches come from.
enum Batches {
    Fixed(Feeds),
    Data(Dataset),
}

impl Batches {
    fn next(&mut self, batch: usize) -> Feeds {
        match self {
            Batches::Fixed(f) => f.clone(),
            Batches::Data(d) => d.next_batch(batch),
        }
    }
}

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
/// a thread of this process, or (`launched`) only this process's rank.
pub fn run<D: Device<Instr: Send> + Send>(
    args: &TrainArgs,
    model: &ModelSpec,
    train: &TrainingSpec,
    mut launched: Option<&mut Launched>,
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
    let data_parallel = match &launched {
        Some(l) => launched_data_parallel(args, l.world.world_size)?,
        None => args.data_parallel.strategy(),
    };
    if launched.is_some() {
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
    let own_rank = launched.as_ref().map(|l| l.world.rank);
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
    let loading = Instant::now();
    let mut ranks = match launched.as_deref_mut() {
        Some(l) => load_own_rank::<D>(program, seed, l, resumed.as_ref().map(|r| &r.states[0])).map_err(context)?,
        None => load_ranks::<D>(program, seed, resumed.as_ref().map(|r| r.states.as_slice())).map_err(context)?,
    };
    let setup = Setup { compile_seconds, load_seconds: loading.elapsed().as_secs_f64() };
    if let Some(path) = &args.weights {
        if resumed.is_some() {
            return Err(context("--weights starts a run, --resume continues one: pass one of them".into()));
        }
        checkpoints::load_weights(path, model, &layout, &mut ranks, own_rank.unwrap_or(0))?;
    }
    let mut batches = match (fixed, &args.data) {
        (Some(f), _) => Batches::Fixed(f),
        (None, Some(data)) => {
            let tokenizer = tokenizer_path(args)?;
            Batches::Data(dataset(data, &tokenizer, &model.head, model.vocab_size, seq, seed)?)
        }
        (None, None) => Batches::Fixed(super::train::synthetic_batch(model, batch, seq, seed)?),
    };
    if let Some(resumed) = &resumed {
        for host in &mut ranks {
            host.set_steps_done(resumed.step);
        }
        match (&mut batches, resumed.data) {
            (Batches::Data(d), Some(cursor)) => d.seek(cursor),
            (Batches::Data(_), None) => eprintln!("note: the save has no data position; --data starts from its top"),
            (Batches::Fixed(_), _) => {}
        }
    }
    let saver = match &args.save {
        Some(dir) if !checkpoints::is_weights_file(dir) => Some(checkpoints::Saver {
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
    train_loop(args, &mut ranks, batches, (batch, seq), saver.as_ref(), launched.as_deref(), setup)?;
    if let Some(path) = args.save.as_ref().filter(|p| checkpoints::is_weights_file(p)) {
        checkpoints::save_weights(path, model, &layout, &ranks)?;
    }
    Ok(())
}

/// The data parallelism of a launched rank: `--ranks` if given, else the
/// launch's `WORLD_SIZE / --tp` ranks (with `--zero` and `--offload`).
fn launched_data_parallel(args: &TrainArgs, world: usize) -> Result<Option<DataParallel>, String> {
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
pub fn run_plan<D: Device<Instr: Send> + Send>(
    args: &TrainArgs,
    launched: Option<&mut Launched>,
) -> Result<(), String> {
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
            Batches::Data(dataset(data, &tokenizer_path(args)?, &head, vocab, seq as usize, args.seed)?)
        }
        // The plan's own shape, seeded as `train SPEC` draws it.
        (None, None) => {
            Batches::Fixed(super::train::synthetic_feeds(&head, vocab, batch as usize, seq as usize, args.seed))
        }
    };
    if launched.is_some() {
        refuse_under_launch(args)?;
    }
    let loading = Instant::now();
    let (mut ranks, launched) = match launched {
        Some(l) => (load_own_rank::<D>(plan.program, args.seed, l, None).map_err(context)?, Some(&*l)),
        None => (load_ranks::<D>(plan.program, args.seed, None).map_err(context)?, None),
    };
    let setup = Setup { compile_seconds: None, load_seconds: loading.elapsed().as_secs_f64() };
    train_loop(args, &mut ranks, batches, (batch as usize, seq as usize), None, launched, setup)
}

/// This process's rank of a launched run, joined to its groups; its state
/// `given` (a resumed run), else initialised from `seed`.
fn load_own_rank<D: Device>(
    program: Program,
    seed: u64,
    launched: &mut Launched,
    given: Option<&State>,
) -> Result<Vec<Runner<D>>, String> {
    let d = data_parallel_ranks(&program.graph) as usize;
    let t = tensor_parallel_ranks(&program.graph) as usize;
    let groups = launched.groups(d, t)?;
    let none = State::new();
    Ok(vec![Runner::load_groups_with(program, seed, groups, given.unwrap_or(&none)).map_err(|e| e.to_string())?])
}

/// The program loaded once per rank it was planned for, `d` data-parallel
/// × `t` tensor-parallel ranks in global rank order (`data·t + tensor`),
/// joined by in-process groups; each rank's state from `states` where given
/// (a resumed run), else initialised from `seed`.
fn load_ranks<D: Device>(program: Program, seed: u64, states: Option<&[State]>) -> Result<Vec<Runner<D>>, String> {
    let d = data_parallel_ranks(&program.graph) as usize;
    let t = tensor_parallel_ranks(&program.graph) as usize;
    let none = State::new();
    InProcess::grid(d, t)
        .into_iter()
        .enumerate()
        .map(|(r, groups)| {
            let given = states.map_or(&none, |s| &s[r]);
            Runner::load_groups_with(program.clone(), seed, groups, given).map_err(|e| e.to_string())
        })
        .collect()
}

/// The head a training graph ends in, and its vocabulary size.
fn head_of(g: &Graph) -> Option<(Head, u64)> {
    let vocab = vocab_of(g)?;
    let labels = g.petgraph().node_weights().find(|n| n.name == "labels" && n.op == Op::Input)?;
    let head = match (labels.outputs[0].shape.rank(), labels.outputs[0].dtype.is_float()) {
        (2, _) => Head::Mlm,
        (_, true) => Head::Classification { num_labels: 1 },
        _ => {
            let logits = g.outputs.iter().find(|(n, _)| n == "logits")?.1;
            Head::Classification { num_labels: g.value_type(logits).shape.dims().last()?.as_constant()? }
        }
    };
    Some((head, vocab))
}

/// The vocabulary of a training graph's word embeddings. A tensor rank
/// holds `1/t` of the table, padded to a multiple of `t`: its cross-entropy
/// knows the real size; without an MLM head, the padded table is the bound.
/// In flat buckets (every plan `compile` writes) the table is a view of its
/// bucket: the lookup's table operand has its rows.
fn vocab_of(g: &Graph) -> Option<u64> {
    let nodes = || g.petgraph().node_weights();
    let parallel = nodes()
        .find_map(|n| match n.op {
            Op::CrossEntropyStats { vocab, .. } => Some(vocab),
            _ => None,
        })
        .or_else(|| {
            nodes().find_map(|n| match n.op {
                Op::VocabShard { ranks, rows } => Some(ranks * rows),
                _ => None,
            })
        });
    let lookup = || {
        let n = g.node_by_name("embeddings.word").filter(|&n| g.node(n).op == Op::Embedding)?;
        g.value_type(*g.operands(n).first()?).shape.dims().first()?.as_constant()
    };
    parallel
        .or_else(|| nodes().find(|n| n.name == "embeddings.word.weight")?.outputs[0].shape.dims()[0].as_constant())
        .or_else(lookup)
}

/// Why training stops at a step whose loss or gradients are not finite
/// (without loss scaling to absorb it): the step run again with every value
/// checked names the first one that is not, and where the run stands.
pub(super) fn diverged<D: Device<Instr: Send> + Send>(
    ranks: &mut [Runner<D>],
    first: usize,
    feeds: &[Vec<Feeds>],
    log: &StepLog,
    saver: Option<&checkpoints::Saver>,
) -> String {
    let what = if log.loss.is_finite() {
        "the gradients are not finite".to_string()
    } else {
        format!("the loss is {}", log.loss)
    };
    let mut message = format!("error: step {}: {what}; stopping.", log.step);
    for host in ranks.iter_mut() {
        host.set_steps_done(log.step - 1);
        host.set_finite_checks(true);
    }
    let results: Vec<_> = std::thread::scope(|s| {
        let running: Vec<_> = ranks.iter_mut().zip(feeds).map(|(h, f)| s.spawn(move || h.step(f).err())).collect();
        running.into_iter().map(|r| r.join().expect("a rank's thread panicked")).collect()
    });
    let first = results.iter().enumerate().find_map(|(rank, e)| match e {
        Some(RunError::NonFinite { node, micro_batch, what }) => Some((first + rank, node, micro_batch, what)),
        _ => None,
    });
    if let Some((rank, node, micro_batch, what)) = first {
        message += &format!(
            "\n  the first value that is not finite: `{node}` ({what}), micro-batch {micro_batch} on rank {rank}"
        );
    }
    if log.skipped {
        message += &format!("\n  the step was not applied: the weights are those after step {}", log.step - 1);
    }
    if let Some(saver) = saver {
        match zeroplan_runtime::checkpoint::training::Checkpoint::open(&saver.dir) {
            Ok(c) => message += &format!("\n  the last save is intact: {} (step {})", c.dir.display(), c.manifest.step),
            Err(_) => message += &format!("\n  nothing was saved in {} yet", saver.dir.display()),
        }
    }
    message + "\n  how to fix: lower --lr (or add warm-up or `max_grad_norm` in the --train spec), or check the data"
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

fn dataset(data: &Path, tokenizer: &Path, head: &Head, vocab: u64, seq: usize, seed: u64) -> Result<Dataset, String> {
    let tokenizer = Tokenizer::load(tokenizer, vocab).map_err(|e| format!("error: {e}"))?;
    let tsv = data.extension().is_some_and(|e| e == "tsv");
    let (examples, mlm) = match (head, tsv) {
        (Head::Mlm, false) => (mlm::load(data, &tokenizer, seq), true),
        (Head::Classification { num_labels }, true) => (glue::load(data, &tokenizer, seq, *num_labels), false),
        (Head::Mlm, true) => {
            return Err(format!(
                "error: {}: a .tsv is fine-tuning data, but the model's head is mlm: pass --head classification:N",
                data.display()
            ));
        }
        (Head::Classification { .. }, false) => {
            return Err(format!(
                "error: {}: text is MLM data, but the model's head classifies: give a GLUE-style .tsv or --head mlm",
                data.display()
            ));
        }
        (Head::Pooler, _) => return Err("error: a pooler head has no loss to train: pass --head".into()),
    };
    Ok(Dataset::new(examples.map_err(|e| format!("error: {e}"))?, seq, &tokenizer, mlm, seed))
}

/// Steps up to `--steps` (from where a resumed run stands) with a progress
/// bar (loss, tokens/s), or JSON lines with `--log-json`: the step's log,
/// `step_seconds` and `tokens_per_s` (wall time of the ranks' step, batch
/// drawing excluded), `arena_high_water_bytes` (rank 0's device arena as far
/// as the steps have written it: the plan's arena, less the last buffer's
/// rounding to 256 bytes, once every tensor has been written), and on the
/// first line `setup`. Each rank steps on its own thread with its own
/// micro-batches; the log shows the ranks' mean loss. `saver` checkpoints
/// when due. Launched, `ranks` is this process's one rank: it draws every
/// replica's batches and keeps its own, gathers every rank's loss for the
/// mean, and only rank 0 logs.
fn train_loop<D: Device<Instr: Send> + Send>(
    args: &TrainArgs,
    ranks: &mut [Runner<D>],
    mut batches: Batches,
    (batch, seq): (usize, usize),
    saver: Option<&checkpoints::Saver>,
    launched: Option<&Launched>,
    setup: Setup,
) -> Result<(), String> {
    // This process's ranks are `first_rank..first_rank + ranks.len()` of `world`.
    let (first_rank, world) = launched.map_or((0, ranks.len()), |l| (l.world.rank, l.world.world_size));
    let logs_here = first_rank == 0;
    let k = ranks[0].micro_batches() as usize;
    let first = ranks[0].steps_done();
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
    // Only the scalars the log needs come back, not the logits.
    let graph = &ranks[0].program().graph;
    // A replica's tensor ranks share its batches; the data ranks draw their own.
    let t = tensor_parallel_ranks(graph) as usize;
    let replicas = world / t;
    let logged: Vec<&str> =
        StepLog::OUTPUTS.into_iter().filter(|name| graph.outputs.iter().any(|(o, _)| o == name)).collect();
    for host in ranks.iter_mut() {
        host.fetch(&logged).map_err(|e| format!("error: {e}"))?;
    }
    for host in ranks.iter_mut() {
        host.set_profiling(args.profile.is_some());
    }
    for step in first..args.steps {
        let _span = tracing::info_span!("step", step = step + 1).entered();
        let drawn: Vec<Vec<Feeds>> = (0..replicas).map(|_| (0..k).map(|_| batches.next(batch)).collect()).collect();
        let feeds: Vec<Vec<Feeds>> = (first_rank..first_rank + ranks.len()).map(|r| drawn[r / t].clone()).collect();
        let started = Instant::now();
        let outputs: Vec<_> = std::thread::scope(|s| {
            let running: Vec<_> =
                ranks.iter_mut().zip(&feeds).map(|(host, feeds)| s.spawn(move || host.step(feeds))).collect();
            running.into_iter().map(|r| r.join().expect("a rank's thread panicked")).collect()
        });
        let seconds = started.elapsed().as_secs_f64();
        let mut logs = Vec::with_capacity(world);
        for out in outputs {
            let out = out.map_err(|e| format!("error: {e}"))?;
            logs.push(
                StepLog::from_rank_outputs(ranks[0].steps_done(), &out.outputs, replicas as u64)
                    .map_err(|e| format!("error: {e}"))?,
            );
        }
        let mut log = logs[0].clone();
        let losses: Vec<f64> = logs.iter().map(|l| l.loss).collect();
        let losses = match launched {
            Some(l) => l.gather(&losses)?,
            None => losses,
        };
        log.loss = losses.iter().sum::<f64>() / world as f64;
        let tokens_per_s = (batch * seq * k * replicas) as f64 / seconds;
        match &bar {
            None if !logs_here => {}
            None if !args.log_json => println!("{log}  {tokens_per_s:.0} tok/s"),
            None => {
                let mut line = serde_json::to_value(&log).expect("serialisable");
                line["step_seconds"] = seconds.into();
                line["tokens_per_s"] = tokens_per_s.into();
                line["arena_high_water_bytes"] = ranks[0].high_water_bytes().into();
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
        if !log.loss.is_finite() || (log.skipped && log.loss_scale.is_none()) {
            if let Some(bar) = &bar {
                bar.abandon();
            }
            return Err(diverged(ranks, first_rank, &feeds, &log, saver));
        }
        if let Some(saver) = saver.filter(|s| s.due(log.step, args.steps)) {
            let cursor = match &batches {
                Batches::Data(d) => Some(d.cursor()),
                Batches::Fixed(_) => None,
            };
            let at = saver.save(ranks, cursor, launched)?;
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
        let profiles: Vec<_> = ranks.iter().filter_map(|host| host.profile()).collect();
        emit(&crate::trace::measured(ranks[0].program(), &profiles)?.to_json(), Some(path))?;
    }
    Ok(())
}
