//! A safetensors file as weights for tiny-bert and as a batch: loaded or
//! refused with a named problem, never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zeroplan_untrusted::targets::safetensors(data));
