//! `zeroplan graph SPEC`: the forward graph, or its summary.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::cli::{GraphArgs, GraphFormat};
use crate::output::emit;
use zeroplan_ir::spec::{self, Head, ModelSpec, TrainingSpec};
use zeroplan_ir::{Graph, Op};
use zeroplan_passes::accounting::{ModelStateBytes, model_state_bytes};
use zeroplan_passes::cost::comm::Traffic;
use zeroplan_passes::manager::PassRecord;
use zeroplan_passes::memory::{Category, MemoryPlan};
use zeroplan_passes::pipeline::{Target, compile, pass_names};

pub fn run(args: &GraphArgs) -> Result<(), String> {
    let mut spec = spec::load(&args.spec).map_err(|e| e.to_string())?;
    if let Some(head) = args.head {
        spec.head = head;
    }
    let train = match &args.train {
        None => None,
        Some(Some(path)) => Some(TrainingSpec::load(path).map_err(|e| e.to_string())?),
        Some(None) => Some(TrainingSpec::default()),
    };
    let target = match &train {
        None => Target::Forward(args.dtype),
        Some(train) => Target::Training(train),
    };
    let mut options = args.passes.options();
    if let Some(after) = &args.after {
        // Stopping after a pass is running none of those after it.
        let names = pass_names(&target);
        let at = names.iter().position(|n| n == after).ok_or_else(|| {
            format!("error: --after {after}: unknown pass\n  help: the passes are {}", names.join(", "))
        })?;
        options.disabled.extend(names[at + 1..].iter().map(|n| n.to_string()));
    }
    let compiled =
        compile(&spec, &target, options.clone()).map_err(|e| format!("{}: error: {e}", args.spec.display()))?;
    if args.passes.time_passes {
        eprint!("{}", pass_report(&compiled.records));
    }
    for line in &compiled.explanations {
        eprintln!("{line}");
    }
    let graph = compiled.graph;
    let text = if args.summary {
        let hint = options.shape_hint;
        let memory =
            zeroplan_passes::memory::plan(&graph, &hint).map_err(|e| format!("{}: error: {e}", args.spec.display()))?;
        let mut summary = Summary::new(&spec, &graph, MemoryReport::new(&memory, &hint));
        let micro_batches = train.as_ref().map_or(1, |t| t.micro_batches);
        summary.comm = zeroplan_passes::cost::comm::traffic(&graph, micro_batches, &hint);
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
            // The kernels of fused nodes follow the graph they belong to.
            (GraphFormat::Text, false) => graph.to_text() + &zeroplan_passes::fuse::kernels_text(&graph),
        }
    };
    emit(&text, args.output.as_deref())
}

/// The memory plan's figures.
#[derive(Serialize)]
struct MemoryReport {
    batch: u64,
    seq: u64,
    /// The arena's size: every buffer at a fixed offset.
    peak_bytes: u64,
    /// The most bytes live at once: no allocator can go below it.
    lower_bound_bytes: u64,
    fragmentation: f64,
    /// Bytes live at the peak, by category.
    at_peak: BTreeMap<Category, u64>,
    /// Host memory the plan needs (ZeRO-Offload), at its own peak.
    host_peak_bytes: u64,
}

impl MemoryReport {
    fn new(plan: &MemoryPlan, hint: &zeroplan_ir::Bindings) -> MemoryReport {
        MemoryReport {
            batch: hint["batch"],
            seq: hint["seq"],
            peak_bytes: plan.arena.size,
            lower_bound_bytes: plan.arena.lower_bound,
            fragmentation: plan.arena.fragmentation(),
            at_peak: plan.at_peak.clone(),
            host_peak_bytes: plan.host.size,
        }
    }

    fn to_text(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let parts: Vec<String> = self
            .at_peak
            .iter()
            .map(|(c, b)| {
                format!("{} {:.1}", serde_json::to_value(c).expect("serialisable").as_str().unwrap_or("?"), mib(*b))
            })
            .collect();
        let host = if self.host_peak_bytes > 0 {
            format!("; host {:.1} MiB", mib(self.host_peak_bytes))
        } else {
            String::new()
        };
        format!(
            "  memory      batch {} × seq {}: peak {:.1} MiB (lower bound {:.1}, fragmentation {:.1}%); at the peak, MiB: {}{host}\n",
            self.batch,
            self.seq,
            mib(self.peak_bytes),
            mib(self.lower_bound_bytes),
            100.0 * self.fragmentation,
            parts.join(", ")
        )
    }
}

/// `--time-passes`: one line per pass.
fn pass_report(records: &[PassRecord]) -> String {
    let mut out = String::new();
    for r in records {
        if !r.ran {
            out += &format!("{:<16} disabled\n", r.name);
            continue;
        }
        let stats: Vec<String> = r.stats.iter().map(|(k, v)| format!("{k} {v}")).collect();
        out += &format!(
            "{:<16} {:>9.3} ms  nodes {} → {}{}{}\n",
            r.name,
            r.time.as_secs_f64() * 1e3,
            r.nodes_before,
            r.nodes_after,
            if stats.is_empty() { "" } else { "  " },
            stats.join(", ")
        );
    }
    out
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
    /// Nodes per phase: forward, and for training graphs backward and optimizer.
    phases: BTreeMap<&'static str, usize>,
    /// Model-state bytes by class (training graphs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    model_state_bytes: Option<ModelStateBytes>,
    /// The static memory plan at the assumed batch and sequence length.
    memory: MemoryReport,
    /// What each rank sends per step, by collective (data-parallel steps).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    comm: BTreeMap<&'static str, Traffic>,
    inputs: BTreeMap<String, String>,
    outputs: BTreeMap<String, String>,
    ops: BTreeMap<&'static str, usize>,
}

impl Summary {
    fn new(spec: &ModelSpec, graph: &Graph, memory: MemoryReport) -> Summary {
        let params = graph.params();
        let param_bytes = params.iter().filter_map(|n| graph.node(*n).outputs[0].size_bytes(&Default::default())).sum();
        // The compute dtype: what the embeddings are looked up in (parameters
        // of a mixed-precision training graph are f32 masters).
        let dtype = graph
            .node_by_name("embeddings.word")
            .map_or("none".to_string(), |n| graph.node(n).outputs[0].dtype.to_string());
        let inputs = graph
            .node_indices()
            .filter(|n| matches!(graph[*n].op, Op::Input))
            .map(|n| (graph[n].name.to_string(), graph[n].outputs[0].to_string()))
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
            phases: graph.phase_counts().into_iter().map(|(p, n)| (p.name(), n)).collect(),
            model_state_bytes: graph
                .node_indices()
                .any(|n| zeroplan_ir::kernel::adamw_operands(graph, n).is_some())
                .then(|| model_state_bytes(graph).0),
            memory,
            comm: BTreeMap::new(),
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
        let phases: Vec<String> = ["forward", "backward", "optimizer"]
            .iter()
            .filter_map(|p| self.phases.get(p).map(|n| format!("{p} {n}")))
            .collect();
        let state = self.model_state_bytes.map_or(String::new(), |b| {
            let per = |x: u64| x as f64 / self.params as f64;
            format!(
                "  model state {:.1} MiB = {:.1} B/param: parameters {:.0}, working copies {:.0}, gradients {:.0}, optimizer {:.0}, micro-batch gradients {:.0}\n",
                b.total() as f64 / (1u64 << 20) as f64,
                per(b.total()),
                per(b.parameters),
                per(b.working_copies),
                per(b.gradients),
                per(b.optimizer),
                per(b.micro_batch_gradients),
            )
        });
        let comm = if self.comm.is_empty() {
            String::new()
        } else {
            let kinds: Vec<String> = self
                .comm
                .iter()
                .map(|(k, t)| format!("{k} {}× {:.1} MiB", t.count, t.bytes / (1u64 << 20) as f64))
                .collect();
            let elements: f64 = self.comm.values().map(|t| t.elements).sum();
            format!(
                "  comm        per rank per step: {} ({:.2}Ψ elements)\n",
                kinds.join(", "),
                elements / self.params as f64
            )
        };
        format!(
            "{name} ({head} head, {dtype})\n  parameters  {params} ({mib:.1} MiB)\n  shape       {layers} layers, hidden {hidden}, {heads} heads, intermediate {inter}, vocab {vocab}\n  nodes       {nodes} ({phases}): {ops}\n{state}{memory}{comm}  inputs      {inputs}\n  outputs     {outputs}\n",
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
            phases = phases.join(", "),
            state = state,
            memory = self.memory.to_text(),
            ops = ops.join(", "),
            inputs = list(&self.inputs),
            outputs = list(&self.outputs),
        )
    }
}
