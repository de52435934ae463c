//! The cost model that decides merges: seconds on one GPU.
//!
//! A GEMM `[M, K] @ [K, N]` in a dtype takes
//!
//! ```text
//! time = max(compute, memory) + launch
//! compute = 2·M·N·K / (peak(dtype) · efficiency(M, N, K)) · quantisation
//! memory  = (M·K + N·K + M·N) · bytes(dtype) / bandwidth
//! efficiency = min over d ∈ {M, N, K} of d / (d + half_efficiency_dim)
//! quantisation = waves · sm_count / tiles ≥ 1
//! tiles = ⌈M / tile_m⌉ · ⌈N / tile_n⌉, waves = ⌈tiles / sm_count⌉
//! ```
//!
//! `efficiency` is a smooth tile-utilisation term: a dimension much smaller
//! than a tile leaves most of each tile's MMA work idle, and it reaches half
//! efficiency at `half_efficiency_dim`. `quantisation` charges the idle SMs
//! of the last partial wave: the kernel takes as long as `waves` full waves.
//!
//! Merging `n` matmuls that share their left operand into one costs
//!
//! ```text
//! merged = gemm(M, Σnᵢ, K) + copy(concat of the weights) + copy(split of the output)
//! ```
//!
//! - the **concat** of the weights is a planned copy each step: the
//!   weights stay separate parameters (Hugging Face checkpoints store Q, K
//!   and V as separate tensors), so it reads and writes `Σnᵢ·K` elements. It
//!   is charged no launch: the concats of all layers depend on no activation
//!   and go in one multi-tensor copy, and a memory planner that places the
//!   weights adjacently turns it into a view.
//! - the **split** of the merged output along its last axis yields strided
//!   pieces; the model prices gathering them as one read and write of the
//!   `M·Σnᵢ` output (no launch: it is folded into the consumers' kernels,
//!   which still pay the traffic). This is the term that grows with `M`:
//!   merging wins at small `M`, where launch overhead and poor tile
//!   utilisation dominate, and can lose at large `M`, where every GEMM runs
//!   at peak and the split's traffic is pure overhead — MosaicBERT's finding
//!   for its fused GLU (faster at small per-GPU batch, slightly slower at
//!   large).

use zeroplan_ir::DType;

/// Throughput parameters of one GPU. [`GpuCostModel::h100_sxm`] is the default.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuCostModel {
    /// Dense tensor-core FLOP/s for bf16 and f16.
    pub peak_flops_16bit: f64,
    /// FLOP/s for f32 matmuls (no TF32: the reference semantics are f32).
    pub peak_flops_f32: f64,
    /// HBM bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Fixed cost of one kernel launch, seconds.
    pub launch_overhead: f64,
    /// Streaming multiprocessors: the tiles that run at once.
    pub sm_count: u64,
    /// Output tile of one thread block.
    pub tile_m: u64,
    pub tile_n: u64,
    /// The dimension at which the tile-utilisation efficiency is one half.
    pub half_efficiency_dim: f64,
}

impl Default for GpuCostModel {
    fn default() -> Self {
        GpuCostModel::h100_sxm()
    }
}

impl GpuCostModel {
    /// NVIDIA H100 SXM5 (datasheet): 989 TFLOP/s dense bf16/f16, 67 TFLOP/s
    /// f32, 3.35 TB/s HBM3, 132 SMs; ~5 µs per launch including framework
    /// dispatch; 128×128 output tiles (cuBLAS/CUTLASS Hopper defaults);
    /// half efficiency at 64 (a 64-wide dimension fills half a tile).
    pub fn h100_sxm() -> GpuCostModel {
        GpuCostModel {
            peak_flops_16bit: 989e12,
            peak_flops_f32: 67e12,
            bandwidth: 3.35e12,
            launch_overhead: 5e-6,
            sm_count: 132,
            tile_m: 128,
            tile_n: 128,
            half_efficiency_dim: 64.0,
        }
    }

    fn peak(&self, dtype: DType) -> f64 {
        match dtype {
            DType::BF16 | DType::F16 => self.peak_flops_16bit,
            _ => self.peak_flops_f32,
        }
    }

    /// Seconds of one `[M, K] @ [K, N]` GEMM, launch included.
    pub fn gemm_seconds(&self, m: u64, n: u64, k: u64, dtype: DType) -> f64 {
        let (mf, nf, kf) = (m as f64, n as f64, k as f64);
        let efficiency = [mf, nf, kf].iter().map(|d| d / (d + self.half_efficiency_dim)).fold(1.0, f64::min);
        let tiles = m.div_ceil(self.tile_m).max(1) * n.div_ceil(self.tile_n).max(1);
        let waves = tiles.div_ceil(self.sm_count);
        let quantisation = (waves * self.sm_count) as f64 / tiles as f64;
        let compute = 2.0 * mf * nf * kf / (self.peak(dtype) * efficiency) * quantisation;
        let memory = (mf * kf + nf * kf + mf * nf) * dtype.size_bytes() as f64 / self.bandwidth;
        compute.max(memory) + self.launch_overhead
    }

    /// Seconds to read and write `elements` of `dtype` (no launch; see the module docs).
    pub fn copy_seconds(&self, elements: u64, dtype: DType) -> f64 {
        2.0 * elements as f64 * dtype.size_bytes() as f64 / self.bandwidth
    }

    /// The separate and merged costs of matmuls `[M, K] @ [K, nᵢ]`.
    pub fn compare(&self, m: u64, ns: &[u64], k: u64, dtype: DType) -> MergeCost {
        let separate = ns.iter().map(|&n| self.gemm_seconds(m, n, k, dtype)).sum();
        let total: u64 = ns.iter().sum();
        let gemm = self.gemm_seconds(m, total, k, dtype);
        let concat = self.copy_seconds(total * k, dtype);
        let split = self.copy_seconds(m * total, dtype);
        MergeCost { separate, gemm, concat, split }
    }
}

/// The two alternatives for one group, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MergeCost {
    /// Σ of the separate GEMMs.
    pub separate: f64,
    /// The merged GEMM.
    pub gemm: f64,
    /// The weight concat.
    pub concat: f64,
    /// The output split.
    pub split: f64,
}

impl MergeCost {
    pub fn merged(&self) -> f64 {
        self.gemm + self.concat + self.split
    }

    /// Merging is chosen when strictly cheaper.
    pub fn merge(&self) -> bool {
        self.merged() < self.separate
    }
}
