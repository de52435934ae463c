//! How long one instruction takes on one GPU of a cluster.
//!
//! - GEMMs: a roofline, `max(FLOPs / (peak · η), bytes / (HBM · 0.85))`
//!   (a GEMM streams its operands no faster than any kernel,
//!   [`HBM_FRACTION`]), where the
//!   efficiency `η` is the achievable fraction of the datasheet peak
//!   ([`GEMM_PEAK_FRACTION`]) times the shape's losses: tile quantisation
//!   (cuBLAS tiles the output in 128 × 128 blocks; a 130-row product pays
//!   for 256), wave quantisation (tiles run in waves of one per SM; 133
//!   tiles on 132 SMs take two waves) and a short-`k` term (a tile's main
//!   loop needs some depth to hide its prologue: `k / (k + 64)`, which is
//!   why attention's head-dim-64 products run at half speed).
//! - Memory-bound kernels: their bytes at [`HBM_FRACTION`] of HBM bandwidth.
//! - Collectives: NCCL's own tuning model ([`super::nccl`]): the fastest
//!   of its algorithms (ring, tree, NVLink SHARP) and protocols (LL, LL128,
//!   Simple) for the message's size, `latency + bytes / bandwidth`, over the
//!   nodes the group spans.
//! - Copies: bytes over PCIe at the profile's host bandwidth.
//! - Host work (ZeRO-Offload's AdamW): bytes at [`HOST_BYTES_PER_SECOND`].
//! - With offloaded states on the NVMe tier, instructions that read or
//!   write them are timed by [`super::offload`]: the drives' share of each
//!   GPU against PCIe and the CPU, overlapped.
//!
//! Every other device instruction also pays [`LAUNCH_SECONDS`] (NCCL's base
//! latency already holds a collective's launch), or [`GRAPH_NODE_SECONDS`]
//! when the rank replays CUDA graphs ([`Launches::Graphs`]). The constants are
//! assumptions of the model, named here so they can be calibrated against a
//! GPU; docs/cost.md lists them with their sources.

use zeroplan_ir::plan::{Launches, OffloadTo};
use zeroplan_ir::spec::Cluster;
use zeroplan_ir::{DType, Op};

use super::nccl::{self, Collective, Fabric, Group};
use super::work::{Engine, GemmShape, Work};

/// Fraction of the datasheet's dense peak cuBLAS sustains on the products
/// of a training step, beyond what the shape terms below take: measured on an
/// H100 SXM at the fidelity rows' layer shapes (GPT-1.7B's QKV, projection
/// and MLP products, forward, input and weight gradients, M = 8,192 and
/// 32,768; `bench/gpu/gemm_sweep.py`, bench/RESULTS.md 2026-11-28): the
/// median of 24 products' rate over `peak × shape efficiency` is 0.706
/// (quartiles 0.665–0.733), where one 8192³ product reaches 0.80. A100 and
/// V100 are taken to sustain the same fraction (unmeasured here; the best
/// shapes reach 86 % of an A100's peak and 80 % of an H100's in Bekman's
/// MAMF measurements, so A100 may be a little faster than this).
pub const GEMM_PEAK_FRACTION: f64 = 0.71;
/// Output tile edge of the tensor-core GEMM kernels, elements.
pub const GEMM_TILE: u64 = 128;
/// `k` at which a GEMM's main loop runs at half efficiency.
pub const GEMM_K_HALF: f64 = 64.0;
/// Fraction of HBM bandwidth a streaming kernel reaches, and a GEMM whose
/// operands' bytes outlast its arithmetic: attention's batched products of
/// the s × s probabilities ran at 2.59–2.76 TB/s on an H100 (torch
/// `matmul`, head dims 96 and 128, 2,048 and 4,096 keys; 77–82 % of 3.35 TB/s;
/// bench/RESULTS.md, 2026-11-28).
pub const HBM_FRACTION: f64 = 0.85;
/// Launch overhead of one kernel, GEMM, copy or collective, seconds (eager
/// launches).
pub const LAUNCH_SECONDS: f64 = 4e-6;
/// What one instruction costs inside a replayed CUDA graph, seconds: CUDA.jl
/// measured 80 small broadcast kernels at 260 µs launched one by one
/// (3.25 µs each, near [`LAUNCH_SECONDS`]) and 70 µs as one graph, 3.5 µs
/// of it on the CPU (<https://cuda.juliagpu.org/dev/usage/graphs/>):
/// 0.875 µs a node, the kernels' own run included, so an upper bound.
/// The graphs' own launches (a few per step) are not counted.
pub const GRAPH_NODE_SECONDS: f64 = 0.875e-6;
/// Host memory traffic of the host optimizer per rank, bytes/s: DeepSpeed's
/// CPU-Adam (AVX-512, every core) updates on the order of 1G parameters/s
/// per GPU's share of a node (Ren et al., ZeRO-Offload, 2021), ≈ 28 bytes
/// read and written per fp32 parameter.
pub const HOST_BYTES_PER_SECOND: f64 = 25e9;

/// A GPU of a cluster, computing in one dtype, with its offloaded states
/// on one tier.
#[derive(Clone, Debug)]
pub struct Machine {
    pub cluster: Cluster,
    /// The dtype GEMMs compute in (the training precision).
    pub dtype: DType,
    /// Where host-placed model states live: CPU memory or the node's NVMe.
    pub offload_to: OffloadTo,
    /// How device instructions are launched: the launch term follows it.
    pub launches: Launches,
}

impl Machine {
    /// The same GPU with its offloaded states on `tier`.
    pub fn offloading_to(&self, tier: OffloadTo) -> Machine {
        Machine { offload_to: tier, ..self.clone() }
    }

    /// What launching one kernel, GEMM or copy costs, seconds.
    pub fn launch_seconds(&self) -> f64 {
        match self.launches {
            Launches::Eager => LAUNCH_SECONDS,
            Launches::Graphs => GRAPH_NODE_SECONDS,
        }
    }

    /// Peak tensor throughput for this dtype, FLOP/s (the f32 peak where
    /// the GPU has no tensor cores for it).
    pub fn peak_flops(&self) -> f64 {
        self.cluster.gpu.peak_flops(self.dtype).unwrap_or(self.cluster.gpu.peak_tflops.f32 * 1e12)
    }

    /// Seconds `work` (of node op `op`) takes on one of `tensor_parallel`
    /// tensor ranks: a replica's tensor ranks are consecutive GPUs, so a
    /// data-parallel group of `r` ranks spreads over `r·tensor_parallel`
    /// of them and leaves a node sooner than a tensor-parallel group does.
    pub fn seconds(&self, op: &Op, work: &Work, tensor_parallel: u64) -> f64 {
        let gpu = &self.cluster.gpu;
        // Device memory streamed at what a kernel reaches, GEMM or not.
        let streamed = || work.bytes / (gpu.hbm_gbps * 1e9 * HBM_FRACTION);
        match work.engine {
            Engine::Free => 0.0,
            Engine::Gemm => {
                let efficiency = GEMM_PEAK_FRACTION * work.gemm.map_or(1.0, |g| self.shape_efficiency(g));
                self.launch_seconds() + (work.flops / (self.peak_flops() * efficiency)).max(streamed())
            }
            Engine::Kernel => self.launch_seconds() + streamed(),
            Engine::Copy => self.launch_seconds() + work.bytes / (gpu.host_gbps * 1e9),
            Engine::Host => work.bytes / HOST_BYTES_PER_SECOND,
            Engine::Collective => {
                // (what it computes, its ranks, the consecutive GPUs they span)
                let (collective, ranks, span) = match *op {
                    Op::AllReduce { ranks } => (Collective::AllReduce, ranks, ranks * tensor_parallel),
                    Op::ReduceScatter { ranks } => (Collective::ReduceScatter, ranks, ranks * tensor_parallel),
                    Op::AllGather { ranks } => (Collective::AllGather, ranks, ranks * tensor_parallel),
                    Op::TensorAllReduce { ranks } => (Collective::AllReduce, ranks, ranks),
                    Op::SequenceAllGather { ranks, .. } => (Collective::AllGather, ranks, ranks),
                    Op::SequenceReduceScatter { ranks } => (Collective::ReduceScatter, ranks, ranks),
                    _ => unreachable!("only collectives run on the collective engine"),
                };
                if ranks < 2 {
                    // NCCL copies the buffer, if anything.
                    return LAUNCH_SECONDS;
                }
                nccl::fastest(collective, work.bytes, self.group(ranks, span), &Fabric::of(gpu)).seconds
            }
        }
    }

    /// The NCCL communicator of `ranks` ranks among `span` consecutive
    /// GPUs: inside one node, or spread evenly over the nodes the span
    /// covers (a data-parallel group strided by the tensor-parallel degree
    /// has `gpus_per_node / tensor_parallel` ranks on each).
    pub fn group(&self, ranks: u64, span: u64) -> Group {
        Group { ranks, nodes: span.div_ceil(self.cluster.gpus_per_node.max(1)).clamp(1, ranks.max(1)) }
    }

    /// Tile, wave and short-`k` efficiency of one GEMM shape, in (0, 1].
    pub fn shape_efficiency(&self, g: GemmShape) -> f64 {
        let tiles_along = |d: u64| d.div_ceil(GEMM_TILE).max(1);
        let tile_fill = (g.m * g.n) as f64 / ((tiles_along(g.m) * tiles_along(g.n) * GEMM_TILE * GEMM_TILE) as f64);
        let tiles = g.batch.max(1) * tiles_along(g.m) * tiles_along(g.n);
        let sms = self.cluster.gpu.sm_count.max(1);
        let wave_fill = tiles as f64 / (tiles.div_ceil(sms) * sms) as f64;
        let depth = g.k as f64 / (g.k as f64 + GEMM_K_HALF);
        (tile_fill * wave_fill * depth).clamp(1e-3, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeroplan_ir::spec::{Cluster, GpuProfile};

    fn h100(launches: Launches) -> Machine {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/gpus/h100-80gb-sxm.ron");
        let gpu = GpuProfile::load(&path).unwrap();
        let cluster = Cluster { nodes: 1, gpus_per_node: 8, gpu, memory_budget: None, host_memory: None, nvme: None };
        Machine { cluster, dtype: DType::BF16, offload_to: OffloadTo::Cpu, launches }
    }

    /// A replayed graph's instruction pays a graph node's cost, an eager
    /// one a launch; host work and collectives are not launched by the rank.
    #[test]
    fn the_launch_term_follows_the_mode() {
        let (eager, graphs) = (h100(Launches::Eager), h100(Launches::Graphs));
        let kernel = Work { engine: Engine::Kernel, flops: 0.0, bytes: 1e6, gemm: None };
        let copy = Work { engine: Engine::Copy, ..kernel };
        let host = Work { engine: Engine::Host, ..kernel };
        let op = Op::Input;
        for w in [kernel, copy] {
            let saved = eager.seconds(&op, &w, 1) - graphs.seconds(&op, &w, 1);
            assert!((saved - (LAUNCH_SECONDS - GRAPH_NODE_SECONDS)).abs() < 1e-12, "{saved}");
        }
        assert_eq!(eager.seconds(&op, &host, 1), graphs.seconds(&op, &host, 1));
        assert_eq!(eager.launch_seconds(), LAUNCH_SECONDS);
    }
}
