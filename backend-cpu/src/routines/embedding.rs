//! `embedding` (a row gather) and `embedding_grad` (its scatter-add, in
//! element order like the reference, accumulated in f64 per row).
//!
//! An id of −1 is a token whose row another tensor rank's vocabulary shard
//! holds (`vocab_shard`): it reads a zero row and adds nothing, as in the
//! interpreter.

/// The row of `id` in a table of `rows`; `None` for −1.
fn row(id: i64, rows: usize) -> Result<Option<usize>, String> {
    if id == -1 {
        return Ok(None);
    }
    usize::try_from(id).ok().filter(|&r| r < rows).map(Some).ok_or_else(|| format!("id {id} is outside [0, {rows})"))
}

/// `out[i] = table[ids[i]]`, rows of `width` (zeros for −1).
pub fn embedding(table: &[f32], ids: &[i64], width: usize, out: &mut [f32]) -> Result<(), String> {
    let rows = table.len().checked_div(width).unwrap_or(0);
    for (i, &id) in ids.iter().enumerate() {
        let o = &mut out[i * width..(i + 1) * width];
        match row(id, rows)? {
            Some(r) => o.copy_from_slice(&table[r * width..(r + 1) * width]),
            None => o.fill(0.0),
        }
    }
    Ok(())
}

/// `out = 0; out[ids[i]] += dy[i]`, rows of `width`; sums in f64, rounded once.
pub fn embedding_grad(dy: &[f32], ids: &[i64], width: usize, out: &mut [f32]) -> Result<(), String> {
    let rows = out.len().checked_div(width).unwrap_or(0);
    let mut acc = vec![0.0f64; out.len()];
    for (i, &id) in ids.iter().enumerate() {
        let Some(r) = row(id, rows)? else { continue };
        for (a, &d) in acc[r * width..(r + 1) * width].iter_mut().zip(&dy[i * width..(i + 1) * width]) {
            *a += f64::from(d);
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a as f32;
    }
    Ok(())
}
