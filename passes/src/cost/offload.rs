//! The offload tiers' costs: CPU memory and NVMe (ZeRO-Infinity,
//! Rajbhandari et al., SC'21).
//!
//! Offloaded model states (fp32 masters, AdamW moments, under
//! `optimizer+params` the 16-bit parameter shards, and the gradient shards
//! the backward copies down for the host optimizer) are host-placed values
//! of the step's graph. On the CPU tier they are read where they lie; on
//! the NVMe tier every instruction that reads one streams it from the
//! node's drives through pinned CPU buffers, and every update of one is
//! written back to them. A node's drives serve all its GPUs at once — the
//! data-parallel ranks run the same instruction at the same time — so each
//! GPU gets `1/gpus_per_node` of the drives' bandwidth.
//!
//! - A parameter shard's host → device copy streams drive → pinned buffer
//!   → GPU in chunks, overlapped: the slower of the GPU's PCIe link and its
//!   share of the drives sets the pace.
//! - The host optimizer streams its states in chunks: read, CPU AdamW,
//!   write back, each chunk's read overlapping the previous one's update
//!   and write (DeepSpeed's pipelined optimizer swapper): the slower of the
//!   CPU and the drives sets the pace. Reads and writes share the drives,
//!   so their times add. The pipeline's fill and drain (one chunk) are not
//!   counted: the step streams hundreds of chunks.
//!
//! Bandwidth-centric partitioning (ZeRO-Infinity §6.1): each of `N`
//! data-parallel ranks reads its `1/N` shard over its own PCIe link and the
//! shards are then all-gathered over NVLink and the network, which the
//! `partition` pass builds; [`parameter_fetch`] sets that against one rank
//! reading the whole parameter, which the cost model shows in `inspect`.

use std::collections::HashMap;
use zeroplan_ir::plan::OffloadTo;
use zeroplan_ir::{Bindings, Graph, NodeIndex, Op, Phase, Place, Value};

use super::time::Machine;

/// Bytes of offloaded model states one instruction reads and writes back.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StateTraffic {
    pub read: f64,
    pub written: f64,
}

/// Whether `n` is an offloaded model state: a parameter or optimizer state
/// that lives on the host across steps, or a gradient shard the backward
/// copied to the host for the host optimizer (it lives until the optimizer
/// phase, and on the NVMe tier it waits on the drives as DeepSpeed's
/// optimizer swapper keeps it).
pub fn is_offloaded_state(graph: &Graph, n: NodeIndex) -> bool {
    let node = graph.node(n);
    node.place == Place::Host && matches!(node.op, Op::Param { .. } | Op::State { .. })
        || is_offloaded_gradient(graph, n)
}

/// Whether `n` copies a gradient shard to the host during the backward.
fn is_offloaded_gradient(graph: &Graph, n: NodeIndex) -> bool {
    let node = graph.node(n);
    node.place == Place::Host && node.phase == Phase::Backward && node.op == Op::Copy
}

/// Per instruction, the offloaded states it reads (operands that are
/// such states) and writes back (values that update one, and the
/// gradient shards copied down).
pub fn state_traffic(graph: &Graph, bindings: &Bindings) -> HashMap<NodeIndex, StateTraffic> {
    let mut out: HashMap<NodeIndex, StateTraffic> = HashMap::new();
    let size = |v| graph.value_type(v).size_bytes(bindings).unwrap_or(0) as f64;
    for n in graph.node_indices() {
        for v in graph.operands(n).iter().copied() {
            if is_offloaded_state(graph, v.node) {
                out.entry(n).or_default().read += size(v);
            }
        }
        if is_offloaded_gradient(graph, n) {
            out.entry(n).or_default().written += size(Value { node: n, output: 0 });
        }
    }
    for &(target, value) in &graph.updates {
        if is_offloaded_state(graph, target) {
            out.entry(value.node).or_default().written += size(value);
        }
    }
    out
}

/// Bytes of offloaded states each GPU keeps across steps: what the NVMe
/// tier holds for it.
pub fn state_bytes(graph: &Graph, bindings: &Bindings) -> u64 {
    graph
        .node_indices()
        .filter(|&n| is_offloaded_state(graph, n))
        .map(|n| graph.node(n).outputs.iter().map(|t| t.size_bytes(bindings).unwrap_or(0)).sum::<u64>())
        .sum()
}

impl Machine {
    /// Each GPU's share of its node's NVMe read and write bandwidth,
    /// bytes/s, when all the node's GPUs stream at once; `None` without
    /// an NVMe tier.
    pub fn nvme_share(&self) -> Option<(f64, f64)> {
        let nvme = self.cluster.nvme?;
        let gpus = self.cluster.gpus_per_node.max(1) as f64;
        Some((nvme.read_gbps * 1e9 / gpus, nvme.write_gbps * 1e9 / gpus))
    }

    /// Seconds of an instruction, timed `cpu_tier_seconds` with its
    /// states in CPU memory, that moves `states` of offloaded states, on
    /// this machine's tier. A copy's PCIe transfer and a host AdamW's CPU
    /// work overlap the drives' chunks, so the slower of the two sets the
    /// time; reads and writes share the drives, so theirs add.
    pub fn tiered_seconds(&self, cpu_tier_seconds: f64, states: StateTraffic) -> f64 {
        match self.streaming_share() {
            Some((read, write)) => cpu_tier_seconds.max(states.read / read + states.written / write),
            None => cpu_tier_seconds,
        }
    }

    /// Whether offloaded states stream from the drives, so that what an
    /// instruction moves of them can change its time
    /// ([`Machine::tiered_seconds`]).
    pub fn streams_states_from_nvme(&self) -> bool {
        self.streaming_share().is_some()
    }

    /// [`Machine::nvme_share`] where the offloaded states live on the
    /// drives: the one condition both of the above ask.
    fn streaming_share(&self) -> Option<(f64, f64)> {
        self.nvme_share().filter(|_| self.offload_to == OffloadTo::Nvme)
    }
}

/// What fetching one whole offloaded parameter tensor onto the GPUs costs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParameterFetch {
    /// Every data-parallel rank reads its `1/N` shard at once over its own
    /// link; the all-gather that follows runs on the GPU fabric.
    pub bandwidth_centric_seconds: f64,
    /// One rank per tensor slice reads the whole slice over its one link
    /// (and would then broadcast it), the slices' readers at once.
    pub single_reader_seconds: f64,
}

/// Seconds to read `bytes` of an offloaded parameter (the whole tensor, or
/// one tensor rank's slice of it) from this machine's tier by `ranks`
/// data-parallel ranks, each reading its `1/ranks` shard, against one rank
/// reading it all (one per slice: the `tensor_parallel` slices are read at
/// once either way). A rank's read runs at the slower of its PCIe link and
/// its share of its node's drives, which every GPU of the node reading at
/// once divides (the drives only on the NVMe tier: CPU memory outruns a
/// node's PCIe links together, 16 × 12 GB/s against the DGX-2's two sockets
/// of six DDR4-2666 channels, 256 GB/s). Where the drives are what bounds
/// one node's readers, more readers on that node gain nothing: what
/// bandwidth-centric partitioning adds is the other nodes' drives and the
/// links a lone reader leaves idle.
pub fn parameter_fetch(machine: &Machine, bytes: f64, ranks: u64, tensor_parallel: u64) -> ParameterFetch {
    let pcie = machine.cluster.gpu.host_gbps * 1e9;
    let nvme = machine.cluster.nvme.filter(|_| machine.offload_to == OffloadTo::Nvme);
    let per_node = (ranks * tensor_parallel.max(1)).clamp(1, machine.cluster.gpus_per_node.max(1));
    let rate = |readers_on_node: u64| match nvme {
        Some(n) => pcie.min(n.read_gbps * 1e9 / readers_on_node as f64),
        None => pcie,
    };
    ParameterFetch {
        bandwidth_centric_seconds: bytes / ranks.max(1) as f64 / rate(per_node),
        single_reader_seconds: bytes / rate(tensor_parallel.clamp(1, machine.cluster.gpus_per_node.max(1))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeroplan_ir::DType;
    use zeroplan_ir::spec::{Cluster, GpuProfile, Nvme};

    /// V100-32GB nodes of 16 GPUs (DGX-2s), their states on `tier`.
    fn dgx2(nodes: u64, tier: OffloadTo) -> Machine {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/gpus/v100-32gb.ron");
        let gpu = GpuProfile::load(&path).unwrap();
        let nvme = Nvme { bytes: 28 << 40, read_gbps: 25.0, write_gbps: 22.7 };
        let cluster =
            Cluster { nodes, gpus_per_node: 16, gpu, memory_budget: None, host_memory: None, nvme: Some(nvme) };
        Machine { cluster, dtype: DType::F16, offload_to: tier, launches: Default::default() }
    }

    /// From CPU memory each rank's PCIe link is its own: 16 ranks reading
    /// a 16th each are 16 times faster than one reading it all.
    #[test]
    fn bandwidth_centric_reads_from_cpu_memory_scale_with_the_ranks() {
        let bytes = 2e12; // a 1T-parameter model in fp16
        let f = parameter_fetch(&dgx2(1, OffloadTo::Cpu), bytes, 16, 1);
        assert!((f.single_reader_seconds / f.bandwidth_centric_seconds - 16.0).abs() < 1e-9, "{f:?}");
        assert!((f.single_reader_seconds - bytes / 12e9).abs() < 1e-6, "one V100's PCIe at 12 GB/s");
    }

    /// From NVMe a node's drives are shared: in one DGX-2 the 16 ranks
    /// together read at the drives' 25 GB/s against one rank's 12 GB/s of
    /// PCIe; over 32 nodes each node's drives serve its own 16 ranks, so
    /// the 512 ranks read 32 × 25 GB/s, ~67 times one rank.
    #[test]
    fn bandwidth_centric_reads_from_nvme_scale_with_the_nodes() {
        let bytes = 64e12; // a 32T-parameter model in fp16
        let one = parameter_fetch(&dgx2(1, OffloadTo::Nvme), bytes, 16, 1);
        assert!((one.bandwidth_centric_seconds - bytes / 25e9).abs() / one.bandwidth_centric_seconds < 1e-9);
        assert!((one.single_reader_seconds / one.bandwidth_centric_seconds - 25.0 / 12.0).abs() < 1e-9, "{one:?}");
        let many = parameter_fetch(&dgx2(32, OffloadTo::Nvme), bytes, 512, 1);
        let speedup = many.single_reader_seconds / many.bandwidth_centric_seconds;
        assert!((speedup - 32.0 * 25.0 / 12.0).abs() < 1e-6, "{speedup}");
        // Tensor ranks read their slices at once too: 2 data-parallel
        // ranks of 8 tensor ranks fill the node, and share its drives.
        let sliced = parameter_fetch(&dgx2(1, OffloadTo::Nvme), bytes / 8.0, 2, 8);
        assert!((sliced.bandwidth_centric_seconds - bytes / 8.0 / 2.0 / (25e9 / 16.0)).abs() < 1e-6, "{sliced:?}");
        // The lone readers, one per slice, share those drives too: 8 of
        // them at 25/8 GB/s each, and on one node the two ways tie.
        assert!((sliced.single_reader_seconds - bytes / 8.0 / (25e9 / 8.0)).abs() < 1e-6, "{sliced:?}");
        assert!((sliced.single_reader_seconds - sliced.bandwidth_centric_seconds).abs() < 1e-6, "{sliced:?}");
    }

    /// The host optimizer on NVMe: reading and writing a GPU's share of
    /// states through the drives takes their bytes over its 16th of the
    /// drives' bandwidth, and the CPU's work hides under it (or the reverse).
    #[test]
    fn nvme_streaming_runs_at_the_slower_of_the_drives_and_the_cpu() {
        let nvme = dgx2(1, OffloadTo::Nvme);
        let states = StateTraffic { read: 12e9, written: 12e9 };
        let drives = 12e9 / (25e9 / 16.0) + 12e9 / (22.7e9 / 16.0);
        assert!((nvme.tiered_seconds(1.0, states) - drives).abs() < 1e-9);
        assert_eq!(nvme.tiered_seconds(1e4, states), 1e4, "a slower CPU sets the pace");
        // On the CPU tier the states are where AdamW reads them.
        assert_eq!(dgx2(1, OffloadTo::Cpu).tiered_seconds(1.0, states), 1.0);
        // Without an NVMe tier nothing streams, whatever the machine says.
        let mut none = nvme.clone();
        none.cluster.nvme = None;
        assert_eq!(none.tiered_seconds(1.0, states), 1.0);
    }
}
