//! Cost models of a planned step: [`work`] (FLOPs and bytes of each
//! instruction), [`time`] (seconds on a GPU of a cluster), [`offload`]
//! (offloaded states on CPU memory or NVMe), [`comm`] (communication
//! volume), [`nccl`] (how long NCCL takes for a collective) and
//! [`simulate`] (the schedule on compute, communication, copy and host
//! streams → step time, tokens/s, MFU).

pub mod comm;
pub mod nccl;
pub mod offload;
pub mod simulate;
pub mod time;
pub mod work;

pub use simulate::simulate;
pub use time::Machine;
