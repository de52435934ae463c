//! Compile time of the pass pipeline on the bert-large training step.
//!
//! `cargo bench -p zeroplan-passes --bench pipeline`. Target (issue 4): the
//! passes take under 100 ms median on the 2-core development machine; the
//! measured figures are in the README.

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::path::PathBuf;
use zeroplan_ir::spec::{self, TrainingSpec};
use zeroplan_passes::fuse::Fuse;
use zeroplan_passes::manager::{Pass, PassContext, PassOptions, run_passes};
use zeroplan_passes::rewrite::Rewrite;
use zeroplan_passes::training::{MixedPrecision, TrainingStep, training_forward};

fn bert_large(c: &mut Criterion) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/bert-large.ron");
    let model = spec::load(&path).expect("bundled spec");
    let train = TrainingSpec { precision: spec::Precision::Bf16, ..TrainingSpec::default() };
    let forward = training_forward(&model, &train, 1, false).expect("builds");
    let step = TrainingStep { train: train.clone() };
    let passes: [&dyn Pass; 4] = [&Rewrite, &MixedPrecision, &step, &Fuse];
    let mut group = c.benchmark_group("bert-large bf16 training step");
    group.sample_size(20);
    group.bench_function("build forward graph", |b| {
        b.iter(|| training_forward(black_box(&model), &train, 1, false).unwrap())
    });
    group.bench_function("pass pipeline", |b| {
        b.iter(|| {
            let mut cx = PassContext::new(PassOptions::default());
            run_passes(black_box(forward.clone()), &passes, &mut cx).unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, bert_large);
criterion_main!(benches);
