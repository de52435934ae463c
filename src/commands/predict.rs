//! `zeroplan predict --task T --model DIR --test test.tsv -o FILE.tsv`: a
//! fine-tuned model's predictions on a GLUE test file, in the submission
//! format GLUE's server reads: a header `index<TAB>prediction`, then each
//! row's index and its class name (or, for STS-B, its score).

use std::fmt::Write;

use super::glue;
use crate::cli::PredictArgs;
use crate::output::emit;
use zeroplan_driver::classify::{Classifier, FineTuned};
use zeroplan_driver::data::glue::{Split, load_task};
use zeroplan_driver::metrics::Predictions;
use zeroplan_ir::spec::Labels;

pub fn run(args: &PredictArgs) -> Result<(), String> {
    let task = glue::task(&args.common.task)?;
    let model = FineTuned::load(&args.common.model, task.num_labels()).map_err(|e| e.to_string())?;
    let seq = glue::seq_len(&args.common, &task, &model.spec)?;
    let test = load_task(&args.test, &task, Split::Test, &model.tokenizer, seq).map_err(|e| format!("error: {e}"))?;
    let mut classifier = Classifier::new(&model.spec, &model.weights, args.common.batch_size as usize, seq)
        .map_err(|e| e.to_string())?;
    let predicted = classifier.predict(&test.examples, &model.tokenizer).map_err(|e| e.to_string())?;
    let rows: Vec<(&str, String)> = test
        .index
        .iter()
        .enumerate()
        .map(|(i, index)| {
            let prediction = match (&predicted, &task.labels) {
                (Predictions::Classes(c), Labels::Classes(names)) => {
                    names.get(c[i]).cloned().unwrap_or_else(|| c[i].to_string())
                }
                (Predictions::Classes(c), Labels::Regression { .. }) => c[i].to_string(),
                (Predictions::Scores(s), _) => format!("{:.3}", s[i]),
            };
            (index.as_str(), prediction)
        })
        .collect();
    let mut out = String::from("index\tprediction\n");
    for (index, prediction) in &rows {
        let _ = writeln!(out, "{index}\t{prediction}");
    }
    if !args.json {
        return emit(&out, args.output.as_deref());
    }
    let mut summary = serde_json::json!({
        "task": task.name,
        "rows": rows.len(),
        "output": args.output.as_ref().map(|p| p.display().to_string()),
    });
    match &args.output {
        Some(path) => emit(&out, Some(path))?,
        None => {
            summary["predictions"] = rows
                .iter()
                .map(|(index, prediction)| serde_json::json!({"index": index, "prediction": prediction}))
                .collect();
        }
    }
    emit(&format!("{summary}\n"), None)
}
