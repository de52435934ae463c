//! Snapshots of each optimising pass's output for a tiny spec of each
//! family: the forward graph after `rewrite` and after `fuse` (with its
//! kernels; `attention` before it), and the fused training step of a
//! one-layer model.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::{load_model as model, tiny_models};
use zeroplan_ir::spec::{self, ModelSpec, TrainingSpec};
use zeroplan_passes::fuse::kernels_text;
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};

/// Small per-GPU shapes, where the cost model merges projections.
fn options(disabled: &[&str]) -> PassOptions {
    PassOptions {
        disabled: disabled.iter().map(|s| s.to_string()).collect(),
        shape_hint: [("batch".to_string(), 2), ("seq".to_string(), 8)].into(),
        ..PassOptions::default()
    }
}

fn text(model: &ModelSpec, target: &Target, disabled: &[&str]) -> String {
    let graph = compile(model, target, options(disabled)).unwrap_or_else(|e| panic!("{}: {e}", model.name)).graph;
    graph.to_text() + &kernels_text(&graph)
}

#[test]
fn forward_after_rewrite() {
    for file in tiny_models() {
        let family = file.trim_start_matches("tiny/").trim_end_matches(".ron");
        insta::assert_snapshot!(
            format!("{family}_forward_rewrite"),
            text(&model(&file), &Target::Forward(zeroplan_ir::DType::F32), &["attention", "fuse"])
        );
    }
}

#[test]
fn forward_after_fuse() {
    for file in tiny_models() {
        let family = file.trim_start_matches("tiny/").trim_end_matches(".ron");
        insta::assert_snapshot!(
            format!("{family}_forward_fuse"),
            text(&model(&file), &Target::Forward(zeroplan_ir::DType::F32), &[])
        );
    }
}

#[test]
fn one_layer_training_step_after_every_pass() {
    let train = TrainingSpec::default();
    for file in tiny_models() {
        let family = file.trim_start_matches("tiny/").trim_end_matches(".ron");
        let mut m = model(&file);
        m.layers = 1;
        if let spec::Sharing::TemplateBank { .. } = m.sharing {
            m.sharing = spec::Sharing::TemplateBank { templates: 1 };
        }
        insta::assert_snapshot!(format!("{family}_training_step"), text(&m, &Target::Training(&train), &[]));
    }
}
