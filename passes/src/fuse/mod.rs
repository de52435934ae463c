//! Kernel fusion: groups of memory-bound nodes become one `fused` node
//! holding a row kernel ([`zeroplan_ir::kernel`]).
//!
//! Runs after autodiff and the optimizer pass, on the training graph.
//! Elementwise ops, dropout, the attention mask and ALiBi bias, LayerNorm,
//! softmax and the elementwise/row gradients are fusible when they produce
//! the kernel's shape (the anchor's) and every operand is that shape, a
//! right-aligned suffix of it (bias, γ, position embeddings) or the `[B, Sk]`
//! attention mask; so is `layer_norm_grad` (dx per element, dγ and dβ as
//! cross-row outputs), and a `sum_to` of a group value down to a trailing
//! suffix of the kernel shape joins the group as a cross-row output (bias
//! gradients). In the optimizer phase each `adamw` and each `squared_sum`
//! becomes a kernel of its own (an AdamW launch over all parameters needs
//! flat parameter buffers). Matmuls, embeddings and reshapes stay as they
//! are; a kernel that starts with a bias add on a matmul output nothing else
//! reads names that matmul as its GEMM epilogue ([`patterns::epilogue`]).
//! With the `attention` pass disabled (attention pinned unfused) the
//! attention-probability dropout and its backward stay lone `dropout` nodes,
//! each a kernel of its own once selected, between the softmax's kernel and
//! the context matmul, and between that matmul's gradient and the softmax
//! gradient's kernel ([`group`]).
//!
//! A group grows from an anchor ([`patterns`]) over producers whose users in
//! the same phase all lie in the group ([`group`]); its values read outside
//! it (by other nodes, later phases, graph outputs or updates) become the
//! kernel's outputs, so the backward still finds the pre-activation or the
//! residual it needs. Each group is lowered op by op to the exact `f64`
//! expressions of the reference interpreter ([`lower`], in `zeroplan_ir`
//! so a runtime can lower a lone node the same way), so the fused graph
//! computes the same values as the unfused one in `Rounding::F64`.
//!
//! The fused node is named `ANCHOR.fused`; its kernel has the same name.
//! The graph's text form shows `{kernel=NAME}`; [`kernels_text`] prints the
//! kernel bodies.

mod group;
mod patterns;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use rayon::prelude::*;

use zeroplan_ir::kernel::lower;
use zeroplan_ir::reassemble::Part;
use zeroplan_ir::{Graph, Node, NodeIndex, Op, Value};

use crate::manager::{Pass, PassContext, PassError};
use crate::value_table::ValueTable;

/// The fusion pass.
pub struct Fuse;

impl Pass for Fuse {
    fn name(&self) -> &'static str {
        "fuse"
    }

    fn run(&self, graph: Graph, cx: &mut PassContext) -> Result<Graph, PassError> {
        let fail = |message: String| PassError::Failed { pass: "fuse", message };
        let before = graph.node_count();
        let (out, counts) = fuse(graph, cx).map_err(fail)?;
        let kernels = out
            .nodes()
            .filter_map(|n| match &n.op {
                Op::Fused { kernel } => Some(kernel),
                _ => None,
            })
            .collect::<Vec<_>>();
        let rank = |k: &zeroplan_ir::kernel::Kernel| k.shape.rank();
        let cross_row: usize =
            kernels.iter().map(|k| k.outputs.iter().filter(|o| o.is_cross_row(rank(k))).count()).sum();
        let epilogues = kernels.iter().filter(|k| k.epilogue_of.is_some()).count();
        cx.stat("kernels", counts.values().sum::<usize>());
        cx.stat("nodes_fused", before + counts.values().sum::<usize>() - out.node_count());
        cx.stat("cross_row_outputs", cross_row);
        cx.stat("gemm_epilogues", epilogues);
        for (pattern, n) in counts {
            cx.stat(format!("pattern.{pattern}"), n);
        }
        Ok(out)
    }
}

/// The kernel bodies of every `fused` node, in the graph's text order.
pub fn kernels_text(graph: &Graph) -> String {
    let order = graph.topo_order();
    order
        .into_iter()
        .filter_map(|n| match &graph.node(n).op {
            Op::Fused { kernel } => Some(kernel.to_text()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

struct Group {
    nodes: Vec<NodeIndex>,
    /// The fused node, reading the input's values.
    fused: Node,
    outputs: Vec<Value>,
}

/// The fused graph and the number of kernels of each pattern.
///
/// Groups are chosen one after another (each takes nodes the later ones
/// may not), then lowered at once: lowering reads only the graph and the
/// group, and on a tiled 100T step it was half the pass.
fn fuse(graph: Graph, cx: &mut PassContext) -> Result<(Graph, BTreeMap<&'static str, usize>), String> {
    let g = &graph;
    let order = g.topo_order();
    let mut position = vec![0; g.node_count()];
    for (i, &n) in order.iter().enumerate() {
        position[n.index()] = i;
    }
    let exported = group::exported(g);
    let mut taken = vec![false; g.node_count()];
    // Each group's members and its anchor: the kernel runs over the
    // anchor's output shape (an optimizer node's, its first operand's).
    let mut chosen: Vec<(Vec<NodeIndex>, NodeIndex)> = Vec::new();
    // Attention pinned unfused (`--attention unfused`, `--disable attention`)
    // runs its softmax and dropout as frameworks without flash attention do.
    let unfused_attention = cx.options.disabled.contains(crate::attention::Attention.name());
    for anchor in patterns::anchors(g, &order) {
        if taken[anchor.index()] || !lower::fusible(g, anchor, &g.node(anchor).outputs[0].shape) {
            continue;
        }
        let Some(nodes) = group::grow(g, anchor, &taken, &position, unfused_attention) else { continue };
        if !cx.may_apply() {
            break;
        }
        for n in &nodes {
            taken[n.index()] = true;
        }
        chosen.push((nodes, anchor));
    }
    let anchored = chosen.len();
    // The optimizer: each `adamw` and `squared_sum` alone, over its first
    // operand's shape (one launch per parameter; a launch over all
    // parameters needs flat parameter buffers).
    for &n in &order {
        if g.node(n).phase != zeroplan_ir::Phase::Optimizer || !lower::optimizer_fusible(g, n) {
            continue;
        }
        if !cx.may_apply() {
            break;
        }
        chosen.push((vec![n], n));
    }
    let lowered: Vec<Result<Option<(Group, &'static str)>, String>> = chosen
        .into_par_iter()
        .enumerate()
        .map(|(at, (nodes, anchor))| {
            let outputs = group::outputs(g, &nodes, &exported);
            // An optimizer node whose results nothing reads stays as it is.
            if at >= anchored && outputs.is_empty() {
                return Ok(None);
            }
            let kshape = if at < anchored {
                g.node(anchor).outputs[0].shape.clone()
            } else {
                g.value_type(g.operands(anchor)[0]).shape.clone()
            };
            let name = format!("{}.fused", g.node(anchor).name);
            let (mut kernel, operands) = lower::lower(g, &nodes, &outputs, &name, &kshape)?;
            if at < anchored {
                kernel.epilogue_of = patterns::epilogue(g, &nodes, &exported, &kshape);
            }
            let pattern = patterns::classify(g, &nodes);
            kernel.pattern = Some(pattern.to_string());
            // The kernel reads and stores its values at the types they have
            // here, which the fused graph keeps.
            let op = Op::Fused { kernel: Box::new(kernel) };
            let types: Vec<_> = operands.iter().map(|&v| g.value_type(v)).collect();
            let types = zeroplan_ir::infer::infer(&op, &types, &[]).map_err(|e| format!("`{name}`: {e}"))?;
            let first = g.node(nodes[0]);
            let fused = Node::new(name, op, types.into(), first.phase, first.place, &operands);
            Ok(Some((Group { nodes, fused, outputs }, pattern)))
        })
        .collect();
    let mut groups: Vec<Group> = Vec::with_capacity(lowered.len());
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for (group, pattern) in lowered.into_iter().filter_map(Result::transpose).collect::<Result<Vec<_>, String>>()? {
        *counts.entry(pattern).or_default() += 1;
        groups.push(group);
    }
    Ok((rebuild(graph, &order, &position, groups).map_err(|e| e.to_string())?, counts))
}

/// The graph with each group replaced by its fused node, in a topological
/// order of the quotient graph: of the units ready, the one whose last
/// member comes first in the input.
///
/// Units are ordered by a sweep over the input's positions — a unit comes
/// up at its last member's — with a heap only for the few a group held
/// back: a unit reading a group that ends after it (a lone node between a
/// group's members) is ready only once the group is placed, after the
/// sweep has passed it. Of the ready units those are the first, so the
/// order is the one a heap of every ready unit gives, without a million
/// pushes and pops on a tiled step. The graph is then reassembled in that
/// order ([`Graph::reassembled`]): the lone nodes moved, not copied.
fn rebuild(
    g: Graph,
    order: &[NodeIndex],
    position: &group::Position,
    groups: Vec<Group>,
) -> Result<Graph, zeroplan_ir::GraphError> {
    // Units: a group (by index) or a single node (groups.len() + position),
    // in dense tables: a step has 300k of them.
    let singles = groups.len();
    let total = singles + order.len();
    let mut unit_at: Vec<usize> = (singles..total).collect();
    for (i, grp) in groups.iter().enumerate() {
        for &n in &grp.nodes {
            unit_at[position[n.index()]] = i;
        }
    }
    let is_unit = |u: usize| u < singles || unit_at[u - singles] == u;
    let members = |u: usize| -> &[NodeIndex] {
        if u < singles { &groups[u].nodes } else { std::slice::from_ref(&order[u - singles]) }
    };
    // A unit's place in the sweep: its last member's position, which no
    // other unit shares (a single node's is its own).
    let group_key: Vec<usize> =
        groups.iter().map(|grp| grp.nodes.iter().map(|n| position[n.index()]).max().unwrap_or(0)).collect();
    let key = |u: usize| if u < singles { group_key[u] } else { u - singles };
    let mut unit_with_key = vec![usize::MAX; order.len()];
    // The units each unit reads, then who reads each, as compressed rows.
    let mut reads_start = vec![0; total + 1];
    let mut reads = Vec::with_capacity(g.operand_count());
    let mut deps = Vec::new();
    for u in 0..total {
        if is_unit(u) {
            unit_with_key[key(u)] = u;
            deps.clear();
            for &n in members(u) {
                deps.extend(g.operands(n).iter().map(|v| unit_at[position[v.node.index()]]).filter(|&d| d != u));
            }
            deps.sort_unstable();
            deps.dedup();
            reads.extend_from_slice(&deps);
        }
        reads_start[u + 1] = reads.len();
    }
    let mut indegree: Vec<usize> = (0..total).map(|u| reads_start[u + 1] - reads_start[u]).collect();
    let mut readers_start = vec![0; total + 1];
    for &d in &reads {
        readers_start[d + 1] += 1;
    }
    for u in 0..total {
        readers_start[u + 1] += readers_start[u];
    }
    let mut fill = readers_start.clone();
    let mut readers = vec![0; reads.len()];
    for u in 0..total {
        for &d in &reads[reads_start[u]..reads_start[u + 1]] {
            readers[fill[d]] = u;
            fill[d] += 1;
        }
    }
    let mut held_back: BinaryHeap<Reverse<(usize, usize)>> = BinaryHeap::new();
    let mut sweep = 0;
    // The units in the fused graph's order, and each one's index there.
    let mut placed = Vec::with_capacity(g.node_count());
    let mut index_of = vec![u32::MAX; total];
    loop {
        let u = match held_back.pop() {
            Some(Reverse((_, u))) => u,
            None => {
                let Some(u) = unit_with_key[sweep..].iter().position(|&u| u != usize::MAX && indegree[u] == 0) else {
                    break;
                };
                let u = unit_with_key[sweep + u];
                sweep = key(u) + 1;
                u
            }
        };
        index_of[u] = placed.len() as u32;
        placed.push(u);
        for &w in &readers[readers_start[u]..readers_start[u + 1]] {
            indegree[w] -= 1;
            if indegree[w] == 0 && key(w) < sweep {
                held_back.push(Reverse((key(w), w)));
            }
        }
    }
    // A group's values read outside it are its fused node's outputs.
    let mut output_of: ValueTable<u32> = ValueTable::for_graph(&g);
    for grp in &groups {
        for (k, v) in grp.outputs.iter().enumerate() {
            output_of.insert(*v, k as u32);
        }
    }
    let renumber = |v: Value| {
        let u = unit_at[position[v.node.index()]];
        let node = index_of[u];
        let output = if u < singles { *output_of.get(&v)? } else { v.output };
        (node != u32::MAX).then(|| Value { node: NodeIndex::new(node as usize), output })
    };
    let parts: Vec<Part> = placed
        .into_iter()
        .map(|u| match u.checked_sub(singles) {
            Some(at) => Part::Kept(order[at]),
            None => Part::Made(u),
        })
        .collect();
    let made = groups.into_iter().map(|grp| grp.fused).collect();
    g.reassembled(&parts, made, renumber)
}
