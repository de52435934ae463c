//! `zeroplan capacity SPEC --gpus N --gpu PROFILE [--tp T] [--zero S]`: the
//! largest model of the spec's family that trains on the cluster, by model
//! states alone and with a full plan (`zeroplan_passes::planner::capacity`).

use serde_json::json;

use crate::cli::{Candidates, CapacityArgs};
use crate::commands::compile::{cluster, training};
use crate::commands::inspect;
use crate::output::{emit, write_atomic};
use zeroplan_ir::spec;
use zeroplan_passes::planner::capacity::{Capacity, LADDER, Size, capacity};
use zeroplan_passes::planner::{Pins, Request, precision_name};

/// What the figures include and leave out, printed with them.
const ASSUMPTIONS: &str = "\
model states: parameters, gradients and AdamW states (16 bytes per parameter in mixed precision or f32) of one \
tensor rank's parameters, split over the data-parallel ranks by the ZeRO stage, against the whole budget; no \
activations, buffers or fragmentation (the ZeRO paper's analysis). full: the planner's plan at one sequence per GPU \
and step (t per data-parallel rank under t-way tensor parallelism): activations from the memory plan with the \
recomputation the search picks, CUDA context, GEMM workspace and NCCL buffers, the arena's fragmentation. Host \
memory is not limited: an offloading plan shows what it keeps on the host per GPU.";

pub fn run(args: &CapacityArgs) -> Result<(), String> {
    let family = spec::load(&args.spec).map_err(|e| e.to_string())?;
    let train = training(&args.training)?;
    let cluster = cluster(&args.cluster)?;
    let pins = Pins { tensor_parallel: args.tp, zero_stage: args.zero, offload: args.offload, ..Pins::default() };
    let world = cluster.world_size();
    let req = Request {
        model: &family,
        train,
        cluster,
        seq: args.seq,
        global_batch: world,
        pins,
        extrapolate_depth: true,
        exhaustive: false,
        shared: Default::default(),
        launches: Default::default(),
    };
    let found = capacity(&req, &LADDER).map_err(|e| format!("{}: error: {e}", args.spec.display()))?;
    if let (Some(path), Some(i)) = (&args.output, found.largest_planned) {
        let Some(Ok(plan)) = &found.sizes[i].full else { unreachable!("the largest planned size has its plan") };
        write_atomic(path, |file| plan.write_ron(file))?;
    }
    let text = if args.json { json_report(&found) } else { text(&req, &found) };
    emit(&text, None)
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn params(n: u64) -> String {
    if n >= 1_000_000_000 { format!("{:.1}B", n as f64 / 1e9) } else { format!("{:.0}M", n as f64 / 1e6) }
}

fn shape(s: &Size) -> String {
    format!("{} × {}", s.model.layers, s.model.hidden)
}

fn text(req: &Request, found: &Capacity) -> String {
    let c = &req.cluster;
    let mut t = format!(
        "capacity of the {} family on {} × {} ({} node{} × {}), {} per GPU, {}, {} tokens per sequence\n",
        req.model.name,
        c.world_size(),
        c.gpu.name,
        c.nodes,
        if c.nodes == 1 { "" } else { "s" },
        c.gpus_per_node,
        gib(c.budget_bytes()),
        precision_name(req.train.precision),
        req.seq
    );
    t += &format!("  {:<14} {:>8}  {:>26}  full plan\n", "layers × width", "params", "model states per GPU");
    for s in &found.sizes {
        let states = format!(
            "{} (TP-{} ZeRO-{}){}",
            gib(s.states_bytes),
            s.states_tensor_parallel,
            s.states_zero_stage,
            if s.states_fit { "" } else { " ✗" }
        );
        let full = match &s.full {
            None => "not planned".to_string(),
            Some(Ok(plan)) if plan.memory.host_bytes > 0 => {
                format!("{} + {} host: {}", gib(plan.memory.peak_bytes), gib(plan.memory.host_bytes), plan.strategy)
            }
            Some(Ok(plan)) => format!("{}: {}", gib(plan.memory.peak_bytes), plan.strategy),
            Some(Err(_)) => "does not fit".to_string(),
        };
        t += &format!("  {:<14} {:>8}  {states:>26}  {full}\n", shape(s), params(s.params));
    }
    let name = |i: Option<usize>| {
        i.map_or("none of the sizes".to_string(), |i| {
            format!("{} ({} parameters)", shape(&found.sizes[i]), params(found.sizes[i].params))
        })
    };
    t += &format!("largest by model states alone: {}\n", name(found.largest_by_states));
    t += &format!("largest with a full plan:      {}\n", name(found.largest_planned));
    if let Some(i) = found.largest_planned
        && let Some(Ok(plan)) = &found.sizes[i].full
    {
        t += "its plan:\n";
        for line in inspect::text(plan, Candidates::default()).lines() {
            t += &format!("  {line}\n");
        }
    }
    t += &format!("assumptions: {ASSUMPTIONS}\n");
    t
}

fn json_report(found: &Capacity) -> String {
    let sizes: Vec<_> = found
        .sizes
        .iter()
        .map(|s| {
            let full = match &s.full {
                None => json!(null),
                Some(Ok(plan)) => json!({ "fits": true, "plan": inspect::value(plan) }),
                Some(Err(why)) => json!({ "fits": false, "why": why }),
            };
            json!({
                "layers": s.model.layers,
                "hidden": s.model.hidden,
                "params": s.params,
                "model_states_bytes": s.states_bytes,
                "model_states_fit": s.states_fit,
                "model_states_tensor_parallel": s.states_tensor_parallel,
                "model_states_zero_stage": s.states_zero_stage,
                "full": full,
            })
        })
        .collect();
    let report = json!({
        "sizes": sizes,
        "largest_by_model_states": found.largest_by_states.map(|i| found.sizes[i].params),
        "largest_planned": found.largest_planned.map(|i| found.sizes[i].params),
        "assumptions": ASSUMPTIONS,
    });
    format!("{}\n", serde_json::to_string_pretty(&report).expect("serialisable"))
}
