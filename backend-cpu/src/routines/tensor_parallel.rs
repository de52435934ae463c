//! The rank-dependent ops of tensor parallelism on the host: the
//! vocabulary-parallel cross-entropy's three steps and ALiBi on a tensor
//! rank's heads. The maths is `zeroplan_ir::interp::tensor_parallel`'s (one
//! definition for the interpreter and every runtime), on f32 buffers widened
//! to f64; the logits a rank holds are `[tokens, vocab/t]`, small next to
//! the GEMMs that make them.

use zeroplan_ir::interp::label_classes;
use zeroplan_ir::interp::tensor_parallel as tp;

fn wide(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

/// `[ranks, N, 3]` statistics with tensor rank `rank`'s slot filled.
pub fn cross_entropy_stats(
    logits: &[f32],
    labels: &[i64],
    classes: usize,
    rank: u64,
    ranks: u64,
    vocab: u64,
) -> Vec<f32> {
    let stats = tp::cross_entropy_stats(&wide(logits), labels, classes, rank, ranks, vocab);
    stats.into_iter().map(|v| v as f32).collect()
}

/// The mean loss from the gathered statistics; labels checked against the
/// whole (padded) vocabulary `vocab`.
pub fn cross_entropy_combine(stats: &[f32], labels: &[i64], vocab: usize, ignore_index: i64) -> Result<f64, String> {
    label_classes(labels, vocab, ignore_index)?;
    Ok(tp::cross_entropy_combine(&wide(stats), labels, ignore_index))
}

/// This rank's columns of the loss's gradient.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_shard_grad(
    logits: &[f32],
    labels: &[i64],
    stats: &[f32],
    dloss: f64,
    ignore_index: i64,
    classes: usize,
    rank: u64,
    vocab: u64,
    out: &mut [f32],
) {
    let grad =
        tp::cross_entropy_shard_grad(&wide(logits), labels, &wide(stats), dloss, ignore_index, classes, rank, vocab);
    for (o, g) in out.iter_mut().zip(grad) {
        *o = g as f32;
    }
}

/// `scores[b, h, i, j] − m_h·|i − j|` over `[B, H, Sq, Sk]` with the slopes
/// of this rank's `H` heads, in f32 as the row kernel computes it (slope
/// times distance, then the difference), so a tensor rank's bias is the
/// bits the whole model's kernel gives its heads.
pub fn alibi_bias(scores: &[f32], shape: [usize; 4], slopes: &[f32], out: &mut [f32]) {
    let [_, h, sq, sk] = shape;
    for (row, (x, o)) in scores.chunks(sk.max(1)).zip(out.chunks_mut(sk.max(1))).enumerate() {
        let (head, query) = ((row / sq.max(1)) % h.max(1), row % sq.max(1));
        let slope = slopes[head];
        for (key, (o, &x)) in o.iter_mut().zip(x).enumerate() {
            *o = x - slope * (key.abs_diff(query) as i32) as f32;
        }
    }
}
