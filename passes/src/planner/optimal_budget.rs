//! The first budget an `optimal` probe tries, predicted from the two steps
//! the search measured at its micro-batch, so that the first whole compile
//! fits: each miss costs a whole-stack compile and memory plan, and is
//! tightened by what it overshot.
//!
//! The policy bounds the bytes the forward stores for the backward, `S`;
//! the peak adds the backward's working set, in one of two places:
//! - the backward's start, where every stored byte is alive beside the
//!   head's and the last layer's working set: `S + X_keep`, where `X_keep`
//!   is what the step that keeps every activation adds to the bytes it
//!   stores (its measured peak less them);
//! - the backward of a layer that recomputes, where the layer holds its
//!   values, stored or regenerated, beside what the layers before it
//!   stored (`H`, [`Costs::held_while_recomputing`]): `H + X_layer`, where
//!   `X_layer` is what the `full` step measured at the same micro-batch
//!   adds to its `H` (an upper bound where its peak lay at the start
//!   instead). A layer that keeps its values is the first case's.
//!
//! The first budget is the largest whole MiB whose decision the model puts
//! within the GPU's budget: a bisection over the dynamic program alone. On
//! bert-1t over one DGX-2 the first tries, sized by `X_keep` alone,
//! overshot by 145–892 MiB on all four choices probed (a layer recomputing
//! its feed-forward last, while every stored value is alive); bert-base's
//! head dwarfs a layer, so its peak lies at the start.

use std::collections::BTreeMap;

use crate::recompute::optimal::{Costs, Decision, choose};
use crate::recompute::regions::Choice;

/// The peak of a step that recomputes some of what it would store, from
/// the bytes it stores and holds.
pub struct PeakModel {
    /// `X_keep`: the peak less the stored bytes, keeping every activation.
    over_stored: u64,
    /// `X_layer`: the peak less the held bytes, recomputing every layer.
    over_held: u64,
}

impl PeakModel {
    /// The model through the peaks measured with every activation kept
    /// (`peak_keep`) and every layer recomputed (`peak_full`).
    pub fn measured(costs: &Costs, peak_keep: u64, peak_full: u64) -> PeakModel {
        let full: BTreeMap<u64, Choice> = costs.layers.iter().map(|(l, _)| (*l, Choice::Layer)).collect();
        PeakModel {
            over_stored: peak_keep.saturating_sub(costs.stored_without_recompute()),
            over_held: peak_full.saturating_sub(costs.held_while_recomputing(&full)),
        }
    }

    /// The predicted peak of `decision`'s step.
    pub fn peak(&self, costs: &Costs, decision: &Decision) -> u64 {
        (decision.cost.bytes + self.over_stored).max(costs.held_while_recomputing(&decision.choices) + self.over_held)
    }
}

/// The largest budget, in whole MiB, whose decision `model` puts within
/// `budget` per GPU; 0 where none does (every layer recomputed).
pub fn first_target(costs: &Costs, model: &PeakModel, budget: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let fits = |target: u64| model.peak(costs, &choose(costs, target * MIB)) <= budget;
    // No decision stores more than the budget less what keeping adds.
    let (mut lo, mut hi) = (0, budget.saturating_sub(model.over_stored) / MIB);
    if fits(hi) {
        return hi * MIB;
    }
    // Invariant: `hi` does not fit; `lo` fits or is 0.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo * MIB
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recompute::optimal::Cost;

    const MIB: u64 = 1 << 20;

    /// Four layers, each: keep 100 MiB, recompute the feed-forward to
    /// 60 MiB for 1 FLOP, the layer to nothing for 10; 50 MiB outside them.
    fn four_layers() -> Costs {
        let options = [(Choice::Keep, 100, 0.0), (Choice::FeedForward, 60, 1.0), (Choice::Layer, 0, 10.0)];
        let layer =
            |l: u64| (l, options.iter().map(|&(c, mib, flops)| (c, Cost { bytes: mib * MIB, flops })).collect());
        Costs { fixed: 50 * MIB, layers: (0..4).map(layer).collect() }
    }

    #[test]
    fn the_model_reads_both_measured_steps() {
        let costs = four_layers();
        // Keeping all: 450 MiB stored, a 1,450 MiB peak. Every layer
        // recomputed: the last regenerates its 100 MiB over 50 MiB, a
        // 1,200 MiB peak.
        let model = PeakModel::measured(&costs, 1450 * MIB, 1200 * MIB);
        assert_eq!((model.over_stored, model.over_held), (1000 * MIB, 1050 * MIB));
        assert_eq!(model.peak(&costs, &choose(&costs, 450 * MIB)), 1450 * MIB);
        assert_eq!(model.peak(&costs, &choose(&costs, 50 * MIB)), 1200 * MIB);
    }

    #[test]
    fn the_first_target_is_where_the_predicted_peak_meets_the_budget() {
        let costs = four_layers();
        let model = PeakModel::measured(&costs, 1450 * MIB, 1200 * MIB);
        let budget = 1230 * MIB;
        // Sized by what keeping adds alone, the budget would be 230 MiB:
        // the layers store 180 MiB, and the last recomputes its
        // feed-forward over 170 MiB stored before it, a 1,320 MiB peak.
        assert_eq!(model.peak(&costs, &choose(&costs, 230 * MIB)), 1320 * MIB);
        // From 110 to 169 MiB the first three recompute whole and the last
        // its feed-forward, over the 50 MiB outside the layers: 1,200.
        let target = first_target(&costs, &model, budget);
        assert_eq!(target, 169 * MIB);
        assert_eq!(model.peak(&costs, &choose(&costs, target)), 1200 * MIB);
        assert!(model.peak(&costs, &choose(&costs, target + MIB)) > budget);
    }

    #[test]
    fn nothing_but_full_fits_a_budget_below_its_peak() {
        let costs = four_layers();
        let model = PeakModel::measured(&costs, 1450 * MIB, 1200 * MIB);
        assert_eq!(first_target(&costs, &model, 1100 * MIB), 0);
    }
}
