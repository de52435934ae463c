//! Where a plan's offloaded model states live, and what that leaves in
//! CPU memory: the memory side of the NVMe tier (ZeRO-Infinity,
//! Rajbhandari et al., SC'21).
//!
//! The memory pass plans one host arena holding every host-placed tensor:
//! the offloaded states (fp32 masters, AdamW moments, offloaded parameter
//! shards), which live across steps, the gradient shards copied down
//! during the backward, which live until the optimizer, and the step's
//! other host tensors (AdamW's scalars). On the CPU tier the
//! arena is what each GPU's process pins. On the NVMe tier the states and
//! gradient shards live on the node's drives and CPU memory holds the rest
//! of the arena plus the pinned buffers they stream through:
//! [`OPTIMIZER_BUFFERS`] of the largest optimizer chunk and
//! [`PARAMETER_BUFFERS`] of the largest parameter or gradient shard.

use zeroplan_ir::Graph;
use zeroplan_ir::plan::OffloadTo;

use super::Request;
use super::evaluate::bindings;
use crate::cost::offload::{state_bytes, state_traffic};
use crate::cost::work::{Engine, work};
use crate::memory::MemoryPlan;

/// Chunks of optimizer states in flight in the pipelined host optimizer:
/// one being read from the drives, one being updated by CPU AdamW, one
/// being written back (DeepSpeed's pipelined optimizer swapper overlaps
/// exactly these three; Rajbhandari et al., 2021, §6.2).
pub const OPTIMIZER_BUFFERS: u64 = 3;
/// Parameter shards in flight: the one crossing PCIe and the next being
/// read from the drives (the one-bucket-ahead prefetch the `partition`
/// pass schedules).
pub const PARAMETER_BUFFERS: u64 = 2;

/// Host bytes per GPU and NVMe bytes per node of a step planned `plan`,
/// its offloaded states on `tier`, at `micro_batch` sequences.
pub fn split(graph: &Graph, plan: &MemoryPlan, tier: OffloadTo, micro_batch: u64, req: &Request) -> (u64, u64) {
    if tier == OffloadTo::Cpu {
        return (plan.host.size, 0);
    }
    let bindings = bindings(micro_batch, req.seq);
    let states = state_bytes(graph, &bindings);
    let (mut optimizer_chunk, mut parameter_chunk) = (0.0f64, 0.0f64);
    for (n, moved) in state_traffic(graph, &bindings) {
        match work(graph, n, &bindings).map(|w| w.engine) {
            Some(Engine::Host) => optimizer_chunk = optimizer_chunk.max(moved.read.max(moved.written)),
            Some(Engine::Copy) => parameter_chunk = parameter_chunk.max(moved.read.max(moved.written)),
            _ => {}
        }
    }
    let staging = OPTIMIZER_BUFFERS * optimizer_chunk as u64 + PARAMETER_BUFFERS * parameter_chunk as u64;
    (plan.host.size.saturating_sub(states) + staging, states * req.cluster.gpus_per_node)
}
