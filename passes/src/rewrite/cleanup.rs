//! The algebraic clean-ups: chains of transposes, reshapes and scales.
//!
//! A *chain node* is a `transpose`, `reshape` or `scale` whose operand is
//! made by an op of the same kind, or whose consumer is, or which is an
//! identity by itself (the identity permutation, a reshape to its operand's
//! shape, a scale by 1). Chain nodes are grouped by layer like the matmul
//! regions; each region is translated into the e-graph of [`super::lang`]
//! (values made outside the region are leaves), saturated under
//! [`super::rules::cleanup_rules`] with the same bounds, and extracted with
//! [`egg::Extractor`] under the cost `(seconds, nodes)`: the seconds of
//! [`super::node_cost`] (each transpose, reshape or scale reads and writes its
//! bytes; a removed node costs nothing), fewer nodes breaking ties. Chains are
//! unary, so a term's tree cost is its DAG cost.
//!
//! The *roots* are the chain nodes whose value leaves the region: a consumer
//! that is not a chain node of the region, or a graph output. Each root whose
//! best term is strictly cheaper than its own is one clean-up (one
//! `may_apply`); it is rebuilt from its best term, keeping its name, and its
//! consumers read the result (the leaf itself when the chain vanishes).
//! Inner terms take the names of the chain nodes of their e-class; chain nodes
//! no root needs any more disappear. A root refused by the pass limit, or not
//! improved, is copied as it was, with the chain beneath it.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use egg::{CostFunction, Extractor, Id, Language, RecExpr, Runner, Symbol};
use zeroplan_ir::{Bindings, Graph, GraphError, NodeIndex, Op, Shape, Value};

use super::cost::GpuCostModel;
use super::lang::{Dims, Factor, Info, LeafInfo, Perm, RegionGraph, Shapes, TensorLang};
use super::{ITER_LIMIT, NODE_LIMIT, Stats, node_cost, region_key, rules};
use crate::manager::PassContext;
use crate::rebuild::{ValueMap, copy_node, copy_outputs, rebuilt};

/// What the clean-ups did.
pub(super) struct Outcome {
    /// The rebuilt graph; `None` when nothing was applied.
    pub graph: Option<Graph>,
    pub regions: usize,
    pub applied: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Transpose,
    Reshape,
    Scale,
}

fn kind(op: &Op) -> Option<Kind> {
    match op {
        Op::Transpose { .. } => Some(Kind::Transpose),
        Op::Reshape { .. } => Some(Kind::Reshape),
        Op::Scale { .. } => Some(Kind::Scale),
        _ => None,
    }
}

fn is_identity(g: &Graph, n: NodeIndex) -> bool {
    match &g.node(n).op {
        Op::Transpose { perm } => perm.iter().enumerate().all(|(i, &p)| i == p),
        Op::Reshape { shape } => *shape == g.value_type(g.operands(n)[0]).shape,
        Op::Scale { factor } => *factor == 1.0,
        _ => false,
    }
}

/// The cost egg's extractor minimises: seconds, then nodes.
struct CleanupCost<'a> {
    egraph: &'a RegionGraph,
    model: &'a GpuCostModel,
    bindings: &'a Bindings,
}

impl CostFunction<TensorLang> for CleanupCost<'_> {
    type Cost = (f64, usize);

    fn cost<C: FnMut(Id) -> (f64, usize)>(&mut self, enode: &TensorLang, mut costs: C) -> (f64, usize) {
        let own = node_cost(self.model, self.bindings, self.egraph, enode);
        let nodes =
            usize::from(matches!(enode, TensorLang::Transpose(_) | TensorLang::Reshape(_) | TensorLang::Scale(_)));
        enode.fold((own, nodes), |(s, n), id| {
            let (cs, cn) = costs(id);
            (s + cs, n + cn)
        })
    }
}

/// One region after saturation and extraction.
struct Planned {
    egraph: RegionGraph,
    /// Each chain node's e-class.
    ids: HashMap<NodeIndex, Id>,
    /// Each leaf's value.
    leaves: HashMap<Symbol, Value>,
    /// The best e-node of each e-class.
    best: HashMap<Id, TensorLang>,
}

fn leaf_name(g: &Graph, v: Value) -> Symbol {
    let name = &g.node(v.node).name;
    Symbol::from(if v.output == 0 { name.to_string() } else { format!("{name}#{}", v.output) })
}

/// Runs the clean-ups over `graph`; see the module docs.
pub(super) fn cleanup(
    graph: &Graph,
    order: &[NodeIndex],
    cx: &mut PassContext,
    model: &GpuCostModel,
    bindings: &Bindings,
    stats: &mut Stats,
) -> Result<Outcome, GraphError> {
    let mut consumers: HashMap<NodeIndex, Vec<NodeIndex>> = HashMap::new();
    for &n in order {
        for v in graph.operands(n).iter().copied() {
            consumers.entry(v.node).or_default().push(n);
        }
    }
    let same_kind = |a: NodeIndex, k: Kind| kind(&graph.node(a).op) == Some(k);
    let chain: HashSet<NodeIndex> = order
        .iter()
        .copied()
        .filter(|&n| {
            let Some(k) = kind(&graph.node(n).op) else { return false };
            same_kind(graph.operands(n)[0].node, k)
                || consumers.get(&n).is_some_and(|cs| cs.iter().any(|&c| same_kind(c, k)))
                || is_identity(graph, n)
        })
        .collect();
    if chain.is_empty() {
        return Ok(Outcome { graph: None, regions: 0, applied: 0 });
    }
    let key = |n: NodeIndex| region_key(&graph.node(n).name);
    // Regions in order of their first chain node.
    let mut keys: Vec<&str> = Vec::new();
    for &n in order.iter().filter(|n| chain.contains(n)) {
        if !keys.contains(&key(n)) {
            keys.push(key(n));
        }
    }
    let inside = |n: NodeIndex, k: &str| chain.contains(&n) && key(n) == k;
    let outputs: HashSet<NodeIndex> = graph.outputs.iter().map(|(_, v)| v.node).collect();
    let updated: HashSet<NodeIndex> =
        graph.updates.iter().flat_map(|(t, v)| [*t, v.node]).collect::<HashSet<NodeIndex>>();
    let is_root = |n: NodeIndex| {
        outputs.contains(&n)
            || updated.contains(&n)
            || consumers.get(&n).is_some_and(|cs| cs.iter().any(|&c| !inside(c, key(n))))
    };

    let explain = cx.explains("rewrite");
    let mut planned: Vec<Planned> = Vec::new();
    let mut region_of: HashMap<NodeIndex, usize> = HashMap::new();
    let mut applied: HashSet<NodeIndex> = HashSet::new();
    let mut roots: HashSet<NodeIndex> = HashSet::new();
    for (r, &k) in keys.iter().enumerate() {
        let start = Instant::now();
        let nodes: Vec<NodeIndex> = order.iter().copied().filter(|&n| inside(n, k)).collect();
        let mut shapes = Shapes::default();
        let mut leaves: HashMap<Symbol, Value> = HashMap::new();
        for &n in &nodes {
            let x = graph.operands(n)[0];
            if !inside(x.node, k) {
                let t = graph.value_type(x);
                let s = leaf_name(graph, x);
                shapes.leaves.insert(s, LeafInfo { shape: t.shape.0.clone(), dtype: t.dtype, param: None });
                leaves.insert(s, x);
            }
        }
        let mut egraph = RegionGraph::new(shapes);
        let mut ids: HashMap<NodeIndex, Id> = HashMap::new();
        for &n in &nodes {
            let x = graph.operands(n)[0];
            let x = match ids.get(&x.node) {
                Some(id) if inside(x.node, k) => *id,
                _ => egraph.add(TensorLang::Leaf(leaf_name(graph, x))),
            };
            let node = match &graph.node(n).op {
                Op::Transpose { perm } => TensorLang::Transpose([egraph.add(TensorLang::Perm(Perm(perm.clone()))), x]),
                Op::Reshape { shape } => TensorLang::Reshape([egraph.add(TensorLang::Dims(Dims(shape.0.clone()))), x]),
                Op::Scale { factor } => TensorLang::Scale([egraph.add(TensorLang::Factor(Factor::new(*factor))), x]),
                _ => unreachable!("chain nodes are transposes, reshapes and scales"),
            };
            ids.insert(n, egraph.add(node));
            region_of.insert(n, r);
        }
        // The original terms, for their costs and the explanations.
        let originals: HashMap<NodeIndex, RecExpr<TensorLang>> = nodes
            .iter()
            .map(|&n| {
                let mut expr = RecExpr::default();
                original_term(graph, n, &|m| inside(m, k), &mut expr);
                (n, expr)
            })
            .collect();
        let runner: Runner<TensorLang, Shapes> = Runner::new(Shapes::default())
            .with_egraph(egraph)
            .with_iter_limit(ITER_LIMIT)
            .with_node_limit(NODE_LIMIT)
            .run(&rules::cleanup_rules());
        stats.iterations += runner.iterations.len();
        stats.enodes += runner.egraph.total_number_of_nodes();
        let stop = format!("{:?}", runner.stop_reason.as_ref().expect("the runner stopped"));
        if !stats.stop.contains(&stop) {
            stats.stop.push(stop);
        }
        let egraph = runner.egraph;
        let cost = CleanupCost { egraph: &egraph, model, bindings };
        let extractor = Extractor::new(&egraph, cost);
        let best: HashMap<Id, TensorLang> =
            egraph.classes().map(|c| (c.id, extractor.find_best_node(c.id).clone())).collect();
        for &n in nodes.iter().filter(|&&n| is_root(n)) {
            roots.insert(n);
            let (best_cost, best_term) = extractor.find_best(ids[&n]);
            let original = &originals[&n];
            let original_cost = term_cost(&egraph, original, model, bindings);
            if best_cost.partial_cmp(&original_cost) != Some(std::cmp::Ordering::Less) {
                continue;
            }
            let decision = if cx.may_apply() {
                applied.insert(n);
                "clean up"
            } else {
                "keep (pass limit)"
            };
            if explain {
                cx.explanations.push(format!(
                    "rewrite: clean-up of {}: {original} {:.2} µs, {} nodes → {best_term} {:.2} µs, {} nodes → {decision}",
                    graph.node(n).name,
                    original_cost.0 * 1e6,
                    original_cost.1,
                    best_cost.0 * 1e6,
                    best_cost.1,
                ));
            }
        }
        drop(extractor);
        stats.seconds += start.elapsed().as_secs_f64();
        planned.push(Planned { egraph, ids, leaves, best });
    }
    let count = applied.len();
    if applied.is_empty() {
        return Ok(Outcome { graph: None, regions: keys.len(), applied: 0 });
    }

    // Chain nodes that kept roots still need as they were.
    let mut reserved: HashSet<NodeIndex> = HashSet::new();
    let mut stack: Vec<NodeIndex> = roots.iter().copied().filter(|n| !applied.contains(n)).collect();
    while let Some(n) = stack.pop() {
        if !reserved.insert(n) {
            continue;
        }
        let x = graph.operands(n)[0].node;
        if inside(x, key(n)) && !applied.contains(&x) {
            stack.push(x);
        }
    }
    // Names an inner term may take: the chain nodes of its e-class that no
    // root and no kept chain uses.
    let mut names: HashMap<(usize, Id), Vec<String>> = HashMap::new();
    for &n in order.iter().filter(|n| chain.contains(n) && !roots.contains(n) && !reserved.contains(n)) {
        let r = region_of[&n];
        let class = planned[r].egraph.find(planned[r].ids[&n]);
        names.entry((r, class)).or_default().push(graph.node(n).name.to_string());
    }
    let (out, map) = rebuilt(graph, graph.node_count());
    let mut rebuild = Rebuild { graph, planned: &planned, out, map, memo: HashMap::new(), names, fresh: 0 };
    for &n in order {
        if !chain.contains(&n) {
            copy_node(graph, n, &mut rebuild.out, &mut rebuild.map)?;
        } else if applied.contains(&n) {
            let r = region_of[&n];
            let v = rebuild.emit(r, planned[r].ids[&n], &graph.node(n).name, true)?;
            rebuild.map.insert(Value { node: n, output: 0 }, v);
        } else if roots.contains(&n) {
            rebuild.copy_kept(n)?;
        }
    }
    let Rebuild { mut out, map, .. } = rebuild;
    copy_outputs(graph, &mut out, &map);
    for (target, value) in &graph.updates {
        let t = map[&Value { node: *target, output: 0 }].node;
        out.set_update(t, map[value])?;
    }
    Ok(Outcome { graph: Some(out), regions: keys.len(), applied: count })
}

/// Appends chain node `n`'s own term (down to the region's leaves) to `expr`.
fn original_term(g: &Graph, n: NodeIndex, inside: &dyn Fn(NodeIndex) -> bool, expr: &mut RecExpr<TensorLang>) -> Id {
    let x = g.operands(n)[0];
    let x = if inside(x.node) {
        original_term(g, x.node, inside, expr)
    } else {
        expr.add(TensorLang::Leaf(leaf_name(g, x)))
    };
    let node = match &g.node(n).op {
        Op::Transpose { perm } => TensorLang::Transpose([expr.add(TensorLang::Perm(Perm(perm.clone()))), x]),
        Op::Reshape { shape } => TensorLang::Reshape([expr.add(TensorLang::Dims(Dims(shape.0.clone()))), x]),
        Op::Scale { factor } => TensorLang::Scale([expr.add(TensorLang::Factor(Factor::new(*factor))), x]),
        _ => unreachable!("chain nodes are transposes, reshapes and scales"),
    };
    expr.add(node)
}

/// The cost of a term, each node priced in the e-graph's types.
fn term_cost(
    egraph: &RegionGraph,
    expr: &RecExpr<TensorLang>,
    model: &GpuCostModel,
    bindings: &Bindings,
) -> (f64, usize) {
    let mut costs: Vec<(f64, usize)> = Vec::new();
    let mut classes: Vec<Id> = Vec::new();
    for node in expr.as_ref() {
        let canonical = node.clone().map_children(|c| classes[usize::from(c)]);
        let own = node_cost(model, bindings, egraph, &canonical);
        let nodes =
            usize::from(matches!(node, TensorLang::Transpose(_) | TensorLang::Reshape(_) | TensorLang::Scale(_)));
        let total = node.children().iter().fold((own, nodes), |(s, n), c| {
            let (cs, cn) = costs[usize::from(*c)];
            (s + cs, n + cn)
        });
        costs.push(total);
        // Present: every original term was added to the e-graph.
        classes.push(egraph.lookup(canonical).expect("an original term"));
    }
    *costs.last().expect("a non-empty term")
}

struct Rebuild<'a> {
    graph: &'a Graph,
    planned: &'a [Planned],
    out: Graph,
    map: ValueMap,
    /// E-classes already built, per region.
    memo: HashMap<(usize, Id), Value>,
    names: HashMap<(usize, Id), Vec<String>>,
    fresh: usize,
}

impl Rebuild<'_> {
    /// Builds region `r`'s best term of e-class `id`; the top node is called
    /// `name` when `top`.
    fn emit(&mut self, r: usize, id: Id, name: &str, top: bool) -> Result<Value, GraphError> {
        let p = &self.planned[r];
        let class = p.egraph.find(id);
        if let Some(v) = self.memo.get(&(r, class)) {
            return Ok(*v);
        }
        let node = p.best[&class].clone();
        let attr = |c: &Id| p.egraph[*c].data.clone();
        let (op, x) = match &node {
            TensorLang::Leaf(s) => {
                let v = self.map[&p.leaves[s]];
                self.memo.insert((r, class), v);
                return Ok(v);
            }
            TensorLang::Transpose([a, x]) => match attr(a) {
                Info::Perm(perm) => (Op::Transpose { perm }, *x),
                other => unreachable!("a transpose's attribute is {other:?}"),
            },
            TensorLang::Reshape([a, x]) => match attr(a) {
                Info::Dims(dims) => (Op::Reshape { shape: Shape(dims) }, *x),
                other => unreachable!("a reshape's attribute is {other:?}"),
            },
            TensorLang::Scale([a, x]) => match attr(a) {
                Info::Factor(factor) => (Op::Scale { factor }, *x),
                other => unreachable!("a scale's attribute is {other:?}"),
            },
            other => unreachable!("a clean-up region holds no {other:?}"),
        };
        let operand = self.emit(r, x, name, false)?;
        let node_name = if top { name.to_string() } else { self.inner_name(r, class, name) };
        let v = self.out.add(node_name, op, &[operand])?;
        self.memo.insert((r, class), v);
        Ok(v)
    }

    fn inner_name(&mut self, r: usize, class: Id, root: &str) -> String {
        if let Some(names) = self.names.get_mut(&(r, class))
            && !names.is_empty()
        {
            return names.remove(0);
        }
        loop {
            let name = format!("{root}.cleanup{}", self.fresh);
            self.fresh += 1;
            if self.graph.node_by_name(&name).is_none() && self.out.node_by_name(&name).is_none() {
                return name;
            }
        }
    }

    /// Copies chain node `n` as it was, with the chain nodes it reads that
    /// are not built yet.
    fn copy_kept(&mut self, n: NodeIndex) -> Result<(), GraphError> {
        for v in self.graph.operands(n).iter().copied() {
            if !self.map.contains_key(&v) {
                self.copy_kept(v.node)?;
            }
        }
        copy_node(self.graph, n, &mut self.out, &mut self.map)
    }
}
