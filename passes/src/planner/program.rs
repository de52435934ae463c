//! The executable part of a plan: the graph in schedule order and a buffer
//! for every tensor.

use rayon::prelude::*;
use zeroplan_ir::Graph;
use zeroplan_ir::plan::{Buffer, Program};

use crate::memory::MemoryPlan;
use crate::value_table::ValueTable;

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
    let mut buffers = Vec::with_capacity(memory.intervals.len() + memory.host_intervals.len());
    for (intervals, arena) in [(&memory.intervals, &memory.arena), (&memory.host_intervals, &memory.host)] {
        // By interval and by value, in dense tables: a tiled step has a
        // million buffers.
        let mut offset_of = vec![None; intervals.len()];
        for p in &arena.placements {
            offset_of[p.interval] = Some(p.offset);
        }
        let mut index_of = ValueTable::for_graph(graph);
        for (i, interval) in intervals.iter().enumerate() {
            index_of.insert(interval.value, i);
        }
        // On every core: each buffer names its value, a string apiece.
        buffers.par_extend((0..intervals.len()).into_par_iter().map(|i| {
            // An alias shares the offset of the buffer at the end of its chain.
            let mut root = i;
            while let Some(&target) = intervals[root].alias_of.and_then(|v| index_of.get(&v)) {
                root = target;
            }
            let interval = &intervals[i];
            Buffer {
                value: graph.value_ref(interval.value),
                place: interval.place,
                offset: offset_of[root].unwrap_or(0),
                bytes: interval.bytes,
                alias_of: interval.alias_of.map(|v| graph.value_ref(v)),
            }
        }));
    }
    buffers
}
