//! `embedding` (a row gather) and `embedding_grad` (its scatter-add, in
//! element order like the reference, accumulated in f64 per row).

/// `out[i] = table[ids[i]]`, rows of `width`.
pub fn embedding(table: &[f32], ids: &[i64], width: usize, out: &mut [f32]) -> Result<(), String> {
    let rows = table.len().checked_div(width).unwrap_or(0);
    for (i, &id) in ids.iter().enumerate() {
        let r =
            usize::try_from(id).ok().filter(|&r| r < rows).ok_or_else(|| format!("id {id} is outside [0, {rows})"))?;
        out[i * width..(i + 1) * width].copy_from_slice(&table[r * width..(r + 1) * width]);
    }
    Ok(())
}

/// `out = 0; out[ids[i]] += dy[i]`, rows of `width`; sums in f64, rounded once.
pub fn embedding_grad(dy: &[f32], ids: &[i64], width: usize, out: &mut [f32]) -> Result<(), String> {
    let rows = out.len().checked_div(width).unwrap_or(0);
    let mut acc = vec![0.0f64; out.len()];
    for (i, &id) in ids.iter().enumerate() {
        let r =
            usize::try_from(id).ok().filter(|&r| r < rows).ok_or_else(|| format!("id {id} is outside [0, {rows})"))?;
        for (a, &d) in acc[r * width..(r + 1) * width].iter_mut().zip(&dy[i * width..(i + 1) * width]) {
            *a += f64::from(d);
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a as f32;
    }
    Ok(())
}
