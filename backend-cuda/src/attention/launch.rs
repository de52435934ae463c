//! The attention kernels' launch shapes: plain numbers from the template's
//! constants (`common.cu`), checked against a device's limits.

use super::{AttentionError, AttentionKernel, AttentionShape, Entry, Pass};
use crate::codegen::DeviceProperties;

/// Threads per block of every attention kernel: 4 warps (`ZP_THREADS`).
pub const THREADS: u32 = 128;
/// The rows of one head a block owns (`ZP_ROWS`): query rows (forward, dQ)
/// or key rows (dK/dV).
pub const ROWS_PER_BLOCK: usize = 16;
/// The other side's rows per shared-memory tile (`ZP_TILE`).
const TILE: usize = 64;
const WARPS: usize = 4;
/// The grid's y extent, `B·H`, is at most this (CUDA's limit on `gridDim.y`).
pub const MAX_BLOCKS_Y: usize = 65_535;

/// How to launch one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelLaunch {
    /// The kernel launched.
    pub entry: Entry,
    /// `(⌈S/16⌉, B·H)`.
    pub grid: (u32, u32),
    /// Threads per block: [`THREADS`].
    pub block: u32,
    /// Static shared memory per block (declared in the source: nothing to
    /// pass at launch).
    pub shared_bytes: u32,
}

/// The launches of one pass, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionLaunch {
    /// One launch per kernel of the pass, in [`Pass::entries`] order.
    pub kernels: Vec<KernelLaunch>,
}

/// The sizes the kernels take as `int`, and a grid CUDA can launch.
pub(super) fn check_shape(shape: AttentionShape) -> Result<(), AttentionError> {
    let AttentionShape { batch, heads, seq } = shape;
    let error = |message: &str| AttentionError::Shape { batch, heads, seq, message: message.to_string() };
    if batch == 0 || heads == 0 || seq == 0 {
        return Err(error("empty tensors: nothing to launch, skip the op"));
    }
    let blocks_y = batch.checked_mul(heads).filter(|&n| n <= MAX_BLOCKS_Y);
    if blocks_y.is_none() {
        return Err(error("batch × heads is over 65,535 (CUDA's grid y limit): split the batch"));
    }
    // Flat element indices are 64-bit in the kernels; the sequence length is an int.
    if seq > i32::MAX as usize / 2 {
        return Err(error("the sequence length overflows the kernels' int"));
    }
    Ok(())
}

impl AttentionKernel {
    /// Static shared memory of `entry`, in bytes (the arrays its source declares).
    pub fn shared_bytes(&self, entry: Entry) -> u32 {
        let (d, pad) = (self.head_dim, self.head_dim + 1);
        let floats = match entry {
            // q_s[16][D], k_s[64][D+1], v_s[64][D], p_s[4][64]
            Entry::Forward => ROWS_PER_BLOCK * d + TILE * pad + TILE * d + WARPS * TILE,
            // q_s, do_s [16][D]; k_s, v_s [64][D+1]; ds_s[4][64]
            Entry::BackwardDq => 2 * ROWS_PER_BLOCK * d + 2 * TILE * pad + WARPS * TILE,
            // k_s, v_s [16][D]; q_s, do_s [64][D+1]; lse_s, d_s [64]; w_s[4][2][64]
            Entry::BackwardDkDv => 2 * ROWS_PER_BLOCK * d + 2 * TILE * pad + 2 * TILE + 2 * WARPS * TILE,
        };
        (floats * 4) as u32
    }

    /// The launches of `pass` over tensors of `shape` on `device`.
    pub fn launch(
        &self,
        pass: Pass,
        shape: AttentionShape,
        device: &DeviceProperties,
    ) -> Result<AttentionLaunch, AttentionError> {
        self.check()?;
        check_shape(shape)?;
        let grid = (shape.seq.div_ceil(ROWS_PER_BLOCK) as u32, (shape.batch * shape.heads) as u32);
        let kernels = pass
            .entries()
            .iter()
            .map(|&entry| {
                let shared_bytes = self.shared_bytes(entry);
                if shared_bytes > device.shared_memory_per_block {
                    return Err(AttentionError::SharedMemory {
                        entry: entry.label(),
                        needed: shared_bytes,
                        available: device.shared_memory_per_block,
                    });
                }
                Ok(KernelLaunch { entry, grid, block: THREADS, shared_bytes })
            })
            .collect::<Result<_, _>>()?;
        Ok(AttentionLaunch { kernels })
    }
}
