//! The search's tile-count dimension: memory-centric tiling
//! ([`crate::tiling`]) for the ZeRO-3 choices that do not fit untiled.
//!
//! Under ZeRO-3 what stays on a GPU however many share the shards is one
//! gathered layer (and the next, prefetched) with one micro-batch's
//! activations. Where that exceeds the budget, the search tiles the large
//! operators — where tiling can help at all: a choice whose least peak
//! stays over the budget with every gathered layer's weights taken off is
//! not probed. It first tries the most tiles: if even those do not fit,
//! gathered weights are not what stays (activations or shards are) and one
//! probe settles the choice — the common case of a model too large for the
//! cluster, where the nothing-fits answer must stay fast. Otherwise it
//! tries 2, 4, 8, … tiles of the largest, each count searched as a choice
//! of its own, and keeps the first that fits (fewer tiles are fewer, wider
//! GEMMs and fewer collectives).
//! A tiled choice then competes with every other on predicted throughput,
//! tensor parallelism included, and the runner-up line says why it lost.

use rayon::prelude::*;

use super::PlanError;
use super::Request;
use super::evaluate::Choice;
use super::search::Outcome;
use crate::cost::Machine;

/// The tile counts the search tries, in order. 64 tiles of the largest
/// operator of the bundled 100T model (`[4h, h]` at h = 163,840) are
/// 3.1 GiB each in 16 bits, well under any GPU's memory; past that the
/// GEMMs grow thin while what stays is activations.
pub const TILE_COUNTS: [u64; 6] = [2, 4, 8, 16, 32, 64];

/// An upper bound on the bytes per GPU tiling can take off a choice's
/// peak: what it splits is one layer's gathered weights, the prefetched
/// next layer's and one layer's gradient bucket — at most three layers of
/// `4h² + 3h·ffn` parameters (GLU's three feed-forward matrices counted) in
/// the working precision (4 bytes for f32, else 2), over the
/// tensor-parallel ranks. A choice whose least peak less
/// this exceeds the budget cannot fit at any tile count, and is not probed:
/// a tiled probe of a huge model compiles 64 times the matmuls, and the
/// nothing-fits answer for such a model must stay fast.
fn most_saved(req: &Request, tensor_parallel: u64) -> u64 {
    let (h, ffn) = (req.model.hidden, req.model.intermediate);
    let layer = 4 * h * h + 3 * h * ffn;
    let bytes = if req.train.precision == zeroplan_ir::spec::Precision::F32 { 4 } else { 2 };
    3 * layer * bytes / tensor_parallel.max(1)
}

/// Tiled outcomes for the ZeRO-3 choices of `outcomes` that fit nowhere
/// untiled: for each, the first tile count that fits, else the most tiles
/// where that lowers the least peak (for the nothing-fits answer).
pub fn tiled_outcomes(
    req: &Request,
    machine: &Machine,
    outcomes: &[Outcome],
    search_choice: impl Fn(&Request, &Machine, Choice) -> Result<Outcome, PlanError> + Sync,
) -> Result<Vec<Outcome>, PlanError> {
    let most = *TILE_COUNTS.last().expect("tile counts");
    let budget = req.cluster.budget_bytes();
    let untiled: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.best.is_none() && o.bounded.is_none() && o.dominated_by.is_none())
        .filter(|o| o.choice.zero_stage == 3 && o.choice.tiles == 1)
        .filter(|o| o.min_peak_bytes.saturating_sub(most_saved(req, o.choice.tensor_parallel)) <= budget)
        .collect();
    // Each choice's tile counts are searched on their own: one task a
    // choice, so that two slow ones never share a task while a core idles.
    let found = untiled.into_par_iter().with_max_len(1).map(|o| -> Result<Option<Outcome>, PlanError> {
        let tiled = {
            let _span = tracing::debug_span!("plan.tiles", tiles = most).entered();
            search_choice(req, machine, Choice { tiles: most, ..o.choice })?
        };
        if tiled.best.is_none() {
            return Ok((tiled.min_peak_bytes < o.min_peak_bytes).then_some(tiled));
        }
        let mut first = tiled;
        for &tiles in TILE_COUNTS.iter().filter(|&&t| t < most) {
            let _span = tracing::debug_span!("plan.tiles", tiles).entered();
            let fewer = search_choice(req, machine, Choice { tiles, ..o.choice })?;
            if fewer.best.is_some() {
                first = fewer;
                break;
            }
        }
        Ok(Some(first))
    });
    Ok(found.collect::<Result<Vec<_>, PlanError>>()?.into_iter().flatten().collect())
}
