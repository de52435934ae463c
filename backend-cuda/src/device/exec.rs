//! Running instructions on a CUDA rank.
//!
//! **Ordering.** Two streams, and the CPU:
//!
//! - *Compute stream*: kernels, GEMMs (cuBLAS, cuBLASLt), the multi-tensor
//!   AdamW, fused attention, the routines' kernels (losses, embeddings,
//!   layout ops, fills) and device↔device copies are queued on it and not
//!   waited for: the stream keeps schedule order.
//! - *Copy stream* (`copies.rs`): host↔device DMA (the pinned arena of
//!   ZeRO-Offload). A copy waits for all work queued on the compute stream
//!   before it (an event): so whatever produced its source, and whatever
//!   still reads its destination, has finished. Compute work queued later
//!   that reads or writes a pending copy's destination, or overwrites its
//!   source, first makes the compute stream wait for that copy's event
//!   (the instruction's buffers against each pending copy's byte ranges).
//!   Compute that does not touch them runs beside the copy.
//! - *CPU*: host routines no kernel takes (and offloaded ones) and
//!   collectives on a staging copy, Cranelift
//!   kernels on the pinned arena, reads and writes for the runner first
//!   wait for both streams, so they see every earlier instruction's result
//!   and no queued kernel or copy still reads what they overwrite.
//!
//! The communication thread runs its collectives the same way (an NCCL
//! collective first orders the compute stream after the pending copies it
//! touches, then waits for the compute stream by an event), so the runner's
//! hazards between the two threads (it waits for an instruction to return)
//! hold on the GPU too.

use zeroplan_ir::{Place, Tensor};

use super::{Cuda, CudaKernel, gemm};
use zeroplan_backend_cpu::device::{Arena, Memory, exec as host};
use zeroplan_exec::{Access, Instr};
use zeroplan_exec::{Buf, Ctx, Instruction};

/// Staged buffers start on this boundary (the widest host SIMD access).
const STAGE_ALIGN: usize = 64;

fn driver(e: cudarc::driver::DriverError) -> String {
    format!("the CUDA driver failed: {e:?}")
}

/// Binds the rank's context to this thread (the runner's communication
/// thread calls in too) and waits for the compute and copy streams.
pub fn settle(cuda: &Cuda) -> Result<(), String> {
    cuda.gpu.context().bind_to_thread().map_err(driver)?;
    cuda.compute.synchronize().map_err(driver)?;
    cuda.copies.synchronize().map_err(driver)
}

/// Makes the compute stream wait for the pending copies `instr` must follow.
pub fn after_copies(cuda: &Cuda, instr: &Instr<CudaKernel>) -> Result<(), String> {
    cuda.copies.order(&cuda.compute, || instr.touches()).map_err(driver)
}

pub fn run(cuda: &Cuda, instr: &Instr<CudaKernel>, cx: &Ctx) -> Result<(), String> {
    cuda.gpu.context().bind_to_thread().map_err(driver)?;
    let mem = &cuda.memory;
    // Work queued on the compute stream (NCCL's stream joins it) follows the
    // pending copies it touches; the CPU's work settles both streams instead.
    let on_gpu = match instr {
        Instr::Kernel { kernel, .. } => !matches!(kernel, CudaKernel::Host(_)),
        Instr::MatMul { .. }
        | Instr::AllReduce { .. }
        | Instr::ReduceScatter { .. }
        | Instr::AllGather { .. }
        | Instr::TensorAllReduce { .. } => true,
        _ => false,
    };
    if on_gpu {
        after_copies(cuda, instr)?;
    }
    match instr {
        Instr::Kernel { kernel: CudaKernel::Gpu(k), inputs, outputs } => {
            let ins: Vec<u64> = inputs.iter().map(|b| mem.device_ptr(*b)).collect();
            let outs: Vec<u64> = outputs.iter().map(|b| mem.device_ptr(*b)).collect();
            if k.generated().uses_dropout {
                cuda.rng.set(&cuda.compute, cx.seed, cx.offset)?;
            }
            // SAFETY: loading placed every operand on the device, at its size
            // and alignment; the arenas outlive the stream's work (`Cuda` drops
            // them after synchronising in `read`, or with the context).
            unsafe { k.launch(&cuda.compute, &ins, &outs, cuda.partials.ptr(), cuda.rng.ptr()) }
                .map_err(|e| e.to_string())
        }
        Instr::Kernel { kernel: CudaKernel::Host(k), inputs, outputs } => {
            settle(cuda)?;
            let ins: Vec<*const u8> = inputs.iter().map(|b| mem.host_ptr(*b).cast_const()).collect();
            let outs: Vec<*mut u8> = outputs.iter().map(|b| mem.host_ptr(*b)).collect();
            // SAFETY: loading placed every operand in the pinned arena at its
            // size; nothing on the GPU touches them while the stream is idle.
            unsafe { k.launch(&ins, &outs, cx.seed, cx.offset) };
            Ok(())
        }
        Instr::Kernel { kernel: CudaKernel::Attention(a), inputs, outputs } => {
            super::attention::run(cuda, a, inputs, outputs, cx)
        }
        Instr::Kernel { kernel: CudaKernel::Gemm(g), inputs, outputs } => {
            super::epilogue::run(cuda, g, inputs, outputs)
        }
        Instr::Kernel { kernel: CudaKernel::AdamW(a), .. } => super::adamw::run(cuda, a),
        Instr::Kernel { kernel: CudaKernel::Routine(r), .. } => super::routines::run(cuda, r),
        Instr::MatMul { shape, a, b, out } => {
            let g = gemm(shape, a.dtype);
            // SAFETY: loading checked the operands lie on the device, of one
            // type, at the shape's sizes; the plan never lets `out` overlap them.
            unsafe { cuda.blas.gemm(&g, mem.device_ptr(*a), mem.device_ptr(*b), mem.device_ptr(*out)) }
                .map_err(|e| e.to_string())
        }
        Instr::Copy { from, to } => copy(cuda, *from, *to),
        routine => match super::collective::run(cuda, routine, cx) {
            Some(done) => done,
            None => staged(cuda, routine, cx),
        },
    }
}

/// Runs a host routine on a staging copy of its buffers: each buffer is
/// downloaded into a host scratch arena, the routine runs there, and what
/// it writes is uploaded back.
fn staged(cuda: &Cuda, instr: &Instr<CudaKernel>, cx: &Ctx) -> Result<(), String> {
    settle(cuda)?;
    let mut local = instr.clone();
    let mut moves = Vec::new();
    let mut end = 0;
    local.for_each_buf(|b, access| {
        let there = Buf { place: Place::Host, offset: end, ..*b };
        moves.push((*b, there, access));
        end += b.bytes().div_ceil(STAGE_ALIGN) * STAGE_ALIGN;
        *b = there;
    });
    let scratch = Memory { device: Arena::new(0)?, host: Arena::new(end)?, nvme: None };
    for (b, there, _) in &moves {
        cuda.memory.download(*b, stage(&scratch, *there)).map_err(driver)?;
    }
    host::run_routine(&local, &scratch, cx)?;
    for (b, there, access) in &moves {
        if *access == Access::Write {
            cuda.memory.upload(*b, stage(&scratch, *there)).map_err(driver)?;
        }
    }
    Ok(())
}

/// A staged buffer's bytes in the scratch arena.
#[allow(clippy::mut_from_ref)]
fn stage(scratch: &Memory, b: Buf) -> &mut [u8] {
    // SAFETY: `b` was laid out inside the scratch arena, apart from the others.
    unsafe { std::slice::from_raw_parts_mut(scratch.ptr(b), b.bytes()) }
}

/// `buf` alone, staged: a scratch memory holding it at offset 0, and its place there.
fn alone(buf: Buf) -> Result<(Memory, Buf), String> {
    let scratch = Memory { device: Arena::new(0)?, host: Arena::new(buf.bytes())?, nvme: None };
    Ok((scratch, Buf { place: Place::Host, offset: 0, ..buf }))
}

pub fn read(cuda: &Cuda, buf: Buf, shape: Vec<usize>) -> Result<Tensor, String> {
    settle(cuda)?;
    let (scratch, there) = alone(buf)?;
    cuda.memory.download(buf, stage(&scratch, there)).map_err(driver)?;
    Ok(host::read_tensor(&scratch, there, shape))
}

pub fn write(cuda: &Cuda, buf: Buf, t: &Tensor) -> Result<(), String> {
    settle(cuda)?;
    let (scratch, there) = alone(buf)?;
    host::write_tensor(&scratch, there, t);
    cuda.memory.upload(buf, stage(&scratch, there)).map_err(driver)
}

pub fn fill(cuda: &Cuda, buf: Buf, value: f64) -> Result<(), String> {
    settle(cuda)?;
    let (scratch, there) = alone(buf)?;
    host::fill(&scratch, there, value);
    cuda.memory.upload(buf, stage(&scratch, there)).map_err(driver)
}

/// Host↔device: DMA on the copy stream. Device↔device without overlap:
/// DMA on the compute stream, after the pending copies it touches. Else
/// (host to host, or an overlapping device copy) through the CPU after
/// both streams are idle.
pub fn copy(cuda: &Cuda, from: Buf, to: Buf) -> Result<(), String> {
    cuda.gpu.context().bind_to_thread().map_err(driver)?;
    if from.place != to.place {
        if cuda.copies.copy(&cuda.memory, &cuda.compute, from, to).map_err(driver)? {
            return Ok(());
        }
    } else if from.place == Place::Device && !from.overlaps(&to) {
        cuda.copies.order(&cuda.compute, || vec![(from, false), (to, true)]).map_err(driver)?;
        if cuda.memory.copy_async(from, to, &cuda.compute).map_err(driver)? {
            return Ok(());
        }
    }
    settle(cuda)?;
    let n = from.bytes().min(to.bytes());
    let (scratch, there) = alone(from)?;
    cuda.memory.download(from, stage(&scratch, there)).map_err(driver)?;
    let bytes = Buf { len: n / to.dtype.size_bytes() as usize, ..to };
    cuda.memory.upload(bytes, &stage(&scratch, there)[..bytes.bytes()]).map_err(driver)
}
