//! Dropout stream words under tensor parallelism: which sites are sharded,
//! and the stream each tensor rank draws them from.
//!
//! A dropout mask is Philox(seed, (element, stream, offset))
//! ([`crate::interp::random::dropout_keeps`]). Every tensor rank runs the
//! same graph with the same seed and offsets, so a site draws the same mask
//! on every rank. That is what a *replicated* site needs (the ranks compute
//! the same tensor and must stay equal) and wrong for a *sharded* one: the
//! attention probabilities of rank `r`'s heads, the column-parallel GLU
//! product, and with sequence parallelism the `[batch, seq/t, hidden]`
//! slices would all repeat one pattern across ranks. Megatron-LM draws
//! sharded-region dropout from a per-tensor-rank generator (its
//! "model-parallel RNG tracker") for this reason; here the rank goes into
//! the stream word.
//!
//! The stream word is split rather than the ops given a `sharded` field:
//!
//! | bits | meaning |
//! |---|---|
//! | 31 | [`SHARDED`]: set by the graph builder at a sharded site |
//! | 16‥30 | the tensor rank, filled in by [`for_tensor_rank`] at load |
//! | 0‥15 | the site (the builder's counter, below [`MAX_SITES`]) |
//!
//! The mark then travels wherever a stream is copied — autodiff's dropout
//! adjoint, the `attention` pass's [`Op::FlashAttention`] and its gradient,
//! recomputation, the fuse pass's [`Expr::Keep`] — with no pass and no
//! backend knowing of it, and a graph without tensor parallelism (nothing
//! marked) is bit for bit what it was. Every backend already takes the
//! stream word as given, so the per-rank masks need no codegen change.

use crate::graph::Graph;
use crate::kernel::Expr;
use crate::op::Op;

/// The mark of a sharded dropout site.
pub const SHARDED: u32 = 1 << 31;
/// Where the tensor rank sits in a sharded site's stream word.
pub const RANK_SHIFT: u32 = 16;
/// The bits of the tensor rank.
pub const RANK_MASK: u32 = 0x7FFF << RANK_SHIFT;
/// Dropout sites a graph may have: the site number must leave the mark and
/// rank bits alone.
pub const MAX_SITES: u32 = 1 << RANK_SHIFT;
/// Tensor ranks the rank field holds, less one: the all-ones word is the
/// initialisation stream ([`crate::interp::random::INIT_STREAM`]).
pub const MAX_TENSOR_RANKS: u64 = 0x7FFF;

/// The stream word of dropout site `site`: marked [`SHARDED`] when the
/// tensor it drops is split over the tensor ranks (each rank holds other
/// elements), unmarked when every tensor rank holds the same tensor.
pub fn site_stream(site: u32, sharded: bool) -> u32 {
    debug_assert!(site < MAX_SITES, "dropout site {site} overflows the stream word");
    if sharded { SHARDED | site } else { site }
}

/// Whether `stream` is a sharded site's.
pub fn is_sharded(stream: u32) -> bool {
    stream & SHARDED != 0
}

/// The stream tensor rank `rank` draws site `stream` from: a sharded site's
/// with `rank` in its rank field (so each rank draws its own mask, as
/// Megatron's model-parallel RNG tracker does), a replicated site's as it is
/// (every rank the same mask, so the replicas stay equal).
pub fn for_tensor_rank(stream: u32, rank: u64) -> u32 {
    debug_assert!(rank < MAX_TENSOR_RANKS, "tensor rank {rank} overflows the stream word");
    if is_sharded(stream) { (stream & !RANK_MASK) | (((rank as u32) << RANK_SHIFT) & RANK_MASK) } else { stream }
}

/// Rewrites every dropout stream of `graph` — [`Op::Dropout`],
/// [`Op::FlashAttention`] and its gradient, and the [`Expr::Keep`]s of fused
/// kernels — for tensor rank `rank` of `ranks` ([`for_tensor_rank`]).
/// Returns how many streams changed (0 when `ranks` is 1: nothing is
/// marked). Run it once per rank before instruction selection.
pub fn graph_for_tensor_rank(graph: &mut Graph, rank: u64, ranks: u64) -> Result<usize, String> {
    if ranks > MAX_TENSOR_RANKS {
        return Err(format!(
            "{ranks} tensor-parallel ranks: dropout streams hold at most {MAX_TENSOR_RANKS} (use fewer tensor ranks)"
        ));
    }
    if rank >= ranks {
        return Err(format!("tensor rank {rank} is not one of {ranks}"));
    }
    let mut changed = 0;
    let mut rewrite = |stream: &mut u32| {
        let new = for_tensor_rank(*stream, rank);
        changed += usize::from(new != *stream);
        *stream = new;
    };
    for node in &mut graph.nodes {
        match &mut node.op {
            Op::Dropout { stream, .. } | Op::FlashAttention { stream, .. } | Op::FlashAttentionGrad { stream, .. } => {
                rewrite(stream)
            }
            Op::Fused { kernel } => {
                for expr in &mut kernel.body {
                    if let Expr::Keep { stream, .. } = expr {
                        rewrite(stream);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::random::INIT_STREAM;

    #[test]
    fn sharded_sites_get_a_stream_per_rank() {
        let site = site_stream(7, true);
        let streams: Vec<u32> = (0..8).map(|r| for_tensor_rank(site, r)).collect();
        for (i, a) in streams.iter().enumerate() {
            assert!(is_sharded(*a));
            assert_eq!(a & 0xFFFF, 7, "the site survives");
            for b in &streams[i + 1..] {
                assert_ne!(a, b, "two ranks share a stream: {streams:?}");
            }
        }
        // Another site never meets this one on any rank.
        let other = site_stream(8, true);
        assert!((0..8).all(|r| !streams.contains(&for_tensor_rank(other, r))));
        // Idempotent: the rank field is set, not or-ed.
        assert_eq!(for_tensor_rank(for_tensor_rank(site, 3), 5), for_tensor_rank(site, 5));
    }

    #[test]
    fn replicated_sites_keep_their_stream() {
        for site in [0, 1, 5, MAX_SITES - 1] {
            let stream = site_stream(site, false);
            assert_eq!(stream, site);
            assert!((0..16).all(|r| for_tensor_rank(stream, r) == stream));
        }
    }

    #[test]
    fn no_rank_reaches_the_init_stream() {
        let last = site_stream(MAX_SITES - 1, true);
        assert_ne!(for_tensor_rank(last, MAX_TENSOR_RANKS - 1), INIT_STREAM);
    }

    #[test]
    fn too_many_ranks_are_refused() {
        let err = graph_for_tensor_rank(&mut Graph::new("g"), 0, MAX_TENSOR_RANKS + 1).unwrap_err();
        assert!(err.contains("use fewer tensor ranks"), "{err}");
        assert!(graph_for_tensor_rank(&mut Graph::new("g"), 2, 2).is_err());
    }
}
