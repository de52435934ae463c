//! Every buffer an instruction touches, and whether it writes it: what a
//! device that runs host routines on a staging copy (the CUDA device) moves
//! in and out, and what the communication stream's hazards see.

use super::Instr;
use crate::buffers::Buf;

/// Whether an instruction writes a buffer (it may also read it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Written, and perhaps read first.
    Write,
}

impl<K> Instr<K> {
    /// Calls `f` on each buffer the instruction reads or writes, in a fixed
    /// order, so a caller can move them (a staging copy's offsets).
    pub fn for_each_buf(&mut self, mut f: impl FnMut(&mut Buf, Access)) {
        use Access::{Read as R, Write as W};
        match self {
            Instr::Input { out, .. } | Instr::Fill { out, .. } | Instr::Arange { out } => f(out, W),
            Instr::Copy { from, to } => {
                f(from, R);
                f(to, W)
            }
            Instr::AllReduce { x, out }
            | Instr::TensorAllReduce { x, out }
            | Instr::SequenceAllGather { x, out, .. }
            | Instr::SequenceReduceScatter { x, out, .. }
            | Instr::SequenceSlice { x, out, .. }
            | Instr::AlibiBias { x, out, .. }
            | Instr::VocabShard { ids: x, out, .. }
            | Instr::ReduceScatter { x, out }
            | Instr::AllGather { x, out }
            | Instr::Transpose { x, out, .. }
            | Instr::Slice { x, out, .. }
            | Instr::Scale { x, out, .. }
            | Instr::SumTo { x, out, .. }
            | Instr::Cast { x, out } => {
                f(x, R);
                f(out, W)
            }
            Instr::SliceGrad { dy, out, .. } => {
                f(dy, R);
                f(out, W)
            }
            Instr::FlashAttention { inputs, outputs, .. } => {
                inputs.iter_mut().for_each(|b| f(b, R));
                outputs.iter_mut().for_each(|b| f(b, W));
            }
            Instr::FlashAttentionGrad { inputs, outputs, .. } => {
                inputs.iter_mut().for_each(|b| f(b, R));
                outputs.iter_mut().for_each(|b| f(b, W));
            }
            Instr::Kernel { inputs, outputs, .. } => {
                inputs.iter_mut().for_each(|b| f(b, R));
                outputs.iter_mut().for_each(|b| f(b, W));
            }
            Instr::MatMul { a, b, out, .. } => {
                f(a, R);
                f(b, R);
                f(out, W)
            }
            Instr::Embedding { table: a, ids: b, out, .. }
            | Instr::CrossEntropyStats { logits: a, labels: b, out, .. }
            | Instr::CrossEntropyCombine { stats: a, labels: b, out, .. }
            | Instr::EmbeddingGrad { dy: a, ids: b, out, .. }
            | Instr::CrossEntropy { logits: a, labels: b, out, .. }
            | Instr::Mse { p: a, t: b, out }
            | Instr::Broadcast { a, b, out, .. } => {
                f(a, R);
                f(b, R);
                f(out, W)
            }
            Instr::CrossEntropyShardGrad { logits: a, labels: b, stats: c, dloss: d, out, .. } => {
                f(a, R);
                f(b, R);
                f(c, R);
                f(d, R);
                f(out, W)
            }
            Instr::CrossEntropyGrad { logits: a, labels: b, dloss: c, out, .. }
            | Instr::MseGrad { p: a, t: b, dloss: c, out } => {
                f(a, R);
                f(b, R);
                f(c, R);
                f(out, W)
            }
            Instr::Split { x, outs, .. } => {
                f(x, R);
                outs.iter_mut().for_each(|b| f(b, W));
            }
            Instr::Concat { parts, out, .. } | Instr::Flatten { parts, out } => {
                parts.iter_mut().for_each(|b| f(b, R));
                f(out, W)
            }
            Instr::LrSchedule { step, out, .. } => {
                f(step, R);
                f(out, W)
            }
            Instr::GradScale { sq, scale, multiplier, finite, .. } => {
                f(sq, R);
                f(scale, R);
                f(multiplier, W);
                f(finite, W)
            }
            Instr::LossScaleUpdate { scale, good, finite, outs, .. } => {
                f(scale, R);
                f(good, R);
                f(finite, R);
                outs.iter_mut().for_each(|b| f(b, W));
            }
        }
    }
}
