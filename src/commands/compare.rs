//! `zeroplan compile SPEC --deepspeed ds_config.json`: a DeepSpeed
//! configuration planned as given — its ZeRO stage, offload, checkpointing,
//! micro-batch and precision pinned — against the best plan found.

use std::path::Path;

use serde_json::json;

use crate::cli::{Candidates, CompileArgs};
use crate::commands::compile::{pins, request};
use crate::commands::inspect;
use crate::output::{emit, write_atomic};
use zeroplan_driver::deepspeed::import;
use zeroplan_ir::plan::{OffloadTo, Plan};
use zeroplan_ir::spec::{Cluster, ModelSpec, TrainingSpec};
use zeroplan_passes::planner::{Pins, plan};

pub fn run(
    args: &CompileArgs,
    config: &Path,
    model: &ModelSpec,
    train: TrainingSpec,
    cluster: Cluster,
) -> Result<(), String> {
    let text = std::fs::read_to_string(config).map_err(|e| format!("error: reading {}: {e}", config.display()))?;
    let file = config.display().to_string();
    let gpus = cluster.world_size();
    let imported = import::read(&text, &file, train, gpus)?;
    if imported.pins.offload_to == Some(OffloadTo::Nvme) && cluster.nvme.is_none() {
        let at = zeroplan_driver::deepspeed::locate(&text, "zero_optimization.offload_optimizer.device")
            .map_or(String::new(), |(line, column)| format!(":{line}:{column}"));
        return Err(format!(
            "{file}{at}: error: the configuration offloads to NVMe, and the cluster has none\n  \
             help: give each node's NVMe capacity with --nvme SIZE (e.g. --nvme 28TiB for a DGX-2)"
        ));
    }
    let mut notes = imported.notes;
    let mut train = imported.train;
    if let Some(precision) = args.training.precision.filter(|p| *p != train.precision) {
        notes.push(format!("--precision overrides the configuration's {:?}", train.precision));
        train.precision = precision;
    }
    let pins = overridden(imported.pins, pins(args), &mut notes);
    let global_batch = match (imported.global_batch, args.global_batch) {
        (Some(given), Some(flag)) if given != flag => {
            return Err(format!(
                "{file}: error: train_batch_size is {given} sequences, --global-batch {flag}\n  help: leave --global-batch out"
            ));
        }
        (given, flag) => given.or(flag).ok_or_else(|| {
            format!(
                "{file}: error: the configuration fixes no batch size (train_batch_size)\n  help: pass --global-batch"
            )
        })?,
    };
    let ranks = gpus / pins.tensor_parallel.unwrap_or(1).max(1);
    let pins = match (pins.micro_batch, imported.accumulation) {
        (None, Some(steps)) if steps > 0 && global_batch.is_multiple_of(steps * ranks) => {
            Pins { micro_batch: Some(global_batch / (steps * ranks)), ..pins }
        }
        _ => pins,
    };
    for note in &notes {
        eprintln!("note: {file}: {note}");
    }
    let context = |e: zeroplan_passes::planner::PlanError| format!("{}: error: {e}", args.spec.display());
    let given = plan(&request(args, model, train.clone(), cluster.clone(), global_batch, pins)).map_err(context);
    let best = plan(&request(args, model, train, cluster, global_batch, Pins::default())).map_err(context)?;
    if let (Some(path), Ok(given)) = (&args.output, &given) {
        write_atomic(path, |file| given.write_ron(file))?;
    }
    let out = if args.json { json_report(&given, &best) } else { text_report(&file, &given, &best, args.candidates) };
    emit(&out, None)?;
    match (&args.output, given) {
        (Some(_), Err(_)) => Err(format!("error: {file} as given has no plan: nothing written")),
        _ => Ok(()),
    }
}

/// The configuration's pins, where the command line pins nothing else.
fn overridden(config: Pins, flags: Pins, notes: &mut Vec<String>) -> Pins {
    let mut note = |what: &str| notes.push(format!("{what} on the command line overrides the configuration"));
    if flags.tensor_parallel.is_some() {
        note("--tp");
    }
    if flags.zero_stage.is_some() {
        note("--zero");
    }
    if flags.offload.is_some() {
        note("--offload");
    }
    if flags.recompute.is_some() {
        note("--recompute");
    }
    if flags.micro_batch.is_some() {
        note("--micro-batch");
    }
    if flags.sequence_parallel.is_some() {
        note("--sp");
    }
    if flags.tiles.is_some() {
        note("--tiles");
    }
    if flags.offload_to.is_some() {
        note("--offload-to");
    }
    Pins {
        tensor_parallel: flags.tensor_parallel.or(config.tensor_parallel),
        zero_stage: flags.zero_stage.or(config.zero_stage),
        offload: flags.offload.or(config.offload),
        recompute: flags.recompute.or(config.recompute),
        micro_batch: flags.micro_batch.or(config.micro_batch),
        sequence_parallel: flags.sequence_parallel.or(config.sequence_parallel),
        tiles: flags.tiles.or(config.tiles),
        offload_to: flags.offload_to.or(config.offload_to),
        // A DeepSpeed configuration does not say how attention runs.
        attention: flags.attention,
    }
}

fn json_report(given: &Result<Plan, String>, best: &Plan) -> String {
    let as_given = match given {
        Ok(plan) => inspect::value(plan),
        Err(e) => json!({ "error": e }),
    };
    let ratio = given.as_ref().ok().map(|g| best.predicted.tokens_per_second / g.predicted.tokens_per_second);
    let report = json!({ "as_given": as_given, "best": inspect::value(best), "best_over_given": ratio });
    format!("{}\n", serde_json::to_string_pretty(&report).expect("serialisable"))
}

fn text_report(file: &str, given: &Result<Plan, String>, best: &Plan, shown: Candidates) -> String {
    let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
    let mut t = format!("DeepSpeed configuration {file}, as given:\n");
    let given = match given {
        Ok(plan) => {
            t += &inspect::text(plan, shown);
            plan
        }
        Err(e) => {
            t += &format!("  no plan: {e}\nbest plan found: {}\n", best.strategy);
            return t;
        }
    };
    t += "against the best plan found\n";
    for (name, plan) in [("as given", given), ("best found", best)] {
        let (m, p) = (&plan.memory, &plan.predicted);
        t += &format!("  {name:<11} {}\n", plan.strategy);
        t += &format!(
            "  {:<11} peak {}, step {:.4} s, {:.0} tokens/s\n",
            "",
            gib(m.peak_bytes),
            p.step_seconds,
            p.tokens_per_second
        );
    }
    let ratio = best.predicted.tokens_per_second / given.predicted.tokens_per_second;
    t += &if given.strategy == best.strategy {
        "  the configuration is the best plan found\n".to_string()
    } else {
        format!("  the best plan found trains {ratio:.2}× as fast\n")
    };
    t
}
