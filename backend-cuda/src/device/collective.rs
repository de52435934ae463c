//! Collectives on device buffers: when the rank's group is NCCL
//! ([`zeroplan_exec::Communicator::device_collectives`]), the CUDA device hands NCCL the
//! plan's device pointers instead of staging the buffers through host
//! memory and the host communicator.
//!
//! NCCL takes the buffer's own type (f32, bf16, f16) and works in place
//! only at the offsets it defines; anything else — a buffer in the pinned
//! host arena (ZeRO-Offload), mixed types, a partial overlap — falls back
//! to the staged host routine, whose collective still goes through NCCL
//! (on a device scratch copy).

use zeroplan_ir::Place;

use super::{Cuda, CudaKernel};
use crate::nccl::Nccl;
use zeroplan_exec::Communicator;
use zeroplan_exec::Instr;
use zeroplan_exec::{Buf, Ctx};

/// Runs `instr` through NCCL on device pointers, if it is a collective
/// that can; `None` when the caller must stage it.
pub fn run(cuda: &Cuda, instr: &Instr<CudaKernel>, cx: &Ctx) -> Option<Result<(), String>> {
    let (comm, x, out): (&dyn Communicator, Buf, Buf) = match *instr {
        Instr::AllReduce { x, out } | Instr::ReduceScatter { x, out } | Instr::AllGather { x, out } => {
            (cx.comm, x, out)
        }
        Instr::TensorAllReduce { x, out } => (cx.tensor, x, out),
        _ => return None,
    };
    let nccl = comm.device_collectives()?.downcast_ref::<Nccl>()?;
    let on_device = x.place == Place::Device && out.place == Place::Device && x.dtype == out.dtype;
    if !on_device || !x.dtype.is_float() {
        return None;
    }
    let (mem, rank, ranks) = (&cuda.memory, comm.rank(), comm.ranks());
    let (xp, outp) = (mem.device_ptr(x), mem.device_ptr(out));
    let size = x.dtype.size_bytes();
    // NCCL's in-place forms; any other overlap is undefined for NCCL.
    let allowed = |in_place: bool| !x.overlaps(&out) || in_place;
    let done = match *instr {
        Instr::AllReduce { .. } | Instr::TensorAllReduce { .. } => {
            if x.len != out.len || !allowed(xp == outp) {
                return None;
            }
            // SAFETY: both lie in the device arena at their lengths; equal or disjoint.
            unsafe { nccl.all_reduce_device(xp, outp, x.len, x.dtype, &cuda.compute) }
        }
        Instr::ReduceScatter { .. } => {
            if x.len != out.len * ranks || !allowed(outp == xp + (rank * out.len) as u64 * size) {
                return None;
            }
            // SAFETY: as above; in place at NCCL's offset or disjoint.
            unsafe { nccl.reduce_scatter_device(xp, outp, out.len, x.dtype, &cuda.compute) }
        }
        Instr::AllGather { .. } => {
            if out.len != x.len * ranks || !allowed(xp == outp + (rank * x.len) as u64 * size) {
                return None;
            }
            // SAFETY: as above.
            unsafe { nccl.all_gather_device(xp, outp, x.len, x.dtype, &cuda.compute) }
        }
        _ => return None,
    };
    Some(done.map_err(|e| e.to_string()))
}
