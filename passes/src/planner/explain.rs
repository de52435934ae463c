//! Why a plan lost, and what would make one fit: the sentences a user
//! reads before deciding how many GPUs to ask for. Identical plans are
//! said once ([`distinct`]): the search tries every combination, and some
//! combinations change nothing.

use rayon::prelude::*;
use std::collections::HashMap;
use zeroplan_ir::plan::{MemorySummary, OffloadTo};

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

/// The error for a search where nothing fits. Each choice's memory at
/// micro-batch 1 is compiled once per rank count it is asked at (a ZeRO
/// choice at `N` and `2N` ranks, an offloading one at `N`), the distinct
/// probes in parallel: they are most of a nothing-fits answer's time.
pub fn nothing_fits(req: &Request, outcomes: &[Outcome]) -> Result<PlanError, PlanError> {
    let world = req.cluster.world_size();
    // A choice's device memory does not depend on the tier its offloaded
    // states live on: its twin on the other tier shares the fit along N,
    // from whichever of the two comes first.
    let twin = |c: Choice| Choice { offload_to: OffloadTo::Cpu, ..c }.to_string();
    // Tiling changes what is gathered, not what is sharded: a tiled
    // choice's peak falls with the ranks as its untiled twin's does (to
    // within 3%, where the arena places the tiles around the shards
    // differently: `passes/tests/tiling.rs`), so it takes the fall from `N`
    // to `2N` ranks from the twin rather than compiling its many tiles again
    // (transformer-100t: 64 tiles, 20k-node graphs, most of the answer's
    // time).
    let untiled = |c: Choice| Choice { tiles: 1, ..c };
    let has_untiled_twin = |c: Choice| c.tiles > 1 && outcomes.iter().any(|o| twin(o.choice) == twin(untiled(c)));
    // The line `peak(N) = A + B/N` is fitted from two data-parallel ranks
    // up: one rank has no NCCL buffers, so from one to two the peak rises.
    let fit_from = |c: Choice| c.data_ranks(world).max(2);
    let mut fitted_along_ranks: HashMap<String, Choice> = HashMap::new();
    let mut probes: Vec<(Choice, u64)> = Vec::new();
    for o in outcomes {
        let ranks = o.choice.data_ranks(world);
        if o.choice.zero_stage > 0 && !fitted_along_ranks.contains_key(&twin(o.choice)) {
            fitted_along_ranks.insert(twin(o.choice), o.choice);
            probes.push((o.choice, fit_from(o.choice)));
            if !has_untiled_twin(o.choice) {
                probes.push((o.choice, 2 * fit_from(o.choice)));
            }
        }
        if o.choice.offload != zeroplan_ir::plan::Offload::None {
            probes.push((o.choice, ranks));
        }
    }
    probes.sort_by_key(|&(c, n)| (c.to_string(), n));
    probes.dedup();
    // At the cluster's own ranks the search measured most of them already.
    let searched = |c: Choice, n: u64| {
        let at_one = outcomes.iter().find(|o| o.choice == c).and_then(|o| o.at_one.as_ref());
        at_one.filter(|_| n == c.data_ranks(world)).cloned()
    };
    let memories: HashMap<(String, u64), MemorySummary> = probes
        .into_par_iter()
        .map(|(choice, n)| {
            let memory = match searched(choice, n) {
                Some(memory) => memory,
                None => {
                    let micro_batches = super::search::per_rank(req, choice).max(1);
                    Probe::compile(req, choice, n, 1, micro_batches)?.memory(req, 1)?
                }
            };
            Ok(((choice.to_string(), n), memory))
        })
        .collect::<Result<_, PlanError>>()?;
    let memory = |c: Choice, n: u64| &memories[&(c.to_string(), n)];

    let mut shortfalls = Vec::new();
    for o in outcomes {
        let ranks = o.choice.data_ranks(world);
        let (mut gpus_to_fit, mut floor_bytes) = (None, None);
        if let Some(&fitted) = fitted_along_ranks.get(&twin(o.choice)) {
            // ZeRO shards over the data-parallel ranks: fit `peak(N)` along them.
            let n = fit_from(fitted);
            let fall = |c: Choice| memory(c, n).peak_bytes as f64 - memory(c, 2 * n).peak_bytes as f64;
            let p1 = memory(fitted, n).peak_bytes as f64;
            let p2 = match fitted_along_ranks.get(&twin(untiled(fitted))) {
                Some(&flat) if has_untiled_twin(fitted) => p1 - fall(flat),
                _ => memory(fitted, 2 * n).peak_bytes as f64,
            };
            let budget = req.cluster.budget_bytes() as f64;
            let t = o.choice.tensor_parallel;
            let replicas_per_node = (req.cluster.gpus_per_node / t).max(1);
            gpus_to_fit = gpus_for_budget(p1, p2, n, budget, replicas_per_node).map(|replicas| replicas * t);
            floor_bytes = Some((2.0 * p2 - p1).max(0.0) as u64);
        }
        let (mut host_bytes_per_node, mut nvme_bytes_per_node) = (None, None);
        if o.choice.offload != zeroplan_ir::plan::Offload::None {
            let memory = memory(o.choice, ranks);
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
    let cluster = SearchedOn {
        budget_bytes: req.cluster.budget_bytes(),
        card_bytes: req.cluster.gpu.memory_bytes(),
        gpus: world,
        gpus_per_node: req.cluster.gpus_per_node,
        nvme: req.cluster.nvme.is_some(),
    };
    Ok(PlanError::NothingFits { cluster, shortfalls })
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

/// How many choices the nothing-fits answer lists: the closest to fitting.
/// The rest are further from it, and the one change named below them is
/// what a person acts on.
const CLOSEST: usize = 5;

/// What the nothing-fits answer needs besides the shortfalls.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchedOn {
    /// The per-GPU budget searched (`--memory`, else the card's).
    pub budget_bytes: u64,
    /// The card's whole memory: what `--memory` may rise to.
    pub card_bytes: u64,
    pub gpus: u64,
    pub gpus_per_node: u64,
    /// Whether the nodes have an NVMe tier.
    pub nvme: bool,
}

/// The error's text: the [`CLOSEST`] distinct choices, least memory first,
/// each with what more GPUs or the hosts would do for it, then the single
/// cheapest change that makes one fit ([`cheapest_change`]). Choices with
/// the same figures share a line: at micro-batch 1 the peak may be the
/// optimizer's, which recomputation does not change, so here `recompute
/// none = full` can name choices that would differ in time once they fit.
pub fn nothing_fits_text(on: &SearchedOn, shortfalls: &[Shortfall]) -> String {
    let gib = |b: u64| b as f64 / GIB;
    let (budget, gpus) = (on.budget_bytes, on.gpus);
    let mut sorted: Vec<&Shortfall> = shortfalls.iter().collect();
    sorted.sort_by_key(|s| s.min_peak_bytes);
    let same_figures = |a: &Shortfall, b: &Shortfall| {
        (a.min_peak_bytes, a.gpus_to_fit, a.floor_bytes, a.host_bytes_per_node, a.nvme_bytes_per_node)
            == (b.min_peak_bytes, b.gpus_to_fit, b.floor_bytes, b.host_bytes_per_node, b.nvme_bytes_per_node)
    };
    let groups = distinct(sorted.iter().copied(), same_figures, |s| s.choice.clone());
    let mut text = format!(
        "no strategy fits in {:.1} GiB per GPU on {gpus} GPU{}. The {} closest of {} choices, by least memory per GPU \
         (micro-batch 1):",
        gib(budget),
        if gpus == 1 { "" } else { "s" },
        groups.len().min(CLOSEST),
        shortfalls.len()
    );
    let width = groups.iter().take(CLOSEST).map(|(choice, _)| choice.chars().count()).max().unwrap_or(0);
    for (choice, members) in groups.iter().take(CLOSEST) {
        let s = members[0];
        let mut more = match (s.gpus_to_fit, s.floor_bytes) {
            _ if s.min_peak_bytes <= budget => "fits the GPU".into(),
            (Some(n), _) => format!("fits on ≥ {n} GPUs"),
            // One GPU has no NCCL buffers; every GPU of several has them.
            (None, Some(floor)) if gpus == 1 => {
                format!("more GPUs do not help: with NCCL's buffers {:.1} GiB stays on each", gib(floor))
            }
            (None, Some(floor)) => format!("more GPUs do not help: {:.1} GiB stays on each", gib(floor)),
            (None, None) => "more GPUs do not help: ZeRO-0 replicates every state".into(),
        };
        if let Some(host) = s.host_bytes_per_node {
            more += &format!(", but offloads {:.1} GiB per node, over --host-memory", gib(host));
        }
        if let Some(nvme) = s.nvme_bytes_per_node {
            more += &format!(", but keeps {:.1} GiB per node on NVMe, over --nvme", gib(nvme));
        }
        text += &format!("\n  {choice:<width$} {:>10.1} GiB   {more}", gib(s.min_peak_bytes));
    }
    text + "\n" + &cheapest_change(on, &sorted)
}

/// The one change that makes a choice fit, the cheapest first. Where a
/// choice fits the GPU but not the hosts or drives, room for what it
/// offloads costs memory or drives, not GPUs. Otherwise more GPUs of the
/// kind there is, over which ZeRO shards the states (what it is for);
/// only where no GPU count fits, a larger budget per GPU: `--memory` up to
/// the card's (the budget the user set is a limit like the card's), else a
/// larger GPU. `sorted`: least memory first.
fn cheapest_change(on: &SearchedOn, sorted: &[&Shortfall]) -> String {
    let gib = |b: u64| b as f64 / GIB;
    // A size as a flag takes it: rounded up, so that it still fits.
    let up = |b: u64| (10.0 * gib(b)).ceil() / 10.0;
    let budget = on.budget_bytes;
    let gpu_fits = |s: &&&Shortfall| s.min_peak_bytes <= budget;
    let host = sorted.iter().filter(gpu_fits).filter_map(|s| Some((s.host_bytes_per_node?, s))).min_by_key(|h| h.0);
    if let Some((bytes, s)) = host {
        let drives = if on.nvme { "" } else { "; or an NVMe tier to hold what it offloads (--nvme SIZE)" };
        return format!(
            "Cheapest change: --host-memory {:.1}GiB per node: the GPUs fit, the hosts do not ({} offloads {:.1} GiB \
             per node){drives}.",
            up(bytes),
            s.choice,
            gib(bytes)
        );
    }
    let drives = sorted.iter().filter(gpu_fits).filter_map(|s| Some((s.nvme_bytes_per_node?, s))).min_by_key(|d| d.0);
    if let Some((bytes, s)) = drives {
        return format!(
            "Cheapest change: --nvme {:.1}GiB per node: the GPUs fit, the drives do not ({} keeps {:.1} GiB per node \
             on NVMe).",
            up(bytes),
            s.choice,
            gib(bytes)
        );
    }
    let offload_fits = |s: &&&Shortfall| s.host_bytes_per_node.is_none() && s.nvme_bytes_per_node.is_none();
    let Some(leanest) = sorted.iter().find(offload_fits) else {
        return "Cheapest change: none known: every choice offloads more than the hosts or drives hold and needs \
                more than the GPU; more GPUs (--gpus) shard both."
            .into();
    };
    let more = sorted.iter().filter(offload_fits).filter_map(|s| Some((s.gpus_to_fit?, s))).min_by_key(|m| m.0);
    if let Some((n, s)) = more {
        let nodes = n.div_ceil(on.gpus_per_node.max(1));
        let nodes = if nodes > 1 { format!(" --nodes {nodes}") } else { String::new() };
        return format!("Cheapest change: --gpus {n}{nodes}: {} shards its states over them to fit.", s.choice);
    }
    let what = if leanest.min_peak_bytes <= on.card_bytes {
        format!("--memory {:.1}GiB (the card has {:.1} GiB)", up(leanest.min_peak_bytes), gib(on.card_bytes))
    } else {
        format!("GPUs with {:.1} GiB each (--gpu)", up(leanest.min_peak_bytes))
    };
    format!(
        "Cheapest change: {what}: {} needs {:.1} GiB at micro-batch 1, and no GPU count lowers what stays on each \
         GPU (only more tensor parallelism, --tp, or tiles, --tiles, shrink it).",
        leanest.choice,
        gib(leanest.min_peak_bytes)
    )
}

/// Whether two labels (strategies or choices, as displayed) can name one
/// plan: they differ at most in the ZeRO stage and the recomputation
/// policy, the two choices that can be no-ops. With the `attention` pass,
/// `selective` finds no attention scores left to recompute and plans what
/// `none` does; with one micro-batch a step, ZeRO-2's gradient partitioning
/// is ZeRO-1's reduce-scatter. Any other difference (tensor ranks, offload,
/// tiles, micro-batch) is a different plan, whatever its figures.
///
/// Returns the label naming them all: the shared words once, the differing
/// ones joined by ` = ` (`ZeRO-0 offload none recompute none = selective`).
pub fn merged_label<S: AsRef<str>>(labels: &[S]) -> Option<String> {
    let words: Vec<Vec<&str>> = labels.iter().map(|l| l.as_ref().split(' ').collect()).collect();
    let first = words.first()?;
    if words.iter().any(|w| w.len() != first.len()) {
        return None;
    }
    let mut merged = Vec::with_capacity(first.len());
    for at in 0..first.len() {
        let mut seen: Vec<&str> = Vec::new();
        for w in &words {
            if !seen.contains(&w[at]) {
                seen.push(w[at]);
            }
        }
        let may_differ = first[at].starts_with("ZeRO-") || (at > 0 && first[at - 1] == "recompute");
        if seen.len() > 1 && !may_differ {
            return None;
        }
        merged.push(seen.join(" = "));
    }
    Some(merged.join(" "))
}

/// `items` with identical plans merged: each group's label
/// ([`merged_label`]) and members, in the order of their first member. Two
/// items are one plan where `same_figures` holds (the same predicted
/// memory and time) and their labels may name one plan.
pub fn distinct<'a, T>(
    items: impl IntoIterator<Item = &'a T>,
    same_figures: impl Fn(&T, &T) -> bool,
    label: impl Fn(&T) -> String,
) -> Vec<(String, Vec<&'a T>)> {
    let mut groups: Vec<(Vec<String>, Vec<&'a T>)> = Vec::new();
    for item in items {
        let own = label(item);
        let joins = |(labels, members): &&mut (Vec<String>, Vec<&'a T>)| {
            same_figures(members[0], item)
                && merged_label(&labels.iter().chain([&own]).map(String::as_str).collect::<Vec<_>>()).is_some()
        };
        match groups.iter_mut().find(|g| joins(g)) {
            Some((labels, members)) => {
                labels.push(own);
                members.push(item);
            }
            None => groups.push((vec![own], vec![item])),
        }
    }
    groups
        .into_iter()
        .map(|(labels, members)| (merged_label(&labels).expect("labels merged as they joined"), members))
        .collect()
}

/// Whether the search's figures for `a` and `b` are one plan
/// ([`distinct`]): the same peak, the same throughput, and strategies that
/// differ at most in what can be a no-op. The runner-up is never the
/// winner's twin: "a tie; either would do" said nothing.
pub fn same_plan(a: &Evaluation, b: &Evaluation) -> bool {
    a.memory.peak_bytes == b.memory.peak_bytes
        && a.predicted.tokens_per_second == b.predicted.tokens_per_second
        && merged_label(&[a.strategy.to_string(), b.strategy.to_string()]).is_some()
}

/// Why `runner` is slower than `winner`: the difference in step time and
/// the figures behind it.
///
/// The runner-up can be an estimate faster than the winner's exact figure:
/// a deep model's estimates come from two short stacks, and only the
/// `WHOLE_COMPILES` fastest are compiled whole.
/// It is then said so, not called a tie.
pub fn why_slower(winner: &Evaluation, runner: &Evaluation) -> String {
    let (w, r) = (&winner.predicted, &runner.predicted);
    // Past the `planner::TIE` of 0.1%.
    if r.tokens_per_second > (1.0 + super::TIE) * w.tokens_per_second {
        let ahead = 100.0 * (r.tokens_per_second / w.tokens_per_second - 1.0);
        return format!(
            "{:.1} ms per step against {:.1} ms ({ahead:.1}% more tokens/s): an estimate from two short stacks, \
             not compiled whole (the search compiles up to {} of the fastest estimates whole and keeps the \
             fastest exact plan)",
            1e3 * r.step_seconds,
            1e3 * w.step_seconds,
            super::WHOLE_COMPILES
        );
    }
    // Rounded to what is printed, so a tie never reads `-0.0%`; a runner-up
    // up to 0.1% faster ties with the winner (`planner::faster`) and reads 0.0%.
    let slower = ((1000.0 * (1.0 - r.tokens_per_second / w.tokens_per_second)).round() / 10.0).max(0.0);
    let mut reasons = Vec::new();
    let compute = |p: &zeroplan_ir::plan::Predicted| p.busy_seconds.get("compute").copied().unwrap_or(0.0);
    if compute(r) > compute(w) + 0.01 * w.step_seconds {
        // Recomputation is a reason only where the runner-up recomputes more
        // than the winner does (fused attention's backward recomputes its
        // scores in both).
        let recomputed = |p: &zeroplan_ir::plan::Predicted| p.hardware_flops / p.model_flops - 1.0;
        let flops = if recomputed(r) > recomputed(w) + 0.001 {
            format!(", recomputing {:.1}% of the model's FLOPs", 100.0 * recomputed(r))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn evaluation(step_seconds: f64) -> Evaluation {
        let choice = Choice {
            tensor_parallel: 1,
            sequence_parallel: false,
            zero_stage: 1,
            offload: zeroplan_ir::plan::Offload::None,
            offload_to: zeroplan_ir::plan::OffloadTo::Cpu,
            recompute: crate::recompute::Policy::Full,
            tiles: 1,
        };
        Evaluation {
            strategy: choice.strategy(8, 4, 2),
            memory: Default::default(),
            comm: Default::default(),
            predicted: zeroplan_ir::plan::Predicted {
                step_seconds,
                tokens_per_second: 1e6 / step_seconds,
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_runner_up_estimated_faster_is_said_to_be_an_estimate_not_a_tie() {
        let said = why_slower(&evaluation(1.0), &evaluation(0.95));
        assert!(said.contains("5.3% more tokens/s") && said.contains("not compiled whole"), "{said}");
        let tie = why_slower(&evaluation(1.0), &evaluation(0.9995));
        assert!(tie.contains("a tie"), "{tie}");
        let slower = why_slower(&evaluation(1.0), &evaluation(1.1));
        assert!(slower.contains("9.1% fewer tokens/s"), "{slower}");
    }

    const G: u64 = 1 << 30;

    fn short(choice: &str, min_peak_bytes: u64, gpus_to_fit: Option<u64>) -> Shortfall {
        Shortfall {
            choice: choice.into(),
            min_peak_bytes,
            gpus_to_fit,
            floor_bytes: Some(G),
            host_bytes_per_node: None,
            nvme_bytes_per_node: None,
        }
    }

    fn on(budget_bytes: u64, card_bytes: u64) -> SearchedOn {
        SearchedOn { budget_bytes, card_bytes, gpus: 8, gpus_per_node: 8, nvme: false }
    }

    #[test]
    fn labels_merge_only_where_a_choice_can_be_a_no_op() {
        let merged = merged_label(&["ZeRO-1 offload none recompute none", "ZeRO-2 offload none recompute selective"]);
        assert_eq!(merged.as_deref(), Some("ZeRO-1 = ZeRO-2 offload none recompute none = selective"));
        assert_eq!(
            merged_label(&["ZeRO-1 offload none recompute none", "ZeRO-1 offload optimizer recompute none"]),
            None
        );
        assert_eq!(
            merged_label(&["TP-2 ZeRO-1 offload none recompute none", "ZeRO-1 offload none recompute none"]),
            None
        );
    }

    #[test]
    fn nothing_fits_lists_the_five_closest_once_each_and_one_change() {
        // Twelve choices, two of each pair the same plan: six distinct.
        let mut shortfalls = Vec::new();
        for (i, stage) in (1..=3).zip(["ZeRO-1", "ZeRO-2", "ZeRO-3"]) {
            for tp in ["", "TP-2 "] {
                for recompute in ["none", "selective"] {
                    let peak = (10 * i + tp.len() as u64) * G;
                    shortfalls.push(short(&format!("{tp}{stage} offload none recompute {recompute}"), peak, Some(64)));
                }
            }
        }
        let text = nothing_fits_text(&on(8 * G, 80 * G), &shortfalls);
        let listed: Vec<&str> = text.lines().filter(|l| l.starts_with("  ")).collect();
        assert_eq!(listed.len(), 5, "{text}");
        assert!(listed[0].contains("ZeRO-1 offload none recompute none = selective"), "{text}");
        assert!(text.lines().next().unwrap().contains("The 5 closest of 12 choices"), "{text}");
        // More GPUs of the kind there is come first.
        assert_eq!(text.lines().count(), 7, "{text}");
        let change = text.lines().last().unwrap();
        assert_eq!(
            change,
            "Cheapest change: --gpus 64 --nodes 8: ZeRO-1 offload none recompute none shards its states over them to fit."
        );
        // Where no GPU count fits: the budget up to the card's, else a larger GPU.
        for s in &mut shortfalls {
            s.gpus_to_fit = None;
        }
        let change = nothing_fits_text(&on(8 * G, 80 * G), &shortfalls).lines().last().unwrap().to_string();
        assert!(change.starts_with("Cheapest change: --memory 10.0GiB (the card has 80.0 GiB): ZeRO-1 offload none recompute none needs 10.0 GiB"), "{change}");
        let change = nothing_fits_text(&on(8 * G, 8 * G), &shortfalls).lines().last().unwrap().to_string();
        assert!(change.starts_with("Cheapest change: GPUs with 10.0 GiB each (--gpu): ZeRO-1"), "{change}");
        assert!(change.contains("--tiles"), "{change}");
    }

    #[test]
    fn room_for_offloaded_states_is_cheaper_than_gpus() {
        let mut offloads = short("ZeRO-2 offload optimizer recompute full", 6 * G, Some(16));
        offloads.host_bytes_per_node = Some(300 * G);
        let shortfalls = [short("ZeRO-2 offload none recompute full", 12 * G, Some(16)), offloads];
        let text = nothing_fits_text(&on(8 * G, 8 * G), &shortfalls);
        assert!(
            text.lines().last().unwrap().starts_with("Cheapest change: --host-memory 300.0GiB per node: the GPUs fit")
        );
        assert!(text.contains("--nvme SIZE"), "no NVMe tier: it is the other way to hold the states: {text}");
    }
}
