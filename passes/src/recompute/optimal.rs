//! The `optimal` policy: the least recomputation whose stored activations
//! fit a budget.
//!
//! Checkmate (Jain et al., 2020) states rematerialization as an integer
//! program: choose which values to keep and which to recompute so that
//! recomputation costs least and memory stays within a budget. Here the
//! choice is restricted to a few regions per layer ([`Choice`]) and memory
//! is the bytes the forward stores for the backward, which makes the
//! problem separable by layer: each layer contributes (stored bytes,
//! recompute FLOPs) under its choice, and totals are sums. A dynamic program
//! over the chain of layers then solves the restricted problem exactly: the
//! Pareto front of (bytes, FLOPs) over the first `i` layers, merged with
//! layer `i + 1`'s choices, dominated points dropped, and points the
//! remaining layers cannot complete within the budget dropped too. The
//! answer is the least-FLOPs point of the last front. When nothing fits,
//! the answer is the least-memory point — each layer's least-memory choice,
//! in practice `layer` everywhere, as `full` — and the pass reports that it
//! does not fit rather than failing: the memory pass and the planner judge
//! the peak.
//!
//! Stored bytes are not the step's peak: the backward also holds one
//! region's recomputed values and the gradients in flight. The memory pass
//! measures the peak; the budget bounds the part recomputation controls.

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;
use zeroplan_ir::{Bindings, Graph, NodeIndex, Op, Phase, Value};

use super::regions::{Choice, Layers, RegionId, is_activation};
use crate::cost::work::work;

/// Figures of one layer's choice, or of a whole step's choices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    /// Bytes kept from the forward for the backward: of the layer's internal
    /// values, or of the whole step's activations.
    pub bytes: u64,
    /// FLOPs of the nodes the backward recomputes.
    pub flops: f64,
}

/// The figures the dynamic program chooses from.
pub struct Costs {
    /// Bytes stored outside the layers' internal values (embeddings, head,
    /// layer boundaries), counted as if every layer recomputed: an upper
    /// bound under any choice, exact where the backward reads the boundaries
    /// anyway (every family here: a layer's first ops, matmuls or a
    /// LayerNorm, keep their input for their gradients).
    pub fixed: u64,
    /// Per layer, each choice's cost.
    pub layers: Vec<(u64, Vec<(Choice, Cost)>)>,
}

/// What the dynamic program chose.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub choices: BTreeMap<u64, Choice>,
    /// Stored activation bytes of the whole step, and recompute FLOPs.
    pub cost: Cost,
    /// Whether `cost.bytes` is within the budget.
    pub fits: bool,
    /// Points on the last Pareto front.
    pub front: usize,
}

/// Every layer's cost under every choice at `bindings`; `None` where a size
/// is unbound. `regathered`: the `regather` pass will run (sequence
/// parallelism), so a gathered GEMM input the backward reads is stored as
/// the slice it gathers ([`stored`]).
pub fn costs(graph: &Graph, layers: &Layers, bindings: &Bindings, regathered: bool) -> Option<Costs> {
    let bytes = |values: FxHashSet<Value>| {
        values.into_iter().map(|v| graph.value_type(v).size_bytes(bindings)).sum::<Option<u64>>()
    };
    let all_full: BTreeMap<u64, Choice> = layers.indices().map(|l| (l, Choice::Layer)).collect();
    let internal = layers.all_internal();
    let outside: Vec<NodeIndex> =
        graph.node_indices().filter(|&n| is_activation(graph, n) && !internal.contains(&n)).collect();
    let fixed = bytes(stored(graph, &outside, &layers.assign(graph, &all_full), regathered))?;
    let mut per_layer = Vec::new();
    for layer in layers.indices() {
        let mut options = Vec::new();
        for choice in Choice::ALL {
            let region = layers.region(graph, layer, choice);
            let flops = region.keys().map(|&n| work(graph, n, bindings).map(|w| w.flops)).sum::<Option<f64>>()?;
            let bytes = bytes(stored(graph, layers.internal(layer), &region, regathered))?;
            options.push((choice, Cost { bytes, flops }));
        }
        per_layer.push((layer, options));
    }
    Some(Costs { fixed, layers: per_layer })
}

/// The buffers among `nodes`' outputs that outlive the forward when
/// `region` is recomputed: read by the backward where not recomputed (the
/// backward reads a recomputed value's clone), or read by a clone from
/// outside its own region. A view's buffer is the value it views. Where
/// `regathered`, a kept `sequence_all_gather` output is not stored: the
/// slice it gathers is, counted with `nodes` when it is one of them (else it
/// is a boundary or head value, stored as the layers' checkpoint).
pub fn stored(
    graph: &Graph,
    nodes: &[NodeIndex],
    region: &FxHashMap<NodeIndex, RegionId>,
    regathered: bool,
) -> FxHashSet<Value> {
    let within: FxHashSet<NodeIndex> = nodes.iter().copied().collect();
    let slice_of = |buffer: Value| {
        let gathered = regathered && matches!(graph.node(buffer.node).op, Op::SequenceAllGather { .. });
        if !gathered {
            return Some(buffer);
        }
        buffer_of(graph, graph.operands(buffer.node)[0]).filter(|slice| within.contains(&slice.node))
    };
    let mut out = FxHashSet::default();
    for &n in nodes {
        for &m in graph.users(n) {
            let phase = graph.node(m).phase;
            if phase == Phase::Forward && !region.contains_key(&m) {
                continue;
            }
            for v in graph.operands(m).iter().copied().filter(|v| v.node == n) {
                let kept = match (region.get(&n), phase) {
                    (None, _) => true,
                    (Some(_), Phase::Backward) => false,
                    (Some(r), Phase::Forward) => region.get(&m) != Some(r),
                    (Some(_), _) => true,
                };
                if let Some(buffer) = kept.then(|| buffer_of(graph, v)).flatten().and_then(slice_of) {
                    out.insert(buffer);
                }
            }
        }
    }
    out
}

/// The activation whose buffer `v` lives in, following views.
fn buffer_of(graph: &Graph, mut v: Value) -> Option<Value> {
    while graph.node(v.node).op.is_view() {
        v = graph.operands(v.node)[0];
    }
    is_activation(graph, v.node).then_some(v)
}

/// Past this many points a front is thinned to the least-FLOPs point per
/// byte interval: the choice still fits, and misses the optimum by at most
/// one interval's worth of bytes traded.
const MAX_FRONT: usize = 4096;

/// A point of a front: totals over the layers so far, and how it was reached.
#[derive(Clone, Copy)]
struct Point {
    bytes: u64,
    flops: f64,
    /// Index of the point of the previous front it extends.
    from: usize,
    choice: Choice,
}

/// The least-FLOPs choices whose stored bytes fit `budget`; the
/// least-memory ones when none fit.
pub fn choose(costs: &Costs, budget: u64) -> Decision {
    let n = costs.layers.len();
    // Each layer's least-memory choice (the cheaper of equals), and the
    // least bytes the layers after each prefix can store.
    let least: Vec<(Choice, Cost)> = costs
        .layers
        .iter()
        .map(|(_, options)| {
            let by_bytes = |a: &&(Choice, Cost), b: &&(Choice, Cost)| {
                a.1.bytes.cmp(&b.1.bytes).then(a.1.flops.total_cmp(&b.1.flops))
            };
            *options.iter().min_by(by_bytes).expect("every layer has choices")
        })
        .collect();
    let mut rest = vec![0u64; n + 1];
    for i in (0..n).rev() {
        rest[i] = rest[i + 1] + least[i].1.bytes;
    }
    if costs.fixed + rest[0] > budget {
        let choices = costs.layers.iter().zip(&least).map(|((l, _), (c, _))| (*l, *c)).collect();
        let flops = least.iter().map(|(_, c)| c.flops).sum();
        return Decision { choices, cost: Cost { bytes: costs.fixed + rest[0], flops }, fits: false, front: 1 };
    }
    let root = Point { bytes: costs.fixed, flops: 0.0, from: 0, choice: Choice::Keep };
    let mut fronts: Vec<Vec<Point>> = vec![vec![root]];
    for (i, (_, options)) in costs.layers.iter().enumerate() {
        let mut next = Vec::new();
        for (from, p) in fronts[i].iter().enumerate() {
            for &(choice, cost) in options {
                let bytes = p.bytes + cost.bytes;
                // Only points the remaining layers can still complete within the budget.
                if bytes + rest[i + 1] <= budget {
                    next.push(Point { bytes, flops: p.flops + cost.flops, from, choice });
                }
            }
        }
        fronts.push(pareto(next));
    }
    // The last front runs from most FLOPs to least: its last point is the answer.
    let last = fronts.last().expect("the root front");
    let mut at = last.len() - 1;
    let cost = Cost { bytes: last[at].bytes, flops: last[at].flops };
    let mut choices = BTreeMap::new();
    for i in (1..=n).rev() {
        let p = fronts[i][at];
        choices.insert(costs.layers[i - 1].0, p.choice);
        at = p.from;
    }
    Decision { choices, cost, fits: true, front: last.len() }
}

/// The points no other point beats in both bytes and FLOPs, by bytes.
fn pareto(mut points: Vec<Point>) -> Vec<Point> {
    points.sort_by(|a, b| a.bytes.cmp(&b.bytes).then(a.flops.total_cmp(&b.flops)));
    let mut front: Vec<Point> = Vec::new();
    for p in points {
        if front.last().is_none_or(|q| p.flops < q.flops) {
            front.push(p);
        }
    }
    if front.len() <= MAX_FRONT {
        return front;
    }
    let (lo, hi) = (front[0].bytes, front[front.len() - 1].bytes);
    let width = (hi - lo) / MAX_FRONT as u64 + 1;
    // Along the front FLOPs fall as bytes grow: each interval's last point is its cheapest.
    // The least-memory point stays: it is the one every budget the front can meet is met by.
    let mut thinned: Vec<Point> = vec![front[0]];
    for p in front.into_iter().skip(1) {
        let cell = |q: &Point| (q.bytes - lo) / width;
        if thinned.len() > 1 && cell(&thinned[thinned.len() - 1]) == cell(&p) {
            *thinned.last_mut().expect("two points") = p;
        } else {
            thinned.push(p);
        }
    }
    thinned
}

/// The training step `graph` (before the `recompute` pass) weighed at
/// `bindings`, as the pass of the standard pipeline would weigh it (with
/// `regather` after it where the step is sequence-parallel); `None` where a
/// size is unbound.
pub fn step_costs(graph: &Graph, bindings: &Bindings) -> Option<Weighed> {
    let order = graph.topo_order();
    let layers = Layers::of(graph, &order);
    let costs = costs(graph, &layers, bindings, true)?;
    let (nodes, operands) = (graph.node_count(), graph.operand_count());
    Some(Weighed { nodes, operands, bindings: bindings.clone(), layers, costs })
}

/// A step weighed before its `recompute` pass: its layers and their costs.
/// The planner weighs a step to choose its `optimal` budget, then compiles
/// that step (a copy of it) on; the pass takes the weighing
/// ([`crate::manager::PassOptions::weighed`]) rather than list the layers
/// and cost them again — on a tiled 100T step, 600k nodes and a third of
/// the pass.
pub struct Weighed {
    /// The step's size, which the pass checks its graph against.
    nodes: usize,
    operands: usize,
    bindings: Bindings,
    pub layers: Layers,
    pub costs: Costs,
}

impl Weighed {
    /// Whether this weighs `graph` at `bindings` with `regather` to come
    /// or not (the planner's steps always have it): the caller hands the
    /// pass the step it weighed, and a graph of another size is not that
    /// step.
    pub fn weighs(&self, graph: &Graph, bindings: &Bindings, regathered: bool) -> bool {
        self.nodes == graph.node_count()
            && self.operands == graph.operand_count()
            && self.bindings == *bindings
            && (regathered || !graph.nodes().any(|n| matches!(n.op, Op::SequenceAllGather { .. })))
    }
}

impl std::fmt::Debug for Weighed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weighed").field("nodes", &self.nodes).field("bindings", &self.bindings).finish_non_exhaustive()
    }
}

impl Costs {
    /// Bytes the step stores for its backward when nothing is recomputed:
    /// where an `optimal` budget starts from.
    pub fn stored_without_recompute(&self) -> u64 {
        self.fixed + self.layers.iter().map(|(_, options)| keep_bytes(options)).sum::<u64>()
    }

    /// The most the layers hold at the backward of any layer that
    /// recomputes under `choices` (0 where none does): what the layers
    /// before it stored, and its own values — those it stores and the
    /// clones of those it does not, which the backward regenerates just
    /// before reading them (its `keep` bytes). The backward runs the layers
    /// last first, so a layer recomputed late in the forward regenerates its
    /// values while the others' are alive: the planner's model of the peak
    /// reads this beside the stored bytes (`planner::optimal_budget`).
    pub fn held_while_recomputing(&self, choices: &BTreeMap<u64, Choice>) -> u64 {
        let (mut before, mut most) = (self.fixed, 0);
        for (layer, options) in &self.layers {
            let held = keep_bytes(options);
            let chosen = choices.get(layer).and_then(|c| options.iter().find(|(o, _)| o == c));
            if chosen.is_some_and(|(c, _)| *c != Choice::Keep) {
                most = most.max(before + held);
            }
            before += chosen.map_or(held, |(_, cost)| cost.bytes);
        }
        most
    }
}

/// The bytes a layer stores keeping every value its backward reads.
fn keep_bytes(options: &[(Choice, Cost)]) -> u64 {
    options.iter().find(|(c, _)| *c == Choice::Keep).map_or(0, |(_, cost)| cost.bytes)
}

impl Decision {
    /// Every layer recomputed whole: the `full` policy's choices, so the
    /// pass makes `full`'s step.
    pub fn is_full(&self) -> bool {
        self.choices.values().all(|&c| c == Choice::Layer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(index: u64, options: &[(Choice, u64, f64)]) -> (u64, Vec<(Choice, Cost)>) {
        (index, options.iter().map(|&(c, bytes, flops)| (c, Cost { bytes, flops })).collect())
    }

    /// Two layers, each: keep 10 B, recompute attention to 6 B for 1 FLOP,
    /// the layer to 2 B for 10 FLOPs.
    fn two_layers() -> Costs {
        let options = [(Choice::Keep, 10, 0.0), (Choice::Attention, 6, 1.0), (Choice::Layer, 2, 10.0)];
        Costs { fixed: 5, layers: vec![layer(0, &options), layer(1, &options)] }
    }

    #[test]
    fn the_cheapest_fitting_mix_is_chosen() {
        let costs = two_layers();
        let d = choose(&costs, 5 + 16);
        assert!(d.fits);
        assert_eq!(d.cost, Cost { bytes: 21, flops: 1.0 });
        assert_eq!(d.choices.values().filter(|&&c| c == Choice::Attention).count(), 1);
        let d = choose(&costs, 5 + 8);
        assert_eq!((d.cost, d.fits), (Cost { bytes: 13, flops: 11.0 }, true), "{:?}", d.choices);
        assert_eq!(choose(&costs, 100).cost, Cost { bytes: 25, flops: 0.0 });
    }

    #[test]
    fn a_recomputing_layer_holds_its_keep_bytes_over_those_stored_before_it() {
        let costs = two_layers();
        let held = |a, b| costs.held_while_recomputing(&BTreeMap::from([(0, a), (1, b)]));
        assert_eq!(held(Choice::Layer, Choice::Keep), 5 + 10);
        assert_eq!(held(Choice::Keep, Choice::Attention), 5 + 10 + 10);
        assert_eq!(held(Choice::Layer, Choice::Layer), 5 + 2 + 10);
        assert_eq!(held(Choice::Keep, Choice::Keep), 0, "nothing recomputed");
    }

    #[test]
    fn without_a_fit_the_least_memory_is_chosen() {
        let d = choose(&two_layers(), 5);
        assert!(!d.fits);
        assert_eq!(d.cost, Cost { bytes: 9, flops: 20.0 });
        assert!(d.choices.values().all(|&c| c == Choice::Layer));
    }

    #[test]
    fn fronts_keep_only_undominated_points() {
        let p = |bytes, flops| Point { bytes, flops, from: 0, choice: Choice::Keep };
        let front = pareto(vec![p(3, 1.0), p(1, 5.0), p(2, 5.0), p(2, 2.0), p(4, 1.0)]);
        let kept: Vec<(u64, f64)> = front.iter().map(|p| (p.bytes, p.flops)).collect();
        assert_eq!(kept, [(1, 5.0), (2, 2.0), (3, 1.0)]);
    }

    #[test]
    fn long_fronts_are_thinned_to_real_points() {
        let n = 3 * MAX_FRONT as u64;
        let points = (0..n).map(|i| Point { bytes: i, flops: (n - i) as f64, from: 0, choice: Choice::Keep });
        let front = pareto(points.collect());
        assert!(front.len() <= MAX_FRONT + 2, "{}", front.len());
        // The least memory and the least FLOPs stay.
        assert!(front[0].bytes == 0 && front[front.len() - 1].bytes == n - 1);
        assert!(front.iter().all(|p| p.flops == (n - p.bytes) as f64));
    }
}
