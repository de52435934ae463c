//! A plan file is input: parsing checks it, and loading it on the host
//! runtime (buffers, arena bounds, kernel compilation) refuses what does
//! not fit instead of panicking or touching memory outside its arenas.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zeroplan_ir::plan::Plan;
use zeroplan_runtime::HostProgram;

/// Larger arenas are refused here only to keep the fuzzer fast.
const ARENA_CAP: u64 = 64 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(plan) = Plan::from_ron(text) else { return };
    if plan.program.arena_bytes <= ARENA_CAP && plan.program.host_arena_bytes <= ARENA_CAP {
        let _ = HostProgram::load(plan.program, 0);
    }
});
