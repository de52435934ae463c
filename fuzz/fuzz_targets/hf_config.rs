//! A Hugging Face `config.json`: read as a spec or refused, never a panic;
//! a spec read builds its forward graph.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zeroplan_untrusted::targets::hf_config(data));
