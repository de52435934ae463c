//! The hazards of moving work between a schedule's steps.
//!
//! The CUDA device runs some groups of nodes as one instruction (a GEMM
//! with its epilogue kernel, one AdamW launch over many parameters) at one
//! step of the group, with the others' steps left empty. That is the same
//! computation exactly when no instruction between the group's steps reads
//! what the moved work writes, or writes what it reads or writes. These
//! functions answer that over the buffers each step's instruction touches
//! ([`zeroplan_exec::Instruction::touches`]; an empty step touches nothing),
//! so they are tested on plain data.

use std::ops::Range;

use zeroplan_exec::{Buf, Instruction, Step};

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
        touched[at]
            .iter()
            .any(|(b, write)| writes.iter().any(|w| w.overlaps(b)) || (*write && reads.iter().any(|r| r.overlaps(b))))
    })
}

#[cfg(test)]
mod tests {
    use zeroplan_ir::{DType, Place};

    use super::*;

    fn buf(offset: usize) -> Buf {
        Buf { place: Place::Device, offset, len: 4, dtype: DType::F32 }
    }

    #[test]
    fn conflicts_are_writes_of_what_is_read_and_any_touch_of_what_is_written() {
        let touched = vec![vec![(buf(0), false)], vec![(buf(64), true)], vec![(buf(128), false)], vec![]];
        // Reading what the moved work reads: no conflict.
        assert_eq!(first_conflict(&touched, 0..4, &[buf(0)], &[]), None);
        // Writing it: a conflict.
        assert_eq!(first_conflict(&touched, 0..4, &[buf(64)], &[]), Some(1));
        // Reading what it writes: a conflict; outside the range: none.
        assert_eq!(first_conflict(&touched, 0..4, &[], &[buf(128)]), Some(2));
        assert_eq!(first_conflict(&touched, 3..4, &[], &[buf(128)]), None);
        // Overlap by one byte counts; another place does not.
        assert_eq!(first_conflict(&touched, 0..4, &[], &[Buf { offset: 12, ..buf(0) }]), Some(0));
        assert_eq!(first_conflict(&touched, 0..4, &[], &[Buf { place: Place::Host, ..buf(0) }]), None);
    }
}
