//! The attention kernels' launch shapes: plain numbers from the template's
//! constants (`fma.cu` for the CUDA-core kernels, `mma.cu` and the rendered
//! tile for the tensor-core kernels), checked against a device's limits.

use super::{AttentionError, AttentionKernel, AttentionShape, Entry, Pass};
use crate::codegen::DeviceProperties;

/// Threads per block of every attention kernel: 4 warps (`ZP_THREADS`).
pub const THREADS: u32 = 128;
const WARPS: usize = 4;
/// A tensor-core tile's row stride beyond the head dim, in elements (`ZP_STRIDE` in `mma.cu`).
const MMA_PAD: usize = 8;
/// The grid's y extent, `B·H`, is at most this (CUDA's limit on `gridDim.y`).
pub const MAX_BLOCKS_Y: usize = 65_535;

/// How to launch one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelLaunch {
    /// The kernel launched.
    pub entry: Entry,
    /// `(⌈S/rows⌉, B·H)`, rows = [`AttentionKernel::rows_per_block`].
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
    /// The rows of one head a block owns (`ZP_ROWS`): query rows (forward,
    /// dQ) or key rows (dK/dV). CUDA cores: 4 a warp; tensor cores: 16 a
    /// warp, one m16 tile.
    pub fn rows_per_block(&self) -> usize {
        if self.tensor_cores { 16 * WARPS } else { 16 }
    }

    /// The other side's rows per shared-memory tile (`ZP_TILE`). CUDA
    /// cores: 64 in the forward (its online softmax reduces each row once a
    /// tile); 32 in the backward, which reduces nothing per tile: the
    /// smaller tile costs only barriers, and keeps a block at D = 64 to
    /// 25–26 KiB, 6 blocks in an A100's 164 KiB (with 64, 42–44 KiB: 3,
    /// under the attention floor of 4). Tensor cores: what keeps a thread
    /// within 128 registers (`ZP_MIN_BLOCKS`) without spilling, measured
    /// with ptxas 13.0 for sm_80 and sm_90: the forward's scores take
    /// `tile/2` registers and its output `D/2`, so `tile = 2048/D` (64, 32,
    /// 16); the backward holds scores and their gradients besides its
    /// accumulators: 32 at D ≤ 64, 16 at D = 128 (which also keeps a block's
    /// two 64-row operands of 136-element rows under 48 KiB).
    pub fn tile(&self, pass: Pass) -> usize {
        match (self.tensor_cores, pass) {
            (false, Pass::Forward) => 64,
            (false, Pass::Backward) => 32,
            (true, Pass::Forward) => 2048 / self.head_dim,
            (true, Pass::Backward) => {
                if self.head_dim <= 64 {
                    32
                } else {
                    16
                }
            }
        }
    }

    /// Whether the tensor-core dK/dV kernel walks the queries twice, dV
    /// then dK (`ZP_SPLIT`): from head dim 64 the two accumulators (D/2
    /// registers each) would not fit beside the products' operands, and
    /// recomputing `K·Qᵀ` costs one product in five of that kernel.
    pub fn split_dk_dv(&self) -> bool {
        self.tensor_cores && self.head_dim >= 64
    }

    /// Whether the tensor-core backward stages the other side's two
    /// operands (K and V, or Q and dO) in turn in one tile buffer
    /// (`ZP_ONE_BUFFER`), at two more barriers a tile: at head dim 128,
    /// where the block's own two 64-row operands of 136-element rows take
    /// 34 KiB and two 16-row buffers would bring a block to 43–44 KiB, 3 in
    /// an A100's 164 KiB (19% of its warp slots, under the attention floor
    /// of 25%); one brings it to 38–39 KiB, 4 blocks.
    pub fn one_operand_buffer(&self) -> bool {
        self.tensor_cores && self.head_dim >= 128
    }

    /// Static shared memory of `entry`, in bytes (the arrays its source declares).
    pub fn shared_bytes(&self, entry: Entry) -> u32 {
        let d = self.head_dim;
        let bytes = if self.tensor_cores {
            let (rows, stride, size) = (self.rows_per_block(), d + MMA_PAD, self.dtype.size_bytes() as usize);
            let buffers = if self.one_operand_buffer() { 1 } else { 2 };
            match entry {
                // q_s[rows], k_s, v_s[tile] rows of the storage type; live_s[tile] bool
                Entry::Forward => {
                    let tile = self.tile(Pass::Forward);
                    (rows + 2 * tile) * stride * size + tile
                }
                // q_s, do_s[rows], kv_s[buffers·tile] rows; lse_s, d_s[rows] f32; live_s[tile] bool
                Entry::BackwardDq => {
                    let tile = self.tile(Pass::Backward);
                    (2 * rows + buffers * tile) * stride * size + 2 * rows * 4 + tile
                }
                // k_s, v_s[rows], qdo_s[buffers·tile] rows; lse_s, d_s[tile] f32
                Entry::BackwardDkDv => {
                    let tile = self.tile(Pass::Backward);
                    (2 * rows + buffers * tile) * stride * size + 2 * tile * 4
                }
            }
        } else {
            let (rows, pad) = (self.rows_per_block(), d + 1);
            let floats = match entry {
                // q_s[16][D], k_s[tile][D+1], v_s[tile][D], p_s[4][tile]
                Entry::Forward => {
                    let tile = self.tile(Pass::Forward);
                    rows * d + tile * pad + tile * d + WARPS * tile
                }
                // q_s, do_s [16][D]; k_s, v_s [tile][D+1]; ds_s[4][tile]
                Entry::BackwardDq => {
                    let tile = self.tile(Pass::Backward);
                    2 * rows * d + 2 * tile * pad + WARPS * tile
                }
                // k_s, v_s [16][D]; q_s, do_s [tile][D+1]; lse_s, d_s [tile]; w_s[4][2][tile]
                Entry::BackwardDkDv => {
                    let tile = self.tile(Pass::Backward);
                    2 * rows * d + 2 * tile * pad + 2 * tile + 2 * WARPS * tile
                }
            };
            floats * 4
        };
        bytes as u32
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
        if self.tensor_cores && device.compute_capability < (8, 0) {
            return Err(AttentionError::TensorCoreArch(device.compute_capability));
        }
        let grid = (shape.seq.div_ceil(self.rows_per_block()) as u32, (shape.batch * shape.heads) as u32);
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
