//! A plan file is input: parsing checks it, and loading it on the host
//! runtime (buffers, arena bounds, kernel compilation) refuses what does
//! not fit instead of panicking or touching memory outside its arenas.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zeroplan_untrusted::targets::plan_file(data));
