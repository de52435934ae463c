//! Collectives between the ranks of a group, behind one trait: what a
//! device's collective instructions call. The implementations — ranks as
//! threads, as processes over TCP (the runtime's), on GPUs over NCCL (the
//! CUDA backend's) — must each give every rank the **same** result bits.

use std::any::Any;

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
    /// This communicator as its concrete type, where it can take a device's
    /// own buffers: the CUDA device downcasts it to its NCCL communicator and
    /// hands it device pointers instead of staging them through host memory.
    /// `None` for host communicators, which take only host slices.
    fn device_collectives(&self) -> Option<&dyn Any> {
        None
    }
}

/// A key-value store every rank of a job reaches (torch.distributed's
/// `Store`): how the ranks of a group exchange what they must agree on
/// before they can talk directly, such as NCCL's unique id.
pub trait Rendezvous {
    /// Publishes `value` under `key`.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), String>;
    /// The value under `key`, waiting until some rank has set it.
    fn get(&self, key: &str) -> Result<Vec<u8>, String>;
}
