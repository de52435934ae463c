//! Lower bounds on a choice's memory from its model states (and under full
//! recomputation its checkpoints) alone, so the search skips compiling what
//! cannot fit.
//!
//! Compiling a choice (two short stacks of the model through every pass)
//! costs tens of milliseconds; a trillion-parameter model on one node has
//! hundreds of choices, most of which keep hundreds of gigabytes of
//! parameters or optimizer states on each GPU, or more offloaded states than
//! the host holds. Where the states live is known without compiling: each
//! GPU's share is `1/t` of the parameters (`t` tensor ranks), and of those
//!
//! - the 16-bit (f32) parameters stay on the GPU unless offloaded; `1/N`
//!   of them at ZeRO-3; at ZeRO-1–2 the `1/N` shard kept across steps and,
//!   at the end of the forward, the whole copy it gathered for the backward
//!   (the embedding tables left out: where no head reads them, the backward
//!   does not either, and their copy is gone by then);
//! - AdamW's f32 moments (8 bytes a parameter) and under mixed precision
//!   the f32 masters (4 more) stay on the GPU unless the optimizer is
//!   offloaded, else on the offload tier (host memory or NVMe); `1/N` of
//!   them from ZeRO-1 on, or whenever offloaded (ZeRO-Offload partitions
//!   what it offloads).
//!
//! Under full recomputation each layer keeps its input for the backward,
//! which recomputes the layer from it (Chen et al., 2016; Korthikanti et
//! al., 2022: `2sbh` bytes a layer in 16 bits, `2sbh/t` split over the
//! tensor ranks by sequence parallelism): at the end of the forward every
//! layer's input is live at once, beside the states. No tile count changes
//! them (tiling splits operators inside a layer), so a choice whose states
//! and layer inputs exceed the budget needs no tiled probe — for a 100T
//! model's 312 layers of hidden 163,840 they are 195 GiB a GPU without
//! sequence parallelism.
//!
//! Gradients, other activations, gathered layers, staging buffers and the
//! reserve only add to this, so a choice whose floor exceeds a capacity does
//! not fit at any micro-batch or tile count (Rajbhandari et al., 2020, §3.1).

use std::collections::HashMap;

use rustc_hash::FxHashSet;
use zeroplan_ir::build::{self, BuildOptions};
use zeroplan_ir::plan::{Offload, OffloadTo, StatesExceed};
use zeroplan_ir::{DType, Op};

use super::evaluate::Choice;
use super::{PlanError, Request, compute_dtype};
use crate::recompute::Policy;

/// Each tensor-parallel degree's parameters per tensor rank, counted once.
#[derive(Default)]
pub struct Floors {
    per_tensor_rank: HashMap<u64, Parameters>,
}

/// One tensor rank's parameters.
#[derive(Clone, Copy)]
struct Parameters {
    all: u64,
    /// Those of the embedding lookups' tables.
    tables: u64,
}

/// A choice's model states per GPU, by where they live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Floor {
    /// Live on each GPU at the end of the forward whatever else is: a
    /// lower bound on its peak.
    pub gpu: u64,
    /// Offloaded, per GPU, on the offload tier.
    pub offloaded: u64,
    /// The layer inputs full recomputation keeps on each GPU at the least
    /// micro-batch; 0 under other policies. Live with `gpu` at the end of
    /// the forward.
    pub checkpoints: u64,
}

impl Floors {
    /// `choice`'s floor, and the first capacity it exceeds (GPU, the
    /// offload tier, then the GPU with the checkpoints), if any.
    pub fn of(&mut self, req: &Request, choice: Choice) -> Result<(Floor, Option<StatesExceed>), PlanError> {
        let params = self.parameters(req, choice.tensor_parallel)?;
        let floor = Floor { checkpoints: checkpoints(req, choice), ..states(req, choice, params) };
        let cluster = &req.cluster;
        let tier = match choice.offload_to {
            _ if choice.offload == Offload::None => None,
            OffloadTo::Cpu => (!cluster.host_fits(floor.offloaded)).then_some(StatesExceed::Host),
            OffloadTo::Nvme => (!cluster.nvme_fits(floor.offloaded.saturating_mul(cluster.gpus_per_node)))
                .then_some(StatesExceed::Nvme),
        };
        let exceeds = if floor.gpu > cluster.budget_bytes() {
            Some(StatesExceed::Gpu)
        } else if tier.is_some() {
            tier
        } else {
            (floor.gpu + floor.checkpoints > cluster.budget_bytes()).then_some(StatesExceed::Checkpoints)
        };
        Ok((floor, exceeds))
    }

    /// The parameters on each of `t` tensor ranks (replicated ones in each).
    fn parameters(&mut self, req: &Request, t: u64) -> Result<Parameters, PlanError> {
        if let Some(&p) = self.per_tensor_rank.get(&t) {
            return Ok(p);
        }
        let dtype = compute_dtype(req.train.precision);
        let options = BuildOptions { dtype, tensor_parallel: t, sequence_parallel: false };
        let graph = build::forward(req.model, &options).map_err(|e| PlanError::Compile(e.to_string()))?;
        let tables: FxHashSet<_> = graph
            .node_indices()
            .filter(|&n| matches!(graph.node(n).op, Op::Embedding))
            .map(|n| graph.operands(n)[0])
            .filter(|table| matches!(graph.node(table.node).op, Op::Param { .. }))
            .collect();
        let tables = tables.iter().filter_map(|&v| graph.value_type(v).shape.numel().as_constant()).sum();
        let p = Parameters { all: graph.parameter_count(), tables };
        self.per_tensor_rank.insert(t, p);
        Ok(p)
    }
}

/// Where `params`' states live under `choice`, per GPU.
fn states(req: &Request, choice: Choice, params: Parameters) -> Floor {
    let dtype = compute_dtype(req.train.precision);
    let ranks = choice.data_ranks(req.cluster.world_size()).max(1);
    let whole = params.all * dtype.size_bytes();
    let parameters = match (choice.offload, choice.zero_stage) {
        (Offload::OptimizerAndParams, _) => 0,
        (_, 3) => whole / ranks,
        (_, 1 | 2) if ranks > 1 => whole / ranks + (params.all - params.tables) * dtype.size_bytes(),
        _ => whole,
    };
    let states = params.all * if dtype == DType::F32 { 8 } else { 12 };
    let (optimizer, offloaded) = match choice.offload {
        Offload::None => (states / if choice.zero_stage >= 1 { ranks } else { 1 }, 0),
        _ => (0, states / ranks),
    };
    Floor { gpu: parameters + optimizer, offloaded, checkpoints: 0 }
}

/// The layer inputs `choice` keeps on each GPU for its backward: one
/// `[b, s, h]` a layer (`[b, s/t, h]` under sequence parallelism) at the
/// least micro-batch `b`, where it recomputes every layer.
fn checkpoints(req: &Request, choice: Choice) -> u64 {
    if choice.recompute != Policy::Full {
        return 0;
    }
    let split = if choice.sequence_parallel { choice.tensor_parallel.max(1) } else { 1 };
    let micro_batch = req.pins.micro_batch.unwrap_or(1);
    let layer = micro_batch * req.seq / split * req.model.hidden * compute_dtype(req.train.precision).size_bytes();
    req.model.layers * layer
}
