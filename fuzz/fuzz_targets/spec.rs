//! A model spec in RON: parsing and validation give a spec or an error,
//! never a panic; a spec that passes builds its forward graph.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zeroplan_untrusted::targets::spec(data));
