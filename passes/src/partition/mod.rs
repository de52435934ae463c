//! The `partition` pass: ZeRO data parallelism over flat buffers.
//!
//! The training step the earlier passes built keeps one parameter, one
//! gradient and two moments per weight matrix. This pass gathers them into
//! [`buckets`] — one flat, padded buffer per layer and weight-decay group —
//! and rewrites the step for `ranks` data-parallel replicas at a ZeRO stage
//! (Rajbhandari et al., 2020):
//!
//! | stage | each rank keeps `1/ranks` of | whole parameters in the step | gradients |
//! |---|---|---|---|
//! | 0 | — | kept whole | all-reduce per bucket during backward |
//! | 1 | optimizer states, parameters | gathered once, by the forward | reduce-scatter after backward |
//! | 2 | optimizer states, gradients, parameters | gathered once, by the forward | reduce-scatter per bucket during backward |
//! | 3 | everything | gathered by each phase | reduce-scatter during backward |
//!
//! From stage 1 on, each rank keeps only its shard of the 16-bit parameters
//! between steps: AdamW updates the shard, and the forward all-gathers each
//! bucket just before it reads it, one layer ahead (prefetch), so that the
//! gathers run under the layers before (Megatron-LM's distributed optimizer
//! with `--overlap-param-gather`; DeepSpeed's stages 1–2 gather after the
//! update instead, where nothing hides them). Stages 1–2 keep the gathered
//! copy for the backward, which reads it until its last reader frees it;
//! stage 3 gathers again for the backward, and the forward's copy dies after
//! the forward. AdamW runs once per bucket over the flat shard.
//! Per rank and step that moves ≈ 2Ψ elements for stages 0–2 and ≈ 3Ψ for
//! stage 3.
//!
//! With ZeRO-Offload the fp32 masters and moments live on the host: the
//! gradient shard is copied over PCIe, AdamW runs on the host, and the new
//! 16-bit shard is copied back (or stays there, when parameters are
//! offloaded too, and crosses PCIe before each all-gather). A shard reduced
//! during the backward leaves the GPU as soon as it is reduced, its squared
//! norm taken on the GPU first (DeepSpeed does both in its gradient
//! partitioning hook): no GPU holds gradients past the bucket being
//! reduced, which is what lets ZeRO-Infinity's trillion-parameter models
//! fit. With several micro-batches the shards accumulate on the host.
//!
//! Gradient accumulation: stages 0–1 add each micro-batch's bucket into an
//! f32 accumulator and communicate once per step, as DDP's `no_sync` does;
//! stages 2–3 reduce-scatter every micro-batch and accumulate the shard.
//! `grad_scale` then averages over micro-batches × ranks, and the squared
//! global norm is the all-reduced sum of the shards' squares.
//!
//! With one rank no collective is emitted: the pass still makes the flat
//! buffers and the flat AdamW, which the reference interpreter runs — the
//! tests check that step against the per-parameter one.

mod buckets;
mod slots;

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;
use zeroplan_ir::plan::{DataParallel, Offload};
use zeroplan_ir::{DType, Dim, Graph, GraphError, Init, NodeIndex, Op, Phase, Place, Shape, TensorType, Value};

use crate::manager::{Pass, PassContext, PassError};
use crate::names::dotted;
use crate::optimizer::{norm_share, tensor_sum};
use crate::rebuild::{ValueMap, copy_node_as, copy_node_over, rebuilt};
use crate::recompute;
pub use buckets::SHARD_ALIGN;
use buckets::{Bucket, flat_init, flat_zeros};
use slots::Step;

/// The `partition` pass.
pub struct Partition {
    pub data_parallel: DataParallel,
}

impl Pass for Partition {
    fn name(&self) -> &'static str {
        "partition"
    }

    fn run(&self, graph: Graph, cx: &mut PassContext) -> Result<Graph, PassError> {
        let dp = self.data_parallel;
        let invalid = |message: String| PassError::Graph {
            pass: "partition",
            error: GraphError { node: graph.name.clone(), op: "adamw", message },
        };
        dp.check().map_err(invalid)?;
        let Some(step) = slots::read(&graph).map_err(invalid)? else { return Ok(graph) };
        let order = graph.topo_order();
        let buckets = buckets::buckets(&graph, &order, &step.slots, dp.ranks);
        cx.stat("buckets", buckets.len());
        cx.stat("padding elements", buckets.iter().map(Bucket::padding).sum::<u64>());
        let out = Builder::new(&graph, &step, &buckets, dp)
            .run(&order)
            .map_err(|error| PassError::Graph { pass: "partition", error })?;
        let collectives = out.nodes().filter(|n| n.op.is_collective()).count();
        cx.stat("collectives", collectives);
        Ok(out)
    }
}

/// Per bucket, what the rewritten step made so far.
#[derive(Default)]
struct Made {
    /// The 16-bit (or fp32) parameters kept between steps: whole, or this rank's shard.
    weights: Option<Value>,
    /// The whole bucket of parameters, per read (gathered from stage 1 on).
    gathered: FxHashMap<Read, Value>,
    /// Each member's view, per read.
    views: FxHashMap<(Read, usize), Value>,
    /// Raw gradients produced so far, by member.
    grads: Vec<Option<Value>>,
    /// The gradient the optimizer reads (set once the optimizer phase starts).
    applied: Option<Value>,
    /// The backward's flat gradient or its accumulator, until then.
    pending: Option<Value>,
    /// The shard's squared norm, when taken on the GPU before the shard
    /// was copied to the host.
    squared: Option<Value>,
}

/// When a bucket's parameters are read: in a phase, or, for a tile of a
/// large operator, by the backward's recomputed forward. A tile gathered
/// once for both its recomputed forward and its backward would stay from
/// the one to the other, and with it every other tile of the operator: the
/// tiled layer whole, which is what tiling is for not to hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Read {
    Phase(Phase),
    Recompute,
}

impl Read {
    fn name(self) -> &'static str {
        match self {
            Read::Phase(phase) => phase.name(),
            Read::Recompute => recompute::CLONE_SUFFIX,
        }
    }

    /// The layer read after `layer`: the next in the forward and its
    /// recomputation, the one before in the backward.
    fn next(self, layer: usize) -> Option<usize> {
        match self {
            Read::Phase(Phase::Forward) | Read::Recompute => layer.checked_add(1),
            Read::Phase(_) => layer.checked_sub(1),
        }
    }
}

struct Builder<'a> {
    graph: &'a Graph,
    step: &'a Step,
    buckets: &'a [Bucket],
    dp: DataParallel,
    out: Graph,
    map: ValueMap,
    made: Vec<Made>,
    /// Slot index → (bucket, member).
    member_of: FxHashMap<usize, (usize, usize)>,
    /// Param or working copy node → slot index.
    slot_of: FxHashMap<NodeIndex, usize>,
    /// Raw gradient → slot index.
    grad_of: FxHashMap<Value, Vec<usize>>,
    /// The dtype the forward computes in.
    compute: DType,
    micro_batches: u64,
    /// The tensor-parallel ranks the graph is one rank of (1: none).
    tensor_ranks: u64,
    /// A view of a parameter made again for another read: (view, read) → copy.
    rephased: FxHashMap<(NodeIndex, Read), Value>,
    /// The tile buckets the backward's recomputed forward reads.
    recomputed_tiles: FxHashSet<usize>,
    /// Layer → its buckets, ascending: whom a gather prefetches.
    by_layer: FxHashMap<usize, Vec<usize>>,
    /// The squared gradient norm summed so far, over the last `summed`
    /// buckets (the order `gradients_for_optimizer` sums in).
    norm: Option<Value>,
    summed: usize,
    /// AdamW's steering scalars on the device → their host copies, made
    /// once for every host optimizer.
    host_scalars: FxHashMap<Value, Value>,
}

impl<'a> Builder<'a> {
    fn new(graph: &'a Graph, step: &'a Step, buckets: &'a [Bucket], dp: DataParallel) -> Builder<'a> {
        let mut member_of = FxHashMap::default();
        for (b, bucket) in buckets.iter().enumerate() {
            for (m, &s) in bucket.slots.iter().enumerate() {
                member_of.insert(s, (b, m));
            }
        }
        let mut slot_of = FxHashMap::default();
        let mut grad_of: FxHashMap<Value, Vec<usize>> = FxHashMap::default();
        for (i, s) in step.slots.iter().enumerate() {
            slot_of.insert(s.param, i);
            slot_of.extend(s.working.map(|w| (w, i)));
            grad_of.entry(s.raw_grad).or_default().push(i);
        }
        let first = &step.slots[0];
        let compute = graph.node(first.working.unwrap_or(first.param)).outputs[0].dtype;
        let mut by_layer: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
        for (b, bucket) in buckets.iter().enumerate() {
            by_layer.entry(bucket.layer).or_default().push(b);
        }
        let micro_batches = match graph.node(step.grad_scale).op {
            Op::GradScale { micro_batches, .. } => micro_batches,
            _ => 1,
        };
        // Partitioning adds the shards, gathers and reduce-scatters: half
        // as many nodes again on a ZeRO-3 step, three quarters on a tiled one
        // (each tile gathered per read).
        let (out, map) = rebuilt(graph, graph.node_count() * 7 / 4);
        Builder {
            graph,
            step,
            buckets,
            dp,
            out,
            map,
            made: buckets.iter().map(|b| Made { grads: vec![None; b.slots.len()], ..Made::default() }).collect(),
            member_of,
            slot_of,
            grad_of,
            compute,
            micro_batches,
            tensor_ranks: graph.tensor_parallel(),
            rephased: FxHashMap::default(),
            recomputed_tiles: FxHashSet::default(),
            by_layer,
            norm: None,
            summed: 0,
            host_scalars: FxHashMap::default(),
        }
        .with_recomputed_tiles()
    }

    fn run(mut self, order: &[NodeIndex]) -> Result<Graph, GraphError> {
        self.out.phase = Phase::Forward;
        for b in 0..self.buckets.len() {
            self.weights(b)?;
        }
        for &n in order {
            if self.step.replaced.contains(&n) {
                continue;
            }
            let node = self.graph.node(n);
            self.out.phase = node.phase;
            if n == self.step.grad_scale {
                self.gradients_for_optimizer()?;
            }
            self.copy(n)?;
            for output in 0..node.outputs.len() as u32 {
                self.gradient_ready(Value { node: n, output })?;
            }
        }
        self.out.phase = Phase::Optimizer;
        for b in 0..self.buckets.len() {
            self.adamw(b)?;
        }
        for (name, v) in &self.graph.outputs {
            self.out.set_output(name.clone(), self.map[v]);
        }
        for (target, v) in &self.graph.updates {
            if !self.step.replaced.contains(target) {
                let target = self.map[&Value { node: *target, output: 0 }].node;
                self.out.set_update(target, self.map[v])?;
            }
        }
        self.out.phase = Phase::Forward;
        Ok(self.out)
    }

    /// Copies `n`, reading members' views where it read parameters, and
    /// averaging over every rank's micro-batches in `grad_scale`.
    fn copy(&mut self, n: NodeIndex) -> Result<(), GraphError> {
        let node = self.graph.node(n);
        let (phase, recompute) = (node.phase, recompute::is_clone(&node.name));
        let mut operands = Vec::new();
        for v in self.graph.operands(n).iter().copied() {
            operands.push(self.operand(v, phase, recompute)?);
        }
        match node.op {
            Op::GradScale { max_norm, micro_batches } => {
                let op = Op::GradScale { max_norm, micro_batches: micro_batches * self.dp.ranks };
                copy_node_as(self.graph, n, op, &operands, &mut self.out, &mut self.map)
            }
            _ => copy_node_over(self.graph, n, &operands, &mut self.out, &mut self.map),
        }
    }

    /// Operand `v` as a node of `phase` (a recomputed clone, if
    /// `recompute`) reads it: a parameter's view for that read. A view of a
    /// parameter made in another phase (Megatron's `f` over a replicated
    /// weight in a sequence-parallel region, which the backward's matmul
    /// reads too) is made again over this read's view: reading the
    /// forward's would keep the forward's gathered copy alive until the
    /// backward — for a tiled operator, every tile at once.
    fn operand(&mut self, v: Value, phase: Phase, recompute: bool) -> Result<Value, GraphError> {
        if let Some(&s) = self.slot_of.get(&v.node) {
            let (b, m) = self.member_of[&s];
            return self.view(b, m, self.read(b, phase, recompute));
        }
        let node = self.graph.node(v.node);
        let elsewhere = node.phase != phase && !self.one_copy();
        let Some(s) = elsewhere.then(|| self.parameter_behind(v.node)).flatten() else {
            return Ok(self.map[&v]);
        };
        let read = self.read(self.member_of[&s].0, phase, recompute);
        if let Some(&made) = self.rephased.get(&(v.node, read)) {
            return Ok(made);
        }
        let inner = self.operand(self.graph.operands(v.node)[0], phase, recompute)?;
        let made = self.out.add(dotted(&[&node.name, read.name()]), node.op.clone(), &[inner])?;
        self.rephased.insert((v.node, read), made);
        Ok(made)
    }

    /// How a node of `phase` (a recomputed clone, if `recompute`) reads
    /// bucket `b`: only a tile is gathered apart for the recomputed forward.
    fn read(&self, b: usize, phase: Phase, recompute: bool) -> Read {
        if recompute && self.buckets[b].tile { Read::Recompute } else { Read::Phase(phase) }
    }

    /// The slot of the parameter `n` is a chain of views of, if it is one.
    fn parameter_behind(&self, n: NodeIndex) -> Option<usize> {
        if !self.graph.node(n).op.is_view() {
            return None;
        }
        self.parameter_of(self.graph.operands(n).first()?.node)
    }

    /// The slot of the parameter `n` is, or is a chain of views of.
    fn parameter_of(&self, n: NodeIndex) -> Option<usize> {
        self.slot_of.get(&n).copied().or_else(|| self.parameter_behind(n))
    }

    /// Notes the tile buckets a recomputed clone reads (directly or through
    /// views), which the recomputed forward prefetches one after another.
    fn with_recomputed_tiles(mut self) -> Self {
        for n in self.graph.node_indices() {
            if !recompute::is_clone(&self.graph.node(n).name) {
                continue;
            }
            for v in self.graph.operands(n).iter().copied() {
                let bucket = self.parameter_of(v.node).map(|s| self.member_of[&s].0);
                if let Some(b) = bucket.filter(|&b| self.buckets[b].tile) {
                    self.recomputed_tiles.insert(b);
                }
            }
        }
        self
    }

    /// Whether the parameters are whole on the device between steps (stage
    /// 0, or one rank without parameter offload): nothing to gather.
    fn whole_on_device(&self) -> bool {
        self.dp.parameter_shards() == 1 && self.weights_place() == Place::Device
    }

    /// Whether every phase reads the same copy of the parameters: whole on
    /// the device, or gathered once for the step (stages 1–2).
    fn one_copy(&self) -> bool {
        self.whole_on_device() || self.dp.gathers_once()
    }

    fn add_at(
        &mut self,
        place: Place,
        name: impl Into<Arc<str>>,
        op: Op,
        operands: &[Value],
    ) -> Result<Value, GraphError> {
        self.out.at_place(place, |out| out.add(name, op, operands))
    }

    fn source_at(
        &mut self,
        place: Place,
        name: impl Into<Arc<str>>,
        op: Op,
        ty: TensorType,
    ) -> Result<Value, GraphError> {
        self.out.at_place(place, |out| out.source(name, op, ty))
    }

    fn flat(len: u64, dtype: DType) -> TensorType {
        TensorType::new(Shape(vec![Dim::constant(len)]), dtype)
    }

    fn optimizer_place(&self) -> Place {
        if self.dp.offload == Offload::None { Place::Device } else { Place::Host }
    }

    /// Whether each bucket's gradient leaves the GPU during the backward:
    /// with the optimizer offloaded, wherever the backward finishes its
    /// reduction (one rank, stage 0 without accumulation, stages 2–3).
    fn gradients_leave_early(&self) -> bool {
        let reduced_late = self.dp.zero_stage == 1 || (self.dp.zero_stage == 0 && self.micro_batches > 1);
        self.optimizer_place() == Place::Host && (self.dp.ranks == 1 || !reduced_late)
    }

    fn weights_place(&self) -> Place {
        if self.dp.offload == Offload::OptimizerAndParams { Place::Host } else { Place::Device }
    }

    /// The parameters kept between steps: a flat param in the compute
    /// dtype, whole or (from stage 1 on) this rank's shard.
    fn weights(&mut self, b: usize) -> Result<Value, GraphError> {
        if let Some(w) = self.made[b].weights {
            return Ok(w);
        }
        let bucket = &self.buckets[b];
        let shards = self.dp.parameter_shards();
        let ty = Self::flat(bucket.len / shards, self.compute);
        let name = dotted(&[&bucket.name, "params"]);
        let w = self.source_at(self.weights_place(), name, Op::Param { init: flat_init(bucket, shards) }, ty)?;
        self.made[b].weights = Some(w);
        Ok(w)
    }

    /// The whole bucket for `read`: the parameters themselves, or from
    /// stage 1 on an all-gather of the shards, made together with the gathers
    /// of the layer that runs next (prefetch, one layer ahead; a tile of a
    /// large operator is a layer of its own, prefetched by the tile before).
    fn gathered(&mut self, b: usize, read: Read) -> Result<Value, GraphError> {
        if let Some(&g) = self.made[b].gathered.get(&read) {
            return Ok(g);
        }
        let w = self.weights(b)?;
        if self.whole_on_device() {
            self.made[b].gathered.insert(read, w);
            return Ok(w);
        }
        let g = self.gather(b, read)?;
        let next = read.next(self.buckets[b].layer).and_then(|l| self.by_layer.get(&l)).cloned().unwrap_or_default();
        for n in next {
            // A tile is prefetched only by the tile before it: a layer's
            // bucket is read at both ends of its backward, and a tile
            // gathered that early would stay beside the next ones. The
            // recomputed forward reads tiles alone, and only those it
            // recomputes; the backward does not reach into a layer whose
            // tiles are recomputed, which first runs its recomputed forward.
            let recomputed = self.recomputed_tiles.contains(&n);
            let prefetch = match read {
                Read::Recompute => recomputed,
                Read::Phase(phase) => {
                    (!self.buckets[n].tile || self.buckets[b].tile) && !(recomputed && phase == Phase::Backward)
                }
            };
            if prefetch && !self.made[n].gathered.contains_key(&read) {
                self.gather(n, read)?;
            }
        }
        Ok(g)
    }

    fn gather(&mut self, b: usize, read: Read) -> Result<Value, GraphError> {
        let w = self.weights(b)?;
        let name = dotted(&[&self.buckets[b].name, "params", read.name()]);
        let mut shard = w;
        if self.weights_place() == Place::Host {
            shard = self.add_at(Place::Device, dotted(&[&name, "h2d"]), Op::Copy, &[w])?;
        }
        // One rank holds every shard: offloaded parameters only cross PCIe.
        let g = if self.dp.parameter_shards() == 1 {
            shard
        } else {
            self.out.add(dotted(&[&name, "gathered"]), Op::AllGather { ranks: self.dp.ranks }, &[shard])?
        };
        self.made[b].gathered.insert(read, g);
        Ok(g)
    }

    /// Member `m` of bucket `b` in its parameter's shape, for `read`: a
    /// slice and a reshape, both views of the flat buffer; a member that
    /// is the whole buffer (a tile of a large operator, its own bucket) is
    /// only reshaped. A tiled 100T step reads each of its 62k tiles three
    /// times: the slice would be 8% of its nodes.
    fn view(&mut self, b: usize, m: usize, read: Read) -> Result<Value, GraphError> {
        // One copy for the step: one view serves all reads.
        let read = if self.one_copy() { Read::Phase(Phase::Forward) } else { read };
        if let Some(&v) = self.made[b].views.get(&(read, m)) {
            return Ok(v);
        }
        let flat = self.gathered(b, read)?;
        let member = &self.buckets[b].members[m];
        // The forward's view is named after the member alone.
        let read_name = if read == Read::Phase(Phase::Forward) { None } else { Some(read.name()) };
        let named = |last: &str| match read_name {
            None => dotted(&[&member.name, last]),
            Some(read) => dotted(&[&member.name, read, last]),
        };
        let (start, len) = (member.offset, member.len());
        let shape = Shape(member.shape.iter().map(|&d| Dim::constant(d)).collect());
        let (flat_name, view_name) = (named("flat"), named("view"));
        let member = if start == 0 && len == self.buckets[b].len {
            flat
        } else {
            self.out.add(flat_name, Op::Slice { axis: 0, start, len }, &[flat])?
        };
        let view = self.out.add(view_name, Op::Reshape { shape }, &[member])?;
        self.made[b].views.insert((read, m), view);
        Ok(view)
    }

    /// Records a raw gradient; when its bucket is complete, flattens it and
    /// (stages 0, 2, 3) starts its reduction while the backward goes on.
    fn gradient_ready(&mut self, old: Value) -> Result<(), GraphError> {
        let Some(slots) = self.grad_of.get(&old).cloned() else { return Ok(()) };
        let new = self.map[&old];
        for s in slots {
            let (b, m) = self.member_of[&s];
            self.made[b].grads[m] = Some(new);
            if self.made[b].grads.iter().all(Option::is_some) {
                self.bucket_gradient(b)?;
            }
        }
        Ok(())
    }

    fn bucket_gradient(&mut self, b: usize) -> Result<(), GraphError> {
        let bucket = &self.buckets[b];
        let name = dotted(&[&bucket.name, "grad"]);
        let grads: Vec<Value> = self.made[b].grads.iter().map(|g| g.expect("complete")).collect();
        let flat = self.out.add(name.clone(), Op::Flatten { len: bucket.len }, &grads)?;
        let ranks = self.dp.ranks;
        // Stage 0 all-reduces now unless micro-batches accumulate first;
        // stages 2–3 reduce-scatter every micro-batch; stage 1 waits.
        let reduced = match self.dp.zero_stage {
            _ if ranks == 1 => flat,
            0 if self.micro_batches == 1 => {
                self.out.add(dotted(&[&name, "all_reduce"]), Op::AllReduce { ranks }, &[flat])?
            }
            0 | 1 => flat,
            _ => self.out.add(dotted(&[&name, "reduce_scatter"]), Op::ReduceScatter { ranks }, &[flat])?,
        };
        let mut reduced = reduced;
        let mut place = Place::Device;
        if self.gradients_leave_early() {
            if self.micro_batches == 1 {
                let sq = self.out.add(dotted(&[&name, "sq"]), Op::SquaredSum, &[reduced])?;
                self.made[b].squared = Some(sq);
                self.sum_ready_squares()?;
            }
            place = Place::Host;
            reduced = self.add_at(place, dotted(&[&name, "d2h"]), Op::Copy, &[reduced])?;
        }
        if self.micro_batches == 1 {
            self.made[b].pending = Some(reduced);
            return Ok(());
        }
        // Several micro-batches: sum into an f32 accumulator where the
        // shard now lies, reset after the step.
        let acc = self.out.at_place(place, |out| Self::accumulate(out, &name, reduced))?;
        self.made[b].pending = Some(acc);
        Ok(())
    }

    /// Adds `reduced` into a new f32 accumulator `{name}.acc`, zeroed in
    /// the optimizer phase; returns the accumulator.
    fn accumulate(out: &mut Graph, name: &str, reduced: Value) -> Result<Value, GraphError> {
        let ty = Self::flat(out.value_type(reduced).shape.numel().as_constant().unwrap_or(0), DType::F32);
        let acc = out.source(dotted(&[name, "acc"]), Op::State { init: Init::Zeros }, ty.clone())?;
        let f32 = match out.value_type(reduced).dtype {
            DType::F32 => reduced,
            _ => out.add(dotted(&[name, "f32"]), Op::Cast { to: DType::F32 }, &[reduced])?,
        };
        let sum = out.add(dotted(&[name, "acc.next"]), Op::Add, &[acc, f32])?;
        out.set_update(acc.node, sum)?;
        let phase = std::mem::replace(&mut out.phase, Phase::Optimizer);
        let zero = out.source(dotted(&[name, "acc.zero"]), Op::Fill { value: 0.0 }, ty)?;
        out.set_update(acc.node, zero)?;
        out.phase = phase;
        Ok(acc)
    }

    /// At the start of the optimizer phase: the reductions left for it
    /// (stage 1's reduce-scatter; with accumulation, stages 0–1's whole
    /// reduction), the squared global norm, and `grad_scale`'s operand.
    fn gradients_for_optimizer(&mut self) -> Result<(), GraphError> {
        let ranks = self.dp.ranks;
        // In the order the backward finishes the buckets (last layer
        // first): collectives run in issue order, so one issued for a
        // bucket whose gradients come last would hold up all the others.
        for b in (0..self.buckets.len()).rev() {
            let name = dotted(&[&self.buckets[b].name, "grad"]);
            let pending = self.made[b].pending.ok_or_else(|| GraphError {
                node: name.to_string(),
                op: "flatten",
                message: "a bucket's gradients are not all computed by the backward".into(),
            })?;
            // What bucket_gradient left for after the last micro-batch.
            let late = (self.micro_batches > 1 && self.dp.zero_stage == 0) || self.dp.zero_stage == 1;
            let applied = match (late && ranks > 1, self.dp.zero_stage) {
                (false, _) => pending,
                (true, 0) => self.out.add(dotted(&[&name, "all_reduce"]), Op::AllReduce { ranks }, &[pending])?,
                (true, _) => {
                    self.out.add(dotted(&[&name, "reduce_scatter"]), Op::ReduceScatter { ranks }, &[pending])?
                }
            };
            self.made[b].applied = Some(applied);
            if b >= self.buckets.len() - self.summed {
                continue;
            }
            let sq = match self.made[b].squared {
                Some(sq) => sq,
                None if self.out.node(applied.node).place == Place::Host => {
                    let sq = self.add_at(Place::Host, dotted(&[&name, "sq"]), Op::SquaredSum, &[applied])?;
                    self.out.add(dotted(&[&name, "sq.h2d"]), Op::Copy, &[sq])?
                }
                None => self.out.add(dotted(&[&name, "sq"]), Op::SquaredSum, &[applied])?,
            };
            self.add_square(b, sq)?;
        }
        let mut total = self.norm.expect("a step has at least one bucket");
        if self.dp.zero_stage >= 1 && ranks > 1 {
            total = self.out.add("train.grad_sq.all_reduce", Op::AllReduce { ranks }, &[total])?;
        }
        total = tensor_sum(&mut self.out, "train.grad_sq", total, self.tensor_ranks)?;
        let old = self.graph.operands(self.step.grad_scale)[0];
        self.map.insert(old, total);
        Ok(())
    }

    /// Adds the squared norms the backward has taken to the running total,
    /// in the order the optimizer phase sums them (last bucket first), as
    /// far as they are ready: each dies as it is added. Kept until the
    /// optimizer phase, the thousands of scalars of a tiled model would
    /// all be live at once. The first bucket's is added in the optimizer
    /// phase, which the step's squared norm is an output of.
    fn sum_ready_squares(&mut self) -> Result<(), GraphError> {
        while let Some(b) = self.buckets.len().checked_sub(self.summed + 1).filter(|&b| b > 0) {
            let Some(sq) = self.made[b].squared else { break };
            self.add_square(b, sq)?;
        }
        Ok(())
    }

    /// Adds bucket `b`'s squared norm (its share, under tensor
    /// parallelism) to the running total.
    fn add_square(&mut self, b: usize, sq: Value) -> Result<(), GraphError> {
        let name = &self.buckets[b].name;
        let init = flat_init(&self.buckets[b], 1);
        let sq = norm_share(&mut self.out, &dotted(&[name, "grad.sq"]), sq, init, self.tensor_ranks)?;
        self.norm = Some(match self.norm {
            None => sq,
            Some(t) => self.out.add(dotted(&["train.grad_sq", name]), Op::Add, &[t, sq])?,
        });
        self.summed += 1;
        Ok(())
    }

    /// AdamW over bucket `b`'s shard and the masters' cast back to the
    /// compute dtype: the parameters' update (from stage 1 on, the shard the
    /// next step's forward gathers).
    fn adamw(&mut self, b: usize) -> Result<(), GraphError> {
        let bucket = &self.buckets[b];
        let name = bucket.name.clone();
        let shards = self.dp.optimizer_shards();
        let shard_len = bucket.len / shards;
        let place = self.optimizer_place();
        let weights = self.weights(b)?;
        // fp32 masters exist under mixed precision and whenever AdamW runs on the host.
        let master = if self.compute != DType::F32 || place == Place::Host {
            let init = Op::State { init: flat_init(bucket, shards) };
            Some(self.source_at(place, dotted(&[&name, "master"]), init, Self::flat(shard_len, DType::F32))?)
        } else {
            None
        };
        let zeros = || Op::State { init: flat_zeros(bucket, shards) };
        let ty = Self::flat(shard_len, DType::F32);
        let m = self.source_at(place, dotted(&[&name, "adam_m"]), zeros(), ty.clone())?;
        let v = self.source_at(place, dotted(&[&name, "adam_v"]), zeros(), ty)?;
        // Without masters AdamW updates the parameters themselves, sharded as
        // the optimizer states are.
        let param = master.unwrap_or(weights);
        let mut grad = self.made[b].applied.expect("gradients_for_optimizer ran");
        let mut scalars: Vec<Value> = self.step.scalars.iter().map(|v| self.map[v]).collect();
        if place == Place::Host {
            if self.out.node(grad.node).place == Place::Device {
                grad = self.add_at(Place::Host, dotted(&[&name, "grad.d2h"]), Op::Copy, &[grad])?;
            }
            scalars = self.host_scalars(&scalars)?;
        }
        let (beta1, beta2, eps) = self.step.betas_eps;
        let op = Op::AdamW { beta1, beta2, eps, weight_decay: bucket.weight_decay };
        let operands = [param, grad, m, v, scalars[0], scalars[1], scalars[2], scalars[3]];
        let updated = self.out.at_place(place, |out| out.add_multi(dotted(&[&name, "adamw"]), op, &operands))?;
        self.out.set_update(m.node, updated[1])?;
        self.out.set_update(v.node, updated[2])?;
        let mut new = updated[0];
        if let Some(master) = master {
            self.out.set_update(master.node, new)?;
            if self.compute != DType::F32 {
                new = self.add_at(place, dotted(&[&name, "params.next"]), Op::Cast { to: self.compute }, &[new])?;
            }
            if place == Place::Host && self.weights_place() == Place::Device {
                new = self.add_at(Place::Device, dotted(&[&name, "params.h2d"]), Op::Copy, &[new])?;
            }
        }
        self.out.set_update(weights.node, new)
    }

    /// AdamW's steering scalars, copied to the host once.
    fn host_scalars(&mut self, scalars: &[Value]) -> Result<Vec<Value>, GraphError> {
        let mut copies = Vec::new();
        for &s in scalars {
            let copy = match self.host_scalars.get(&s) {
                Some(&copy) => copy,
                None => {
                    let name = format!("{}.d2h", self.out.value_ref(s).replace('#', "."));
                    let copy = self.add_at(Place::Host, name, Op::Copy, &[s])?;
                    self.host_scalars.insert(s, copy);
                    copy
                }
            };
            copies.push(copy);
        }
        Ok(copies)
    }
}
