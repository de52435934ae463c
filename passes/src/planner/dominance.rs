//! Choices the search need not compile: those a twin beats at every
//! micro-batch they could run.
//!
//! Two of the search's dimensions only ever trade time for memory.
//! Recomputation (`selective`, `full`) runs the forward again in the
//! backward: the same step plus compute, so at one micro-batch it is never
//! faster than keeping every activation (`none`). The NVMe tier streams the
//! offloaded states through the same pinned buffers as CPU memory, at the
//! drives' bandwidth rather than the host's: never faster than CPU memory.
//! Neither changes what a micro-batch costs on the GPU otherwise. So where
//! the cheaper twin (`none`, CPU memory, or both) fits every micro-batch the
//! choice could use, the choice can at best tie it, and is not compiled:
//! its candidate row names the twin that dominates it (`--exhaustive`
//! compiles it anyway). The cheaper twins are searched first ([`wave`]) so
//! their outcomes are known when the dearer ones are reached.
//!
//! The same argument spares the exact stage a whole compile: an `optimal`
//! probe recomputes the least that fits at `full`'s micro-batch, so where
//! the search planned it whole, `full` at that micro-batch can at best tie
//! it ([`lighter_twin`]).
//!
//! `passes/tests/pruning.rs` plans a grid of cases both ways: the same
//! winner, and no dominated choice faster than its twin.

use zeroplan_ir::plan::OffloadTo;

use super::evaluate::Choice;
use super::search::Outcome;
use crate::recompute::Policy;

/// The wave a choice is searched in: how many of its two dearer settings
/// (recomputation, the NVMe tier) it has. Every twin that may dominate it
/// is in an earlier wave.
pub fn wave(choice: &Choice) -> u8 {
    u8::from(choice.recompute != Policy::None) + u8::from(choice.offload_to == OffloadTo::Nvme)
}

/// The number of waves [`wave`] numbers.
pub const WAVES: u8 = 3;

/// The cheaper twins of `choice`: it without recomputation, on CPU memory,
/// or both.
fn cheaper_twins(choice: Choice) -> impl Iterator<Item = Choice> {
    let recompute = [choice.recompute, Policy::None];
    let tiers = [choice.offload_to, OffloadTo::Cpu];
    recompute
        .into_iter()
        .flat_map(move |recompute| tiers.into_iter().map(move |offload_to| Choice { recompute, offload_to, ..choice }))
        .filter(move |twin| *twin != choice)
}

/// The searched twin that dominates `choice`, if one does: it fits every
/// micro-batch `choice` could use, with no more work at each.
pub fn dominator(choice: Choice, searched: &[Outcome]) -> Option<Choice> {
    // A pinned `optimal` budget is the user's question, answered exactly.
    if matches!(choice.recompute, Policy::Optimal { .. }) {
        return None;
    }
    cheaper_twins(choice).find(|twin| searched.iter().any(|o| o.choice == *twin && o.fits_every))
}

/// The `optimal` twin of a `full` outcome that the search planned whole
/// at `full`'s estimated micro-batch, if there is one: its place in
/// `searched`. Read before the exact stage takes the whole steps.
///
/// The twin's budget recomputes the least that fits there
/// (`search::optimal_outcomes`): never more than `full`, which recomputes
/// every layer, and the rest of the choice is the same. So `full`'s whole
/// plan at that micro-batch is at best as fast as the twin's, exact
/// already, and the winner is at least as fast as the twin; `full` is not
/// compiled whole to be weighed against it (bert-1t on one DGX-2: four
/// `full` estimates lie 0.2–2 % above their twins, and their whole plans,
/// 2.3 s of compiling, each lost).
pub fn lighter_twin(full: &Outcome, searched: &[Outcome]) -> Option<usize> {
    if full.choice.recompute != Policy::Full {
        return None;
    }
    let b = full.best.as_ref()?.strategy.micro_batch;
    searched.iter().position(|o| {
        matches!(o.choice.recompute, Policy::Optimal { .. })
            && Choice { recompute: Policy::Full, ..o.choice } == full.choice
            && o.best.as_ref().is_some_and(|e| e.strategy.micro_batch == b)
            && o.whole.holds(b)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeroplan_ir::plan::Offload;

    fn choice(recompute: Policy, offload_to: OffloadTo) -> Choice {
        Choice {
            tensor_parallel: 1,
            sequence_parallel: false,
            zero_stage: 3,
            offload: Offload::Optimizer,
            offload_to,
            recompute,
            tiles: 1,
        }
    }

    #[test]
    fn every_cheaper_twin_is_searched_in_an_earlier_wave() {
        for recompute in [Policy::None, Policy::Selective, Policy::Full] {
            for tier in [OffloadTo::Cpu, OffloadTo::Nvme] {
                let c = choice(recompute, tier);
                assert!(wave(&c) < WAVES);
                for twin in cheaper_twins(c) {
                    assert!(wave(&twin) < wave(&c), "{twin} is not searched before {c}");
                }
            }
        }
        assert_eq!(cheaper_twins(choice(Policy::None, OffloadTo::Cpu)).count(), 0);
        assert_eq!(cheaper_twins(choice(Policy::Full, OffloadTo::Nvme)).count(), 3);
    }
}
