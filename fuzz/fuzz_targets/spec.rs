//! A model spec in RON: parsing and validation give a spec or an error,
//! never a panic; a spec that passes builds its forward graph.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::spec::ModelSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(spec) = ModelSpec::from_ron(text, "fuzz.ron") {
        let _ = forward(&spec, &BuildOptions::default());
    }
});
