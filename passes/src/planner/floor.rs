//! Lower bounds on a choice's memory from its model states alone, so the
//! search skips compiling what cannot fit.
//!
//! Compiling a choice (two short stacks of the model through every pass)
//! costs tens of milliseconds; a trillion-parameter model on one node has
//! hundreds of choices, most of which keep hundreds of gigabytes of
//! parameters or optimizer states on each GPU, or more offloaded states than
//! the host holds. Where the states live is known without compiling: each
//! GPU's share is `1/t` of the parameters (`t` tensor ranks), and of those
//!
//! - the 16-bit (f32) parameters stay on the GPU unless offloaded; `1/N`
//!   of them at ZeRO-3;
//! - AdamW's f32 moments (8 bytes a parameter) and under mixed precision
//!   the f32 masters (4 more) stay on the GPU unless the optimizer is
//!   offloaded, else on the offload tier (host memory or NVMe); `1/N` of
//!   them from ZeRO-1 on, or whenever offloaded (ZeRO-Offload partitions
//!   what it offloads).
//!
//! Gradients, activations, gathered layers, staging buffers and the reserve
//! only add to this, so a choice whose floor exceeds a capacity does not fit
//! at any micro-batch or tile count (Rajbhandari et al., 2020, §3.1).

use std::collections::HashMap;

use zeroplan_ir::DType;
use zeroplan_ir::build::{self, BuildOptions};
use zeroplan_ir::plan::{Offload, OffloadTo, StatesExceed};

use super::evaluate::Choice;
use super::{PlanError, Request, compute_dtype};

/// Each tensor-parallel degree's parameters per tensor rank, counted once.
#[derive(Default)]
pub struct Floors {
    per_tensor_rank: HashMap<u64, u64>,
}

/// A choice's model states per GPU, by where they live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Floor {
    /// Kept on each GPU across steps: a lower bound on its peak.
    pub gpu: u64,
    /// Offloaded, per GPU, on the offload tier.
    pub offloaded: u64,
}

impl Floors {
    /// `choice`'s floor, and the first capacity it exceeds (GPU, then the
    /// offload tier), if any.
    pub fn of(&mut self, req: &Request, choice: Choice) -> Result<(Floor, Option<StatesExceed>), PlanError> {
        let params = self.parameters(req, choice.tensor_parallel)?;
        let floor = states(req, choice, params);
        let cluster = &req.cluster;
        let exceeds = if floor.gpu > cluster.budget_bytes() {
            Some(StatesExceed::Gpu)
        } else if choice.offload != Offload::None {
            match choice.offload_to {
                OffloadTo::Cpu => (!cluster.host_fits(floor.offloaded)).then_some(StatesExceed::Host),
                OffloadTo::Nvme => (!cluster.nvme_fits(floor.offloaded.saturating_mul(cluster.gpus_per_node)))
                    .then_some(StatesExceed::Nvme),
            }
        } else {
            None
        };
        Ok((floor, exceeds))
    }

    /// The parameters on each of `t` tensor ranks (replicated ones in each).
    fn parameters(&mut self, req: &Request, t: u64) -> Result<u64, PlanError> {
        if let Some(&p) = self.per_tensor_rank.get(&t) {
            return Ok(p);
        }
        let dtype = compute_dtype(req.train.precision);
        let options = BuildOptions { dtype, tensor_parallel: t, sequence_parallel: false };
        let graph = build::forward(req.model, &options).map_err(|e| PlanError::Compile(e.to_string()))?;
        let p = graph.parameter_count();
        self.per_tensor_rank.insert(t, p);
        Ok(p)
    }
}

/// Where `params` parameters' states live under `choice`, per GPU.
fn states(req: &Request, choice: Choice, params: u64) -> Floor {
    let dtype = compute_dtype(req.train.precision);
    let ranks = choice.data_ranks(req.cluster.world_size()).max(1);
    let parameters = match (choice.offload, choice.zero_stage) {
        (Offload::OptimizerAndParams, _) => 0,
        (_, 3) => params * dtype.size_bytes() / ranks,
        _ => params * dtype.size_bytes(),
    };
    let per_param = if dtype == DType::F32 { 8 } else { 12 };
    let (optimizer, offloaded) = match choice.offload {
        Offload::None => (params * per_param / if choice.zero_stage >= 1 { ranks } else { 1 }, 0),
        _ => (0, params * per_param / ranks),
    };
    Floor { gpu: parameters + optimizer, offloaded }
}
