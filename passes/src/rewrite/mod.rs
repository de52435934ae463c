//! The `rewrite` pass: equality saturation over the forward graph, with a
//! GPU cost model choosing what to keep.
//!
//! Today's rewrite is **matmul merging**: matmuls `x @ wᵢᵀ` sharing their
//! activation `x`, with parameter weights of one shape (Q, K and V; a GLU's
//! gate and up) may run as one `x @ concat(w₁…wₙ)ᵀ` whose output is split
//! back. Each layer's matmuls form a *region*, translated into an
//! [`egg::EGraph`] over [`lang::TensorLang`]; the guarded rule of
//! [`rules`] adds the merged form as an equivalent of each member;
//! [`extract`] prices both forms as DAGs with [`cost::GpuCostModel`] at the
//! batch and sequence length of `shape_hint` (32 and 128 when unbound) and
//! keeps the cheaper one per group.
//!
//! A merged group becomes three nodes, e.g. for layer 0's attention:
//! `layer0.attn.qkv.weight = concat {axis: 0}` of the (still separate)
//! parameters, `layer0.attn.qkv.mm` the merged matmul, and
//! `layer0.attn.qkv.split = split {axis: last}` whose outputs replace the
//! old matmuls' (a GLU's are `layerL.ffn.gate_up.*`). The weights stay
//! separate parameters because checkpoints (Hugging Face's layout) store
//! them separately and the optimizer state follows them; the concat is a
//! planned copy each step, which a memory planner can turn into a view by
//! placing the weights adjacently. The pass runs before autodiff, which
//! differentiates `concat` and `split`, so each weight's gradient is split
//! back out of the merged one.
//!
//! **Scaling.** Regions with the same signature (matmul names without the
//! layer prefix, operand sharing, types) build the same e-graph, so one is
//! saturated and its decision reused: saturation time does not grow with
//! depth.
//!
//! **Clean-ups** ([`cleanup`]), run first so that the matmul regions see
//! the cleaned operands: chains of `transpose`, `reshape` and `scale` in one
//! layer are translated into the same language (`(transpose perm[…] t)`,
//! `(reshape dims[…] t)`, `(scale factor[…] t)`) and analysis, saturated
//! under [`rules::cleanup_rules`] with the same bounds, and extracted by
//! `(seconds, nodes)`: each transpose, reshape or scale is priced as one read
//! and write of its bytes ([`GpuCostModel::copy_seconds`]), a removed node
//! costs nothing. So `transpose(transpose(x, p), q)` becomes one
//! `transpose(x, p∘q)` (or `x` when `p∘q` is the identity),
//! `reshape(reshape(x, s1), s2)` becomes `reshape(x, s2)` (or `x` when `s2`
//! is `x`'s shape), and `scale(scale(x, a), b)` becomes `scale(x, a·b)` (or
//! `x` when `a·b = 1`); a lone identity transpose, reshape or scale by 1
//! vanishes. A rebuilt chain keeps the name of its last node; consumers of a
//! removed chain read its replacement (the source itself when the chain
//! vanishes); a chain value read outside the chain (another consumer, a graph
//! output) is kept for that reader. `scale(scale(x, a), b) → scale(x, a·b)`
//! rounds once where the original rounded twice (exact when `a` or `b` is a
//! power of two). The builder emits no such chains today; the tests build
//! them by hand.
//!
//! Statistics: `regions`, `regions saturated`, `iterations`, `e-nodes`,
//! `stop reason`, `saturation ms`, `groups merged`, `groups kept`,
//! `clean-up regions`, `clean-ups applied` (iterations, e-nodes, stop reasons
//! and time include the clean-up regions'). `--pass-limit` counts one
//! application per merged group and per cleaned-up chain value;
//! `--explain rewrite` writes one line per group with both costs, and one per
//! improvable chain value with both terms and costs, e.g.
//! `rewrite: clean-up of t2: (transpose perm[1,0,2] (transpose perm[1,0,2]
//! x)) 0.16 µs, 2 nodes → x 0.00 µs, 0 nodes → clean up`.

pub mod cleanup;
pub mod cost;
pub mod extract;
pub mod lang;
pub mod rules;

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use egg::{Id, Runner, Symbol};
use zeroplan_ir::{Bindings, Dim, Graph, GraphError, NodeIndex, Op, TensorType, Value};

use crate::manager::{Pass, PassContext, PassError};
use crate::rebuild::{copy_node, copy_outputs, rebuilt};
use cost::GpuCostModel;
use lang::{Info, LeafInfo, RegionGraph, Shapes, TensorLang};

/// The rewrite pass, priced for an H100 SXM ([`GpuCostModel::h100_sxm`]).
pub struct Rewrite;

impl Pass for Rewrite {
    fn name(&self) -> &'static str {
        "rewrite"
    }

    fn run(&self, graph: Graph, cx: &mut PassContext) -> Result<Graph, PassError> {
        rewrite(&graph, cx, &GpuCostModel::h100_sxm()).map_err(|error| PassError::Graph { pass: "rewrite", error })
    }
}

/// Bounds on one region's saturation.
const ITER_LIMIT: usize = 8;
const NODE_LIMIT: usize = 10_000;

/// The symbol values the cost model assumes: `shape_hint`, then batch 32
/// and sequence 128; any other unbound symbol counts as 1.
pub fn hint_bindings(hint: &Bindings) -> Bindings {
    let mut b: Bindings = [("batch".to_string(), 32), ("seq".to_string(), 128)].into();
    b.extend(hint.iter().map(|(k, v)| (k.clone(), *v)));
    b
}

fn eval(d: &Dim, b: &Bindings) -> u64 {
    let mut b = b.clone();
    for s in d.symbols() {
        b.entry(s.clone()).or_insert(1);
    }
    d.eval(&b).unwrap_or(u64::MAX)
}

/// A matmul `x @ wᵀ` with a parameter `w`.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    mm: NodeIndex,
    x: Value,
    w: NodeIndex,
}

/// One layer's candidates (`key` is `layerL`, or empty outside layers).
#[derive(Default)]
struct Region {
    key: String,
    candidates: Vec<Candidate>,
    xs: Vec<Value>,
    ws: Vec<NodeIndex>,
}

type Signature = Vec<(String, usize, usize, TensorType, TensorType)>;

impl Region {
    fn local<'a>(&self, name: &'a str) -> &'a str {
        name.strip_prefix(&self.key).and_then(|s| s.strip_prefix('.')).unwrap_or(name)
    }

    fn signature(&self, g: &Graph) -> Signature {
        self.candidates
            .iter()
            .map(|c| {
                let xi = self.xs.iter().position(|v| *v == c.x).expect("indexed");
                let wi = self.ws.iter().position(|w| *w == c.w).expect("indexed");
                let name = self.local(&g.node(c.mm).name).to_string();
                (name, xi, wi, g.value_type(c.x).clone(), g.node(c.w).outputs[0].clone())
            })
            .collect()
    }
}

fn region_key(name: &str) -> &str {
    let first = name.split('.').next().unwrap_or("");
    match first.strip_prefix("layer") {
        Some(n) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => first,
        _ => "",
    }
}

fn regions(g: &Graph, order: &[NodeIndex]) -> Vec<Region> {
    let mut regions: Vec<Region> = Vec::new();
    for &n in order {
        let node = g.node(n);
        if node.op != (Op::MatMul { transpose_a: false, transpose_b: true }) {
            continue;
        }
        let ops = g.operands(n);
        let (x, w) = (ops[0], ops[1]);
        let wt = &g.node(w.node).outputs[0];
        let xt = g.value_type(x);
        let constant = |d: &Dim| d.as_constant().is_some();
        if !matches!(g.node(w.node).op, Op::Param { .. })
            || wt.shape.rank() != 2
            || !wt.shape.dims().iter().all(constant)
            || xt.shape.rank() < 2
            || !xt.shape.last().is_some_and(constant)
        {
            continue;
        }
        let key = region_key(&node.name);
        let index = match regions.iter().position(|r| r.key == key) {
            Some(i) => i,
            None => {
                regions.push(Region { key: key.to_string(), ..Region::default() });
                regions.len() - 1
            }
        };
        let r = &mut regions[index];
        r.candidates.push(Candidate { mm: n, x, w: w.node });
        if !r.xs.contains(&x) {
            r.xs.push(x);
        }
        if !r.ws.contains(&w.node) {
            r.ws.push(w.node);
        }
    }
    regions
}

/// A group's decision, in a region's candidate indices.
#[derive(Clone, Debug)]
struct GroupPlan {
    /// Candidate indices in concat order.
    members: Vec<usize>,
    separate: f64,
    merged: f64,
}

#[derive(Clone, Debug)]
struct RegionPlan {
    groups: Vec<GroupPlan>,
}

/// The price of one e-node (seconds) under `model` at `bindings`.
fn node_cost(model: &GpuCostModel, bindings: &Bindings, egraph: &RegionGraph, node: &TensorLang) -> f64 {
    let ty = |id: &Id| egraph[*id].data.tensor().cloned();
    let elements = |t: &LeafInfo| t.shape.iter().map(|d| eval(d, bindings)).product::<u64>();
    match node {
        TensorLang::MatMulT([x, w]) => {
            let (Some(x), Some(w)) = (ty(x), ty(w)) else { return f64::INFINITY };
            let (k, rows) = x.shape.split_last().expect("rank ≥ 2");
            let m = rows.iter().map(|d| eval(d, bindings)).product();
            model.gemm_seconds(m, eval(&w.shape[0], bindings), eval(k, bindings), x.dtype)
        }
        TensorLang::Concat(_) | TensorLang::Cols(_) => {
            match &egraph[egraph.lookup(node.clone()).expect("present")].data {
                Info::Tensor(t) => model.copy_seconds(elements(t), t.dtype),
                _ => f64::INFINITY,
            }
        }
        TensorLang::Transpose([_, x]) | TensorLang::Reshape([_, x]) | TensorLang::Scale([_, x]) => match ty(x) {
            Some(t) => model.copy_seconds(elements(&t), t.dtype),
            None => f64::INFINITY,
        },
        TensorLang::Perm(_) | TensorLang::Dims(_) | TensorLang::Factor(_) => 0.0,
        TensorLang::Num(_) | TensorLang::Leaf(_) => 0.0,
    }
}

/// Saturation statistics, summed over the regions saturated.
#[derive(Default)]
struct Stats {
    saturated: usize,
    iterations: usize,
    enodes: usize,
    stop: Vec<String>,
    seconds: f64,
}

fn plan_region(g: &Graph, r: &Region, model: &GpuCostModel, bindings: &Bindings, stats: &mut Stats) -> RegionPlan {
    let start = Instant::now();
    let mut shapes = Shapes::default();
    let leaf = |s: String| Symbol::from(s);
    for (i, x) in r.xs.iter().enumerate() {
        let t = g.value_type(*x);
        shapes.leaves.insert(leaf(format!("x{i}")), LeafInfo { shape: t.shape.0.clone(), dtype: t.dtype, param: None });
    }
    for (j, w) in r.ws.iter().enumerate() {
        let t = &g.node(*w).outputs[0];
        shapes
            .leaves
            .insert(leaf(format!("w{j}")), LeafInfo { shape: t.shape.0.clone(), dtype: t.dtype, param: Some(j) });
    }
    let mut egraph = RegionGraph::new(shapes);
    let roots: Vec<Id> = r
        .candidates
        .iter()
        .map(|c| {
            let xi = r.xs.iter().position(|v| *v == c.x).expect("indexed");
            let wi = r.ws.iter().position(|w| *w == c.w).expect("indexed");
            let x = egraph.add(TensorLang::Leaf(leaf(format!("x{xi}"))));
            let w = egraph.add(TensorLang::Leaf(leaf(format!("w{wi}"))));
            egraph.add(TensorLang::MatMulT([x, w]))
        })
        .collect();
    let runner: Runner<TensorLang, Shapes> = Runner::new(Shapes::default())
        .with_egraph(egraph)
        .with_iter_limit(ITER_LIMIT)
        .with_node_limit(NODE_LIMIT)
        .run(&rules::rules());
    stats.saturated += 1;
    stats.iterations += runner.iterations.len();
    stats.enodes += runner.egraph.total_number_of_nodes();
    let stop = format!("{:?}", runner.stop_reason.as_ref().expect("the runner stopped"));
    if !stats.stop.contains(&stop) {
        stats.stop.push(stop);
    }
    let cost = |eg: &RegionGraph, n: &TensorLang| node_cost(model, bindings, eg, n);
    let groups = extract::groups(&runner.egraph, &roots)
        .into_iter()
        .map(|group| {
            let (separate, merged) = extract::group_costs(&runner.egraph, &roots, &group, &cost);
            GroupPlan { members: group.members, separate, merged }
        })
        .collect();
    stats.seconds += start.elapsed().as_secs_f64();
    RegionPlan { groups }
}

/// The merged nodes' base name: the members' common prefix and suffix
/// around the differing parts, joined (`layer0.attn.` + `qkv`, `layer0.ffn.`
/// + `gate_up`). `None` when the names do not differ in one place.
fn merged_base(names: &[&str]) -> Option<String> {
    let parts: Vec<Vec<&str>> = names.iter().map(|n| n.split('.').collect()).collect();
    let shortest = parts.iter().map(Vec::len).min()?;
    let prefix = (0..shortest).take_while(|&i| parts.iter().all(|p| p[i] == parts[0][i])).count();
    let at_end = |p: &Vec<&str>, i: usize| p[p.len() - 1 - i].to_string();
    let suffix =
        (0..shortest - prefix).take_while(|&i| parts.iter().all(|p| at_end(p, i) == at_end(&parts[0], i))).count();
    let middles: Vec<String> =
        parts.iter().map(|p| p[prefix.min(p.len())..p.len().saturating_sub(suffix).max(prefix)].join(".")).collect();
    if middles.iter().any(|m| m.is_empty() || m.contains('.')) {
        return None;
    }
    let joined = if middles.iter().all(|m| m.chars().count() == 1) { middles.concat() } else { middles.join("_") };
    let mut out: Vec<&str> = parts[0][..prefix].to_vec();
    out.push(&joined);
    Some(out.join("."))
}

/// A group to merge, in graph nodes.
struct Merge {
    members: Vec<Candidate>,
    base: String,
}

/// Runs the pass with `model`; see the module docs.
pub fn rewrite(graph: &Graph, cx: &mut PassContext, model: &GpuCostModel) -> Result<Graph, GraphError> {
    let bindings = hint_bindings(&cx.options.shape_hint);
    let mut stats = Stats::default();
    // The clean-ups first: the matmul regions then see the cleaned operands.
    let order = graph.topo_order();
    let cleaned = cleanup::cleanup(graph, &order, cx, model, &bindings, &mut stats)?;
    let graph = cleaned.graph.as_ref().unwrap_or(graph);
    let order = if cleaned.graph.is_some() { graph.topo_order() } else { order };
    let regions = regions(graph, &order);
    let mut cache: HashMap<Signature, RegionPlan> = HashMap::new();
    let (mut merged_count, mut kept_count) = (0usize, 0usize);
    let mut merges: Vec<Merge> = Vec::new();
    let explain = cx.explains("rewrite");
    for r in &regions {
        let signature = r.signature(graph);
        let plan = match cache.get(&signature) {
            Some(plan) => plan.clone(),
            None => {
                let plan = plan_region(graph, r, model, &bindings, &mut stats);
                cache.insert(signature, plan.clone());
                plan
            }
        };
        for group in &plan.groups {
            let members: Vec<Candidate> = group.members.iter().map(|&i| r.candidates[i]).collect();
            let names: Vec<&str> = members.iter().map(|c| &*graph.node(c.mm).name).collect();
            let base = merged_base(&names).filter(|b| {
                ["weight", "mm", "split"].iter().all(|s| graph.node_by_name(&format!("{b}.{s}")).is_none())
            });
            let cheaper = group.merged < group.separate;
            let decision = match &base {
                None => "keep (no free name for the merged nodes)",
                Some(_) if !cheaper => "keep",
                Some(_) if !cx.may_apply() => "keep (pass limit)",
                Some(_) => "merge",
            };
            if explain {
                let x = graph.value_type(members[0].x);
                let m: u64 = x.shape.dims()[..x.shape.rank() - 1].iter().map(|d| eval(d, &bindings)).product();
                cx.explanations.push(format!(
                    "rewrite: {{{}}} on {x} (M={m}): separate {:.2} µs, merged {:.2} µs → {decision}",
                    names.join(", "),
                    group.separate * 1e6,
                    group.merged * 1e6,
                ));
            }
            match (decision, base) {
                ("merge", Some(base)) => {
                    merged_count += 1;
                    merges.push(Merge { members, base });
                }
                _ => kept_count += 1,
            }
        }
    }
    cx.stat("regions", regions.len());
    cx.stat("regions saturated", stats.saturated);
    cx.stat("iterations", stats.iterations);
    cx.stat("e-nodes", stats.enodes);
    cx.stat("stop reason", if stats.stop.is_empty() { "none".to_string() } else { stats.stop.join(", ") });
    cx.stat("saturation ms", format!("{:.3}", stats.seconds * 1e3));
    cx.stat("groups merged", merged_count);
    cx.stat("groups kept", kept_count);
    cx.stat("clean-up regions", cleaned.regions);
    cx.stat("clean-ups applied", cleaned.applied);
    apply(graph, &order, &merges)
}

/// Rebuilds `graph` with `merges` applied; other nodes are copied unchanged.
fn apply(graph: &Graph, order: &[NodeIndex], merges: &[Merge]) -> Result<Graph, GraphError> {
    let mut first: HashMap<NodeIndex, usize> = HashMap::new();
    let mut member_of: HashMap<NodeIndex, usize> = HashMap::new();
    for (i, m) in merges.iter().enumerate() {
        for c in &m.members {
            member_of.insert(c.mm, i);
        }
        let earliest = order.iter().find(|n| m.members.iter().any(|c| c.mm == **n)).expect("a member");
        first.insert(*earliest, i);
    }
    let (mut out, mut map) = rebuilt(graph, graph.node_count());
    // Concats already built, by weights: shared weights (ALBERT) concatenate once.
    let mut concats: BTreeMap<Vec<NodeIndex>, Value> = BTreeMap::new();
    for &n in order {
        if map.contains_key(&Value { node: n, output: 0 }) {
            continue; // a weight copied early for a merge
        }
        if let Some(&i) = first.get(&n) {
            let m = &merges[i];
            let weights: Vec<NodeIndex> = m.members.iter().map(|c| c.w).collect();
            for &w in &weights {
                if !map.contains_key(&Value { node: w, output: 0 }) {
                    copy_node(graph, w, &mut out, &mut map)?;
                }
            }
            let concat = match concats.get(&weights) {
                Some(v) => *v,
                None => {
                    let operands: Vec<Value> = weights.iter().map(|w| map[&Value { node: *w, output: 0 }]).collect();
                    let v = out.add(format!("{}.weight", m.base), Op::Concat { axis: 0 }, &operands)?;
                    concats.insert(weights.clone(), v);
                    v
                }
            };
            let x = map[&m.members[0].x];
            let mm =
                out.add(format!("{}.mm", m.base), Op::MatMul { transpose_a: false, transpose_b: true }, &[x, concat])?;
            let rank = out.value_type(mm).shape.rank();
            let sizes: Vec<u64> = weights
                .iter()
                .map(|w| graph.node(*w).outputs[0].shape.dims()[0].as_constant().expect("constant rows"))
                .collect();
            let pieces = out.add_multi(format!("{}.split", m.base), Op::Split { axis: rank - 1, sizes }, &[mm])?;
            for (c, piece) in m.members.iter().zip(pieces) {
                map.insert(Value { node: c.mm, output: 0 }, piece);
            }
            continue;
        }
        if member_of.contains_key(&n) {
            continue; // replaced by its piece of the split
        }
        copy_node(graph, n, &mut out, &mut map)?;
    }
    copy_outputs(graph, &mut out, &map);
    // Updates of a forward graph are none; keep any, mapped, for safety.
    for (target, value) in &graph.updates {
        let t = map[&Value { node: *target, output: 0 }].node;
        out.set_update(t, map[value])?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeroplan_ir::{DType, Init, Shape};

    /// `x[batch, seq, 64] @ wᵢᵀ` for three `[n, 64]` weights, and one of another shape.
    fn fan_out(n: u64) -> Graph {
        let mut g = Graph::new("fan-out");
        let x = TensorType::new(Shape(vec![Dim::symbol("batch"), Dim::symbol("seq"), Dim::constant(64)]), DType::BF16);
        let x = g.input("x", x).unwrap();
        for (s, rows) in [("q", n), ("k", n), ("v", n), ("o", n + 1)] {
            let wt = TensorType::new(Shape(vec![Dim::constant(rows), Dim::constant(64)]), DType::BF16);
            let w = g.param(format!("layer0.{s}.weight"), wt, Init::Zeros).unwrap();
            let mm = g.add(format!("layer0.{s}.mm"), Op::MatMul { transpose_a: false, transpose_b: true }, &[x, w]);
            g.set_output(s, mm.unwrap());
        }
        g
    }

    #[test]
    fn dag_costs_price_the_merged_matmul_once() {
        let g = fan_out(96);
        let order = g.topo_order();
        let regions = regions(&g, &order);
        assert_eq!(regions.len(), 1);
        let model = GpuCostModel::h100_sxm();
        let bindings = hint_bindings(&Bindings::new());
        let plan = plan_region(&g, &regions[0], &model, &bindings, &mut Stats::default());
        // One group: q, k, v (the `o` weight has another shape).
        assert_eq!(plan.groups.len(), 1);
        assert_eq!(plan.groups[0].members, vec![0, 1, 2]);
        let expected = model.compare(32 * 128, &[96; 3], 64, DType::BF16);
        let group = &plan.groups[0];
        assert!((group.separate - expected.separate).abs() < 1e-15, "{group:?} vs {expected:?}");
        assert!((group.merged - expected.merged()).abs() < 1e-15, "{group:?} vs {expected:?}");
        // A tree extractor would pay the merged matmul and concat per member.
        let tree = 3.0 * (expected.gemm + expected.concat) + expected.split;
        assert!(tree > group.separate && group.merged < group.separate);
    }

    #[test]
    fn merged_names() {
        assert_eq!(
            merged_base(&["layer0.attn.q.mm", "layer0.attn.k.mm", "layer0.attn.v.mm"]).unwrap(),
            "layer0.attn.qkv"
        );
        assert_eq!(merged_base(&["layer3.ffn.gate", "layer3.ffn.up"]).unwrap(), "layer3.ffn.gate_up");
        assert_eq!(merged_base(&["a.b.c", "a.d.e"]), None);
    }
}
