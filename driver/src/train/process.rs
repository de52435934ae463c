//! One process per rank: this process runs one rank of a run, found through
//! the torchrun environment (`zeroplan launch`, torchrun, or a scheduler),
//! and meets the others at the rendezvous store.
//!
//! Its collectives go through `comm::Tcp` (the host device; the CUDA device
//! with `ZEROPLAN_COMM=tcp`) or the CUDA backend's `Nccl`, laid out as the
//! threaded run's `InProcess::grid`, so a run of one process per rank is
//! the threaded run split over processes: over TCP, the same bits.

use std::sync::Arc;

use zeroplan_backend_cuda::device as cuda;
use zeroplan_backend_cuda::{Nccl, nccl};
use zeroplan_runtime::comm::{self, Communicator, Groups, Store, Tcp, World};

/// Which transport the collectives of `--backend cuda` take.
pub const COMM_VAR: &str = "ZEROPLAN_COMM";

/// How the ranks' collectives travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    /// NCCL on this GPU.
    Nccl {
        ordinal: usize,
    },
}

/// The device a process's rank runs on, which decides its transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// The host runtime: collectives over TCP.
    Host,
    /// A GPU: collectives over NCCL, or TCP where `ZEROPLAN_COMM=tcp`.
    Cuda,
}

/// This process's rank, its rendezvous, and its collectives' transport.
pub struct ProcessRank {
    pub world: World,
    store: Store,
    transport: Transport,
    /// Every rank, for what the log shares (each rank's loss).
    everyone: Option<Arc<dyn Communicator>>,
}

/// The rank this process is, when `WORLD_SIZE` says it is one: the
/// environment read and checked, the transport chosen (NCCL probed), the
/// rendezvous joined.
pub fn from_env(device: DeviceKind) -> Result<Option<ProcessRank>, String> {
    let Some(world) = World::from_env().map_err(|e| format!("error: {e}"))? else { return Ok(None) };
    let transport = match device {
        DeviceKind::Host => Transport::Tcp,
        DeviceKind::Cuda => match std::env::var(COMM_VAR).as_deref() {
            Ok("tcp") => Transport::Tcp,
            Ok("nccl") | Err(_) => {
                nccl::probe().map_err(|e| format!("error: --backend cuda under launch: {e}"))?;
                Transport::Nccl { ordinal: cuda::ordinal()? }
            }
            Ok(other) => return Err(format!("error: {COMM_VAR}={other}: use nccl (the default) or tcp")),
        },
    };
    let store = world.rendezvous().map_err(|e| format!("error: rank {}: {e}", world.rank))?;
    Ok(Some(ProcessRank { world, store, transport, everyone: None }))
}

impl ProcessRank {
    /// This rank's data and tensor groups of a `data × tensor` run, which
    /// must be the launch's world; also joins the group of every rank.
    pub fn groups(&mut self, data: usize, tensor: usize) -> Result<Groups, String> {
        let world = self.world.world_size;
        if data * tensor != world {
            return Err(format!(
                "the program runs {data} data-parallel × {tensor} tensor-parallel rank(s), but the launch has \
                 WORLD_SIZE={world}: make them equal (leave --ranks out under launch: it is WORLD_SIZE / --tp)"
            ));
        }
        let rank = self.world.rank;
        let groups = match self.transport {
            Transport::Tcp => Tcp::grid(&self.store, rank, data, tensor),
            Transport::Nccl { ordinal } => Nccl::grid(&self.store, rank, data, tensor, ordinal)
                .map(|(data, tensor)| Groups { data: Arc::new(data), tensor: Arc::new(tensor) }),
        }
        .map_err(|e| format!("rank {rank}: {e}"))?;
        let everyone = Tcp::join(&self.store, "world", rank, world).map_err(|e| format!("rank {rank}: {e}"))?;
        self.everyone = Some(Arc::new(everyone));
        Ok(groups)
    }

    /// Every rank's `values`, in rank order (after [`ProcessRank::groups`]).
    pub fn gather(&self, values: &[f64]) -> Result<Vec<f64>, String> {
        self.share(values, "sharing the step's log")
    }

    /// As [`ProcessRank::gather`]; `doing` names the exchange in its error.
    /// It returns once every rank has reached it: a barrier too.
    pub fn share(&self, values: &[f64], doing: &str) -> Result<Vec<f64>, String> {
        let everyone = self.everyone.as_ref().expect("groups() joined the world group");
        comm::all_gather_f64(everyone.as_ref(), values).map_err(|e| format!("error: {doing}: {e}"))
    }
}
