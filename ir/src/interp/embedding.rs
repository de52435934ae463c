//! `embedding` (row gather) and its adjoint `embedding_grad` (scatter-add).

use super::nd;
use crate::tensor::Tensor;

/// `table[ids[...]]`: shape `ids.shape + [E]`. An id of −1 reads a zero row
/// (a token another tensor rank's vocabulary shard holds, see
/// [`crate::Op::VocabShard`]); any other id outside `[0, V)` is an error
/// that names it and its position.
pub(super) fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor, String> {
    let (rows, width) = table_shape(table.shape())?;
    let t = nd::floats(table, "the table")?;
    let ids_v = nd::ints(ids, "the ids")?;
    let mut out = Vec::with_capacity(ids_v.len() * width);
    for (position, &id) in ids_v.iter().enumerate() {
        match checked_row(id, rows, position)? {
            Some(row) => out.extend_from_slice(&t[row * width..][..width]),
            None => out.extend(std::iter::repeat_n(0.0, width)),
        }
    }
    let mut shape = ids.shape().to_vec();
    shape.push(width);
    Ok(nd::float(shape, table.dtype(), out))
}

/// `(dy[..., E], ids[...]) → [rows, E]`: each row of `dy` added into the
/// table row its id names, in element order. Ids must be in `[0, rows)`,
/// or −1 (no row: nothing added).
pub(super) fn embedding_grad(dy: &Tensor, ids: &Tensor, rows: usize) -> Result<Tensor, String> {
    let g = nd::floats(dy, "the gradient")?;
    let ids_v = nd::ints(ids, "the ids")?;
    let width = dy.shape().last().copied().ok_or("the gradient must have rank ≥ 1")?;
    if dy.shape()[..dy.shape().len() - 1] != *ids.shape() {
        return Err(format!("the gradient {:?} must be the ids {:?} with one more axis", dy.shape(), ids.shape()));
    }
    let mut out = vec![0.0; rows * width];
    for (position, &id) in ids_v.iter().enumerate() {
        let Some(row) = checked_row(id, rows, position)? else { continue };
        for (o, &d) in out[row * width..][..width].iter_mut().zip(&g[position * width..][..width]) {
            *o += d;
        }
    }
    Ok(nd::float(vec![rows, width], dy.dtype(), out))
}

fn table_shape(shape: &[usize]) -> Result<(usize, usize), String> {
    match shape {
        [rows, width] => Ok((*rows, *width)),
        _ => Err(format!("the table must be [rows, width], got {shape:?}")),
    }
}

/// The row of `id`; `None` for −1, the id of a row on another tensor rank.
fn checked_row(id: i64, rows: usize, position: usize) -> Result<Option<usize>, String> {
    if id == -1 {
        return Ok(None);
    }
    usize::try_from(id)
        .ok()
        .filter(|&r| r < rows)
        .map(Some)
        .ok_or_else(|| format!("id {id} at position {position} is outside the table's rows [0, {rows})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn gathers_rows_and_scatter_adds_gradients() {
        let table = Tensor::float(vec![3, 2], DType::F32, vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0]).unwrap();
        let ids = Tensor::int(vec![2, 2], DType::I64, vec![2, 0, 2, 1]).unwrap();
        let e = embedding(&table, &ids).unwrap();
        assert_eq!(e.shape(), &[2, 2, 2]);
        assert_eq!(e.floats().unwrap(), &[20.0, 21.0, 0.0, 1.0, 20.0, 21.0, 10.0, 11.0]);
        let dy = Tensor::float(vec![2, 2, 2], DType::F32, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]).unwrap();
        let g = embedding_grad(&dy, &ids, 3).unwrap();
        // row 0 ← dy[0,1]; row 1 ← dy[1,1]; row 2 ← dy[0,0] + dy[1,0].
        assert_eq!(g.floats().unwrap(), &[3.0, 4.0, 7.0, 8.0, 6.0, 8.0]);
    }

    #[test]
    fn bad_ids_are_named() {
        let table = Tensor::float(vec![3, 2], DType::F32, vec![0.0; 6]).unwrap();
        for bad in [3, -2] {
            let ids = Tensor::int(vec![2], DType::I64, vec![0, bad]).unwrap();
            let err = embedding(&table, &ids).unwrap_err();
            assert!(err.contains(&format!("id {bad} at position 1")), "{err}");
            let dy = Tensor::float(vec![2, 2], DType::F32, vec![0.0; 4]).unwrap();
            assert!(embedding_grad(&dy, &ids, 3).is_err());
        }
    }
}
