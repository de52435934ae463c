//! The losses: cross-entropy over rows with an ignore index, and mean
//! squared error, each with its gradient.
//!
//! A masked-LM's logits are the step's largest tensor (`[tokens, vocab]`,
//! 125 M values at MiniLM's 4096 tokens), so the cross-entropy runs its rows
//! on rayon's threads and takes each `exp` in f32 (relative error ~1e-7),
//! summing the rows' statistics in f64 in row order, so the result does not
//! depend on the thread count.

use rayon::prelude::*;
use zeroplan_ir::interp::label_classes;

/// `max + log Σ exp(x − max)` of a row, in f64 from f32 terms.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let sum: f64 = row.iter().map(|&x| f64::from((x - max).exp())).sum();
    f64::from(max) + sum.ln()
}

/// The mean over counted rows of `logsumexp(row) − row[label]` (0 with none).
pub fn cross_entropy(logits: &[f32], labels: &[i64], c: usize, ignore_index: i64) -> Result<f32, String> {
    let classes = label_classes(labels, c, ignore_index)?;
    let losses: Vec<Option<f64>> = logits
        .par_chunks(c.max(1))
        .zip(&classes)
        .map(|(row, class)| class.map(|k| log_sum_exp(row) - f64::from(row[k])))
        .collect();
    let (total, count) = losses.iter().flatten().fold((0.0, 0usize), |(t, n), l| (t + l, n + 1));
    Ok(if count == 0 { 0.0 } else { (total / count as f64) as f32 })
}

/// `dloss·(softmax(row) − onehot(label))/count` on counted rows, 0 elsewhere.
pub fn cross_entropy_grad(
    logits: &[f32],
    labels: &[i64],
    dloss: f32,
    c: usize,
    ignore_index: i64,
    out: &mut [f32],
) -> Result<(), String> {
    let classes = label_classes(labels, c, ignore_index)?;
    let count = classes.iter().filter(|k| k.is_some()).count();
    let scale = f64::from(dloss) / count as f64;
    logits.par_chunks(c.max(1)).zip(out.par_chunks_mut(c.max(1))).zip(&classes).for_each(|((row, o), class)| {
        let Some(class) = class else {
            o.fill(0.0);
            return;
        };
        let lse = log_sum_exp(row);
        for (g, &x) in o.iter_mut().zip(row) {
            *g = ((f64::from(x) - lse) as f32).exp() * scale as f32;
        }
        o[*class] -= scale as f32;
    });
    Ok(())
}

/// `Σ(p − t)²/N` (0 when `N = 0`).
pub fn mse(p: &[f32], t: &[f32]) -> f32 {
    let total: f64 = p.iter().zip(t).map(|(&p, &t)| (f64::from(p) - f64::from(t)).powi(2)).sum();
    if p.is_empty() { 0.0 } else { (total / p.len() as f64) as f32 }
}

/// `dloss·2(p − t)/N`.
pub fn mse_grad(p: &[f32], t: &[f32], dloss: f32, out: &mut [f32]) {
    let n = p.len() as f64;
    for ((o, &p), &t) in out.iter_mut().zip(p).zip(t) {
        *o = (f64::from(dloss) * 2.0 * (f64::from(p) - f64::from(t)) / n) as f32;
    }
}
