//! The rank-dependent ops of tensor parallelism (Megatron-LM's
//! vocabulary-parallel embedding and cross-entropy), as functions of the
//! tensor rank `rank` of `ranks`, so that the interpreter (one rank) and the
//! compiled runtimes (each rank) compute the same thing.
//!
//! A vocabulary-parallel cross-entropy never gathers the logits: each rank
//! reduces its `[N, C]` columns to three numbers per row (local maximum
//! `m_r`, `s_r = Σ exp(x − m_r)`, the label's logit where it holds the
//! label), the ranks exchange those, and every rank combines them:
//! `M = max m_r`, `logsumexp = M + ln Σ s_r·exp(m_r − M)`.

use super::loss::label_classes;
use super::nd;
use crate::tensor::Tensor;

/// The statistics per row and rank: maximum, sum of exponentials, label logit.
pub const STATS: usize = 3;

/// Tensor rank `rank`'s local ids of a table of `rows` rows per rank: `id −
/// rank·rows` where that lies in `[0, rows)`, else −1. An id outside the
/// whole table `[0, ranks·rows)` is an error naming it.
pub fn vocab_shard(ids: &[i64], rank: u64, ranks: u64, rows: u64) -> Result<Vec<i64>, String> {
    let (start, whole) = ((rank * rows) as i64, (ranks * rows) as i64);
    ids.iter()
        .enumerate()
        .map(|(position, &id)| {
            if !(0..whole).contains(&id) {
                return Err(format!("id {id} at position {position} is outside the table's rows [0, {whole})"));
            }
            let local = id - start;
            Ok(if (0..rows as i64).contains(&local) { local } else { -1 })
        })
        .collect()
}

/// The columns of this rank that are real classes (the rest pad the
/// vocabulary up to a multiple of the ranks).
fn real_columns(c: usize, rank: u64, vocab: u64) -> usize {
    (vocab.saturating_sub(rank * c as u64) as usize).min(c)
}

/// `[ranks, N, 3]` with this rank's slot filled: see [`crate::Op::CrossEntropyStats`].
/// `labels` are whole-vocabulary classes (or the ignore index, which no
/// column holds).
pub fn cross_entropy_stats(logits: &[f64], labels: &[i64], c: usize, rank: u64, ranks: u64, vocab: u64) -> Vec<f64> {
    let n = labels.len();
    let real = real_columns(c, rank, vocab);
    let start = rank as i64 * c as i64;
    let mut out = vec![0.0; ranks as usize * n * STATS];
    for (i, (row, &label)) in logits.chunks(c.max(1)).zip(labels).enumerate() {
        let row = &row[..real];
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum = if max == f64::NEG_INFINITY { 0.0 } else { row.iter().map(|x| (x - max).exp()).sum() };
        let local = label - start;
        let target = if (0..real as i64).contains(&local) { row[local as usize] } else { 0.0 };
        out[(rank as usize * n + i) * STATS..][..STATS].copy_from_slice(&[max, sum, target]);
    }
    out
}

/// Per row, `logsumexp` over every rank's columns from the gathered `[ranks, N, 3]`.
pub fn log_sum_exp(stats: &[f64], n: usize, i: usize) -> f64 {
    let ranks = stats.len() / (n * STATS).max(1);
    let at = |r: usize| &stats[(r * n + i) * STATS..][..STATS];
    let max = (0..ranks).map(|r| at(r)[0]).fold(f64::NEG_INFINITY, f64::max);
    let total: f64 = (0..ranks).map(|r| at(r)[1] * (at(r)[0] - max).exp()).filter(|v| !v.is_nan()).sum();
    max + total.ln()
}

/// The label's logit of row `i`: only its owner's slot is nonzero.
fn target(stats: &[f64], n: usize, i: usize) -> f64 {
    let ranks = stats.len() / (n * STATS).max(1);
    (0..ranks).map(|r| stats[(r * n + i) * STATS + 2]).sum()
}

/// Mean over counted rows of `logsumexp − logit[label]`; 0 with none.
pub fn cross_entropy_combine(stats: &[f64], labels: &[i64], ignore_index: i64) -> f64 {
    let n = labels.len();
    let (mut total, mut count) = (0.0, 0usize);
    for (i, &label) in labels.iter().enumerate() {
        if label != ignore_index {
            total += log_sum_exp(stats, n, i) - target(stats, n, i);
            count += 1;
        }
    }
    if count == 0 { 0.0 } else { total / count as f64 }
}

/// `dloss·(softmax − onehot)/count` on this rank's `c` columns (0 on padding).
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_shard_grad(
    logits: &[f64],
    labels: &[i64],
    stats: &[f64],
    dloss: f64,
    ignore_index: i64,
    c: usize,
    rank: u64,
    vocab: u64,
) -> Vec<f64> {
    let n = labels.len();
    let real = real_columns(c, rank, vocab);
    let start = rank as i64 * c as i64;
    let count = labels.iter().filter(|&&l| l != ignore_index).count();
    let mut out = vec![0.0; logits.len()];
    for (i, (row, &label)) in logits.chunks(c.max(1)).zip(labels).enumerate() {
        if label == ignore_index {
            continue;
        }
        let lse = log_sum_exp(stats, n, i);
        let scale = dloss / count as f64;
        let grad = &mut out[i * c..][..c];
        for (g, x) in grad[..real].iter_mut().zip(row) {
            *g = (x - lse).exp() * scale;
        }
        let local = label - start;
        if (0..real as i64).contains(&local) {
            grad[local as usize] -= scale;
        }
    }
    out
}

/// The interpreter's forms, on tensors, for tensor rank `rank` of `ranks`.
pub(super) mod on_tensors {
    use super::*;

    fn logits_of(logits: &Tensor, labels: &[i64]) -> Result<usize, String> {
        match logits.shape() {
            [n, c] if *n == labels.len() => Ok(*c),
            shape => Err(format!("logits must be [{}, classes], got {shape:?}", labels.len())),
        }
    }

    /// Labels checked against the whole vocabulary.
    fn checked(labels: &Tensor, vocab: u64, ignore_index: Option<i64>) -> Result<&[i64], String> {
        let l = nd::ints(labels, "the labels")?;
        label_classes(l, vocab as usize, ignore_index.unwrap_or(i64::MIN))?;
        Ok(l)
    }

    pub fn vocab_shard(ids: &Tensor, rank: u64, ranks: u64, rows: u64) -> Result<Tensor, String> {
        let local = super::vocab_shard(nd::ints(ids, "the ids")?, rank, ranks, rows)?;
        Tensor::int(ids.shape().to_vec(), ids.dtype(), local).map_err(|e| e.to_string())
    }

    pub fn stats(logits: &Tensor, labels: &Tensor, rank: u64, ranks: u64, vocab: u64) -> Result<Tensor, String> {
        // The ignore index is the combine's business: any label outside the
        // vocabulary is simply held by no rank here.
        let l = nd::ints(labels, "the labels")?;
        let c = logits_of(logits, l)?;
        let out = cross_entropy_stats(nd::floats(logits, "the logits")?, l, c, rank, ranks, vocab);
        Ok(nd::float(vec![ranks as usize, l.len(), STATS], logits.dtype(), out))
    }

    pub fn combine(stats: &Tensor, labels: &Tensor, logits: &Tensor, ignore_index: i64) -> Result<Tensor, String> {
        let vocab = (stats.shape()[0] * logits.shape()[1]) as u64;
        let l = checked(labels, vocab, Some(ignore_index))?;
        Ok(nd::scalar(cross_entropy_combine(nd::floats(stats, "the statistics")?, l, ignore_index)))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn shard_grad(
        logits: &Tensor,
        labels: &Tensor,
        stats: &Tensor,
        dloss: &Tensor,
        ignore_index: i64,
        rank: u64,
        vocab: u64,
    ) -> Result<Tensor, String> {
        let l = checked(labels, vocab, Some(ignore_index))?;
        let c = logits_of(logits, l)?;
        let (x, s) = (nd::floats(logits, "the logits")?, nd::floats(stats, "the statistics")?);
        let out = cross_entropy_shard_grad(x, l, s, nd::item(dloss, "dloss")?, ignore_index, c, rank, vocab);
        Ok(nd::float(logits.shape().to_vec(), logits.dtype(), out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::philox::philox4x32_10;

    /// Logits of `n` rows over `v` classes, spread over a few units.
    fn logits(n: usize, v: usize) -> Vec<f64> {
        (0..n * v).map(|e| f64::from(philox4x32_10([e as u32, 0, 0, 0], [1, 2])[0]) / 4.0e8 - 5.0).collect()
    }

    /// Column block `r` of `[n, v]` logits padded to `ranks·c` columns.
    fn block(all: &[f64], n: usize, v: usize, c: usize, r: usize) -> Vec<f64> {
        let mut out = vec![0.0; n * c];
        for i in 0..n {
            for j in 0..c {
                let col = r * c + j;
                out[i * c + j] = if col < v { all[i * v + col] } else { 1e9 };
            }
        }
        out
    }

    #[test]
    fn sharded_cross_entropy_is_the_whole_one() {
        // 10 classes over 4 ranks: 3 columns each, the last two padding
        // (filled with 1e9, which must not count).
        let (n, v, ranks, c) = (5, 10, 4u64, 3);
        let all = logits(n, v);
        let labels = [3i64, -100, 9, 0, 7];
        let mut gathered = vec![0.0; ranks as usize * n * STATS];
        for r in 0..ranks {
            let part = cross_entropy_stats(&block(&all, n, v, c, r as usize), &labels, c, r, ranks, v as u64);
            for (g, p) in gathered.iter_mut().zip(part) {
                *g += p;
            }
        }
        let whole = {
            let t = nd::float(vec![n, v], crate::DType::F32, all.clone());
            let l = Tensor::int(vec![n], crate::DType::I64, labels.to_vec()).unwrap();
            let loss = crate::interp::loss::cross_entropy(&t, &l, -100).unwrap();
            let one = nd::scalar(1.0);
            let grad = crate::interp::loss::cross_entropy_grad(&t, &l, &one, -100).unwrap();
            (nd::item(&loss, "").unwrap(), grad.floats().unwrap().to_vec())
        };
        let loss = cross_entropy_combine(&gathered, &labels, -100);
        assert!((loss - whole.0).abs() < 1e-12, "{loss} vs {}", whole.0);
        for r in 0..ranks as usize {
            let x = block(&all, n, v, c, r);
            let g = cross_entropy_shard_grad(&x, &labels, &gathered, 1.0, -100, c, r as u64, v as u64);
            for i in 0..n {
                for j in 0..c {
                    let col = r * c + j;
                    let expected = if col < v { whole.1[i * v + col] } else { 0.0 };
                    assert!((g[i * c + j] - expected).abs() < 1e-12, "rank {r} row {i} column {j}");
                }
            }
        }
    }

    #[test]
    fn vocab_shards_map_ids_to_local_rows_or_none() {
        assert_eq!(vocab_shard(&[0, 4, 5, 11], 1, 3, 4).unwrap(), vec![-1, 0, 1, -1]);
        let err = vocab_shard(&[12], 0, 3, 4).unwrap_err();
        assert!(err.contains("id 12 at position 0"), "{err}");
    }
}
