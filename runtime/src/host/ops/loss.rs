//! The losses: cross-entropy over rows with an ignore index, and mean
//! squared error, each with its gradient. Row statistics in f64 (the
//! logits row is short next to the GEMM that made it).

/// Each row's class, `None` for an ignored row; a bad label is an error.
fn classes(labels: &[i64], c: usize, ignore_index: i64) -> Result<Vec<Option<usize>>, String> {
    labels
        .iter()
        .enumerate()
        .map(|(row, &label)| {
            if label == ignore_index {
                return Ok(None);
            }
            usize::try_from(label).ok().filter(|&k| k < c).map(Some).ok_or_else(|| {
                format!("label {label} of row {row} is outside [0, {c}) and is not ignore_index {ignore_index}")
            })
        })
        .collect()
}

/// `max` and `log Σ exp(x − max)` of a row.
fn log_sum_exp(row: &[f32]) -> (f64, f64) {
    let max = row.iter().map(|&x| f64::from(x)).fold(f64::NEG_INFINITY, f64::max);
    (max, row.iter().map(|&x| (f64::from(x) - max).exp()).sum::<f64>().ln())
}

/// The mean over counted rows of `logsumexp(row) − row[label]` (0 with none).
pub fn cross_entropy(logits: &[f32], labels: &[i64], c: usize, ignore_index: i64) -> Result<f32, String> {
    let classes = classes(labels, c, ignore_index)?;
    let (mut total, mut count) = (0.0, 0usize);
    for (row, class) in logits.chunks(c.max(1)).zip(&classes) {
        let Some(class) = class else { continue };
        let (max, lse) = log_sum_exp(row);
        total += max + lse - f64::from(row[*class]);
        count += 1;
    }
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
    let classes = classes(labels, c, ignore_index)?;
    let count = classes.iter().filter(|k| k.is_some()).count();
    let scale = f64::from(dloss) / count as f64;
    for ((row, o), class) in logits.chunks(c.max(1)).zip(out.chunks_mut(c.max(1))).zip(&classes) {
        match class {
            None => o.fill(0.0),
            Some(class) => {
                let (max, lse) = log_sum_exp(row);
                for (j, (g, &x)) in o.iter_mut().zip(row).enumerate() {
                    let p = (f64::from(x) - max - lse).exp();
                    let onehot = if j == *class { 1.0 } else { 0.0 };
                    *g = ((p - onehot) * scale) as f32;
                }
            }
        }
    }
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
