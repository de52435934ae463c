//! The search's tile-count dimension: memory-centric tiling
//! ([`crate::tiling`]) for the ZeRO-3 choices that do not fit untiled.
//!
//! Under ZeRO-3 what stays on a GPU however many share the shards is one
//! gathered layer (and the next, prefetched) with one micro-batch's
//! activations. Where that exceeds the budget, the search tiles the large
//! operators: 2, 4, 8, … tiles of the largest, each count searched as a
//! choice of its own, stopping at the first count that fits (fewer tiles
//! are fewer, wider GEMMs and fewer collectives) or once two counts in a
//! row do not lower the least peak (activations or shards, not gathered
//! weights, are what stays).
//! A tiled choice then competes with every other on predicted throughput,
//! tensor parallelism included, and the runner-up line says why it lost.

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

/// Tiled outcomes for the ZeRO-3 choices of `outcomes` that fit nowhere
/// untiled; for each, the first tile count that fits, else the one with
/// the least peak.
pub fn tiled_outcomes(
    req: &Request,
    machine: &Machine,
    outcomes: &[Outcome],
    search_choice: impl Fn(&Request, &Machine, Choice) -> Result<Outcome, PlanError>,
) -> Result<Vec<Outcome>, PlanError> {
    let mut out = Vec::new();
    for o in outcomes.iter().filter(|o| o.best.is_none() && o.choice.zero_stage == 3 && o.choice.tiles == 1) {
        let (mut least, mut misses): (Option<Outcome>, u32) = (None, 0);
        for tiles in TILE_COUNTS {
            let _span = tracing::debug_span!("plan.tiles", tiles).entered();
            let tiled = search_choice(req, machine, Choice { tiles, ..o.choice })?;
            let before = least.as_ref().map_or(o.min_peak_bytes, |l| l.min_peak_bytes);
            let (fits, lower) = (tiled.best.is_some(), tiled.min_peak_bytes < before);
            misses = if lower { 0 } else { misses + 1 };
            if fits || lower {
                least = Some(tiled);
            }
            // The peak is not monotone in the tile count (the operators
            // under the max tile change bucket): give up after two misses.
            if fits || misses == 2 {
                break;
            }
        }
        out.extend(least);
    }
    Ok(out)
}
