//! The runtime's communicators: the groups a rank belongs to and the
//! host implementations of [`Communicator`] (its trait is
//! `zeroplan_exec`'s, what a device's collective instructions call).
//!
//! The runtime executes a plan's `all_reduce`, `reduce_scatter` and
//! `all_gather` nodes (and a resumed checkpoint's `broadcast`) through a
//! [`Communicator`] without knowing what is behind it: [`InProcess`] (ranks
//! as threads of this process, for the host runtime and the tests), [`Tcp`]
//! (ranks as processes, on one node or many, met through the rendezvous
//! [`Store`] that the torchrun environment ([`World`]) points to, every
//! connection opened by a challenge–response over the job's [`JobToken`]:
//! `auth`) and the CUDA backend's `Nccl` (ranks as processes on GPUs).
//! Payloads are `f32` — the host runtime widens 16-bit buffers before a
//! collective and rounds the result once, as NCCL's f32 accumulation of
//! bf16 would.
//!
//! Every implementation must give each rank the **same** result bits, and
//! a result that does not depend on timing: [`InProcess`] sums in rank
//! order, in `f64`, and [`Tcp`] gives the same bits as it does.

mod auth;
mod in_process;
pub mod store;
mod tcp;
pub mod token;
mod wire;
pub mod world;

use std::sync::Arc;

pub use zeroplan_exec::comm::{CommError, Communicator, Rendezvous};

pub use in_process::InProcess;
pub use store::{Store, StoreConfig, StoreError, StoreServer};
pub use tcp::{PIECE as TCP_PIECE, Tcp};
pub use token::{JobToken, TokenError};
pub use world::{World, WorldError};

/// One rank's handles under tensor × data parallelism (Megatron-LM's
/// grid): `data` over the ranks holding the same tensor shards (ZeRO's
/// collectives), `tensor` over the ranks of its model replica
/// (`tensor_all_reduce`). Global rank `data_rank·t + tensor_rank`: a
/// replica's tensor ranks are consecutive, as the planner's cost model
/// places them inside a node.
#[derive(Clone)]
pub struct Groups {
    pub data: Arc<dyn Communicator>,
    pub tensor: Arc<dyn Communicator>,
}

impl Groups {
    /// A data-parallel rank with no tensor parallelism (a tensor group of one).
    pub fn data_parallel(data: Arc<dyn Communicator>) -> Groups {
        Groups { data, tensor: Arc::new(InProcess::group(1).pop().expect("a group of one")) }
    }

    /// Global rank `data_rank·t + tensor_rank`.
    pub fn global_rank(&self) -> usize {
        self.data.rank() * self.tensor.ranks() + self.tensor.rank()
    }

    /// Tells both groups' peers this rank stopped (see [`Communicator::abort`]).
    pub fn abort(&self) {
        self.data.abort();
        self.tensor.abort();
    }
}

/// Every rank's `values`, concatenated in rank order, through `comm`'s
/// f32 all-gather as bit patterns (two f32 words per f64): an all-gather
/// copies bits unchanged on every implementation, so each rank gets every
/// rank's exact values (a log's per-rank losses, averaged as one process
/// of threads averages them).
pub fn all_gather_f64(comm: &dyn Communicator, values: &[f64]) -> Result<Vec<f64>, CommError> {
    let words: Vec<f32> =
        values.iter().flat_map(|v| [v.to_bits() as u32, (v.to_bits() >> 32) as u32]).map(f32::from_bits).collect();
    let mut all = vec![0.0f32; words.len() * comm.ranks()];
    comm.all_gather(&words, &mut all)?;
    Ok(all
        .chunks_exact(2)
        .map(|w| f64::from_bits(u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32)))
        .collect())
}
