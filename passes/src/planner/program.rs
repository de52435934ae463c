//! The executable part of a plan: the graph in schedule order and a buffer
//! for every tensor.

use rustc_hash::FxHashMap;
use zeroplan_ir::Graph;
use zeroplan_ir::plan::{Buffer, Program};

use crate::memory::MemoryPlan;

/// The program of `graph` as `memory` placed it, symbols bound to
/// `batch` × `seq`.
pub fn program(graph: Graph, memory: &MemoryPlan, batch: u64, seq: u64) -> Program {
    let buffers = buffers(&graph, memory);
    with_buffers(graph, buffers, memory, batch, seq)
}

/// [`program`] with its [`buffers`] made already.
pub fn with_buffers(graph: Graph, buffers: Vec<Buffer>, memory: &MemoryPlan, batch: u64, seq: u64) -> Program {
    Program { batch, seq, arena_bytes: memory.arena.size, host_arena_bytes: memory.host.size, buffers, graph }
}

/// A buffer for every tensor of `graph` as `memory` placed it.
pub fn buffers(graph: &Graph, memory: &MemoryPlan) -> Vec<Buffer> {
    let mut buffers = Vec::new();
    for (intervals, arena) in [(&memory.intervals, &memory.arena), (&memory.host_intervals, &memory.host)] {
        let offset_of: FxHashMap<usize, u64> = arena.placements.iter().map(|p| (p.interval, p.offset)).collect();
        let index_of: FxHashMap<_, usize> = intervals.iter().enumerate().map(|(i, iv)| (iv.value, i)).collect();
        for (i, interval) in intervals.iter().enumerate() {
            // An alias shares the offset of the buffer at the end of its chain.
            let mut root = i;
            while let Some(&target) = intervals[root].alias_of.and_then(|v| index_of.get(&v)) {
                root = target;
            }
            buffers.push(Buffer {
                value: graph.value_ref(interval.value),
                place: interval.place,
                offset: offset_of.get(&root).copied().unwrap_or(0),
                bytes: interval.bytes,
                alias_of: interval.alias_of.map(|v| graph.value_ref(v)),
            });
        }
    }
    buffers
}
