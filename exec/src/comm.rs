//! Collectives between the ranks of a group, behind one trait: what a
//! device's collective instructions call. The implementations — ranks as
//! threads, as processes over TCP (the runtime's), on GPUs over NCCL (the
//! CUDA backend's) — must each give every rank the **same** result bits.

use std::any::Any;

/// Why a collective failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    /// The ranks gave one collective buffers of different lengths.
    #[error("rank {rank} gave {got} elements to {op}, rank 0 gave {expected}: the ranks run different programs")]
    Mismatch {
        /// The collective, as the trait's method is named.
        op: &'static str,
        /// The first rank whose length differs from rank 0's.
        rank: usize,
        /// That rank's length, in elements.
        got: usize,
        /// Rank 0's length, in elements.
        expected: usize,
    },
    /// Another rank aborted ([`Communicator::abort`]): this call cannot
    /// complete.
    #[error("{op}: a peer rank failed (see its error), so this rank stopped too")]
    PeerFailed {
        /// The collective this rank was in.
        op: &'static str,
    },
    /// A broadcast from a rank the group does not have.
    #[error("{op} from root {root}: the group has {ranks} ranks")]
    NoRoot {
        /// The collective.
        op: &'static str,
        /// The root asked for.
        root: usize,
        /// The group's ranks.
        ranks: usize,
    },
    /// A reduce-scatter or all-gather whose whole length is not a multiple
    /// of the ranks, so the slices cannot be equal.
    #[error("{op} of {len} elements over {ranks} ranks: the length must divide evenly")]
    Uneven {
        /// The collective.
        op: &'static str,
        /// The whole length, in elements.
        len: usize,
        /// The group's ranks.
        ranks: usize,
    },
    /// A peer's connection broke mid-collective: it exited or was killed.
    #[error("{op}: lost rank {peer} of the group ({cause}): it failed or was killed (see its error)")]
    PeerLost {
        /// The collective this rank was in.
        op: &'static str,
        /// The rank whose connection broke.
        peer: usize,
        /// The transport's error, as text.
        cause: String,
    },
    /// A peer made a different call than this rank at the same point of
    /// the sequence: the ranks are not running one program.
    #[error("{op}: rank {peer} called {theirs} where this rank called {ours}: the ranks run different programs")]
    Diverged {
        /// The collective this rank called.
        op: &'static str,
        /// The rank that called something else.
        peer: usize,
        /// The peer's call: collective, sequence number and root.
        theirs: String,
        /// This rank's call, in the same form.
        ours: String,
    },
    /// This rank could not join its group (the rendezvous or the
    /// connections to its peers failed).
    #[error("joining group `{group}` as rank {rank}: {message}")]
    Join {
        /// The group's name in the rendezvous store.
        group: String,
        /// The rank joining.
        rank: usize,
        /// What failed.
        message: String,
    },
    /// An NCCL call returned an error.
    #[error("{op}: NCCL failed: {message}")]
    Nccl {
        /// The collective.
        op: &'static str,
        /// NCCL's error.
        message: String,
    },
}

/// One rank's handle on a group of ranks that run the same program.
///
/// Every rank must call the same collectives in the same order (as a plan's
/// schedule guarantees); each call returns once every rank has made it.
pub trait Communicator: Send + Sync {
    /// This rank, in `0..ranks()`.
    fn rank(&self) -> usize;
    /// The group's size: how many ranks every collective waits for.
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
