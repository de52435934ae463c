//! `zeroplan export-deepspeed PLAN -o ds_config.json`: the DeepSpeed
//! configuration that trains as the plan does.

use crate::cli::ExportDeepspeedArgs;
use crate::output::emit;
use zeroplan_driver::deepspeed::export;
use zeroplan_ir::plan::Plan;

pub fn run(args: &ExportDeepspeedArgs) -> Result<(), String> {
    let text =
        std::fs::read_to_string(&args.plan).map_err(|e| format!("error: reading {}: {e}", args.plan.display()))?;
    let plan = Plan::from_ron(&text).map_err(|e| e.report(&args.plan.display().to_string()))?;
    let (config, notes) = export::config(&plan).map_err(|e| format!("{}: {e}", args.plan.display()))?;
    if !args.json {
        for note in notes {
            eprintln!("note: {note}");
        }
        return emit(&config, args.output.as_deref());
    }
    let output = args.output.as_deref();
    if let Some(path) = output {
        emit(&config, Some(path))?;
    }
    let config: serde_json::Value = serde_json::from_str(&config).expect("the export writes JSON");
    let summary = serde_json::json!({
        "output": output.map(|p| p.display().to_string()),
        "notes": notes,
        "config": if output.is_none() { config } else { serde_json::Value::Null },
    });
    emit(&format!("{summary}\n"), None)
}
