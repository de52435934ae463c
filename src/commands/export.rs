//! `zeroplan export DIR -o model.safetensors`: a training checkpoint's
//! parameters, joined from the ranks' shards, as one Hugging Face file.

use crate::cli::ExportArgs;
use zeroplan_runtime::checkpoint::training;

pub fn run(args: &ExportArgs) -> Result<(), String> {
    let checkpoint = training::export(&args.checkpoint, &args.output).map_err(|e| format!("error: {e}"))?;
    let m = &checkpoint.manifest;
    if args.json {
        let summary = serde_json::json!({
            "output": args.output.display().to_string(),
            "model": m.model.name,
            "step": m.step,
            "ranks": m.ranks,
            "checkpoint": checkpoint.dir.display().to_string(),
        });
        println!("{summary}");
        return Ok(());
    }
    eprintln!(
        "wrote {}: `{}` after step {}, joined from {} rank(s) ({})",
        args.output.display(),
        m.model.name,
        m.step,
        m.ranks,
        checkpoint.dir.display()
    );
    Ok(())
}
