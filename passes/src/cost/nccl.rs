//! How long NCCL takes for one collective, the way NCCL's own tuner
//! predicts it.
//!
//! NCCL picks, for every call, the algorithm and protocol its model says is
//! fastest for that size: `time = latency + bytes / algorithm bandwidth`
//! (`ncclTopoGetAlgoTime` in NCCL's `src/graph/tuning.cc`). The message is
//! cut into chunks that flow through the ring or tree as a pipeline, so the
//! bandwidth term is the whole message over the bus bandwidth — not one
//! round-trip latency per step added to it. What a step costs is a small
//! per-hop latency (0.6–3.4 µs over NVLink, by protocol), which NCCL counts
//! per ring step; a tree pays it per level, so across many nodes the tree
//! wins for small and medium messages and the ring for large ones.
//!
//! The structure and every constant below are NCCL's, from `tuning.cc`
//! (`ncclTunerConstantsDefaults`, `ncclTopoTuneModel`, `ncclTopoGetAlgoTime`),
//! `src/graph/search.cc` (the per-channel speed arrays) and `src/graph/topo.h`
//! (the link bandwidths NCCL credits), read at NVIDIA/nccl master of 2026.
//!
//! - **Algorithms**: ring; tree (a chain inside each node, a double binary
//!   tree across nodes — NCCL's hierarchical all-reduce); NVLS (NVLink SHARP:
//!   the NVSwitch reduces and multicasts, one node) and NVLS-tree (NVLS inside
//!   each node, a tree across nodes), only where the profile's fabric has
//!   NVLink SHARP.
//! - **Protocols**: LL (8-byte stores with a flag: lowest latency, half the
//!   bandwidth), LL128 (128-byte lines, 120 of them payload) and Simple
//!   (bulk copies with fences: full bandwidth, the highest latency).
//!
//! What NCCL knows and this model does not: the channel count its topology
//! search settles on, so the per-channel bandwidth caps (`perChMaxTreeBws`,
//! `perChMaxRingLL128Bws`) are left out; and the host CPU's vendor, so the
//! network overhead and the multi-node LL caps are those of an Intel host.

use zeroplan_ir::spec::GpuProfile;

/// What a collective computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
}

/// How the ranks exchange the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    Ring,
    Tree,
    Nvls,
    NvlsTree,
}

/// How each chunk is sent and its arrival signalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Ll,
    Ll128,
    Simple,
}

impl Algorithm {
    pub const ALL: [Algorithm; 4] = [Algorithm::Ring, Algorithm::Tree, Algorithm::Nvls, Algorithm::NvlsTree];
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Ll, Protocol::Ll128, Protocol::Simple];

    /// The column of NCCL's tables (LL, LL128, Simple).
    fn index(self) -> usize {
        self as usize
    }
}

/// Base latency of a collective by algorithm, µs per protocol
/// (`baseLatencies`): the launch and the synchronisation every call pays.
/// NVLS pays only its hardware latency.
const BASE_LATENCY_US: [(Algorithm, [f64; 3]); 4] = [
    (Algorithm::Tree, [6.8, 14.0, 8.4]),
    (Algorithm::Ring, [6.6, 14.0, 8.4]),
    (Algorithm::Nvls, [0.0, 0.0, 0.0]),
    (Algorithm::NvlsTree, [0.0, 0.0, 0.0]),
];

/// Latency of one hop, µs per protocol (`hwLatencies`), by link: NVLink,
/// PCIe, the network.
const NVLINK_HOP_US: [(Algorithm, [f64; 3]); 4] = [
    (Algorithm::Tree, [0.6, 1.25, 4.0]),
    (Algorithm::Ring, [0.6, 1.9, 3.4]),
    (Algorithm::Nvls, [0.0, 0.0, 25.0]),
    (Algorithm::NvlsTree, [0.0, 0.0, 25.0]),
];
const PCI_HOP_US: [(Algorithm, [f64; 3]); 4] = [
    (Algorithm::Tree, [1.0, 1.9, 4.0]),
    (Algorithm::Ring, [1.0, 2.5, 5.7]),
    (Algorithm::Nvls, [0.0, 0.0, 0.0]),
    (Algorithm::NvlsTree, [0.0, 0.0, 0.0]),
];
const NET_HOP_US: [(Algorithm, [f64; 3]); 4] = [
    (Algorithm::Tree, [5.0, 8.5, 14.0]),
    (Algorithm::Ring, [2.7, 4.0, 14.0]),
    (Algorithm::Nvls, [0.0, 0.0, 18.0]),
    (Algorithm::NvlsTree, [0.0, 0.0, 20.9]),
];

/// Host overhead of posting one network transfer, µs (`getNetOverhead`:
/// 1 µs on an Intel x86 host, 2 on AMD); Simple posts three per step.
const NET_OVERHEAD_US: f64 = 1.0;

/// Fraction of an NVLink's 25 GB/s line rate per direction NCCL moves:
/// `topo.h` credits an NVLink2/3 link with 20 GB/s (`SM70_NVLINK_BW`,
/// `SM80_NVLINK_BW`; Hopper's `SM90_NVLINK_BW` is 20.6). The rest is the
/// protocol's overhead (sjeaugey in NVIDIA/nccl-tests#212: "with the
/// protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of
/// 370GB/s" of the H100's 450).
pub const NVLINK_EFFICIENCY: f64 = 20.0 / 25.0;
/// Fraction of a NIC's line rate NCCL's topology search credits: the
/// fastest entry of its speed arrays under a 200 Gb/s (25 GB/s) port is
/// 24 GB/s, under a 400 Gb/s one 48 (`speedArrayInter`,
/// `sm90SpeedArrayInter` in `search.cc`); `topo.h`'s `NET_BW` gives a
/// 100 Gb/s port 12.
pub const NET_EFFICIENCY: f64 = 0.96;
/// Fraction of NVLS's ideal bus bandwidth Hopper reaches (`nvlsEfficiency`).
pub const NVLS_EFFICIENCY: f64 = 0.85;
/// Per-channel speeds NCCL's topology search tries on Hopper, GB/s, inside
/// a node and across nodes (`sm90SpeedArrayIntra`, `sm90SpeedArrayInter`):
/// NVLS runs one channel per GPU at the fastest speed all of them fit.
const SM90_SPEEDS_INTRA: [f64; 11] = [60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0];
const SM90_SPEEDS_INTER: [f64; 10] = [48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0];
/// Channels NVLS may use at most (`NCCL_MAX_NVLS_ARITY`, `device.h`).
const MAX_NVLS_CHANNELS: u64 = 32;
/// Most channels NCCL runs (`MAXCHANNELS`, `device.h`).
const MAX_CHANNELS: u64 = 32;
/// Per-channel cap of NVLS-tree on Hopper, GB/s, for 2 nodes and more
/// (`perChMaxNVLSTreeBws`).
const NVLS_TREE_CHANNEL_CAP: [f64; 2] = [57.7, 45.5];
/// The LL protocol's bandwidth ceiling, GB/s (`llMaxBws`): inside a node
/// Ampere's 87.7 (Volta's is 39, Hopper's 141); across 2 nodes and more,
/// an Intel host's 39 and 20.4.
const LL_MAX_GBPS: [f64; 3] = [87.7, 39.0, 20.4];
/// Ring all-reduce latency grows by this factor across nodes once a
/// channel's share of the message passes 64 bytes ("plateau effect of
/// ring", `ncclTopoGetAlgoTime`; 1.9 before Ampere).
const RING_PLATEAU: f64 = 1.4;
/// Measured correction of the tree all-reduce's bandwidth by message size,
/// per protocol, for sizes of 64 B × 2^i (`treeCorrectionFactor`): trees
/// fall short of their model at medium sizes.
const TREE_CORRECTION: [[f64; 23]; 3] = [
    [1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0, 1.0],
    [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9],
];

fn lookup(table: &[(Algorithm, [f64; 3]); 4], a: Algorithm, p: Protocol) -> f64 {
    table.iter().find(|(t, _)| *t == a).map_or(0.0, |(_, row)| row[p.index()])
}

/// A communicator: `ranks` GPUs spread evenly over `nodes` nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    pub ranks: u64,
    pub nodes: u64,
}

impl Group {
    /// Ranks on each node (NCCL's `ppn`).
    pub fn per_node(self) -> u64 {
        (self.ranks / self.nodes.max(1)).max(1)
    }
}

/// A GPU's links as NCCL's topology search rates them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fabric {
    /// Whether a node's GPUs talk over NVLink (else over PCIe).
    pub nvlink: bool,
    /// What a ring inside a node moves per GPU and direction, GB/s.
    pub intra_gbps: f64,
    /// What NCCL moves through one GPU's NIC per direction, GB/s.
    pub nic_gbps: f64,
    /// Whether the NVSwitches reduce and multicast (NVLink SHARP).
    pub nvls: bool,
}

impl Fabric {
    pub fn of(gpu: &GpuProfile) -> Fabric {
        let nvlink = gpu.nvlink_gbps > 0.0;
        Fabric {
            nvlink,
            intra_gbps: if nvlink { gpu.nvlink_gbps * NVLINK_EFFICIENCY } else { gpu.host_gbps },
            nic_gbps: gpu.internode_gbps * NET_EFFICIENCY,
            nvls: nvlink && gpu.nvlink_sharp,
        }
    }

    /// Hop latency inside a node (NVLink or PCIe), µs.
    fn intra_hop_us(&self, a: Algorithm, p: Protocol) -> f64 {
        lookup(if self.nvlink { &NVLINK_HOP_US } else { &PCI_HOP_US }, a, p)
    }
}

/// The fastest way NCCL runs one collective, and its time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    pub algorithm: Algorithm,
    pub protocol: Protocol,
    pub seconds: f64,
}

/// The fastest algorithm and protocol for `bytes` (the whole tensor: the
/// all-gather's output, the reduce-scatter's input), as NCCL picks them:
/// the minimum of [`seconds`] over every pair the fabric runs.
pub fn fastest(c: Collective, bytes: f64, group: Group, fabric: &Fabric) -> Choice {
    let mut best = Choice { algorithm: Algorithm::Ring, protocol: Protocol::Simple, seconds: f64::INFINITY };
    for a in Algorithm::ALL {
        for p in Protocol::ALL {
            if let Some(seconds) = seconds(c, a, p, bytes, group, fabric)
                && seconds < best.seconds
            {
                best = Choice { algorithm: a, protocol: p, seconds };
            }
        }
    }
    best
}

/// Seconds one collective of `bytes` takes with algorithm `a` and protocol
/// `p` (`ncclTopoGetAlgoTime`): latency plus the bytes at the algorithm
/// bandwidth; `None` where NCCL does not run that pair.
pub fn seconds(c: Collective, a: Algorithm, p: Protocol, bytes: f64, group: Group, fabric: &Fabric) -> Option<f64> {
    let mut gbps = algorithm_gbps(c, a, p, group, fabric)?;
    let mut latency = latency_us(c, a, p, group, fabric);
    let size_class = (bytes / 64.0).log2().floor();
    if a == Algorithm::Tree && c == Collective::AllReduce && (0.0..23.0).contains(&size_class) {
        gbps *= TREE_CORRECTION[p.index()][size_class as usize];
    }
    if a == Algorithm::Ring
        && p == Protocol::Simple
        && c == Collective::AllReduce
        && group.nodes > 1
        && bytes / (MAX_CHANNELS * group.ranks) as f64 >= 64.0
    {
        latency *= RING_PLATEAU;
    }
    // 1 GB/s moves 1,000 bytes a microsecond.
    Some((latency + bytes / (1e3 * gbps)) * 1e-6)
}

/// Bus bandwidth, GB/s (NCCL's `busBw`; nccl-tests' `busbw` of a large
/// message): what each GPU's link moves, whatever the algorithm, so rings
/// of any size compare. `None` where NCCL does not run the pair.
pub fn bus_gbps(c: Collective, a: Algorithm, p: Protocol, group: Group, fabric: &Fabric) -> Option<f64> {
    let (ranks, nodes, per_node) = (group.ranks, group.nodes.max(1), group.per_node());
    if ranks < 2 {
        return None;
    }
    let nvls_like = matches!(a, Algorithm::Nvls | Algorithm::NvlsTree);
    let runs = match a {
        Algorithm::Ring => true,
        Algorithm::Tree => c == Collective::AllReduce,
        // NVLS across nodes needs a SHARP network (CollNet); NVLS-tree
        // reduces only.
        Algorithm::Nvls => fabric.nvls && nodes == 1 && per_node >= 2,
        Algorithm::NvlsTree => fabric.nvls && nodes > 1 && per_node >= 2 && c == Collective::AllReduce,
    };
    if !runs || (nvls_like && p != Protocol::Simple) {
        return None;
    }
    // The node's NICs together: a multi-node ring runs one channel per
    // rail, each leaving the node through its own GPU's NIC.
    let network = per_node as f64 * fabric.nic_gbps;
    let bus = match a {
        Algorithm::Ring if nodes == 1 => fabric.intra_gbps,
        Algorithm::Ring => fabric.intra_gbps.min(network),
        // With 2 nodes NCCL lets a tree's intra-node links run up to twice
        // its network speed (`search.cc`, "increase bwIntra for trees").
        Algorithm::Tree if nodes <= 2 => fabric.intra_gbps.min(2.0 * network),
        Algorithm::Tree => fabric.intra_gbps.min(network),
        Algorithm::Nvls | Algorithm::NvlsTree => nvls_bus_gbps(c, a, group, fabric),
    };
    let ll_max = LL_MAX_GBPS[(nodes.min(3) - 1) as usize];
    Some(match (a, p) {
        (Algorithm::Ring, Protocol::Ll) => (0.5 * bus).min(ll_max),
        // 120 of every 128 bytes are payload.
        (Algorithm::Ring, Protocol::Ll128) => 0.92 * bus,
        (Algorithm::Tree, Protocol::Ll) => (0.92 * bus / 3.8).min(ll_max),
        (Algorithm::Tree, Protocol::Ll128) => 0.92 * bus * if nodes == 1 { 7.0 / 9.0 } else { 120.0 / 128.0 },
        (Algorithm::Tree, Protocol::Simple) => 0.92 * bus,
        _ => bus,
    })
}

/// NVLS's bus bandwidth, GB/s: one channel per GPU of the node, each at
/// the fastest of NCCL's Hopper speeds that all of them fit in the GPU's
/// NVLink, at [`NVLS_EFFICIENCY`] less one channel's share; an all-reduce
/// pipelines its reduce and its multicast, so counts twice. NVLS-tree also
/// sends each channel through a NIC, capped per channel.
fn nvls_bus_gbps(c: Collective, a: Algorithm, group: Group, fabric: &Fabric) -> f64 {
    let per_node = group.per_node();
    let channels = per_node.min(MAX_NVLS_CHANNELS) as f64;
    let fits = |s: &&f64| **s * channels <= fabric.intra_gbps;
    let speed = if group.nodes == 1 {
        SM90_SPEEDS_INTRA.iter().find(fits).copied().unwrap_or(3.0)
    } else {
        SM90_SPEEDS_INTER.iter().filter(|s| **s <= fabric.nic_gbps).find(fits).copied().unwrap_or(15.0)
    };
    let mut intra = speed * NVLS_EFFICIENCY * (channels - 1.0) / channels;
    if c == Collective::AllReduce {
        intra *= 2.0;
    } else {
        intra *= (per_node - 1) as f64 / per_node as f64;
    }
    let per_channel = match a {
        Algorithm::NvlsTree => {
            let inter = speed * if group.nodes <= 2 { 2.0 } else { 1.0 };
            intra.min(inter).min(NVLS_TREE_CHANNEL_CAP[usize::from(group.nodes > 2)])
        }
        _ => intra,
    };
    channels * per_channel
}

/// Algorithm bandwidth, GB/s: the message size over its transfer time.
/// A ring all-reduce moves `2(r−1)/r` of the message over each link, a
/// reduce-scatter or all-gather `(r−1)/r`, and a tree all-reduce the
/// message up and down (half the bus bandwidth).
pub fn algorithm_gbps(c: Collective, a: Algorithm, p: Protocol, group: Group, fabric: &Fabric) -> Option<f64> {
    let bus = bus_gbps(c, a, p, group, fabric)?;
    let r = group.ranks as f64;
    Some(match (a, c) {
        (Algorithm::Tree, _) => 0.5 * bus,
        // NCCL converts NVLS reduce-scatter and all-gather bandwidths as they are.
        (Algorithm::Nvls, Collective::ReduceScatter | Collective::AllGather) => bus,
        (_, Collective::AllReduce) => bus * r / (2.0 * (r - 1.0)),
        (_, _) => bus * r / (r - 1.0),
    })
}

/// Latency of one call, µs (`ncclTopoTuneModel`): the base, plus a hop per
/// ring step (network hops where the ring crosses nodes), per tree level
/// (down and up) or through the switch for NVLS.
pub fn latency_us(c: Collective, a: Algorithm, p: Protocol, group: Group, fabric: &Fabric) -> f64 {
    let (ranks, nodes, per_node) = (group.ranks, group.nodes.max(1), group.per_node());
    let base = lookup(&BASE_LATENCY_US, a, p);
    let intra = fabric.intra_hop_us(a, p);
    // With one rank a node every hop is a network hop: NCCL takes the
    // tree's network latency then.
    let inter = lookup(&NET_HOP_US, if per_node == 1 { Algorithm::Tree } else { a }, p);
    let levels = (nodes as f64).log2().floor();
    match a {
        Algorithm::Ring => {
            let steps = if c == Collective::AllReduce { 2 * (ranks - 1) } else { ranks - 1 };
            let inter_steps = match (nodes, c) {
                (1, _) => 0,
                (_, Collective::AllReduce) => 2 * (nodes - 1),
                _ => nodes - 1,
            };
            // Inter-node rings post a network transfer every step.
            let overhead = match (nodes, p) {
                (1, _) => 0.0,
                (_, Protocol::Simple) => 3.0 * NET_OVERHEAD_US,
                _ => NET_OVERHEAD_US,
            };
            base + (steps - inter_steps) as f64 * intra.max(overhead) + inter_steps as f64 * inter
        }
        Algorithm::Tree => base + 2.0 * ((per_node - 1) as f64 * intra + levels * inter),
        // NVLS replaces the base latency with the switch's.
        Algorithm::Nvls => intra,
        Algorithm::NvlsTree => base + intra + 2.0 * levels * inter,
    }
}

/// What nccl-tests would report as `busbw` for `bytes`: the algorithm
/// bandwidth of NCCL's fastest choice times `2(r−1)/r` for an all-reduce,
/// `(r−1)/r` for a reduce-scatter or all-gather.
pub fn reported_bus_gbps(c: Collective, bytes: f64, group: Group, fabric: &Fabric) -> f64 {
    let r = group.ranks as f64;
    let factor = if c == Collective::AllReduce { 2.0 * (r - 1.0) / r } else { (r - 1.0) / r };
    bytes / fastest(c, bytes, group, fabric).seconds * 1e-9 * factor
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = (1u64 << 30) as f64;

    fn profile(name: &str) -> GpuProfile {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../models/gpus/{name}.ron"));
        GpuProfile::load(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    fn fabric(name: &str) -> Fabric {
        Fabric::of(&profile(name))
    }

    fn node(ranks: u64) -> Group {
        Group { ranks, nodes: 1 }
    }

    fn nodes(nodes: u64) -> Group {
        Group { ranks: 8 * nodes, nodes }
    }

    fn within(predicted: f64, measured: f64, tolerance: f64) -> bool {
        (predicted / measured - 1.0).abs() <= tolerance
    }

    /// The model's large-message all-reduce bus bandwidth against
    /// nccl-tests' `all_reduce_perf` busbw as published, within 10%:
    /// - 8 × A100 SXM4 on NVSwitch: 232.5 GB/s (NVIDIA/nccl-tests#175,
    ///   "singleNode ... -g 8, result: 232.54GB/s").
    /// - 8 × H100 SXM, ring: 365–370 GB/s (NVIDIA/nccl#1455 with
    ///   `NCCL_ALGO=RING`; sjeaugey in NVIDIA/nccl-tests#212: "an effective
    ///   NVLink bandwidth of 370GB/s").
    /// - 8 × H100 SXM, NVLS: 480 GB/s (NVIDIA/nccl#1455 with
    ///   `NCCL_ALGO=NVLS` at 8 GPUs; nccl-tests#212: "a peak busBw of
    ///   ~480GB/s (algbw ~275GB/s)").
    /// - 3 nodes of 8 × A100 with 4 HDR NICs each (12.5 GB/s a GPU): peak
    ///   96 GB/s (NVIDIA/nccl-tests#119).
    /// - DGX A100 nodes (one 200 Gb/s HDR NIC a GPU), 16 of them: 8 NICs ×
    ///   24 GB/s, the per-NIC figure sjeaugey gives for HDR in NVIDIA/nccl#412
    ///   ("you should get ... 24GB/s inter-node").
    #[test]
    fn large_messages_reach_the_published_bus_bandwidth() {
        let busbw = |f: &Fabric, g: Group| reported_bus_gbps(Collective::AllReduce, 8.0 * GIB, g, f);
        let a100 = fabric("a100-40gb");
        assert!(within(busbw(&a100, node(8)), 232.5, 0.10), "A100 node: {}", busbw(&a100, node(8)));
        let h100 = fabric("h100-80gb-sxm");
        let h100_ring = Fabric { nvls: false, ..h100 };
        assert!(within(busbw(&h100_ring, node(8)), 370.0, 0.10), "H100 ring: {}", busbw(&h100_ring, node(8)));
        assert!(within(busbw(&h100, node(8)), 480.0, 0.10), "H100 NVLS: {}", busbw(&h100, node(8)));
        let four_nics = Fabric::of(&GpuProfile { internode_gbps: 12.5, ..profile("a100-40gb") });
        assert!(within(busbw(&four_nics, nodes(3)), 96.0, 0.10), "4 NICs: {}", busbw(&four_nics, nodes(3)));
        assert!(within(busbw(&a100, nodes(16)), 8.0 * 24.0, 0.10), "DGX A100 × 16: {}", busbw(&a100, nodes(16)));
        // NCCL picks what it should: NVLS on an H100 node, a ring across
        // many DGX A100 nodes.
        assert_eq!(fastest(Collective::AllReduce, 8.0 * GIB, node(8), &h100).algorithm, Algorithm::Nvls);
        assert_eq!(fastest(Collective::AllReduce, 8.0 * GIB, nodes(16), &a100).algorithm, Algorithm::Ring);
    }

    /// Large messages run at the bus bandwidth: the latency is lost in the
    /// transfer time (within 1% in a node; across 16 nodes the ring's 254
    /// hops still cost 1.7 ms of 90, so within 3%).
    #[test]
    fn large_messages_cost_their_bytes_at_the_bus_bandwidth() {
        let f = fabric("a100-40gb");
        for (g, tolerance) in [(node(8), 0.01), (nodes(16), 0.03)] {
            let choice = fastest(Collective::AllReduce, 8.0 * GIB, g, &f);
            let gbps = algorithm_gbps(Collective::AllReduce, choice.algorithm, choice.protocol, g, &f).unwrap();
            let transfer = 8.0 * GIB / (gbps * 1e9);
            assert!(within(choice.seconds, transfer, tolerance), "{g:?}: {choice:?} vs {transfer}");
        }
    }

    /// Small messages cost the algorithm's latency, the bytes nothing.
    #[test]
    fn small_messages_are_latency_bound() {
        for (f, g) in
            [(fabric("a100-40gb"), node(8)), (fabric("a100-40gb"), nodes(16)), (fabric("h100-80gb-sxm"), node(8))]
        {
            let choice = fastest(Collective::AllReduce, 8.0, g, &f);
            let latency = latency_us(Collective::AllReduce, choice.algorithm, choice.protocol, g, &f) * 1e-6;
            assert!(within(choice.seconds, latency, 0.01), "{g:?}: {choice:?} against {latency}");
            assert_eq!(choice.protocol, Protocol::Ll, "{g:?}: LL has the lowest latency");
        }
    }

    /// Across many nodes a ring pays a hop per rank, a tree one per level:
    /// the tree wins small messages, the ring the largest.
    #[test]
    fn tree_beats_ring_for_small_messages_across_many_nodes() {
        let f = fabric("a100-40gb");
        let best = |a: Algorithm, bytes: f64| {
            Protocol::ALL
                .iter()
                .filter_map(|&p| seconds(Collective::AllReduce, a, p, bytes, nodes(16), &f))
                .fold(f64::INFINITY, f64::min)
        };
        for bytes in [8.0, 64e3, 1e6] {
            assert!(best(Algorithm::Tree, bytes) < best(Algorithm::Ring, bytes), "{bytes} B");
        }
        assert!(best(Algorithm::Ring, 8.0 * GIB) < best(Algorithm::Tree, 8.0 * GIB));
    }

    /// A large all-reduce's time barely grows with the ranks: each rank
    /// moves `2(r−1)/r` of the message whatever `r`, and the bus bandwidth
    /// drops once, from NVLink's to the NICs', when the group leaves the
    /// node. What grows is the latency: a hop per ring step, a level per
    /// tree.
    #[test]
    fn large_message_time_grows_sublinearly_in_ranks() {
        let f = fabric("a100-40gb");
        let time = |g: Group| fastest(Collective::AllReduce, GIB, g, &f).seconds;
        let (one, two, sixteen, sixty_four) = (time(node(8)), time(nodes(2)), time(nodes(16)), time(nodes(64)));
        assert!(one < two && two < sixteen && sixteen < sixty_four);
        // 64× the GPUs of a node: under 2× its time; 4× the nodes: under 1.5×.
        assert!(sixty_four < 2.0 * one, "{one} s on 8 GPUs, {sixty_four} s on 512");
        assert!(sixty_four < 1.5 * sixteen, "{sixteen} s on 128 GPUs, {sixty_four} s on 512");
        // The ring's bus bandwidth is flat across nodes.
        let ring = |g| bus_gbps(Collective::AllReduce, Algorithm::Ring, Protocol::Simple, g, &f);
        assert_eq!(ring(nodes(2)), ring(nodes(64)));
    }

    /// Every bucket is one collective launch: the same gradients in 10×
    /// more buckets pay 10× the latencies, which dominate small buckets.
    #[test]
    fn ten_times_more_buckets_cost_more_at_small_sizes() {
        let f = fabric("a100-40gb");
        let total =
            |bytes: f64, buckets: f64| buckets * fastest(Collective::AllReduce, bytes / buckets, nodes(16), &f).seconds;
        // 16 MB of gradients: 52 buckets (one a layer, as the partition
        // pass makes them for a 24-layer BERT) against 520.
        let (few, many) = (total(16e6, 52.0), total(16e6, 520.0));
        assert!(many > 2.0 * few, "{few} s in 52 buckets, {many} s in 520");
        // 1 GB: the latencies matter less but still count.
        assert!(total(1e9, 520.0) > total(1e9, 52.0));
    }

    /// Reduce-scatters and all-gathers run as rings (NVLS on one H100
    /// node), never as trees; NVLS runs only where the fabric has it.
    #[test]
    fn algorithms_run_only_where_nccl_runs_them() {
        let (a100, h100) = (fabric("a100-40gb"), fabric("h100-80gb-sxm"));
        let s = Protocol::Simple;
        assert_eq!(bus_gbps(Collective::ReduceScatter, Algorithm::Tree, s, node(8), &a100), None);
        assert_eq!(bus_gbps(Collective::AllReduce, Algorithm::Nvls, s, node(8), &a100), None);
        assert!(bus_gbps(Collective::AllGather, Algorithm::Nvls, s, node(8), &h100).is_some());
        assert_eq!(bus_gbps(Collective::AllGather, Algorithm::Nvls, s, nodes(2), &h100), None);
        assert!(bus_gbps(Collective::AllReduce, Algorithm::NvlsTree, s, nodes(2), &h100).is_some());
        assert_eq!(bus_gbps(Collective::AllReduce, Algorithm::Nvls, Protocol::Ll, node(8), &h100), None);
    }
}
