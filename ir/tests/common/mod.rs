//! Helpers shared by the ir and passes integration tests (the passes tests
//! include this file by path).
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use zeroplan_ir::spec::{self, FeedForward, Head, ModelSpec, NormPlacement, PositionEncoding, Sharing};

/// The repository's `models/` folder.
pub fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models")
}

/// Every tiny spec under `models/tiny/`, as paths under `models/`, sorted:
/// a new family's tiny spec is tested without editing the tests.
pub fn tiny_models() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(models_dir().join("tiny"))
        .expect("models/tiny exists")
        .map(|e| e.expect("readable").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".ron"))
        .map(|name| format!("tiny/{name}"))
        .collect();
    names.sort();
    names
}

pub fn load_model(relative: &str) -> ModelSpec {
    spec::load(&models_dir().join(relative)).unwrap_or_else(|e| panic!("{e}"))
}

/// Parameter count of a spec by closed form, written from the architecture
/// papers independently of the graph builder.
pub fn closed_form_params(s: &ModelSpec) -> u64 {
    let (v, h, i, l, p, t) = (s.vocab_size, s.hidden, s.intermediate, s.layers, s.max_position, s.type_vocab);
    let e = s.embedding_size.unwrap_or(h);
    let mut embeddings = v * e + t * e;
    if s.position == PositionEncoding::Learned {
        embeddings += p * e;
    }
    if s.norm == NormPlacement::Post {
        embeddings += 2 * e;
    }
    if e != h {
        embeddings += e * h + h;
    }
    let (matrices, matrix_params, ffn_biases) = match s.feed_forward {
        FeedForward::Mlp => (6, 4 * h * h + 2 * h * i, i + h),
        FeedForward::Glu => (7, 4 * h * h + 3 * h * i, h),
    };
    let vectors = 4 * h + ffn_biases + 4 * h;
    let layers = match s.sharing {
        Sharing::Independent => l * (matrix_params + vectors),
        Sharing::CrossLayer { groups } => groups * (matrix_params + vectors),
        Sharing::TemplateBank { templates } => templates * matrix_params + l * (templates * matrices + vectors),
    };
    let final_norm = if s.norm == NormPlacement::Pre { 2 * h } else { 0 };
    let head = match s.head {
        Head::Pooler => h * h + h,
        Head::Classification { num_labels } => h * h + h + num_labels * h + num_labels,
        Head::Mlm => e * h + e + 2 * e + v,
    };
    embeddings + layers + final_norm + head
}
