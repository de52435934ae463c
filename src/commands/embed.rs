//! `zeroplan embed --model DIR --text … [--backend cpu|reference]`: sentence embeddings and their cosine
//! similarities.

use std::fmt::Write;

use crate::cli::{Backend, EmbedArgs};
use crate::output::emit;
use zeroplan_driver::embed::{self, Embedder, Embeddings};

/// Embedding values shown per text in the text output.
const SHOWN: usize = 6;

pub fn run(args: &EmbedArgs) -> Result<(), String> {
    let backend = match args.backend {
        Backend::Cpu => embed::Backend::Cpu,
        Backend::Reference => embed::Backend::Reference,
        Backend::Cuda => return Err("error: embed runs on --backend cpu or reference; not on CUDA yet".into()),
    };
    let mut embedder = Embedder::load(&args.model, backend).map_err(|e| e.to_string())?;
    let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
    let result = embedder.embed(&texts).map_err(|e| e.to_string())?;
    let text = if args.json {
        let mut json = serde_json::to_string(&result).expect("serialisable");
        json.push('\n');
        json
    } else {
        render(&texts, &result)
    };
    emit(&text, None)
}

fn render(texts: &[&str], r: &Embeddings) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} embeddings of dimension {} (mean-pooled, L2-normalised)", r.embeddings.len(), r.dim);
    for (i, (t, e)) in texts.iter().zip(&r.embeddings).enumerate() {
        let head: Vec<String> = e.iter().take(SHOWN).map(|x| format!("{x:+.5}")).collect();
        let norm = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        let _ = writeln!(out, "[{i}] [{}, …]  norm {norm:.6}  {t:?}", head.join(", "));
    }
    let _ = writeln!(out, "cosine similarity:");
    let _ = writeln!(
        out,
        "     {}",
        (0..r.similarity.len()).map(|j| format!("{:>8}", format!("[{j}]"))).collect::<String>()
    );
    for (i, row) in r.similarity.iter().enumerate() {
        let cells: String = row.iter().map(|s| format!("{s:>8.4}")).collect();
        let _ = writeln!(out, "{:>4} {cells}", format!("[{i}]"));
    }
    out
}
