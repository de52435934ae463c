//! `zeroplan eval --task T --model DIR --dev dev.tsv`: a fine-tuned model's
//! scores on a GLUE task's dev files, with the task's metrics.

use super::glue;
use crate::cli::EvalArgs;
use crate::output::emit;
use zeroplan_driver::classify::{Classifier, FineTuned};

pub fn run(args: &EvalArgs) -> Result<(), String> {
    let task = glue::task(&args.common.task)?;
    let model = FineTuned::load(&args.common.model, task.num_labels()).map_err(|e| e.to_string())?;
    let seq = glue::seq_len(&args.common, &task, &model.spec)?;
    let devs = glue::load_dev(&args.dev, &task, &model.tokenizer, seq)?;
    let mut classifier = Classifier::new(&model.spec, &model.weights, args.common.batch_size as usize, seq)
        .map_err(|e| e.to_string())?;
    let scores = glue::evaluate(&mut classifier, &devs, &task, &model.tokenizer)?;
    let text = if args.json { format!("{}\n", glue::to_json(&scores)) } else { glue::render(&scores) };
    emit(&text, None)
}
