//! `zeroplan graph SPEC`: the forward graph, or its summary.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::cli::{GraphArgs, GraphFormat};
use crate::output::emit;
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::spec::{self, Head, ModelSpec};
use zeroplan_ir::{Graph, Op};

pub fn run(args: &GraphArgs) -> Result<(), String> {
    let mut spec = spec::load(&args.spec).map_err(|e| e.to_string())?;
    if let Some(head) = args.head {
        spec.head = head;
    }
    let graph = forward(&spec, &BuildOptions { dtype: args.dtype })
        .map_err(|e| format!("{}: error: {e}", args.spec.display()))?;
    let text = if args.summary {
        let summary = Summary::new(&spec, &graph);
        if args.json {
            format!("{}\n", serde_json::to_string_pretty(&summary).expect("serialisable"))
        } else {
            summary.to_text()
        }
    } else {
        match (args.format, args.json) {
            (GraphFormat::Json, _) | (_, true) => {
                format!("{}\n", serde_json::to_string_pretty(&graph.to_json()).expect("serialisable"))
            }
            (GraphFormat::Dot, false) => graph.to_dot(),
            (GraphFormat::Text, false) => graph.to_text(),
        }
    };
    emit(&text, args.output.as_deref())
}

/// What `--summary` reports.
#[derive(Serialize)]
struct Summary {
    name: String,
    /// Unique trainable scalars.
    params: u64,
    /// Bytes of the parameters at the graph's dtype.
    param_bytes: u64,
    layers: u64,
    hidden: u64,
    heads: u64,
    intermediate: u64,
    vocab_size: u64,
    head: String,
    dtype: String,
    nodes: usize,
    inputs: BTreeMap<String, String>,
    outputs: BTreeMap<String, String>,
    ops: BTreeMap<&'static str, usize>,
}

impl Summary {
    fn new(spec: &ModelSpec, graph: &Graph) -> Summary {
        let g = graph.petgraph();
        let params = graph.params();
        let param_bytes = params.iter().filter_map(|n| graph.node(*n).outputs[0].size_bytes(&Default::default())).sum();
        let dtype = params.first().map_or("none".to_string(), |n| graph.node(*n).outputs[0].dtype.to_string());
        let inputs = g
            .node_indices()
            .filter(|n| matches!(g[*n].op, Op::Input))
            .map(|n| (g[n].name.clone(), g[n].outputs[0].to_string()))
            .collect();
        let outputs = graph.outputs.iter().map(|(name, v)| (name.clone(), graph.value_type(*v).to_string())).collect();
        Summary {
            name: spec.name.clone(),
            params: graph.parameter_count(),
            param_bytes,
            layers: spec.layers,
            hidden: spec.hidden,
            heads: spec.heads,
            intermediate: spec.intermediate,
            vocab_size: spec.vocab_size,
            head: match spec.head {
                Head::Mlm => "mlm".into(),
                Head::Pooler => "pooler".into(),
                Head::Classification { num_labels: 1 } => "regression".into(),
                Head::Classification { num_labels } => format!("classification:{num_labels}"),
            },
            dtype,
            nodes: graph.node_count(),
            inputs,
            outputs,
            ops: graph.op_histogram(),
        }
    }

    fn to_text(&self) -> String {
        let group = |n: u64| {
            let digits = n.to_string();
            let mut out = String::new();
            for (i, c) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i).is_multiple_of(3) {
                    out.push(',');
                }
                out.push(c);
            }
            out
        };
        let list =
            |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ");
        let ops: Vec<String> = self.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        format!(
            "{name} ({head} head, {dtype})\n  parameters  {params} ({mib:.1} MiB)\n  shape       {layers} layers, hidden {hidden}, {heads} heads, intermediate {inter}, vocab {vocab}\n  nodes       {nodes}: {ops}\n  inputs      {inputs}\n  outputs     {outputs}\n",
            name = self.name,
            head = self.head,
            dtype = self.dtype,
            params = group(self.params),
            mib = self.param_bytes as f64 / (1u64 << 20) as f64,
            layers = self.layers,
            hidden = self.hidden,
            heads = self.heads,
            inter = self.intermediate,
            vocab = self.vocab_size,
            nodes = self.nodes,
            ops = ops.join(", "),
            inputs = list(&self.inputs),
            outputs = list(&self.outputs),
        )
    }
}
