//! The `tiling` pass: ZeRO-Infinity's memory-centric tiling (Rajbhandari et
//! al., SC'21, §5.1.3).
//!
//! Under ZeRO-3 each GPU gathers a layer's whole weights before using them,
//! so the largest gathered operator bounds the memory a GPU needs however
//! many GPUs share the shards: at a hidden size of 160K one `[4h, h]`
//! feed-forward weight is 200 GiB in 16 bits. Tiling splits such an
//! operator into tiles computed one after another: `y = x @ Wᵀ` becomes
//! `y = concat(x @ W₀ᵀ, …, x @ W_{k-1}ᵀ)` along the last axis, each `W_i`
//! a block of `W`'s rows (output features) and a parameter of its own. The
//! `partition` pass then gathers, uses and frees each tile as its own
//! bucket, and reduce-scatters each tile's gradient on its own, so the
//! working set of the operator is a tile (and the next one, prefetched)
//! instead of the layer. Autodiff does the backward: the input gradient is
//! the sum over tiles, each tile's weight gradient its own.
//!
//! `tiles` is the number of tiles of the largest tileable weight; every
//! weight larger than that tile (`max tile = ⌈largest / tiles⌉` elements)
//! is cut into as many row blocks as make each at most the tile, and every
//! parameter of a tiled operator becomes a tile parameter, so none of them
//! stays in its layer's bucket. A weight merged by `rewrite` (the `concat`
//! of Q, K and V) is tiled per member, never materialised whole. Tile
//! parameters carry [`Init::Slice`]: they start bitwise where the untiled
//! parameter would, so a tiled step computes what the untiled one does.
//!
//! Tileable: `x @ Wᵀ` (`transpose_b`, no `transpose_a`) where `W` is a
//! rank-2 parameter, a row-wise `concat` of them, or a `tensor_copy` of one
//! (a replicated weight in a sequence-parallel region: each tile gets its
//! own), and every use of each such parameter is a tileable matmul. The tiles are ordinary `matmul`,
//! `concat` and (in the backward) `slice` nodes, which both backends run.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::Arc;
use zeroplan_ir::{Dim, Graph, GraphError, Init, NodeIndex, Op, Shape, TensorType, Value};

use crate::manager::{Pass, PassContext, PassError};
use crate::rebuild::{copy_node, copy_outputs, rebuilt};

/// The `tiling` pass.
pub struct Tiling {
    /// Tiles of the largest tileable weight; 1 leaves the graph as it is.
    pub tiles: u64,
}

/// Suffix of the `i`th tile parameter of a weight: `layer0.mlp.up.weight.tile2`.
pub const TILE_SUFFIX: &str = ".tile";

impl Pass for Tiling {
    fn name(&self) -> &'static str {
        "tiling"
    }

    fn run(&self, graph: Graph, cx: &mut PassContext) -> Result<Graph, PassError> {
        if self.tiles == 0 {
            let message = "a tile count is at least 1".into();
            return Err(PassError::Graph {
                pass: "tiling",
                error: GraphError { node: graph.name, op: "matmul", message },
            });
        }
        let plan = TilePlan::new(&graph, self.tiles);
        cx.stat("tiled operators", plan.operators.len());
        cx.stat("tile parameters", plan.pieces.values().map(Vec::len).sum::<usize>());
        cx.stat("max tile elements", plan.max_tile);
        if plan.operators.is_empty() {
            return Ok(graph);
        }
        plan.rewrite(&graph).map_err(|error| PassError::Graph { pass: "tiling", error })
    }
}

/// Which operators and parameters to tile, and how.
struct TilePlan {
    /// Elements a tile holds at most.
    max_tile: u64,
    /// Matmuls to tile → their weight's member parameters, in row order.
    operators: BTreeMap<NodeIndex, Vec<NodeIndex>>,
    /// Tiled parameter → its row blocks `(start, len)`.
    pieces: BTreeMap<NodeIndex, Vec<(u64, u64)>>,
}

/// A rank-2 parameter's `[rows, cols]`, if it is one of constant shape.
fn matrix(graph: &Graph, n: NodeIndex) -> Option<(u64, u64)> {
    let node = graph.node(n);
    if !matches!(node.op, Op::Param { .. }) {
        return None;
    }
    match node.outputs[0].shape.dims() {
        [rows, cols] => Some((rows.as_constant()?, cols.as_constant()?)),
        _ => None,
    }
}

/// The member parameters of matmul `n`'s weight, if `n` is `x @ Wᵀ` with
/// `W` a matrix parameter or a row-wise concat of them.
fn weight_members(graph: &Graph, n: NodeIndex) -> Option<Vec<NodeIndex>> {
    if !matches!(graph.node(n).op, Op::MatMul { transpose_a: false, transpose_b: true }) {
        return None;
    }
    let operands = graph.operands(n);
    let w = operands[1];
    if operands[0].node == w.node {
        return None;
    }
    let members = match graph.node(w.node).op {
        Op::Param { .. } => vec![w.node],
        // A replicated weight read in a sequence-parallel region: its
        // gradient is summed over the tensor ranks; each tile's will be.
        Op::TensorCopy { .. } => graph.operands(w.node).iter().map(|v| v.node).collect(),
        Op::Concat { axis: 0 } => graph.operands(w.node).iter().map(|v| v.node).collect(),
        _ => return None,
    };
    members.iter().all(|&m| matrix(graph, m).is_some()).then_some(members)
}

/// `rows` cut into `count` blocks as equal as can be, the longer first.
fn blocks(rows: u64, count: u64) -> Vec<(u64, u64)> {
    let (base, extra) = (rows / count, rows % count);
    let mut start = 0;
    (0..count)
        .map(|i| {
            let len = base + u64::from(i < extra);
            start += len;
            (start - len, len)
        })
        .collect()
}

/// Drops from `matmuls` those reading a parameter some other node reads
/// too (other than through a row-wise concat that only `matmuls` read),
/// until none is left to drop: a tiled parameter exists only as tiles.
fn keep_closed(graph: &Graph, matmuls: &mut BTreeMap<NodeIndex, Vec<NodeIndex>>) {
    loop {
        let only_read_by_matmuls = |p: NodeIndex| {
            graph.users(p).iter().all(|&u| match graph.node(u).op {
                Op::Concat { axis: 0 } | Op::TensorCopy { .. } => {
                    graph.users(u).iter().all(|m| matmuls.contains_key(m))
                }
                _ => matmuls.contains_key(&u),
            })
        };
        let dropped: Vec<NodeIndex> = matmuls
            .iter()
            .filter(|(_, members)| !members.iter().all(|&p| only_read_by_matmuls(p)))
            .map(|(&m, _)| m)
            .collect();
        if dropped.is_empty() {
            return;
        }
        for m in dropped {
            matmuls.remove(&m);
        }
    }
}

impl TilePlan {
    fn new(graph: &Graph, tiles: u64) -> TilePlan {
        let order = graph.topo_order();
        let mut candidates: BTreeMap<NodeIndex, Vec<NodeIndex>> =
            order.iter().filter_map(|&n| weight_members(graph, n).map(|m| (n, m))).collect();
        keep_closed(graph, &mut candidates);
        let elements = |members: &[NodeIndex]| -> u64 {
            members.iter().map(|&p| matrix(graph, p).map_or(0, |(r, c)| r * c)).sum()
        };
        let largest = candidates.values().map(|m| elements(m)).max().unwrap_or(0);
        let max_tile = largest.div_ceil(tiles.max(1));
        let mut operators: BTreeMap<NodeIndex, Vec<NodeIndex>> =
            candidates.into_iter().filter(|(_, m)| tiles > 1 && elements(m) > max_tile).collect();
        keep_closed(graph, &mut operators);
        let mut pieces = BTreeMap::new();
        for &p in operators.values().flatten() {
            let (rows, cols) = matrix(graph, p).expect("members are matrices");
            let count = (rows * cols).div_ceil(max_tile).clamp(1, rows);
            pieces.insert(p, blocks(rows, count));
        }
        TilePlan { max_tile, operators, pieces }
    }

    /// `graph` with the tiled operators' parameters cut into tiles and each
    /// tiled matmul computed tile by tile.
    fn rewrite(&self, graph: &Graph) -> Result<Graph, GraphError> {
        let order = graph.topo_order();
        let (mut out, mut map) = rebuilt(graph, graph.node_count());
        out.phase = graph.phase;
        let mut tiles: FxHashMap<NodeIndex, Vec<Value>> = FxHashMap::default();
        for n in order {
            let node = graph.node(n);
            out.phase = node.phase;
            if let Some(blocks) = self.pieces.get(&n) {
                tiles.insert(n, self.tile_params(graph, n, blocks, &mut out)?);
            } else if let Some(members) = self.operators.get(&n) {
                let (x, w) = (map[&graph.operands(n)[0]], graph.operands(n)[1]);
                let rank = node.outputs[0].shape.rank();
                let copy = match &graph.node(w.node).op {
                    op @ Op::TensorCopy { .. } => Some(op.clone()),
                    _ => None,
                };
                let mut parts = Vec::new();
                for &w in members.iter().flat_map(|p| &tiles[p]) {
                    let w = match &copy {
                        Some(op) => {
                            let name = format!("{}.sequence_parallel", out.node(w.node).name);
                            match out.node_by_name(&name) {
                                Some(node) => Value { node, output: 0 },
                                None => out.at_place(node.place, |out| out.add(name, op.clone(), &[w]))?,
                            }
                        }
                        None => w,
                    };
                    let name = format!("{}{TILE_SUFFIX}{}", node.name, parts.len());
                    parts.push(out.at_place(node.place, |out| out.add(name, node.op.clone(), &[x, w]))?);
                }
                let y =
                    out.at_place(node.place, |out| out.add(node.name.clone(), Op::Concat { axis: rank - 1 }, &parts))?;
                map.insert(Value { node: n, output: 0 }, y);
            } else if matches!(node.op, Op::Concat { axis: 0 } | Op::TensorCopy { .. })
                && graph.operands(n).iter().all(|v| self.pieces.contains_key(&v.node))
            {
                // A merged (or sequence-parallel) weight read only by tiled
                // matmuls: never built; the tiles are.
            } else {
                copy_node(graph, n, &mut out, &mut map)?;
            }
        }
        copy_outputs(graph, &mut out, &map);
        for (target, v) in &graph.updates {
            out.set_update(map[&Value { node: *target, output: 0 }].node, map[v])?;
        }
        Ok(out)
    }

    /// Parameter `p`'s tiles: one parameter per row block, named
    /// `p.tileI`, initialised as that block of `p`.
    fn tile_params(
        &self,
        graph: &Graph,
        p: NodeIndex,
        blocks: &[(u64, u64)],
        out: &mut Graph,
    ) -> Result<Vec<Value>, GraphError> {
        let node = graph.node(p);
        let Op::Param { init } = &node.op else { unreachable!("tiles are cut from parameters") };
        let (rows, cols) = matrix(graph, p).expect("tiled parameters are matrices");
        let mut values = Vec::new();
        let whole: Arc<[u64]> = Arc::new([rows, cols]);
        let of_init = Arc::new(init.clone());
        for (i, &(start, len)) in blocks.iter().enumerate() {
            let init = Init::Slice { of: node.name.clone(), whole: whole.clone(), start, len, init: of_init.clone() };
            let ty = TensorType::new(Shape(vec![Dim::constant(len), Dim::constant(cols)]), node.outputs[0].dtype);
            let name = format!("{}{TILE_SUFFIX}{i}", node.name);
            values.push(out.at_place(node.place, |out| out.param(name, ty, init))?);
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::blocks;

    #[test]
    fn blocks_cover_the_rows_longer_first() {
        assert_eq!(blocks(10, 3), vec![(0, 4), (4, 3), (7, 3)]);
        assert_eq!(blocks(8, 4), vec![(0, 2), (2, 2), (4, 2), (6, 2)]);
        assert_eq!(blocks(5, 1), vec![(0, 5)]);
    }
}
