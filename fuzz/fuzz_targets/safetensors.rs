//! A safetensors file as weights for tiny-bert and as a batch: loaded or
//! refused with a named problem, never a panic.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zeroplan_ir::Graph;
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::{Interpreter, Rounding, State};
use zeroplan_ir::spec::{self, ModelSpec};
use zeroplan_runtime::checkpoint::{load_batch, load_weights};

fn model() -> &'static (ModelSpec, Graph, State) {
    static MODEL: OnceLock<(ModelSpec, Graph, State)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny/tiny-bert.ron");
        let spec = spec::load(&path).expect("the tiny spec loads");
        let graph = forward(&spec, &BuildOptions::default()).expect("it builds");
        let state = Interpreter::new(Rounding::Native, 0).init_state(&graph).expect("it initialises");
        (spec, graph, state)
    })
}

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("zeroplan-fuzz-{}.safetensors", std::process::id()));
    std::fs::write(&path, data).expect("the temporary file is writable");
    let (spec, graph, state) = model();
    let mut weights = state.clone();
    let _ = load_weights(&path, spec, graph, &mut weights);
    let _ = load_batch(&path);
});
