//! Helpers shared by the passes integration tests.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use zeroplan_ir::spec::{self, ModelSpec};

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models")
}

/// A bundled spec, by its path under `models/` (`tiny/tiny-bert.ron`).
pub fn model(relative: &str) -> ModelSpec {
    spec::load(&models_dir().join(relative)).unwrap_or_else(|e| panic!("{e}"))
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
