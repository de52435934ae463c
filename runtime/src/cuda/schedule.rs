//! The hazards of moving work between a schedule's steps.
//!
//! The CUDA device runs some groups of nodes as one instruction (a GEMM
//! with its epilogue kernel, one AdamW launch over many parameters) at one
//! step of the group, with the others' steps left empty. That is the same
//! computation exactly when no instruction between the group's steps reads
//! what the moved work writes, or writes what it reads or writes. These
//! functions answer that over the buffers each step's instruction touches
//! ([`crate::runner::Instruction::touches`]; an empty step touches nothing),
//! so they are tested on plain data.

use std::ops::Range;

use crate::runner::{Buf, Instruction, Step};

/// The buffers each step's instruction reads (`false`) and writes (`true`).
pub fn touches<I: Instruction>(steps: &[Step<I>]) -> Vec<Vec<(Buf, bool)>> {
    steps.iter().map(|s| s.instr.as_ref().map(Instruction::touches).unwrap_or_default()).collect()
}

/// The first step of `between` that writes a buffer overlapping one of
/// `reads`, or reads or writes one overlapping one of `writes`.
pub fn first_conflict(
    touched: &[Vec<(Buf, bool)>],
    between: Range<usize>,
    reads: &[Buf],
    writes: &[Buf],
) -> Option<usize> {
    between.into_iter().find(|&at| {
        touched[at].iter().any(|(b, write)| {
            writes.iter().any(|w| w.overlaps(b)) || (*write && reads.iter().any(|r| r.overlaps(b)))
        })
    })
}
