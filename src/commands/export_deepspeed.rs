//! `zeroplan export-deepspeed PLAN -o ds_config.json`: the DeepSpeed
//! configuration that trains as the plan does.

use crate::cli::ExportDeepspeedArgs;
use crate::deepspeed::export;
use crate::output::emit;
use zeroplan_ir::plan::Plan;

pub fn run(args: &ExportDeepspeedArgs) -> Result<(), String> {
    let text =
        std::fs::read_to_string(&args.plan).map_err(|e| format!("error: reading {}: {e}", args.plan.display()))?;
    let plan = Plan::from_ron(&text).map_err(|e| format!("{}: error: {e}", args.plan.display()))?;
    let (config, notes) = export::config(&plan).map_err(|e| format!("{}: {e}", args.plan.display()))?;
    for note in notes {
        eprintln!("note: {note}");
    }
    emit(&config, args.output.as_deref())
}
