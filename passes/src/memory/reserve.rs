//! Device memory a run needs outside the arena.
//!
//! The arena holds every tensor of the step; a real process also holds the
//! CUDA context, cuBLASLt's workspace and NCCL's communication buffers.
//! Estimators that leave these out promise a fit that then fails by a few
//! hundred MiB, so the plan's peak includes them. The figures are
//! assumptions of the model until measured on a GPU (docs/memory.md):
//!
//! - CUDA context: the driver's per-process state and the module images,
//!   with lazy loading (CUDA ≥ 11.7): ≈ 500 MiB on A100/H100 as PyTorch
//!   reports it before the first allocation.
//! - cuBLASLt workspace: 32 MiB, NVIDIA's recommended size on Hopper (the
//!   largest of the recommendations).
//! - NCCL: `NCCL_BUFFSIZE` (4 MiB) per channel, per ring neighbour, per
//!   protocol; with 16 channels, 2 neighbours and the Simple + LL128
//!   protocols that is ≈ 512 MiB per communicator.

use zeroplan_ir::plan::Reserve;
use zeroplan_ir::{Graph, Op};

const MIB: u64 = 1 << 20;
pub const CUDA_CONTEXT_BYTES: u64 = 512 * MIB;
pub const GEMM_WORKSPACE_BYTES: u64 = 32 * MIB;
pub const NCCL_BYTES: u64 = 512 * MIB;

/// What a process running `graph` holds outside the arena: NCCL's buffers
/// only when it communicates, the GEMM workspace only when it multiplies.
pub fn reserve(graph: &Graph) -> Reserve {
    let communicates = graph.node_indices().any(|n| graph[n].op.is_collective());
    let multiplies = graph.node_indices().any(|n| matches!(graph[n].op, Op::MatMul { .. }));
    Reserve {
        cuda_context: CUDA_CONTEXT_BYTES,
        gemm_workspace: if multiplies { GEMM_WORKSPACE_BYTES } else { 0 },
        nccl: if communicates { NCCL_BYTES } else { 0 },
    }
}
