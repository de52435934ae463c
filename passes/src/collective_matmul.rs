//! Collective matmul: a sequence-parallel collective and the GEMM beside it
//! cut into chunks, so each chunk's collective runs on the communication
//! stream while the previous chunk's GEMM runs on the compute stream.
//!
//! With sequence parallelism a column-parallel GEMM reads the gather of
//! the ranks' slices (`sequence_all_gather`), and a row-parallel GEMM's
//! partial product is summed and sliced (`sequence_reduce_scatter`); each
//! GEMM waits for, or is waited for by, the whole collective, so both sit
//! on the critical path. Megatron-LM's `--tp-comm-overlap` (Transformer
//! Engine's userbuffers) pipelines them, as the collective matmul of Wang
//! et al. ("Overlap Communication with Dependent Computation via
//! Decomposition in Large Deep Learning Models", ASPLOS 2023) does:
//!
//! - **gather → GEMM** (Q/K/V and feed-forward up in the forward, the
//!   row-parallel input gradients in the backward): each rank's slice
//!   `[b, s/t, h]` is cut along the sequence into `k` chunks of `s/(t·k)`
//!   positions, each gathered (`[b, s/k, h]`: chunk `j` of every rank, in
//!   rank order) and multiplied on its own; the products are put back in
//!   sequence order by one concatenation of the `[b, t, 1, s/(t·k), n]`
//!   views along the chunk axis. A reader of the gather that is not such a
//!   GEMM (the weight gradient's reshape) reads the gathered chunks put
//!   back the same way.
//! - **GEMM → reduce-scatter** (the row-parallel output in the forward,
//!   the column-parallel input gradient in the backward): the product's
//!   `n` output columns are cut into `k` blocks (rows of a transposed
//!   weight, a view; columns otherwise, a copy), each multiplied and
//!   reduce-scattered on its own, and the slices concatenated.
//!
//! The sequence is the axis cut on the gather side, not the batch: the
//! planner binds one compiled step at every micro-batch it measures (1
//! among them), while the sequence length is fixed for the whole search.
//!
//! `k` is the cost model's ([`Chunks::Cost`]): for each site, the chunk
//! count among the divisors of the cut axis (down to one GEMM tile of
//! rows or columns) whose pipeline `c₁ + (k−1)·max(c, g) + g_k` plus the
//! copies it adds is the shortest, every chunk paying its collective's
//! NCCL latency and its GEMM's launch. The runtime issues every collective
//! on its communication stream in schedule order and this pass emits each
//! chunk's collective ahead of the GEMM it overlaps, so the overlap the
//! simulation ([`crate::cost::simulate`]) predicts is the one the runtime
//! runs; the memory plan keeps a sequence collective's operand live until
//! its result is first read ([`crate::memory`]), so no GEMM output is
//! placed over a chunk the communication stream still reads.

use rustc_hash::{FxHashMap, FxHashSet};
use std::cell::OnceCell;
use zeroplan_ir::shape::{Dim, Shape};
use zeroplan_ir::{Bindings, Graph, GraphError, Init, NodeIndex, Op, Value};

use crate::cost::time::{GEMM_TILE, Machine};
use crate::cost::work::{Engine, GemmShape, Stream, Work, work};
use crate::manager::{Pass, PassContext, PassError};
use crate::rebuild::{ValueMap, copy_node, rebuilt};

/// How many chunks each sequence-parallel collective is cut into.
#[derive(Clone, Debug, Default)]
pub enum Chunks {
    /// None: the collectives stay whole.
    #[default]
    Whole,
    /// `k` at every site whose cut axis `k` divides (tests).
    Fixed(u64),
    /// The count the cost model predicts fastest on this GPU, per site.
    Cost(Box<Machine>),
}

/// The `collective-matmul` pass.
pub struct CollectiveMatmul;

/// A gather whose GEMM readers are chunked.
struct Gather {
    chunks: u64,
    /// The GEMMs reading the gather as their left operand.
    gemms: Vec<NodeIndex>,
}

/// The gathered chunks of a gather, once emitted.
struct Gathered {
    parts: Vec<Value>,
    /// The tensor ranks `t`.
    ranks: u64,
    /// Every rank's chunk length, `s/(t·k)`.
    chunk: Dim,
}

impl Pass for CollectiveMatmul {
    fn name(&self) -> &'static str {
        "collective-matmul"
    }

    fn run(&self, graph: Graph, cx: &mut PassContext) -> Result<Graph, PassError> {
        let fail = |error| PassError::Graph { pass: "collective-matmul", error };
        let order = graph.topo_order();
        let chunks = cx.options.collective_chunks.clone();
        let bindings = cx.options.shape_hint.clone();
        // Found once: each is a walk of the whole step.
        let tp = graph.tensor_parallel();
        let at: FxHashMap<NodeIndex, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let mut gathers: FxHashMap<NodeIndex, Gather> = FxHashMap::default();
        // Reduce-scatters by the GEMM they sum.
        let mut scatters: FxHashMap<NodeIndex, (NodeIndex, u64)> = FxHashMap::default();
        for &n in &order {
            if let Some((gemms, axis, ranks)) = gather_site(&graph, n) {
                let most = axis.eval(&bindings).unwrap_or(0) * ranks / GEMM_TILE;
                // The work beside the whole gather, the same at every `k`.
                let before = OnceCell::new();
                let seconds = |m: &Machine, k| {
                    let m = Timing { machine: m, tensor_parallel: tp };
                    let before = *before.get_or_init(|| {
                        let whole = collective_chunk_seconds(&graph, m, n, 1, &bindings)?;
                        Some(slack(&graph, m, &order[at[&n]..], |x| gemms.contains(&x), whole, &bindings))
                    });
                    gather_seconds(&graph, m, n, &gemms, before?, k, &bindings)
                };
                let k = choose(&chunks, &bindings, &axis, most, seconds);
                if k > 1 && cx.may_apply() {
                    gathers.insert(n, Gather { chunks: k, gemms });
                }
            } else if let Some((mm, columns)) = scatter_site(&graph, n) {
                let most = columns.eval(&bindings).unwrap_or(0) / GEMM_TILE;
                let after = OnceCell::new();
                let seconds = |m: &Machine, k| {
                    let m = Timing { machine: m, tensor_parallel: tp };
                    let after = *after.get_or_init(|| {
                        let whole = collective_chunk_seconds(&graph, m, n, 1, &bindings)?;
                        let readers = graph.users(n);
                        Some(slack(&graph, m, &order[at[&mm]..], |x| readers.contains(&x), whole, &bindings))
                    });
                    scatter_seconds(&graph, m, mm, n, after?, k, &bindings)
                };
                let k = choose(&chunks, &bindings, &columns, most, seconds);
                if k > 1 && cx.may_apply() {
                    scatters.insert(n, (mm, k));
                }
            }
        }
        cx.stat("gathers chunked", gathers.len());
        cx.stat("reduce-scatters chunked", scatters.len());
        if gathers.is_empty() && scatters.is_empty() {
            return Ok(graph);
        }
        let summed: FxHashMap<NodeIndex, NodeIndex> = scatters.iter().map(|(&r, &(mm, _))| (mm, r)).collect();
        let gemm_of: FxHashMap<NodeIndex, NodeIndex> =
            gathers.iter().flat_map(|(&g, site)| site.gemms.iter().map(move |&m| (m, g))).collect();
        let order = hoisted(&graph, &order, &gathers);
        let (mut out, mut map) = rebuilt(&graph, graph.node_count());
        let mut gathered: FxHashMap<NodeIndex, Gathered> = FxHashMap::default();
        for &n in &order {
            let node = graph.node(n);
            out.phase = node.phase;
            if let Some(site) = gathers.get(&n) {
                let parts = out.at_place(node.place, |out| gather_chunks(&graph, n, site.chunks, &map, out));
                gathered.insert(n, parts.map_err(fail)?);
            } else if let Some(&g) = gemm_of.get(&n) {
                if map.contains_key(&out_of(n)) {
                    // Emitted with the gather's first GEMM.
                    continue;
                }
                // Chunk by chunk across the gather's GEMMs where their weights
                // are at hand, so each gathered chunk is multiplied whole
                // while the next is gathered; else this GEMM's chunks alone.
                // A tiled operator's GEMMs go alone too: across them, every
                // tile's gathered weight would be live at once, which is
                // what tiling is there to prevent.
                let left: Vec<NodeIndex> =
                    gathers[&g].gemms.iter().copied().filter(|&m| !map.contains_key(&out_of(m))).collect();
                let all = left.iter().all(|&m| map.contains_key(&graph.operands(m)[1]) && !tiled(&graph, m));
                let together = if all { left } else { vec![n] };
                let parts = &gathered[&g];
                let ys = out.at_place(node.place, |out| gemm_chunks(&graph, &together, parts, &map, out));
                for (m, y) in together.into_iter().zip(ys.map_err(fail)?) {
                    map.insert(out_of(m), y);
                }
            } else if let Some(&r) = summed.get(&n) {
                // The chain goes where the GEMM was, so what the schedule ran
                // after the GEMM runs beside the last chunks' reduce-scatters.
                let k = scatters[&r].1;
                let y = out.at_place(node.place, |out| scatter_chunks(&graph, n, r, k, &map, out)).map_err(fail)?;
                map.insert(out_of(r), y);
            } else if scatters.contains_key(&n) {
                // Emitted with its GEMM.
            } else {
                // A reader of a chunked gather other than its GEMMs reads the whole.
                for v in graph.operands(n).iter().copied() {
                    if let (None, Some(parts)) = (map.get(&v), gathered.get(&v.node)) {
                        let whole = graph.value_type(v).shape.clone();
                        let name = graph.node(v.node).name.clone();
                        let assembled =
                            out.at_place(graph.node(v.node).place, |out| assemble(&name, parts, &whole, out));
                        map.insert(v, assembled.map_err(fail)?);
                    }
                }
                copy_node(&graph, n, &mut out, &mut map).map_err(fail)?;
            }
        }
        for (name, v) in &graph.outputs {
            out.set_output(name.clone(), map[v]);
        }
        for (target, v) in &graph.updates {
            let target = map[&Value { node: *target, output: 0 }].node;
            out.set_update(target, map[v]).map_err(fail)?;
        }
        out.phase = zeroplan_ir::Phase::Forward;
        Ok(out)
    }
}

/// `order` with the right operands of each chunked gather's GEMMs (their
/// weights, and what computes them) moved before the first of the GEMMs,
/// so that all of them can multiply each gathered chunk in turn. The
/// result is a schedule still: a node is placed after its operands.
fn hoisted(graph: &Graph, order: &[NodeIndex], gathers: &FxHashMap<NodeIndex, Gather>) -> Vec<NodeIndex> {
    let position: FxHashMap<NodeIndex, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let first: FxHashMap<NodeIndex, &Gather> =
        gathers.values().filter_map(|site| site.gemms.iter().min_by_key(|m| position[m]).map(|&m| (m, site))).collect();
    let mut placed = FxHashSet::default();
    let mut out = Vec::with_capacity(order.len());
    for &n in order {
        if let Some(site) = first.get(&n) {
            for &m in &site.gemms {
                place(graph, graph.operands(m)[1].node, &mut placed, &mut out);
            }
        }
        place(graph, n, &mut placed, &mut out);
    }
    out
}

/// Whether GEMM `mm`'s weight is a tile the `tiling` pass cut (an
/// [`Init::Slice`] parameter, read through casts, views and tensor copies).
fn tiled(graph: &Graph, mm: NodeIndex) -> bool {
    let mut n = graph.operands(mm)[1].node;
    loop {
        match &graph.node(n).op {
            Op::Param { init } => return matches!(init, Init::Slice { .. }),
            op if op.is_view() || matches!(op, Op::Cast { .. } | Op::TensorCopy { .. }) => {
                n = graph.operands(n)[0].node;
            }
            _ => return false,
        }
    }
}

/// Places `n` after its operands not yet placed.
fn place(graph: &Graph, n: NodeIndex, placed: &mut FxHashSet<NodeIndex>, out: &mut Vec<NodeIndex>) {
    if placed.contains(&n) {
        return;
    }
    for v in graph.operands(n).iter().copied() {
        place(graph, v.node, placed, out);
    }
    placed.insert(n);
    out.push(n);
}

/// Whether `mm` is `x @ W` (or `x @ Wᵀ`) with `x` a `[b, s, …]` activation
/// and `W` a matrix: a GEMM whose rows can be cut.
fn row_gemm(graph: &Graph, mm: NodeIndex) -> bool {
    let Op::MatMul { transpose_a: false, .. } = graph.node(mm).op else { return false };
    let operands = graph.operands(mm);
    graph.value_type(operands[0]).shape.rank() == 3 && graph.value_type(operands[1]).shape.rank() == 2
}

/// A sequence gather read by at least one GEMM as its left operand (and
/// not as its right): those GEMMs, the slice's sequence axis and the ranks.
fn gather_site(graph: &Graph, n: NodeIndex) -> Option<(Vec<NodeIndex>, Dim, u64)> {
    let Op::SequenceAllGather { ranks, .. } = graph.node(n).op else { return None };
    let gathered = Value { node: n, output: 0 };
    if graph.outputs.iter().any(|(_, v)| *v == gathered) {
        return None;
    }
    let x = graph.value_type(graph.operands(n)[0]);
    if x.shape.rank() != 3 {
        return None;
    }
    let gemms: Vec<NodeIndex> = graph
        .users(n)
        .iter()
        .copied()
        .filter(|&m| row_gemm(graph, m) && graph.operands(m)[0] == gathered && graph.operands(m)[1] != gathered)
        .collect();
    (!gemms.is_empty()).then(|| (gemms, x.shape.dims()[1].clone(), ranks))
}

/// A sequence reduce-scatter of a GEMM it alone reads: the GEMM and its
/// output columns.
fn scatter_site(graph: &Graph, n: NodeIndex) -> Option<(NodeIndex, Dim)> {
    let Op::SequenceReduceScatter { .. } = graph.node(n).op else { return None };
    let v = graph.operands(n)[0];
    let mm = v.node;
    if !row_gemm(graph, mm) || graph.users(mm) != [n] || graph.outputs.iter().any(|(_, o)| o.node == mm) {
        return None;
    }
    let columns = graph.value_type(v).shape.dims().last()?.clone();
    columns.as_constant().map(|_| (mm, columns))
}

/// The chunk count for a site whose cut axis is `axis`: `Fixed`'s where it
/// divides the axis, under `Cost` the fastest by `seconds` (the site's
/// predicted time at `k` chunks) of the counts that divide the axis and
/// leave each chunk's GEMM at least one tile (`most`: the GEMM's cut rows
/// or columns over [`GEMM_TILE`]; thinner chunks waste tiles and add
/// launches), 1 otherwise.
fn choose(
    chunks: &Chunks,
    bindings: &Bindings,
    axis: &Dim,
    most: u64,
    seconds: impl Fn(&Machine, u64) -> Option<f64>,
) -> u64 {
    let Some(length) = axis.eval(bindings) else { return 1 };
    let divides = |k: u64| k > 0 && length.is_multiple_of(k) && axis.divided_by(k).is_some();
    match chunks {
        Chunks::Whole => 1,
        Chunks::Fixed(k) if *k > 1 && divides(*k) => *k,
        Chunks::Fixed(_) => 1,
        Chunks::Cost(machine) => {
            let timed = (1..=most.max(1)).filter(|&k| divides(k)).filter_map(|k| Some((k, seconds(machine, k)?)));
            timed.min_by(|a, b| a.1.total_cmp(&b.1)).map_or(1, |(k, _)| k)
        }
    }
}

/// The GPU the chunks are timed on, and the step's tensor-parallel degree
/// (which collectives' groups span), found once per pass.
#[derive(Clone, Copy)]
struct Timing<'m> {
    machine: &'m Machine,
    tensor_parallel: u64,
}

impl Timing<'_> {
    fn seconds(&self, op: &Op, work: &Work) -> f64 {
        self.machine.seconds(op, work, self.tensor_parallel)
    }
}

/// Seconds of one GEMM of `mm`'s with its rows (`rows`) or its output
/// columns cut `k` ways.
fn gemm_chunk_seconds(graph: &Graph, machine: Timing, mm: NodeIndex, k: u64, rows: bool, b: &Bindings) -> Option<f64> {
    let whole = work(graph, mm, b)?;
    let g = whole.gemm?;
    let operands = graph.operands(mm);
    let (a, w, out) = (bytes(graph, operands[0], b)?, bytes(graph, operands[1], b)?, bytes(graph, out_of(mm), b)?);
    let kf = k as f64;
    let (shape, bytes) = if rows {
        (GemmShape { m: g.m / k, ..g }, a / kf + w + out / kf)
    } else {
        (GemmShape { n: g.n / k, ..g }, a + w / kf + out / kf)
    };
    let chunk = Work { engine: Engine::Gemm, flops: whole.flops / kf, bytes, gemm: Some(shape) };
    Some(machine.seconds(&graph.node(mm).op, &chunk))
}

/// Seconds of one of `k` chunks of collective `c`.
fn collective_chunk_seconds(graph: &Graph, machine: Timing, c: NodeIndex, k: u64, b: &Bindings) -> Option<f64> {
    let whole = work(graph, c, b)?;
    let chunk = Work { bytes: whole.bytes / k as f64, ..whole };
    Some(machine.seconds(&graph.node(c).op, &chunk))
}

/// Seconds of a copy kernel (split, slice, concatenation) of `bytes`: read
/// and written once.
fn copy_seconds(machine: Timing, bytes: f64) -> f64 {
    let copy = Work { engine: Engine::Kernel, flops: 0.0, bytes: 2.0 * bytes, gemm: None };
    machine.machine.seconds(&Op::Concat { axis: 0 }, &copy, 1)
}

fn bytes(graph: &Graph, v: Value, b: &Bindings) -> Option<f64> {
    graph.value_type(v).size_bytes(b).map(|x| x as f64)
}

fn out_of(n: NodeIndex) -> Value {
    Value { node: n, output: 0 }
}

/// Compute-stream seconds of the nodes after the first of `order` (the
/// schedule from `from` on) that do not read it, up to the first node
/// `stop` accepts: the work that runs beside `from`'s collective anyway.
/// Counted up to `enough` (beyond it the collective is hidden whole).
fn slack(
    graph: &Graph,
    machine: Timing,
    order: &[NodeIndex],
    stop: impl Fn(NodeIndex) -> bool,
    enough: f64,
    b: &Bindings,
) -> f64 {
    let from = order[0];
    let readers = graph.users(from);
    let mut seconds = 0.0;
    for &n in &order[1..] {
        if stop(n) || seconds >= enough {
            break;
        }
        if readers.contains(&n) {
            continue;
        }
        if let Some(w) = work(graph, n, b).filter(|w| w.engine.stream() == Some(Stream::Compute)) {
            seconds += machine.seconds(&graph.node(n).op, &w);
        }
    }
    seconds
}

/// Predicted seconds from gather `g`'s issue to its GEMMs' products, in
/// order, at `k` chunks: the input's split; the chunks gathered one after
/// another; the compute stream running `before` seconds of other work,
/// then each chunk's GEMMs once it is gathered; the products (and the
/// gather, where another node reads it whole) put back in order.
fn gather_seconds(
    graph: &Graph,
    machine: Timing,
    g: NodeIndex,
    gemms: &[NodeIndex],
    before: f64,
    k: u64,
    b: &Bindings,
) -> Option<f64> {
    let collective = collective_chunk_seconds(graph, machine, g, k, b)?;
    let mut products = 0.0;
    let mut assembled = 0.0;
    for &mm in gemms {
        products += gemm_chunk_seconds(graph, machine, mm, k, true, b)?;
        assembled += copy_seconds(machine, bytes(graph, out_of(mm), b)?);
    }
    let split = if k == 1 { 0.0 } else { copy_seconds(machine, bytes(graph, graph.operands(g)[0], b)?) };
    if k == 1 {
        assembled = 0.0;
    } else if graph.users(g).len() > gemms.len() {
        assembled += copy_seconds(machine, bytes(graph, out_of(g), b)?);
    }
    let mut compute = split + before;
    for j in 1..=k {
        compute = compute.max(split + j as f64 * collective) + products;
    }
    Some(compute + assembled)
}

/// Predicted seconds from GEMM `mm`'s issue to the first reader of its
/// reduce-scatter `r`, at `k` chunks: the weight's column blocks (a copy
/// unless the weight is transposed); each block's GEMM, its reduce-scatter
/// issued once it is done; `after` seconds of other compute (what the
/// schedule runs after the GEMM that does not read the reduce-scatter);
/// the slices' concatenation once the last is reduced.
fn scatter_seconds(
    graph: &Graph,
    machine: Timing,
    mm: NodeIndex,
    r: NodeIndex,
    after: f64,
    k: u64,
    b: &Bindings,
) -> Option<f64> {
    let product = gemm_chunk_seconds(graph, machine, mm, k, false, b)?;
    let collective = collective_chunk_seconds(graph, machine, r, k, b)?;
    let Op::MatMul { transpose_b, .. } = graph.node(mm).op else { return None };
    let (blocks, joined) = if k == 1 {
        (0.0, 0.0)
    } else {
        let blocks = if transpose_b { 0.0 } else { copy_seconds(machine, bytes(graph, graph.operands(mm)[1], b)?) };
        (blocks, copy_seconds(machine, bytes(graph, out_of(r), b)?))
    };
    let (mut compute, mut comm) = (blocks, 0.0f64);
    for _ in 0..k {
        compute += product;
        comm = comm.max(compute) + collective;
    }
    Some((compute + after).max(comm) + joined)
}

/// Emits gather `g`'s input cut into `k` chunks along the sequence, and
/// each chunk's gather.
fn gather_chunks(graph: &Graph, g: NodeIndex, k: u64, map: &ValueMap, out: &mut Graph) -> Result<Gathered, GraphError> {
    let name = &graph.node(g).name;
    let x = graph.operands(g)[0];
    let dims = graph.value_type(x).shape.dims().to_vec();
    let chunk = dims[1].divided_by(k).expect("the site's chunk count divides its sequence");
    let cut = Shape(vec![dims[0].clone(), Dim::constant(k), chunk.clone(), dims[2].clone()]);
    let cut = out.add(named(name, "chunks"), Op::Reshape { shape: cut }, &[map[&x]])?;
    let pieces = out.add_multi(named(name, "split"), Op::Split { axis: 1, sizes: vec![1; k as usize] }, &[cut])?;
    let piece = Shape(vec![dims[0].clone(), chunk.clone(), dims[2].clone()]);
    let mut parts = Vec::with_capacity(k as usize);
    for (j, p) in pieces.into_iter().enumerate() {
        let p = out.add(named(name, &format!("chunk{j}.in")), Op::Reshape { shape: piece.clone() }, &[p])?;
        parts.push(out.add(chunk_name(name, j), graph.node(g).op.clone(), &[p])?);
    }
    let Op::SequenceAllGather { ranks, .. } = graph.node(g).op else { unreachable!("a gather site gathers") };
    Ok(Gathered { parts, ranks, chunk })
}

/// Emits GEMMs `gemms` on each gathered chunk, chunk by chunk, and each
/// GEMM's products put back in sequence order.
fn gemm_chunks(
    graph: &Graph,
    gemms: &[NodeIndex],
    gathered: &Gathered,
    map: &ValueMap,
    out: &mut Graph,
) -> Result<Vec<Value>, GraphError> {
    let mut products: Vec<Vec<Value>> = vec![Vec::with_capacity(gathered.parts.len()); gemms.len()];
    for (j, &part) in gathered.parts.iter().enumerate() {
        for (&mm, chunks) in gemms.iter().zip(&mut products) {
            let node = graph.node(mm);
            let w = map[&graph.operands(mm)[1]];
            chunks.push(out.add(chunk_name(&node.name, j), node.op.clone(), &[part, w])?);
        }
    }
    gemms
        .iter()
        .zip(products)
        .map(|(&mm, parts)| {
            let node = graph.node(mm);
            let chunks = Gathered { parts, ranks: gathered.ranks, chunk: gathered.chunk.clone() };
            assemble(&node.name, &chunks, &node.outputs[0].shape, out)
        })
        .collect()
}

/// `[b, t·c, n]` chunks (chunk `j` of every rank's `c` positions, in rank
/// order) put back into the `[b, s, n]` sequence: each viewed as
/// `[b, t, 1, c, n]`, concatenated along the chunk axis, viewed whole
/// under the name `name` of the value it stands for.
fn assemble(name: &str, chunks: &Gathered, whole: &Shape, out: &mut Graph) -> Result<Value, GraphError> {
    let dims = whole.dims();
    let last = dims[dims.len() - 1].clone();
    let view = Shape(vec![dims[0].clone(), Dim::constant(chunks.ranks), Dim::constant(1), chunks.chunk.clone(), last]);
    let mut views = Vec::with_capacity(chunks.parts.len());
    for (j, &p) in chunks.parts.iter().enumerate() {
        views.push(out.add(named(name, &format!("chunk{j}.view")), Op::Reshape { shape: view.clone() }, &[p])?);
    }
    let joined = out.add(named(name, "joined"), Op::Concat { axis: 2 }, &views)?;
    out.add(name, Op::Reshape { shape: whole.clone() }, &[joined])
}

/// Emits GEMM `mm` cut into `k` blocks of output columns, each
/// reduce-scattered as `r` is, and the slices concatenated.
fn scatter_chunks(
    graph: &Graph,
    mm: NodeIndex,
    r: NodeIndex,
    k: u64,
    map: &ValueMap,
    out: &mut Graph,
) -> Result<Value, GraphError> {
    let node = graph.node(mm);
    let Op::MatMul { transpose_b, .. } = node.op else { unreachable!("a scatter site sums a GEMM") };
    let operands = graph.operands(mm);
    let (a, w) = (map[&operands[0]], map[&operands[1]]);
    let columns = node.outputs[0].shape.dims().last().and_then(Dim::as_constant).expect("constant columns");
    let len = columns / k;
    // The output's columns are the rows of a transposed weight (views),
    // else its columns (one copy, split).
    let blocks = if transpose_b {
        (0..k)
            .map(|j| {
                out.add(
                    named(&node.name, &format!("chunk{j}.weight")),
                    Op::Slice { axis: 0, start: j * len, len },
                    &[w],
                )
            })
            .collect::<Result<Vec<Value>, GraphError>>()?
    } else {
        out.add_multi(named(&node.name, "weight_blocks"), Op::Split { axis: 1, sizes: vec![len; k as usize] }, &[w])?
    };
    let mut slices = Vec::with_capacity(k as usize);
    for (j, block) in blocks.into_iter().enumerate() {
        let product = out.add(chunk_name(&node.name, j), node.op.clone(), &[a, block])?;
        slices.push(out.add(chunk_name(&graph.node(r).name, j), graph.node(r).op.clone(), &[product])?);
    }
    out.add(graph.node(r).name.clone(), Op::Concat { axis: 2 }, &slices)
}

/// Chunk `j`'s name: `NAME.chunkJ`.
fn chunk_name(name: &str, j: usize) -> String {
    named(name, &format!("chunk{j}"))
}

/// `NAME.SUFFIX`, keeping a recomputed node's `.recompute` last: model
/// FLOPs leave out `*.recompute` nodes, the copies and GEMMs cut from them
/// included.
fn named(name: &str, suffix: &str) -> String {
    match name.strip_suffix(".recompute") {
        Some(stem) => format!("{stem}.{suffix}.recompute"),
        None => format!("{name}.{suffix}"),
    }
}
