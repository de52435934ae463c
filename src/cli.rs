//! The command line, as clap sees it.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "zeroplan", version, about = "Compile BERT-family models into memory-planned training programs")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Build a model's forward graph and print it (text, Graphviz or JSON) or its summary.
    Graph(GraphArgs),
    /// List the devices plans can run on here: the host, and CUDA GPUs if a driver is found.
    Devices(DevicesArgs),
}

#[derive(Args)]
pub struct GraphArgs {
    /// A `.ron` model spec (see models/) or a Hugging Face `config.json` (or its directory).
    pub spec: PathBuf,
    /// Output format of the graph.
    #[arg(long, value_enum, default_value_t = GraphFormat::Text)]
    pub format: GraphFormat,
    /// Print a summary (parameters, layers, nodes…) instead of the graph.
    #[arg(long)]
    pub summary: bool,
    /// Print JSON: the summary as one object with --summary, else the graph.
    #[arg(long)]
    pub json: bool,
    /// Replace the spec's head: `mlm`, `pooler`, or `classification:N`.
    #[arg(long, value_parser = parse_head)]
    pub head: Option<zeroplan_ir::spec::Head>,
    /// Compute dtype of the forward graph (with --train, the training spec's precision decides).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: zeroplan_ir::DType,
    /// Show the whole training step (forward, backward, optimizer) under a RON
    /// training spec, or the defaults when no file is given.
    #[arg(long, value_name = "TRAIN.ron", num_args = 0..=1, require_equals = false)]
    pub train: Option<Option<PathBuf>>,
    /// Write to this file (atomically) instead of standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

#[derive(Args)]
pub struct DevicesArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// One line per node, in topological order.
    Text,
    /// Graphviz DOT, one cluster per layer.
    Dot,
    /// The graph file's layout, in JSON.
    Json,
}

fn parse_head(s: &str) -> Result<zeroplan_ir::spec::Head, String> {
    use zeroplan_ir::spec::Head;
    match s {
        "mlm" => Ok(Head::Mlm),
        "pooler" => Ok(Head::Pooler),
        _ => s
            .strip_prefix("classification:")
            .and_then(|n| n.parse().ok())
            .map(|num_labels| Head::Classification { num_labels })
            .ok_or_else(|| format!("`{s}` is not a head: use mlm, pooler or classification:N (N = 1 for regression)")),
    }
}

fn parse_dtype(s: &str) -> Result<zeroplan_ir::DType, String> {
    zeroplan_ir::DType::from_name(s).ok_or_else(|| format!("`{s}` is not a dtype: use f32, bf16 or f16"))
}
