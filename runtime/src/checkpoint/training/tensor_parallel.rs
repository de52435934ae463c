//! The tensor-parallel side of a checkpoint's logical view: a parameter
//! split over `t` tensor ranks (`Init::TensorShard`, `zeroplan_ir::build`)
//! is saved whole, as the one-rank model holds it, so a save of any `t`
//! resumes under any other.
//!
//! Tensor rank `r` holds the `r`-th of `t` equal slices along the split
//! axis of a tensor whose extent there is padded up to a multiple of `t`:
//! only the vocabulary is padded (the word embeddings' rows, the MLM
//! decoder's bias), by extra entries after the real ones. [`join`] puts the
//! slices side by side and drops the padding; [`split`] pads with zeros and
//! cuts. Zero, not what a fresh run would have drawn there: `vocab_shard`
//! never looks a padded row up and the cross-entropy gives it no gradient,
//! so its value reaches no loss, gradient or norm (weight decay only scales
//! it) — and a zero moment is exactly what a never-read row's moment is.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use zeroplan_ir::Tensor;

/// Which logical tensors a program splits over its tensor-parallel ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorParallel {
    /// The tensor-parallel ranks `t` of a model replica.
    pub ranks: usize,
    /// The split tensors by logical name (a parameter and its AdamW
    /// moments); every other tensor is replicated on each tensor rank.
    pub splits: BTreeMap<String, Split>,
}

/// How one logical tensor is split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Split {
    /// The axis the ranks split.
    pub axis: usize,
    /// The shape of all ranks' slices together: the one-rank shape with
    /// `axis` padded up to a multiple of the ranks.
    pub padded: Vec<usize>,
    /// The extent along `axis` in the one-rank model; what follows is padding.
    pub logical: usize,
}

impl Split {
    /// The shape of the tensor as the one-rank model holds it.
    /// (Total on splits that fail [`Split::check`]: their shapes are never
    /// used, but a crafted manifest must not panic on the way.)
    pub fn logical_shape(&self) -> Vec<usize> {
        let mut shape = self.padded.clone();
        if let Some(along) = shape.get_mut(self.axis) {
            *along = self.logical;
        }
        shape
    }

    /// The shape of one of `ranks` tensor ranks' slices.
    pub fn shard_shape(&self, ranks: usize) -> Vec<usize> {
        let mut shape = self.padded.clone();
        if let Some(along) = shape.get_mut(self.axis) {
            *along = along.checked_div(ranks).unwrap_or(0);
        }
        shape
    }

    /// Why this split cannot be over `ranks` ranks (input read from a
    /// manifest is not trusted): an axis out of range, an extent the ranks
    /// do not divide, padding that is negative, sizes that overflow.
    pub fn check(&self, ranks: usize) -> Result<(), String> {
        let Some(&along) = self.padded.get(self.axis) else {
            return Err(format!("axis {} of a rank-{} tensor", self.axis, self.padded.len()));
        };
        if ranks == 0 || !along.is_multiple_of(ranks) {
            return Err(format!("{along} along axis {} does not split over {ranks} ranks", self.axis));
        }
        if self.logical > along {
            return Err(format!("{} logical entries along axis {} exceed the padded {along}", self.logical, self.axis));
        }
        if self.padded.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).is_none() {
            return Err(format!("shape {:?} overflows", self.padded));
        }
        Ok(())
    }

    /// `(outer, inner)`: the elements before and after `axis` in row-major order.
    fn blocks(&self) -> (usize, usize) {
        (self.padded[..self.axis].iter().product(), self.padded[self.axis + 1..].iter().product())
    }
}

/// The logical tensor from the tensor ranks' slices `shards` (in tensor
/// rank order), the padding dropped.
pub fn join(shards: &[&Tensor], split: &Split) -> Result<Tensor, String> {
    let ranks = shards.len();
    split.check(ranks)?;
    let want = split.shard_shape(ranks);
    let mut parts = Vec::with_capacity(ranks);
    for (r, t) in shards.iter().enumerate() {
        if t.shape() != want {
            return Err(format!("tensor rank {r}'s slice is {:?}, the split's is {want:?}", t.shape()));
        }
        parts.push(t.floats().ok_or("an integer tensor is never split")?);
    }
    let (outer, inner) = split.blocks();
    let (part, logical) = (want[split.axis], split.logical);
    let mut values = Vec::with_capacity(outer * logical * inner);
    for o in 0..outer {
        // Row `o` of the whole tensor: each rank's block in turn, cut at the padding.
        let mut left = logical;
        for p in &parts {
            let rows = part.min(left);
            let at = o * part * inner;
            values.extend_from_slice(&p[at..at + rows * inner]);
            left -= rows;
        }
    }
    Tensor::float(split.logical_shape(), shards[0].dtype(), values).map_err(|e| e.0)
}

/// Tensor rank `rank`'s slice of the logical tensor, of `ranks`: padded
/// with zeros along the axis, then cut.
pub fn split(logical: &Tensor, split: &Split, rank: usize, ranks: usize) -> Result<Tensor, String> {
    split.check(ranks)?;
    if rank >= ranks {
        return Err(format!("tensor rank {rank} of {ranks}"));
    }
    if logical.shape() != split.logical_shape() {
        return Err(format!("the tensor is {:?}, the split's is {:?}", logical.shape(), split.logical_shape()));
    }
    let values = logical.floats().ok_or("an integer tensor is never split")?;
    let (outer, inner) = split.blocks();
    let part = split.padded[split.axis] / ranks;
    let first = rank * part;
    let mut out = Vec::with_capacity(outer * part * inner);
    for o in 0..outer {
        // A rank may hold padding only (5 words over 4 ranks: rank 3's two rows).
        let real = split.logical.saturating_sub(first).min(part);
        if real > 0 {
            let at = (o * split.logical + first) * inner;
            out.extend_from_slice(&values[at..at + real * inner]);
        }
        out.resize(out.len() + (part - real) * inner, 0.0);
    }
    Tensor::float(split.shard_shape(ranks), logical.dtype(), out).map_err(|e| e.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeroplan_ir::DType;

    /// A tensor whose element `i` is `i + 1` (never 0, so padding shows).
    fn counting(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::float(shape.to_vec(), DType::F32, (1..=n).map(|i| i as f64).collect()).unwrap()
    }

    /// The padded whole tensor, the slow way: element by element, the index
    /// along `axis` past `logical` reading 0.
    fn padded_whole(t: &Tensor, s: &Split) -> Vec<f64> {
        let (outer, inner) = s.blocks();
        let values = t.floats().unwrap();
        let mut out = Vec::new();
        for o in 0..outer {
            for a in 0..s.padded[s.axis] {
                for i in 0..inner {
                    out.push(if a < s.logical { values[(o * s.logical + a) * inner + i] } else { 0.0 });
                }
            }
        }
        out
    }

    #[test]
    fn split_then_join_is_the_identity_on_every_axis_with_padding() {
        // [rows, columns, depth] split along each axis over 1–4 ranks, the split extent padded or not.
        for axis in 0..3 {
            for ranks in 1..=4 {
                // All of the last rank's slice padding, too: 4·ranks − 4 real entries.
                for logical in [4 * ranks - 4, 4 * ranks - 1, 4 * ranks] {
                    let mut padded = vec![3, 2, 5];
                    padded[axis] = 4 * ranks;
                    let s = Split { axis, padded: padded.clone(), logical };
                    let whole = counting(&s.logical_shape());
                    let shards: Vec<Tensor> = (0..ranks).map(|r| split(&whole, &s, r, ranks).unwrap()).collect();
                    // Each slice is the rank's block of the zero-padded whole, as Init::TensorShard cuts it.
                    let want = padded_whole(&whole, &s);
                    let (outer, inner) = s.blocks();
                    let part = padded[axis] / ranks;
                    for (r, shard) in shards.iter().enumerate() {
                        assert_eq!(shard.shape(), s.shard_shape(ranks));
                        let got = shard.floats().unwrap();
                        for o in 0..outer {
                            let at = (o * padded[axis] + r * part) * inner;
                            let block = &got[o * part * inner..(o + 1) * part * inner];
                            assert_eq!(block, &want[at..at + part * inner], "axis {axis}, rank {r} of {ranks}");
                        }
                    }
                    let refs: Vec<&Tensor> = shards.iter().collect();
                    assert_eq!(join(&refs, &s).unwrap(), whole, "axis {axis}, {ranks} ranks, logical {logical}");
                }
            }
        }
    }

    #[test]
    fn the_vocabulary_padding_is_zero_rows_and_is_dropped_again() {
        // 62 words over 4 ranks: 16 rows each, the last rank's final two padding.
        let s = Split { axis: 0, padded: vec![64, 3], logical: 62 };
        let table = counting(&[62, 3]);
        let last = split(&table, &s, 3, 4).unwrap();
        assert_eq!(&last.floats().unwrap()[14 * 3..], &[0.0; 6]);
        assert_eq!(last.floats().unwrap()[..3], [145.0, 146.0, 147.0], "row 48");
        // Whatever the padding holds, the join drops it.
        let mut shards: Vec<Tensor> = (0..4).map(|r| split(&table, &s, r, 4).unwrap()).collect();
        shards[3].floats_mut().unwrap()[14 * 3..].fill(7.5);
        assert_eq!(join(&shards.iter().collect::<Vec<_>>(), &s).unwrap(), table);
    }

    #[test]
    fn what_does_not_fit_is_an_error_not_a_panic() {
        let s = Split { axis: 1, padded: vec![2, 6], logical: 6 };
        let whole = counting(&[2, 6]);
        assert!(split(&whole, &s, 0, 4).unwrap_err().contains("does not split over 4 ranks"));
        assert!(split(&whole, &s, 2, 2).unwrap_err().contains("tensor rank 2 of 2"));
        assert!(split(&counting(&[2, 5]), &s, 0, 2).unwrap_err().contains("[2, 5]"));
        let a = split(&whole, &s, 0, 2).unwrap();
        assert!(join(&[&a, &whole], &s).unwrap_err().contains("tensor rank 1's slice is [2, 6]"));
        let bad = Split { axis: 2, padded: vec![2, 6], logical: 6 };
        assert!(join(&[&a], &bad).unwrap_err().contains("axis 2 of a rank-2 tensor"));
        let over = Split { axis: 0, padded: vec![2, 6], logical: 3 };
        assert!(over.check(2).unwrap_err().contains("exceed"));
        assert!(join(&[], &s).unwrap_err().contains("over 0 ranks"));
    }
}
