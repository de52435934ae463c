//! Planning time: the whole search (every ZeRO stage × offload ×
//! recomputation × micro-batch), the winner compiled and placed.
//!
//! `cargo bench -p zeroplan-passes --bench plan`. Issue 5's target: plans
//! in seconds, even for a 100-trillion-parameter spec on 512 GPUs — which
//! no choice fits (a gathered layer alone is ~600 GiB), so that figure is
//! the time to the nothing-fits answer with every choice's least memory
//! and GPU count. The measured figures are in the README.

use criterion::{Criterion, criterion_group, criterion_main};
use std::path::PathBuf;
use zeroplan_ir::spec::{self, Cluster, GpuProfile, Precision, TrainingSpec};
use zeroplan_passes::planner::{Pins, PlanError, Request, plan};

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models")
}

fn request(model: &spec::ModelSpec, gpus: u64, seq: u64, global_batch: u64) -> Request<'_> {
    let gpu = GpuProfile::load(&models().join("gpus/h100-80gb-sxm.ron")).expect("bundled profile");
    Request {
        model,
        train: TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() },
        cluster: Cluster { nodes: gpus / 8, gpus_per_node: 8, gpu, memory_budget: None, host_memory: None, nvme: None },
        seq,
        global_batch,
        pins: Pins::default(),
        extrapolate_depth: true,
        exhaustive: false,
        shared: Default::default(),
        launches: Default::default(),
    }
}

fn planning(c: &mut Criterion) {
    let large = spec::load(&models().join("bert-large.ron")).expect("bundled spec");
    let huge = spec::load(&models().join("transformer-100t.ron")).expect("bundled spec");
    let mut group = c.benchmark_group("plan");
    group.sample_size(10);
    group.bench_function("bert-large, 64 H100, seq 512, global batch 2048", |b| {
        b.iter(|| plan(&request(&large, 64, 512, 2048)).expect("bert-large fits"))
    });
    group.bench_function("transformer-100t, 512 H100, seq 2048, global batch 512", |b| {
        b.iter(|| match plan(&request(&huge, 512, 2048, 512)) {
            Err(PlanError::NothingFits { shortfalls, .. }) => shortfalls,
            other => panic!("expected nothing to fit: {:?}", other.map(|p| p.strategy)),
        })
    });
    let mut whole = request(&large, 64, 512, 2048);
    whole.extrapolate_depth = false;
    group.bench_function("bert-large, 64 H100, every candidate compiled whole", |b| {
        b.iter(|| plan(&whole).expect("bert-large fits"))
    });
    group.finish();
}

criterion_group!(benches, planning);
criterion_main!(benches);
