//! `zeroplan inspect PLAN`: what a plan decided and predicts, per GPU.

use serde::Serialize;

use crate::cli::{Candidates, InspectArgs};
use crate::output::emit;
use zeroplan_ir::DType;
use zeroplan_ir::plan::{
    Candidate, ClusterDescription, CommSummary, MemorySummary, Offload, Plan, Predicted, RunnerUp, StatesExceed,
    Strategy, Workload,
};
use zeroplan_ir::spec::Cluster;
use zeroplan_passes::cost::Machine;
use zeroplan_passes::planner::evaluate::bindings;
use zeroplan_passes::planner::explain::distinct;

pub fn run(args: &InspectArgs) -> Result<(), String> {
    let text =
        std::fs::read_to_string(&args.plan).map_err(|e| format!("error: reading {}: {e}", args.plan.display()))?;
    let plan = Plan::from_ron(&text).map_err(|e| e.report(&args.plan.display().to_string()))?;
    let mut out = if args.json { json(&plan) } else { self::text(&plan, args.candidates) };
    if args.timeline {
        out += &timeline(&plan)?;
    }
    if let Some(path) = &args.trace {
        emit(&crate::trace::predicted(&plan)?.to_json(), Some(path))?;
    }
    if let Some(path) = &args.memory_svg {
        emit(&crate::chart::memory_svg(&plan)?, Some(path))?;
    }
    emit(&out, None)
}

/// The plan less its program, as JSON.
#[derive(Serialize)]
struct Inspection<'a> {
    model: &'a str,
    params: u64,
    cluster: &'a ClusterDescription,
    workload: &'a Workload,
    strategy: &'a Strategy,
    memory: &'a MemorySummary,
    comm: &'a CommSummary,
    predicted: &'a Predicted,
    runner_up: &'a Option<RunnerUp>,
    candidates: &'a [Candidate],
}

pub fn json(plan: &Plan) -> String {
    format!("{}\n", serde_json::to_string_pretty(&value(plan)).expect("serialisable"))
}

/// The plan less its program, as a JSON value.
pub fn value(plan: &Plan) -> serde_json::Value {
    let inspection = Inspection {
        model: &plan.model,
        params: plan.params,
        cluster: &plan.cluster,
        workload: &plan.workload,
        strategy: &plan.strategy,
        memory: &plan.memory,
        comm: &plan.comm,
        predicted: &plan.predicted,
        runner_up: &plan.runner_up,
        candidates: &plan.candidates,
    };
    serde_json::to_value(&inspection).expect("serialisable")
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn gb(bytes: f64) -> String {
    // `+ 0.0` turns a one-GPU plan's −0 traffic into 0 (`-0.000 GB` read as a bug).
    format!("{:.3} GB", bytes / 1e9 + 0.0)
}

fn tokens(per_second: f64) -> String {
    match per_second {
        r if r >= 1e6 => format!("{:.2}M", r / 1e6),
        r if r >= 1e3 => format!("{:.1}k", r / 1e3),
        // A drive-bound plan (1T parameters on one node) makes tens a second.
        r => format!("{r:.1}"),
    }
}

/// The plan for a reader: strategy, memory, traffic, time, the
/// candidates `shown`, then the runner-up and why it lost.
pub fn text(plan: &Plan, shown: Candidates) -> String {
    let (c, w, s, m) = (&plan.cluster, &plan.workload, &plan.strategy, &plan.memory);
    let mut t = format!(
        "{} ({:.1}M parameters) on {} × {} ({} node{} × {}), budget {} per GPU\n",
        plan.model,
        plan.params as f64 / 1e6,
        s.world(),
        c.gpu.name,
        c.nodes,
        if c.nodes == 1 { "" } else { "s" },
        c.gpus_per_node,
        gib(c.budget_bytes)
    );
    let groups = if s.tensor_parallel > 1 {
        let sp = if s.sequence_parallel { ", sequence-parallel" } else { "" };
        format!(" ({} tensor-parallel{sp} × {} data-parallel ranks)", s.tensor_parallel, s.ranks)
    } else {
        String::new()
    };
    t += &format!(
        "workload   {} sequences × {} tokens per step, {}{}\nstrategy   {s}{groups}\n",
        w.global_batch,
        w.seq,
        w.precision,
        if w.attention.is_fused() { "" } else { ", attention unfused" }
    );
    let fragmentation =
        m.arena_bytes.saturating_sub(m.params_bytes + m.grads_bytes + m.optimizer_bytes + m.activations_bytes);
    t += "memory per GPU at the peak\n";
    for (name, bytes) in [
        ("parameters", m.params_bytes),
        ("gradients", m.grads_bytes),
        ("optimizer", m.optimizer_bytes),
        ("activations", m.activations_bytes),
        ("fragmentation", fragmentation),
    ] {
        t += &format!("  {name:<14} {:>12}\n", gib(bytes));
    }
    t += &format!(
        "  {:<14} {:>12}   CUDA context {}, GEMM workspace {}, NCCL {}\n",
        "reserve",
        gib(m.reserve_bytes),
        gib(m.reserve.cuda_context),
        gib(m.reserve.gemm_workspace),
        gib(m.reserve.nccl)
    );
    t += &format!(
        "  {:<14} {:>12}   of {} ({:.0}%); lower bound of the arena {}\n",
        "peak",
        gib(m.peak_bytes),
        gib(m.budget_bytes),
        100.0 * m.peak_bytes as f64 / m.budget_bytes.max(1) as f64,
        gib(m.lower_bound_bytes + m.reserve_bytes)
    );
    if m.host_bytes > 0 && m.nvme_bytes == 0 {
        t += &format!("  {:<14} {:>12}   (offloaded to CPU memory, per GPU)\n", "host", gib(m.host_bytes));
    } else if m.host_bytes > 0 {
        t += &format!(
            "  {:<14} {:>12}   (pinned buffers the NVMe tier streams through, per GPU)\n",
            "host",
            gib(m.host_bytes)
        );
    }
    if m.nvme_bytes > 0 {
        let of = c.nvme.map_or(String::new(), |n| format!(" of {}", gib(n.bytes)));
        t += &format!("  {:<14} {:>12}   (offloaded to NVMe, per node{of})\n", "nvme", gib(m.nvme_bytes));
    }
    t += &format!("communication per GPU per step: {}\n", gb(plan.comm.bytes_per_step));
    for (kind, traffic) in &plan.comm.by_collective {
        t += &format!("  {kind:<14} {:>5} × {:>12}\n", traffic.count, gb(traffic.bytes));
    }
    if plan.comm.host_copy_bytes > 0.0 {
        t += &format!("  {:<14} {:>20}\n", "PCIe copies", gb(plan.comm.host_copy_bytes));
    }
    if let Some(line) = parameter_fetch(plan) {
        t += &line;
    }
    let p = &plan.predicted;
    t += &format!(
        "predicted  step {:.4} s, {} tokens/s, MFU {:.1}%\n",
        p.step_seconds,
        tokens(p.tokens_per_second),
        100.0 * p.mfu
    );
    let busy: Vec<String> = p.busy_seconds.iter().map(|(k, v)| format!("{k} {v:.4} s")).collect();
    t += &format!("  busy: {}; compute stalled {:.4} s\n", busy.join(", "), p.stalled_seconds);
    t += &candidates(plan, shown);
    match &plan.runner_up {
        Some(r) => t += &format!("runner-up  {}: {}\n", r.strategy, r.reason),
        None if plan.candidates.iter().filter(|c| c.fits).count() > 1 => {
            let or = if plan.candidates.iter().any(|c| c.recomputes_more_than.is_some()) {
                " or recomputes more than a plan above at the same micro-batch"
            } else {
                ""
            };
            t += &format!("runner-up  none: every other strategy that fits is this plan (its twins above){or}\n")
        }
        None => t += "runner-up  none: no other strategy fits\n",
    }
    t
}

/// The candidates table: the `shown` fastest distinct plans (identical
/// ones on one line, naming the choices they differ in), or every one.
fn candidates(plan: &Plan, shown: Candidates) -> String {
    // A choice a cheaper twin dominates was not compiled: one line for all
    // of them, unless every candidate is listed.
    let compiled = plan.candidates.iter().filter(|c| c.dominated_by.is_none());
    let rows: Vec<(String, Vec<&Candidate>)> = match shown {
        Candidates::All => plan.candidates.iter().map(|c| (label(c), vec![c])).collect(),
        Candidates::Best(_) => {
            let same_figures = |a: &Candidate, b: &Candidate| {
                (a.fits, a.peak_bytes, a.tokens_per_second, a.states_exceed)
                    == (b.fits, b.peak_bytes, b.tokens_per_second, b.states_exceed)
            };
            distinct(compiled, same_figures, label)
        }
    };
    let dominated = plan.candidates.iter().filter(|c| c.dominated_by.is_some()).count();
    let listed = match shown {
        Candidates::Best(n) => n.min(rows.len()),
        Candidates::All => rows.len(),
    };
    let mut t = "candidates (best micro-batch of each; peak per GPU)".to_string();
    if listed < rows.len() {
        t += &format!(
            ": the {listed} fastest of {} distinct plans ({} strategies searched; --candidates all lists each)",
            rows.len(),
            plan.candidates.len()
        );
    }
    t += "\n";
    let width = rows[..listed].iter().map(|(l, _)| l.chars().count()).max().unwrap_or(0);
    for (strategy, members) in &rows[..listed] {
        let candidate = members[0];
        let bound = candidate.recomputes_more_than.as_ref().and_then(|twin| {
            let twin_speed = plan.candidates.iter().find(|c| c.strategy == *twin)?.tokens_per_second?;
            Some((twin, twin_speed))
        });
        let speed = match (candidate.tokens_per_second, &candidate.dominated_by) {
            (Some(x), _) if let Some((twin, at_most)) = bound => format!(
                "≤ {} tokens/s: it recomputes more than `{}` at this micro-batch (estimated {})",
                tokens(at_most),
                twin.recompute,
                tokens(x)
            ),
            (Some(x), _) => format!("{} tokens/s", tokens(x)),
            (None, Some(twin)) => {
                format!("not compiled: {} fits every micro-batch it could use, with less work", choice_name(twin))
            }
            (None, None) => match candidate.states_exceed {
                Some(StatesExceed::Gpu) => "does not fit: its model states alone".to_string(),
                Some(StatesExceed::Checkpoints) => {
                    "does not fit: its model states and the layer inputs it keeps for the backward alone".to_string()
                }
                Some(StatesExceed::Host) => "does not fit: its offloaded states alone exceed --host-memory".to_string(),
                Some(StatesExceed::Nvme) => "does not fit: its offloaded states alone exceed --nvme".to_string(),
                None => "does not fit".to_string(),
            },
        };
        // Not compiled: a bound on the GPU's share where the GPU is what
        // overflows; where the hosts or drives do, that share (near nothing
        // with everything offloaded) says nothing, so no figure.
        let peak = match candidate.states_exceed {
            _ if candidate.dominated_by.is_some() => "—".to_string(),
            None => gib(candidate.peak_bytes),
            Some(StatesExceed::Gpu | StatesExceed::Checkpoints) => format!("≥ {}", gib(candidate.peak_bytes)),
            Some(StatesExceed::Host | StatesExceed::Nvme) => "—".to_string(),
        };
        t += &format!("  {strategy:<width$} {peak:>14}  {speed}\n");
    }
    if dominated > 0 && matches!(shown, Candidates::Best(_)) {
        t += &format!(
            "  and {dominated} not compiled: each is beaten by a cheaper twin that fits every micro-batch it could use \
             (keeping every activation rather than recomputing, CPU memory rather than NVMe); --exhaustive compiles them\n"
        );
    }
    t
}

/// A candidate as the table names it: its strategy, without the
/// micro-batch where it does not fit (none was found).
fn label(candidate: &Candidate) -> String {
    if candidate.fits {
        return candidate.strategy.to_string();
    }
    choice_name(&candidate.strategy)
}

/// A strategy without its micro-batch.
fn choice_name(s: &Strategy) -> String {
    let tp = s.tensor_parallel;
    let sp = if s.sequence_parallel { "+SP" } else { "" };
    format!(
        "{}ZeRO-{} offload {} recompute {}{}",
        if tp > 1 { format!("TP-{tp}{sp} ") } else { String::new() },
        s.zero_stage,
        s.offload_label(),
        s.recompute,
        if s.tiles > 1 { format!(" tiles {}", s.tiles) } else { String::new() }
    )
}

/// Bandwidth-centric partitioning in figures, for a plan that offloads its
/// parameters: the time every data-parallel rank takes to read its shard
/// of the whole model from the tier, against one rank reading all of it.
fn parameter_fetch(plan: &Plan) -> Option<String> {
    let s = &plan.strategy;
    if s.offload != Offload::OptimizerAndParams {
        return None;
    }
    let machine = machine(plan).ok()?;
    let bytes = plan.params as f64 * machine.dtype.size_bytes() as f64 / s.tensor_parallel as f64;
    let fetch = zeroplan_passes::cost::offload::parameter_fetch(&machine, bytes, s.ranks, s.tensor_parallel);
    Some(format!(
        "  parameter reads from {} per pass over the model: {:.2} s with {} ranks each reading its shard \
         (one rank reading all: {:.2} s)\n",
        s.offload_to.name(),
        fetch.bandwidth_centric_seconds,
        s.ranks,
        fetch.single_reader_seconds
    ))
}

/// The machine `plan` was made for: its cluster and compute dtype.
pub fn machine(plan: &Plan) -> Result<Machine, String> {
    let c = &plan.cluster;
    let cluster = Cluster {
        nodes: c.nodes,
        gpus_per_node: c.gpus_per_node,
        gpu: c.gpu.clone(),
        memory_budget: Some(c.budget_bytes),
        host_memory: c.host_memory_bytes,
        nvme: c.nvme,
    };
    let dtype = DType::from_name(&plan.workload.precision)
        .ok_or_else(|| format!("error: the plan's precision `{}` is not f32, bf16 or f16", plan.workload.precision))?;
    Ok(Machine { cluster, dtype, offload_to: plan.strategy.offload_to, launches: plan.predicted.launches })
}

/// The first micro-batch and the optimizer, instruction by instruction,
/// as the cost model plays them on the plan's GPU.
fn timeline(plan: &Plan) -> Result<String, String> {
    let machine = machine(plan)?;
    let graph = &plan.program.graph;
    let order = graph.topo_order();
    let bindings = bindings(plan.program.batch, plan.program.seq);
    let events = zeroplan_passes::cost::simulate::timeline(graph, &order, &bindings, &machine)
        .ok_or("error: the plan's graph has unbound sizes")?;
    let mut t = format!(
        "timeline (first micro-batch, then the optimizer), ms
  {:>10} {:>10}  {:<8} instruction
",
        "start", "end", "stream"
    );
    for e in events.iter().filter(|e| e.stream.is_some()) {
        let node = graph.node(e.node);
        let stream = e.stream.map_or("", |s| s.name());
        t += &format!(
            "  {:>10.4} {:>10.4}  {stream:<8} {} ({})\n",
            1e3 * e.start,
            1e3 * e.end,
            node.name,
            node.op.name()
        );
    }
    Ok(t)
}
