//! GPU profiles and clusters: what the planner plans for.
//!
//! A profile is a RON file under `models/gpus/` with the figures a cost
//! model needs and their sources in comments. A cluster is nodes × GPUs per
//! node × one profile, with an optional per-GPU memory budget (the memory a
//! plan may use, when less than the card's).

use serde::{Deserialize, Serialize};

use super::error::{FieldProblem, SpecError};
use crate::dtype::DType;

/// Dense (non-sparse) peak matrix throughput, TFLOP/s, by input dtype.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakTflops {
    pub f32: f64,
    /// TF32 tensor cores (f32 inputs); 0 where there are none.
    pub tf32: f64,
    /// 0 where the GPU has no bf16 tensor cores.
    pub bf16: f64,
    pub f16: f64,
}

/// One GPU model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuProfile {
    pub name: String,
    /// Streaming multiprocessors: GEMM tiles run in waves of this many.
    pub sm_count: u64,
    /// Device memory as the driver reports it, MiB.
    pub memory_mib: u64,
    pub peak_tflops: PeakTflops,
    /// HBM bandwidth, GB/s.
    pub hbm_gbps: f64,
    /// NVLink bandwidth per direction per GPU, GB/s (0 without NVLink).
    pub nvlink_gbps: f64,
    /// Network bandwidth per GPU between nodes, per direction, GB/s.
    pub internode_gbps: f64,
    /// Host ↔ device bandwidth achieved over PCIe, per direction, GB/s.
    pub host_gbps: f64,
    /// Whether the node's NVSwitches reduce and multicast in the switch
    /// (NVLink SHARP, third-generation NVSwitch: HGX/DGX H100 and H200), so
    /// NCCL can run its NVLS algorithms; false where absent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nvlink_sharp: bool,
    /// Sequential read bandwidth of the local NVMe drives of the node this
    /// GPU ships in (all drives together), GB/s; absent where the profile
    /// names no node (then `--nvme-gbps` gives it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme_read_gbps: Option<f64>,
    /// Their sequential write bandwidth, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme_write_gbps: Option<f64>,
}

impl GpuProfile {
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib << 20
    }

    /// Peak matrix FLOP/s for GEMMs in `dtype` (f32 uses TF32 tensor cores
    /// where present); `None` where the GPU cannot compute in it.
    pub fn peak_flops(&self, dtype: DType) -> Option<f64> {
        let t = match dtype {
            DType::F32 => self.peak_tflops.tf32.max(self.peak_tflops.f32),
            DType::BF16 => self.peak_tflops.bf16,
            DType::F16 => self.peak_tflops.f16,
            DType::I32 | DType::I64 => 0.0,
        };
        (t > 0.0).then_some(t * 1e12)
    }

    /// Reads a RON profile; `file` names it in errors.
    pub fn from_ron(text: &str, file: &str) -> Result<GpuProfile, SpecError> {
        super::from_ron(text, file, GpuProfile::validate)
    }

    pub fn load(path: &std::path::Path) -> Result<GpuProfile, SpecError> {
        let (text, file) = super::read(path)?;
        GpuProfile::from_ron(&text, &file)
    }

    fn validate(&self) -> Result<(), Vec<FieldProblem>> {
        let mut problems = Vec::new();
        let positive = |x: f64| x.is_finite() && x > 0.0;
        let non_negative = |x: f64| x.is_finite() && x >= 0.0;
        let mut check = |ok: bool, field: &'static str, what: &str| {
            if !ok {
                problems.push(FieldProblem {
                    field,
                    message: format!("`{field}` {what}"),
                    help: "take the figure from the GPU's datasheet (see models/gpus/*.ron)".into(),
                });
            }
        };
        check(!self.name.trim().is_empty(), "name", "is empty");
        check(self.sm_count > 0, "sm_count", "is 0");
        check(self.memory_mib > 0, "memory_mib", "is 0");
        let p = self.peak_tflops;
        check(
            positive(p.f32) && non_negative(p.tf32) && non_negative(p.bf16) && non_negative(p.f16),
            "peak_tflops",
            "must be positive for f32 and not negative elsewhere",
        );
        check(positive(self.hbm_gbps), "hbm_gbps", "must be positive");
        check(non_negative(self.nvlink_gbps), "nvlink_gbps", "must not be negative");
        check(positive(self.internode_gbps), "internode_gbps", "must be positive");
        check(positive(self.host_gbps), "host_gbps", "must be positive");
        check(!self.nvlink_sharp || self.nvlink_gbps > 0.0, "nvlink_sharp", "needs NVLink (`nvlink_gbps` > 0)");
        check(self.nvme_read_gbps.is_none_or(positive), "nvme_read_gbps", "must be positive");
        check(self.nvme_write_gbps.is_none_or(positive), "nvme_write_gbps", "must be positive");
        check(
            self.nvme_read_gbps.is_some() == self.nvme_write_gbps.is_some(),
            "nvme_write_gbps",
            "must be given together with `nvme_read_gbps`",
        );
        if problems.is_empty() { Ok(()) } else { Err(problems) }
    }
}

/// A node's local NVMe drives, ZeRO-Infinity's slowest and largest tier.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nvme {
    /// Capacity a plan may fill per node.
    pub bytes: u64,
    /// Sequential read bandwidth of all the node's drives together, GB/s.
    pub read_gbps: f64,
    /// Sequential write bandwidth of all the node's drives together, GB/s.
    pub write_gbps: f64,
}

/// The machines a plan runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    pub nodes: u64,
    pub gpus_per_node: u64,
    pub gpu: GpuProfile,
    /// Bytes a plan may use per GPU; the card's memory when `None`.
    pub memory_budget: Option<u64>,
    /// Host bytes a plan may use per node for what ZeRO-Offload moves
    /// there (every GPU's share together); unchecked when `None`.
    pub host_memory: Option<u64>,
    /// Each node's NVMe; `None`: no NVMe tier.
    pub nvme: Option<Nvme>,
}

impl Cluster {
    pub fn world_size(&self) -> u64 {
        self.nodes * self.gpus_per_node
    }

    /// The bytes a plan may use on each GPU.
    pub fn budget_bytes(&self) -> u64 {
        self.memory_budget.unwrap_or(self.gpu.memory_bytes()).min(self.gpu.memory_bytes())
    }

    /// Whether a node's GPUs, each holding `host_bytes_per_gpu` on the host,
    /// fit the host memory budget.
    pub fn host_fits(&self, host_bytes_per_gpu: u64) -> bool {
        self.host_memory.is_none_or(|h| host_bytes_per_gpu.saturating_mul(self.gpus_per_node) <= h)
    }

    /// Whether `nvme_bytes_per_node` fit a node's drives (without an
    /// NVMe tier only nothing does).
    pub fn nvme_fits(&self, nvme_bytes_per_node: u64) -> bool {
        nvme_bytes_per_node == 0 || self.nvme.is_some_and(|n| nvme_bytes_per_node <= n.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundled() -> Vec<GpuProfile> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/gpus");
        let mut profiles: Vec<GpuProfile> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| GpuProfile::load(&e.unwrap().path()).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        profiles.sort_by_key(|p| p.memory_mib);
        profiles
    }

    #[test]
    fn the_five_bundled_profiles_load() {
        let names: Vec<String> = bundled().into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["V100-32GB", "A100-40GB", "H100-80GB-SXM", "A100-80GB", "H200"]);
    }

    #[test]
    fn peak_flops_by_dtype() {
        let v100 = &bundled()[0];
        assert_eq!(v100.peak_flops(DType::BF16), None, "V100 has no bf16 tensor cores");
        assert_eq!(v100.peak_flops(DType::F16), Some(125e12));
        let h100 = bundled().into_iter().find(|p| p.name == "H100-80GB-SXM").unwrap();
        assert_eq!(h100.peak_flops(DType::BF16), Some(989.4e12));
        assert_eq!(h100.peak_flops(DType::F32), Some(494.7e12));
    }

    #[test]
    fn budgets_never_exceed_the_card() {
        let gpu = bundled()[1].clone();
        let cluster =
            Cluster { nodes: 2, gpus_per_node: 8, gpu, memory_budget: Some(u64::MAX), host_memory: None, nvme: None };
        assert_eq!((cluster.world_size(), cluster.budget_bytes()), (16, 40960 << 20));
    }

    #[test]
    fn bad_profiles_name_the_field() {
        let text =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/gpus/h200.ron"))
                .unwrap();
        let err = GpuProfile::from_ron(&text.replace("hbm_gbps: 4800.0", "hbm_gbps: -1.0"), "bad.ron")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad.ron:") && err.contains("`hbm_gbps` must be positive"), "{err}");
    }
}
