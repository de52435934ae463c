//! The `attention` pass: each self-attention's unfused chain becomes one
//! [`Op::FlashAttention`].
//!
//! The builder writes attention as
//! `matmul(q, kᵀ) → scale → (alibi_bias) → attention_mask → softmax →
//! (dropout) → matmul(·, v)`, so a training step keeps the `[B, H, S, S]`
//! probabilities (and their dropped-out copy) for the backward: at long
//! sequences, most of the activation memory. The fused op computes the same
//! values (bit for bit in the interpreter's `F64`) while keeping only its
//! output and one f32 log-sum-exp per query row; its adjoint,
//! [`Op::FlashAttentionGrad`], recomputes the probabilities (Dao et al.,
//! FlashAttention, 2022; FlashAttention-2, 2023).
//!
//! A chain is replaced only where it is exactly that: every intermediate
//! value (scores, scaled, biased, masked, probabilities, dropped) read by
//! the next op of the chain alone — not by another node, a graph output or
//! an update — `q`, `k`, `v` of one `[B, H, S, D]` type and the mask an
//! integer `[B, S]`. A chain that fails is left as it is, and `--explain
//! attention` says why. The fused node takes the context matmul's name (its
//! readers are unchanged); its attributes come from the chain: the scale's
//! factor, ALiBi's tensor ranks, the dropout's `p` and stream.
//!
//! It runs on the forward graph: after `rewrite` (whose matmul merging it
//! leaves alone) and before `training-step`, whose autodiff differentiates
//! the fused op as a whole; for forward targets before `fuse`, which leaves
//! it an instruction of its own. Statistics: `attention fused`,
//! `attention kept`.

use rustc_hash::{FxHashMap, FxHashSet};
use zeroplan_ir::{Graph, NodeIndex, Op, Value};

use crate::manager::{Pass, PassContext, PassError};
use crate::rebuild::{copy_node, copy_outputs, rebuilt};

/// The attention fusion pass.
pub struct Attention;

impl Pass for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }

    fn run(&self, graph: Graph, cx: &mut PassContext) -> Result<Graph, PassError> {
        let order = graph.topo_order();
        let mut matches = Vec::new();
        let mut kept = 0usize;
        for &n in &order {
            match chain(&graph, n) {
                Some(Ok(m)) if cx.may_apply() => matches.push(m),
                Some(Ok(_)) => {}
                Some(Err(why)) => {
                    kept += 1;
                    if cx.explains("attention") {
                        cx.explanations.push(format!("attention: `{}` kept unfused: {why}", graph.node(n).name));
                    }
                }
                None => {}
            }
        }
        cx.stat("attention fused", matches.len());
        cx.stat("attention kept", kept);
        if cx.explains("attention") {
            for m in &matches {
                cx.explanations.push(format!(
                    "attention: `{}` fused ({} nodes) into {}",
                    graph.node(m.context).name,
                    m.chain.len() + 1,
                    m.op.name()
                ));
            }
        }
        rebuild(&graph, &order, &matches).map_err(|error| PassError::Graph { pass: "attention", error })
    }
}

/// One matched chain.
struct Match {
    /// The context matmul `probs·v`, which the fused node replaces.
    context: NodeIndex,
    /// The chain's other nodes, which disappear.
    chain: Vec<NodeIndex>,
    /// `q, k, v, mask`.
    operands: [Value; 4],
    op: Op,
}

/// The chain ending at `n` when `n` is a context matmul: `None` when `n`
/// does not look like one at all (not a plain matmul reading a softmax,
/// maybe through dropout), `Some(Err(why))` when it does but the chain
/// cannot be fused.
fn chain(g: &Graph, n: NodeIndex) -> Option<Result<Match, String>> {
    if g.node(n).op != (Op::MatMul { transpose_a: false, transpose_b: false }) {
        return None;
    }
    let [probs_in, v] = <[Value; 2]>::try_from(g.operands(n)).ok()?;
    let mut at = probs_in;
    let (dropout, stream) = match g.node(at.node).op {
        Op::Dropout { p, stream } => {
            at = g.operands(at.node)[0];
            (p, stream)
        }
        _ => (0.0, 0),
    };
    if g.node(at.node).op != Op::Softmax {
        return None;
    }
    // From here on it is attention's softmax: a mismatch is worth a reason.
    Some(match_scores(g, n, probs_in, at, v, dropout, stream))
}

/// The rest of the chain, from the softmax `probs` back to `matmul(q, kᵀ)`.
fn match_scores(
    g: &Graph,
    context: NodeIndex,
    probs_in: Value,
    probs: Value,
    v: Value,
    dropout: f64,
    stream: u32,
) -> Result<Match, String> {
    let mut chain = vec![probs.node];
    if probs_in != probs {
        chain.push(probs_in.node);
    }
    let masked = g.operands(probs.node)[0];
    if g.node(masked.node).op != Op::AttentionMask {
        return Err(format!("the softmax reads {}, not attention_mask", g.node(masked.node).op.name()));
    }
    chain.push(masked.node);
    let [mut at, mask] = <[Value; 2]>::try_from(g.operands(masked.node)).expect("attention_mask has two operands");
    let alibi_ranks = match g.node(at.node).op {
        Op::AlibiBias { ranks } => {
            chain.push(at.node);
            at = g.operands(at.node)[0];
            Some(ranks)
        }
        _ => None,
    };
    let Op::Scale { factor: scale } = g.node(at.node).op else {
        return Err(format!("the scores reach the mask through {}, not scale", g.node(at.node).op.name()));
    };
    chain.push(at.node);
    let scores = g.operands(at.node)[0];
    if g.node(scores.node).op != (Op::MatMul { transpose_a: false, transpose_b: true }) {
        return Err(format!("the scale reads {}, not matmul(q, kᵀ)", g.node(scores.node).op.name()));
    }
    chain.push(scores.node);
    let [q, k] = <[Value; 2]>::try_from(g.operands(scores.node)).expect("matmul has two operands");
    let (tq, tk, tv, tm) = (g.value_type(q), g.value_type(k), g.value_type(v), g.value_type(mask));
    if tq.shape.rank() != 4 || tq != tk || tq != tv {
        return Err(format!("q, k and v are {tq}, {tk} and {tv}, not one [B, H, S, D] type"));
    }
    let [b, _, s, _] = <[_; 4]>::try_from(tq.shape.dims().to_vec()).expect("rank 4");
    if !tm.dtype.is_int() || tm.shape.dims() != [b.clone(), s.clone()] {
        return Err(format!("the mask is {tm}, not an integer [{b}, {s}]"));
    }
    // Every intermediate has the next op of the chain as its only reader.
    let members: FxHashSet<NodeIndex> = chain.iter().copied().chain([context]).collect();
    for &m in &chain {
        let node = g.node(m);
        let readers = g.users(m);
        let outside = readers.iter().find(|r| !members.contains(r));
        let output = g.outputs.iter().find(|(_, v)| v.node == m);
        let update = g.updates.iter().any(|(_, v)| v.node == m);
        if let Some(r) = outside {
            return Err(format!("`{}` is also read by `{}`", node.name, g.node(*r).name));
        }
        if let Some((name, _)) = output {
            return Err(format!("`{}` is the graph output `{name}`", node.name));
        }
        if update {
            return Err(format!("`{}` updates a state", node.name));
        }
        if edge_count(g, m) != 1 {
            return Err(format!("`{}` is read more than once", node.name));
        }
    }
    let op = Op::FlashAttention { scale, alibi_ranks, dropout, stream };
    Ok(Match { context, chain, operands: [q, k, v, mask], op })
}

/// The number of operand slots that read `n`'s outputs.
fn edge_count(g: &Graph, n: NodeIndex) -> usize {
    g.users(n).iter().copied().map(|u| g.operands(u).iter().filter(|v| v.node == n).count()).sum()
}

/// `g` with each match's chain replaced by its fused node.
fn rebuild(g: &Graph, order: &[NodeIndex], matches: &[Match]) -> Result<Graph, zeroplan_ir::GraphError> {
    let gone: FxHashSet<NodeIndex> = matches.iter().flat_map(|m| m.chain.iter().copied()).collect();
    let fused: FxHashMap<NodeIndex, &Match> = matches.iter().map(|m| (m.context, m)).collect();
    let (mut out, mut map) = rebuilt(g, g.node_count());
    for &n in order {
        if gone.contains(&n) {
            continue;
        }
        let node = g.node(n);
        out.phase = node.phase;
        match fused.get(&n) {
            Some(m) => {
                let operands: Vec<Value> = m.operands.iter().map(|v| map[v]).collect();
                let made = out
                    .at_place(node.place, |out| out.add_node(node.name.clone(), m.op.clone(), &operands, Vec::new()))?;
                map.insert(Value { node: n, output: 0 }, Value { node: made, output: 0 });
            }
            None => copy_node(g, n, &mut out, &mut map)?,
        }
    }
    out.phase = g.phase;
    copy_outputs(g, &mut out, &map);
    for (target, v) in &g.updates {
        let t = map[&Value { node: *target, output: 0 }].node;
        out.set_update(t, map[v])?;
    }
    Ok(out)
}
