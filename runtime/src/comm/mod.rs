//! Collectives between data-parallel ranks, behind one trait.
//!
//! The runtime executes a plan's `all_reduce`, `reduce_scatter` and
//! `all_gather` nodes (and, later, a resumed checkpoint's `broadcast`)
//! through a [`Communicator`] without knowing what is behind it:
//! [`InProcess`] (ranks as threads of this process, for the host runtime
//! and the tests), [`Tcp`] (ranks as processes, on one node or many, met
//! through the rendezvous [`Store`] that the torchrun environment
//! ([`World`]) points to) and [`Nccl`] (ranks as processes on GPUs).
//! Payloads are `f32` — the host runtime widens 16-bit buffers before a
//! collective and rounds the result once, as NCCL's f32 accumulation of
//! bf16 would.
//!
//! Every implementation must give each rank the **same** result bits, and
//! a result that does not depend on timing: [`InProcess`] sums in rank
//! order, in `f64`, and [`Tcp`] gives the same bits as it does.

mod in_process;
pub mod nccl;
pub mod store;
mod tcp;
mod wire;
pub mod world;

use std::sync::Arc;

pub use in_process::InProcess;
pub use nccl::Nccl;
pub use store::{Store, StoreError, StoreServer};
pub use tcp::{PIECE as TCP_PIECE, Tcp};
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

/// Why a collective failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    #[error("rank {rank} gave {got} elements to {op}, rank 0 gave {expected}: the ranks run different programs")]
    Mismatch { op: &'static str, rank: usize, got: usize, expected: usize },
    #[error("{op}: a peer rank failed (see its error), so this rank stopped too")]
    PeerFailed { op: &'static str },
    #[error("{op} from root {root}: the group has {ranks} ranks")]
    NoRoot { op: &'static str, root: usize, ranks: usize },
    #[error("{op} of {len} elements over {ranks} ranks: the length must divide evenly")]
    Uneven { op: &'static str, len: usize, ranks: usize },
    #[error("{op}: lost rank {peer} of the group ({cause}): it failed or was killed (see its error)")]
    PeerLost { op: &'static str, peer: usize, cause: String },
    #[error("{op}: rank {peer} called {theirs} where this rank called {ours}: the ranks run different programs")]
    Diverged { op: &'static str, peer: usize, theirs: String, ours: String },
    #[error("joining group `{group}` as rank {rank}: {message}")]
    Join { group: String, rank: usize, message: String },
    #[error("{op}: NCCL failed: {message}")]
    Nccl { op: &'static str, message: String },
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

/// One rank's handle on a group of ranks that run the same program.
///
/// Every rank must call the same collectives in the same order (as a plan's
/// schedule guarantees); each call returns once every rank has made it.
pub trait Communicator: Send + Sync {
    /// This rank, in `0..ranks()`.
    fn rank(&self) -> usize;
    fn ranks(&self) -> usize;
    /// Every rank's `data` summed, into every rank's `data`.
    fn all_reduce(&self, data: &mut [f32]) -> Result<(), CommError>;
    /// Every rank's `data` summed; this rank keeps its `1/ranks` slice of the
    /// sum (slice `rank()`, in order) in `out`.
    fn reduce_scatter(&self, data: &[f32], out: &mut [f32]) -> Result<(), CommError>;
    /// Every rank's `part`, concatenated in rank order, into `out`.
    fn all_gather(&self, part: &[f32], out: &mut [f32]) -> Result<(), CommError>;
    /// Rank `root`'s `data` into every rank's `data` (a resumed run's state
    /// read once and shared).
    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<(), CommError>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<(), CommError>;
    /// Tells the peers this rank will make no more calls (it failed), so
    /// that they return [`CommError::PeerFailed`] instead of waiting forever.
    fn abort(&self);
    /// The NCCL communicator behind this one, which takes device pointers
    /// (the CUDA device then hands it its buffers instead of staging them
    /// through host memory); `None` for host communicators.
    fn nccl(&self) -> Option<&Nccl> {
        None
    }
}
