//! `zeroplan finetune --task T --model DIR --train train.tsv --dev dev.tsv`:
//! fine-tuning on a GLUE task on the host runtime.
//!
//! The encoder's weights come from `--model` (or `--init-from`), under the
//! task's classification head; a head of another label count is replaced.
//! Each epoch walks the training file once in a fresh order —
//! ⌈examples / batch⌉ steps, the last batch topped up from the epoch's first
//! examples — under the task's optimizer settings, the learning rate decaying
//! linearly to 0 over the run (the Hugging Face Trainer's default schedule)
//! after any warm-up. Then every dev file is scored with the task's metrics
//! by the forward program (dropout off), and when the first metric on the
//! first dev file is the best so far, the model goes to `--out` in Hugging
//! Face layout, each file written atomically.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::glue;
use crate::cli::FinetuneArgs;
use crate::output::emit;
use zeroplan_driver::classify::Classifier;
use zeroplan_driver::data::glue::{Split, load_task};
use zeroplan_driver::data::{Dataset, Tokenizer};
use zeroplan_driver::model_dir::{CONFIG, TOKENIZER, WEIGHTS};
use zeroplan_driver::program;
use zeroplan_driver::train::checkpoints;
use zeroplan_driver::train::divergence::{diverged, diverges};
use zeroplan_ir::Graph;
use zeroplan_ir::spec::{self, Head, Labels, ModelSpec, TaskSpec, TrainingSpec};
use zeroplan_passes::pipeline::Target;
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::checkpoint::training::{Layout, model_weights};
use zeroplan_runtime::checkpoint::{self, HeadShapes, Weights};
use zeroplan_runtime::reference::StepLog;

/// The scores file written beside the best model.
const EVAL: &str = "eval.json";

pub fn run(args: &FinetuneArgs) -> Result<(), String> {
    let common = &args.common;
    let task = glue::task(&common.task)?;
    let mut model = spec::load(&common.model).map_err(|e| e.to_string())?;
    model.head = Head::Classification { num_labels: task.num_labels() };
    let seq = glue::seq_len(common, &task, &model)?;
    let batch = common.batch_size as usize;
    let tokenizer =
        Tokenizer::load(&common.model.join(TOKENIZER), model.vocab_size).map_err(|e| format!("error: {e}"))?;
    let train_data =
        load_task(&args.train, &task, Split::Labelled, &tokenizer, seq).map_err(|e| format!("error: {e}"))?;
    let mut data = Dataset::new(train_data.examples, seq, &tokenizer, false, args.seed);
    let devs = glue::load_dev(&args.dev, &task, &tokenizer, seq)?;
    let epochs = args.epochs.unwrap_or(task.epochs);
    let steps = data.examples.len().div_ceil(batch) as u64;
    let train = training_spec(args, &task, epochs, steps)?;

    let program = program::plan(&model, &Target::Training(&train), batch, seq).map_err(|e| format!("error: {e}"))?;
    let layout = checkpoints::layout(&program, &model)?;
    let mut host = HostProgram::load(program, args.seed).map_err(|e| format!("error: {e}"))?;
    let start = args.init_from.as_ref().unwrap_or(&common.model).join(WEIGHTS);
    checkpoints::load_weights_with(&start, &model, &layout, std::slice::from_mut(&mut host), 0, HeadShapes::Replace)?;
    // Only the scalars the log needs come back, not the logits.
    let logged: Vec<&str> = StepLog::OUTPUTS
        .into_iter()
        .filter(|name| host.program().graph.outputs.iter().any(|(o, _)| o == name))
        .collect();
    host.fetch(&logged).map_err(|e| format!("error: {e}"))?;
    let (_, weights) = current_weights(&model, &layout, &host)?;
    let mut classifier = Classifier::new(&model, &weights, batch, seq).map_err(|e| e.to_string())?;

    let out = args.out.clone().unwrap_or_else(|| PathBuf::from(format!("finetuned-{}", task.name)));
    let bar = (!args.log_json).then(|| {
        let bar = indicatif::ProgressBar::new(epochs * steps);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  [{elapsed} < {eta}]")
                .expect("a valid template"),
        );
        bar
    });
    let mut best: Option<(u64, f64)> = None;
    for epoch in 1..=epochs {
        let started = Instant::now();
        let loss = train_epoch(&mut host, &mut data, batch, steps, bar.as_ref(), &format!("epoch {epoch}/{epochs}"))?;
        let seconds = started.elapsed().as_secs_f64();
        let (graph, weights) = current_weights(&model, &layout, &host)?;
        classifier.set_weights(&weights).map_err(|e| e.to_string())?;
        let scores = glue::evaluate(&mut classifier, &devs, &task, &tokenizer)?;
        let key = scores[0].key();
        let improved = best.is_none_or(|(_, b)| key > b);
        let record = serde_json::json!({
            "task": task.name, "epoch": epoch, "epochs": epochs, "steps": host.steps_done(), "loss": loss,
            "seconds": seconds, "dev": glue::to_json(&scores), "best": improved,
        });
        if improved {
            best = Some((epoch, key));
            save(&out, &common.model, &task, &model, &graph, &weights, &record)?;
        }
        match &bar {
            None => println!("{record}"),
            Some(bar) => {
                let kept = if improved { format!("; the best yet, saved to {}", out.display()) } else { String::new() };
                let lines = glue::render(&scores).lines().map(|l| format!("\n  {l}")).collect::<String>();
                bar.suspend(|| println!("epoch {epoch}/{epochs}: train loss {loss:.4} ({seconds:.2} s){kept}{lines}"));
            }
        }
    }
    if let (Some(bar), Some((epoch, _))) = (bar, best) {
        bar.finish_and_clear();
        println!("best: epoch {epoch}, in {} ({} has its scores)", out.display(), out.join(EVAL).display());
    }
    Ok(())
}

/// One pass over `data` in a fresh order, `steps` batches; the mean loss.
/// A loss or gradient that is not finite stops the run, naming the first
/// value that is not, as `train` does.
fn train_epoch(
    host: &mut HostProgram,
    data: &mut Dataset,
    batch: usize,
    steps: u64,
    bar: Option<&indicatif::ProgressBar>,
    epoch: &str,
) -> Result<f64, String> {
    data.shuffle();
    let mut loss = 0.0;
    for _ in 0..steps {
        let _span = tracing::info_span!("step", step = host.steps_done() + 1).entered();
        let feeds = [vec![data.next_batch(batch)]];
        let result = host.step(&feeds[0]).map_err(|e| format!("error: {e}"))?;
        let log = StepLog::from_outputs(host.steps_done(), &result.outputs).map_err(|e| format!("error: {e}"))?;
        if diverges(&log) {
            if let Some(bar) = bar {
                bar.abandon();
            }
            return Err(diverged(std::slice::from_mut(host), 0, &feeds, &log, None));
        }
        loss += log.loss / steps as f64;
        if let Some(bar) = bar {
            bar.set_message(format!("{epoch}  loss {:.4}  lr {:.2e}", log.loss, log.lr));
            bar.inc(1);
        }
    }
    Ok(loss)
}

/// The task's training settings under the flags, for `epochs` of `steps`
/// steps: the learning rate decays linearly to 0 at the end of the run,
/// unless the task sets its own `total_steps`.
fn training_spec(args: &FinetuneArgs, task: &TaskSpec, epochs: u64, steps: u64) -> Result<TrainingSpec, String> {
    let mut t = task.train.clone();
    t.lr = args.lr.unwrap_or(t.lr);
    t.weight_decay = args.weight_decay.unwrap_or(t.weight_decay);
    t.warmup_steps = args.warmup.unwrap_or(t.warmup_steps);
    t.dropout = args.dropout.or(t.dropout);
    let total = epochs * steps;
    if t.total_steps.is_none() && t.warmup_steps > total {
        return Err(format!(
            "error: {} warm-up steps, but the run is {total} steps ({epochs} epochs of {steps}): give fewer with --warmup",
            t.warmup_steps
        ));
    }
    t.total_steps = t.total_steps.or(Some(total));
    t.validate().map_err(|problems| {
        let lines: Vec<String> = problems.iter().map(|p| format!("error: {}\n  help: {}", p.message, p.help)).collect();
        lines.join("\n")
    })?;
    Ok(t)
}

/// The model's parameters as the training program holds them now, with the
/// forward graph they are named by.
fn current_weights(model: &ModelSpec, layout: &Layout, host: &HostProgram) -> Result<(Graph, Weights), String> {
    let logical = layout.consolidate(&[host.state()]).map_err(|e| format!("error: {e}"))?;
    model_weights(model, &logical).map_err(|e| format!("error: {e}"))
}

/// Writes the model to `out` in Hugging Face layout: `model.safetensors`,
/// `config.json` (`from`'s, as a classifier over the task's labels),
/// `from`'s `tokenizer.json`, and `eval.json` with `record` (last, so it
/// names the epoch whose files are there).
fn save(
    out: &Path,
    from: &Path,
    task: &TaskSpec,
    model: &ModelSpec,
    graph: &Graph,
    weights: &Weights,
    record: &serde_json::Value,
) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("error: could not create {}: {e}", out.display()))?;
    checkpoint::save_weights(&out.join(WEIGHTS), model, graph, weights).map_err(|e| e.to_string())?;
    emit(&config_json(&from.join(CONFIG), task)?, Some(&out.join(CONFIG)))?;
    let tokenizer = from.join(TOKENIZER);
    let text = std::fs::read_to_string(&tokenizer).map_err(|e| format!("error: {}: {e}", tokenizer.display()))?;
    emit(&text, Some(&out.join(TOKENIZER)))?;
    emit(&format!("{record:#}\n"), Some(&out.join(EVAL)))
}

/// The model's `config.json` as `BertForSequenceClassification`'s over the
/// task's labels (`id2label` in class order; one `LABEL_0` output for a
/// score), every other field kept.
fn config_json(path: &Path, task: &TaskSpec) -> Result<String, String> {
    let fail = |e: String| format!("error: {}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let mut config: serde_json::Value = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
    let object = config.as_object_mut().ok_or_else(|| fail("not a JSON object".into()))?;
    let (names, problem) = match &task.labels {
        Labels::Classes(names) => (names.clone(), "single_label_classification"),
        Labels::Regression { .. } => (vec!["LABEL_0".to_string()], "regression"),
    };
    let id2label: serde_json::Map<String, serde_json::Value> =
        names.iter().enumerate().map(|(i, n)| (i.to_string(), n.clone().into())).collect();
    let label2id: serde_json::Map<String, serde_json::Value> =
        names.iter().enumerate().map(|(i, n)| (n.clone(), i.into())).collect();
    object.insert("architectures".into(), serde_json::json!(["BertForSequenceClassification"]));
    object.insert("finetuning_task".into(), task.name.clone().into());
    object.insert("num_labels".into(), names.len().into());
    object.insert("id2label".into(), id2label.into());
    object.insert("label2id".into(), label2id.into());
    object.insert("problem_type".into(), problem.into());
    Ok(format!("{config:#}\n"))
}
