//! A Hugging Face `config.json`: read as a spec or refused, never a panic;
//! a spec read builds its forward graph.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::spec::hf::from_config_json;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(spec) = from_config_json(text, "config.json", "fuzz") {
        let _ = forward(&spec, &BuildOptions::default());
    }
});
