//! Why a plan lost, and what would make one fit: the sentences a user
//! reads before deciding how many GPUs to ask for.

use std::collections::HashMap;
use zeroplan_ir::plan::OffloadTo;

use super::depth::Probe;
use super::evaluate::{Choice, Evaluation};
use super::search::Outcome;
use super::{PlanError, Request};

const GIB: f64 = (1u64 << 30) as f64;

/// One choice that does not fit, and what would make it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shortfall {
    /// The choice (`ZeRO-3 offload optimizer recompute full`).
    pub choice: String,
    /// Its least memory per GPU, at micro-batch 1.
    pub min_peak_bytes: u64,
    /// The fewest GPUs over which its shards would fit the budget, where
    /// more GPUs help (the model `peak(N) = A + B/N` through N and 2N).
    pub gpus_to_fit: Option<u64>,
    /// `A`: what each GPU holds however many share the rest (whole
    /// states, gathered layers, activations); `None` for ZeRO-0.
    pub floor_bytes: Option<u64>,
    /// What its GPUs offload to one node's host, where that exceeds
    /// `--host-memory`.
    pub host_bytes_per_node: Option<u64>,
    /// What its GPUs keep on one node's NVMe, where that exceeds `--nvme`.
    pub nvme_bytes_per_node: Option<u64>,
}

/// The error for a search where nothing fits.
pub fn nothing_fits(req: &Request, outcomes: &[Outcome]) -> Result<PlanError, PlanError> {
    let world = req.cluster.world_size();
    let mut shortfalls = Vec::new();
    // A choice's device memory does not depend on the tier its offloaded
    // states live on: its twin on the other tier shares the fit along N.
    let mut along_ranks: HashMap<String, (Option<u64>, Option<u64>)> = HashMap::new();
    for o in outcomes {
        let (mut gpus_to_fit, mut floor_bytes) = (None, None);
        let twin = Choice { offload_to: OffloadTo::Cpu, ..o.choice }.to_string();
        if let Some(&known) = along_ranks.get(&twin) {
            (gpus_to_fit, floor_bytes) = known;
        } else if o.choice.zero_stage > 0 {
            // ZeRO shards over the data-parallel ranks: fit `peak(N)` along them.
            let (t, ranks) = (o.choice.tensor_parallel, o.choice.data_ranks(world));
            let micro_batches = super::search::per_rank(req, o.choice).max(1);
            let at = |n: u64| -> Result<f64, PlanError> {
                Ok(Probe::compile(req, o.choice, n, 1, micro_batches)?.memory(req, 1)?.peak_bytes as f64)
            };
            let (p1, p2) = (at(ranks)?, at(2 * ranks)?);
            let budget = req.cluster.budget_bytes() as f64;
            let replicas_per_node = (req.cluster.gpus_per_node / t).max(1);
            gpus_to_fit = gpus_for_budget(p1, p2, ranks, budget, replicas_per_node).map(|replicas| replicas * t);
            floor_bytes = Some((2.0 * p2 - p1).max(0.0) as u64);
            along_ranks.insert(twin, (gpus_to_fit, floor_bytes));
        }
        let (mut host_bytes_per_node, mut nvme_bytes_per_node) = (None, None);
        if o.choice.offload != zeroplan_ir::plan::Offload::None {
            let (ranks, micro_batches) = (o.choice.data_ranks(world), super::search::per_rank(req, o.choice).max(1));
            let memory = Probe::compile(req, o.choice, ranks, 1, micro_batches)?.memory(req, 1)?;
            if !req.cluster.host_fits(memory.host_bytes) {
                host_bytes_per_node = Some(memory.host_bytes * req.cluster.gpus_per_node);
            }
            if !req.cluster.nvme_fits(memory.nvme_bytes) {
                nvme_bytes_per_node = Some(memory.nvme_bytes);
            }
        }
        shortfalls.push(Shortfall {
            choice: o.choice.to_string(),
            min_peak_bytes: o.min_peak_bytes,
            gpus_to_fit,
            floor_bytes,
            host_bytes_per_node,
            nvme_bytes_per_node,
        });
    }
    let nvme = req.cluster.nvme.is_some();
    Ok(PlanError::NothingFits { budget_bytes: req.cluster.budget_bytes(), gpus: world, nvme, shortfalls })
}

/// The GPU count at which `peak(N) = A + B/N`, fitted through `p1` at `n`
/// and `p2` at `2n` ranks, falls to `budget`; whole nodes past one node.
pub fn gpus_for_budget(p1: f64, p2: f64, n: u64, budget: f64, gpus_per_node: u64) -> Option<u64> {
    let b = 2.0 * n as f64 * (p1 - p2);
    let a = 2.0 * p2 - p1;
    if b <= 0.0 || budget <= a {
        return None;
    }
    let gpus = (b / (budget - a)).ceil().max(1.0);
    if gpus > 1e7 {
        return None;
    }
    let gpus = gpus as u64;
    Some(if gpus > gpus_per_node { gpus.div_ceil(gpus_per_node) * gpus_per_node } else { gpus })
}

/// The error's text: one line per choice, least memory first; `nvme`:
/// whether the nodes have an NVMe tier.
pub fn nothing_fits_text(budget_bytes: &u64, gpus: &u64, nvme: &bool, shortfalls: &[Shortfall]) -> String {
    let gib = |b: u64| b as f64 / GIB;
    let mut text = format!(
        "no strategy fits in {:.1} GiB per GPU on {gpus} GPU{}. Each choice's least memory per GPU (micro-batch 1):",
        gib(*budget_bytes),
        if *gpus == 1 { "" } else { "s" }
    );
    let mut sorted: Vec<&Shortfall> = shortfalls.iter().collect();
    sorted.sort_by_key(|s| s.min_peak_bytes);
    for s in &sorted {
        let mut more = match (s.gpus_to_fit, s.floor_bytes) {
            _ if s.min_peak_bytes <= *budget_bytes => "fits the GPU".into(),
            (Some(n), _) => format!("fits on ≥ {n} GPUs"),
            (None, Some(floor)) => format!("more GPUs do not help: {:.1} GiB stays on each", gib(floor)),
            (None, None) => "more GPUs do not help: ZeRO-0 replicates every state".into(),
        };
        if let Some(host) = s.host_bytes_per_node {
            more += &format!(", but offloads {:.1} GiB per node, over --host-memory", gib(host));
        }
        if let Some(nvme) = s.nvme_bytes_per_node {
            more += &format!(", but keeps {:.1} GiB per node on NVMe, over --nvme", gib(nvme));
        }
        text += &format!("\n  {:<50} {:>10.1} GiB   {more}", s.choice, gib(s.min_peak_bytes));
    }
    let offload_limited = |s: &&&Shortfall| {
        (s.host_bytes_per_node.is_some() || s.nvme_bytes_per_node.is_some()) && s.min_peak_bytes <= *budget_bytes
    };
    let host_limited: Vec<&&Shortfall> = sorted.iter().filter(offload_limited).collect();
    if let Some(least) = host_limited.iter().filter_map(|s| s.host_bytes_per_node).min() {
        text += &format!(
            "\nThe GPUs fit, the hosts do not: {:.1} GiB of host memory per node fits the leanest offloading choice \
             (--host-memory; more GPUs shard what is offloaded).",
            gib(least)
        );
        if !nvme {
            text += " Or give the nodes an NVMe tier (--nvme SIZE, e.g. --nvme 28TiB on a DGX-2): ZeRO-Infinity \
                     keeps the offloaded states on the drives and streams them through CPU memory.";
        }
    } else if let Some(least) = host_limited.iter().filter_map(|s| s.nvme_bytes_per_node).min() {
        text += &format!(
            "\nThe GPUs fit, the drives do not: {:.1} GiB of NVMe per node fits the leanest choice that offloads \
             there (--nvme; more nodes shard what is offloaded).",
            gib(least)
        );
    } else if let Some(least) = sorted.iter().find(|s| s.host_bytes_per_node.is_none()) {
        text += &format!(
            "\nA budget of {:.1} GiB per GPU fits the leanest choice (--memory, or a larger GPU with --gpu).",
            gib(least.min_peak_bytes)
        );
    }
    if sorted.iter().all(|s| s.gpus_to_fit.is_none()) {
        text += "\nNo GPU count fits: what stays on each GPU (a gathered layer's weights, one micro-batch's \
                 activations) exceeds the budget. That needs more tensor parallelism (--tp: each GPU of a \
                 group holds 1/t of every layer and its activations) or more tiles of the large operators \
                 (--tiles: ZeRO-3 gathers, uses and frees one tile at a time; the search stops where more \
                 tiles no longer lower the peak).";
    }
    text
}

/// Why `runner` is slower than `winner`: the difference in step time and
/// the figures behind it.
pub fn why_slower(winner: &Evaluation, runner: &Evaluation) -> String {
    let (w, r) = (&winner.predicted, &runner.predicted);
    // Rounded to what is printed, so a tie never reads `-0.0%`; a runner-up
    // up to 0.1% faster ties with the winner (`planner::faster`) and reads 0.0%.
    let slower = ((1000.0 * (1.0 - r.tokens_per_second / w.tokens_per_second)).round() / 10.0).max(0.0);
    let mut reasons = Vec::new();
    let compute = |p: &zeroplan_ir::plan::Predicted| p.busy_seconds.get("compute").copied().unwrap_or(0.0);
    if compute(r) > compute(w) + 0.01 * w.step_seconds {
        let flops = if r.hardware_flops > r.model_flops * 1.001 {
            format!(", recomputing {:.1}% of the model's FLOPs", 100.0 * (r.hardware_flops / r.model_flops - 1.0))
        } else {
            String::new()
        };
        reasons.push(format!("its GPU computes {:.1} ms longer per step{flops}", 1e3 * (compute(r) - compute(w))));
    }
    if runner.comm.bytes_per_step > 1.01 * winner.comm.bytes_per_step {
        reasons.push(format!(
            "each GPU sends {:.2} GB per step against {:.2} GB",
            runner.comm.bytes_per_step / 1e9,
            winner.comm.bytes_per_step / 1e9
        ));
    }
    if runner.comm.host_copy_bytes > 1.01 * winner.comm.host_copy_bytes {
        reasons.push(format!("it copies {:.2} GB per step over PCIe", runner.comm.host_copy_bytes / 1e9));
    }
    if r.stalled_seconds > w.stalled_seconds + 0.01 * w.step_seconds {
        reasons.push(format!(
            "compute waits {:.1} ms per step on communication, copies or the host optimizer against {:.1} ms",
            1e3 * r.stalled_seconds,
            1e3 * w.stalled_seconds
        ));
    }
    if runner.strategy.micro_batch < winner.strategy.micro_batch {
        reasons.push(format!(
            "it fits micro-batches of {} sequences against {} (smaller GEMMs, more launches per step)",
            runner.strategy.micro_batch, winner.strategy.micro_batch
        ));
    }
    let head = format!(
        "{:.1} ms per step against {:.1} ms ({slower:.1}% fewer tokens/s)",
        1e3 * r.step_seconds,
        1e3 * w.step_seconds
    );
    if slower.abs() < 0.1 {
        format!("{head}: a tie (under 0.1% apart); either would do")
    } else if reasons.is_empty() {
        head
    } else {
        format!("{head}: {}", reasons.join("; "))
    }
}
