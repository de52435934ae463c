//! The layouts of sequence parallelism (Korthikanti et al., 2022), as
//! functions of the tensor rank, so that every runtime moves the same
//! elements: tensor rank `r` of `t` keeps positions `r·S/t … (r+1)·S/t − 1`
//! of a `[B, S, …]` activation, i.e. block `r` of the `[B, t, S/t·…]` view.
//!
//! A flat collective (the communicators' all-gather and reduce-scatter)
//! works on rank-major buffers `[t, B, S/t·…]`: [`to_rank_major`] lays a
//! whole-sequence tensor out that way before a reduce-scatter, and
//! [`from_rank_major`] puts an all-gather's result back into `[B, S, …]`.

/// `[outer, ranks, chunk] -> [ranks, outer, chunk]`: a whole-sequence
/// tensor (`outer` = the batch, `chunk` = `S/t` positions' elements) to the
/// rank-major order a flat reduce-scatter splits.
pub fn to_rank_major<T: Copy>(x: &[T], outer: usize, ranks: usize) -> Vec<T> {
    swap_leading(x, outer, ranks)
}

/// `[ranks, outer, chunk] -> [outer, ranks, chunk]`: a flat all-gather's
/// rank-major result back to the whole sequence.
pub fn from_rank_major<T: Copy>(x: &[T], outer: usize, ranks: usize) -> Vec<T> {
    swap_leading(x, ranks, outer)
}

/// `[a, b, chunk] -> [b, a, chunk]`.
fn swap_leading<T: Copy>(x: &[T], a: usize, b: usize) -> Vec<T> {
    let chunk = x.len() / (a * b).max(1);
    let mut out = Vec::with_capacity(x.len());
    for j in 0..b {
        for i in 0..a {
            out.extend_from_slice(&x[(i * b + j) * chunk..][..chunk]);
        }
    }
    out
}

/// Tensor rank `rank`'s slice of `ranks` along `axis` of a tensor of
/// `shape`: for each index of the axes before `axis`, its block `rank` of
/// the axis and everything after it.
pub fn slice<T: Copy>(x: &[T], shape: &[usize], axis: usize, rank: usize, ranks: usize) -> Vec<T> {
    let outer: usize = shape[..axis].iter().product();
    let block = x.len() / (outer * ranks).max(1);
    (0..outer).flat_map(|o| x[(o * ranks + rank) * block..][..block].iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[B, S, H]` with element value `100·b + 10·s + h`.
    fn whole(b: usize, s: usize, h: usize) -> Vec<i64> {
        (0..b * s * h).map(|e| (100 * (e / (s * h)) + 10 * (e / h % s) + e % h) as i64).collect()
    }

    #[test]
    fn slices_hold_consecutive_positions_and_gather_back_to_the_whole() {
        let (b, s, h, t) = (2, 6, 2, 3);
        let x = whole(b, s, h);
        let slices: Vec<Vec<i64>> = (0..t).map(|r| slice(&x, &[b, s, h], 1, r, t)).collect();
        // Rank 1 holds positions 2 and 3 of each sequence.
        assert_eq!(slices[1], vec![20, 21, 30, 31, 120, 121, 130, 131]);
        // A flat all-gather concatenates the slices in rank order.
        let gathered: Vec<i64> = slices.concat();
        assert_eq!(from_rank_major(&gathered, b, t), x);
        // A flat reduce-scatter's part r of the rank-major layout is slice r.
        let major = to_rank_major(&x, b, t);
        for (r, part) in major.chunks(x.len() / t).enumerate() {
            assert_eq!(part, slices[r].as_slice(), "rank {r}");
        }
    }

    #[test]
    fn a_leading_axis_slices_too() {
        // Position ids [S] over 2 ranks.
        let ids: Vec<i64> = (0..8).collect();
        assert_eq!(slice(&ids, &[8], 0, 1, 2), vec![4, 5, 6, 7]);
    }
}
