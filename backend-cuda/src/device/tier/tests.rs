use zeroplan_exec::nvme::{Io, persistent_host_buffers};
use zeroplan_exec::{Buf, Instr};
use zeroplan_ir::plan::{DataParallel, Offload};
use zeroplan_ir::spec::{Precision, TrainingSpec};
use zeroplan_ir::{DType, Place};

use super::*;
use crate::device::testing::{model, selected_with};

/// A host f32 buffer of `bytes` at `offset`.
fn host(offset: usize, bytes: usize) -> Buf {
    Buf { place: Place::Host, offset, len: bytes / 4, dtype: DType::F32 }
}

fn device(offset: usize, bytes: usize) -> Buf {
    Buf { place: Place::Device, offset, len: bytes / 4, dtype: DType::F32 }
}

#[test]
fn copies_touching_a_slot_go_through_staging_and_the_rest_by_plain_dma() {
    let slot = host(4096, 256);
    let in_slot = |b: Buf| b.place == Place::Host && b.offset >= slot.offset && b.offset + b.bytes() <= 4096 + 1024;
    let (pinned, grad) = (host(0, 256), device(0, 256));
    assert_eq!(route(slot, grad, in_slot), Route::Up, "a master going up");
    assert_eq!(route(grad, slot, in_slot), Route::Down, "a state coming down");
    assert_eq!(route(host(4096 + 512, 64), grad, in_slot), Route::Up, "a view inside a slot");
    assert_eq!(route(grad, pinned, in_slot), Route::Dma, "a gradient to the pinned arena");
    assert_eq!(route(pinned, grad, in_slot), Route::Dma);
    assert_eq!(route(grad, device(2048, 256), in_slot), Route::Dma);
    assert_eq!(route(grad, device(128, 256), in_slot), Route::Cpu, "an overlapping device copy");
    assert_eq!(route(pinned, slot, in_slot), Route::Cpu, "host to host, into a slot");
    assert_eq!(route(slot, pinned, in_slot), Route::Cpu, "host to host, out of a slot");
    assert_eq!(route_beside(None, slot, grad), Route::Dma, "without a tier every host buffer is pinned");
}

#[test]
fn chunks_cover_a_copy_once_each_on_its_own_boundary() {
    for (len, chunk) in [(0, 8), (1, 8), (8, 8), (9, 8), (64, 8), (CHUNK * 2 + 3, CHUNK)] {
        let pieces: Vec<Range<usize>> = chunks(len, chunk).collect();
        assert_eq!(pieces.len(), len.div_ceil(chunk), "{len} in {chunk}");
        let mut at = 0;
        for p in &pieces {
            assert_eq!(p.start, at, "{len} in {chunk}: contiguous");
            assert_eq!(p.start % chunk, 0, "{len} in {chunk}: each piece starts a staging buffer's worth in");
            assert!(!p.is_empty() && p.len() <= chunk, "{len} in {chunk}: {p:?} fits a staging buffer");
            at = p.end;
        }
        assert_eq!(at, len, "{len} in {chunk}: every byte");
    }
}

/// Whether byte `i` of the arena is page-locked by `ranges`.
fn pinned(ranges: &[Range<usize>], i: usize) -> bool {
    ranges.iter().any(|r| r.contains(&i))
}

#[test]
fn the_host_arena_is_pinned_around_the_slots_in_whole_pages() {
    let page = 4096;
    // Buffers between slots, a slot sharing a page with its neighbours, a
    // slot of several pages, and a slot at the end.
    let slots = [host(100, 40), host(3 * page + 8, 2 * page), host(10 * page, 4 * page)];
    let len = 14 * page;
    let ranges = pinned_ranges(len, &slots, page);
    for w in ranges.windows(2) {
        assert!(w[0].end < w[1].start, "sorted, disjoint and merged where they meet: {ranges:?}");
    }
    for r in &ranges {
        assert!(r.start % page == 0 && r.end % page == 0 && r.start < r.end, "whole pages: {r:?}");
    }
    let in_slot = |i: usize| slots.iter().any(|s| (s.offset..s.offset + s.bytes()).contains(&i));
    for i in 0..len {
        if !in_slot(i) {
            assert!(pinned(&ranges, i), "byte {i}, outside the slots, is not pinned: {ranges:?}");
        }
    }
    // The pages only a slot uses stay unpinned: the tier's RAM saving.
    for p in [4, 10, 11, 12, 13] {
        assert!(!pinned(&ranges, p * page), "page {p} lies inside a slot but is pinned: {ranges:?}");
    }
    assert_eq!(ranges, vec![0..4 * page, 5 * page..10 * page]);
    assert_eq!(pinned_ranges(len, &[], page), vec![0..len], "no slot: the whole arena");
    assert!(pinned_ranges(2 * page, &[host(0, 2 * page)], page).is_empty(), "one slot filling the arena");
    assert!(pinned_ranges(0, &[], page).is_empty());
}

/// What attaching a tier to a rank of `dp` makes of its copies: the route
/// of every host↔device copy the schedule runs, with whether its host side
/// lies in a tier slot.
fn copy_plan(dp: DataParallel, precision: Precision) -> Vec<(Route, bool)> {
    let train = TrainingSpec { precision, ..TrainingSpec::default() };
    let s = selected_with(&model("tiny-bert"), &train, Some(dp));
    let slots = persistent_host_buffers(&s.program.graph, &s.bufs);
    assert!(!slots.is_empty(), "{dp:?}: nothing for the tier");
    let dir = std::env::temp_dir().join(format!("zeroplan-cuda-tier-{}-{}", std::process::id(), dp.zero_stage));
    std::fs::create_dir_all(&dir).unwrap();
    let tier = Tier::open(&dir, "copy-plan.states", &slots, Io::default()).unwrap();
    let persistent = |b: &Buf| slots.iter().any(|s| s.overlaps(b));
    let plan = s
        .steps
        .iter()
        .filter_map(|step| match &step.instr {
            Some(Instr::Copy { from, to }) if from.place != to.place => {
                let host_side = if from.place == Place::Host { from } else { to };
                Some((route_beside(Some(&tier), *from, *to), persistent(host_side)))
            }
            _ => None,
        })
        .collect();
    drop(tier);
    std::fs::remove_dir_all(&dir).unwrap();
    plan
}

#[test]
fn attaching_a_tier_routes_exactly_the_slots_copies_through_staging() {
    let cases = [
        (DataParallel { ranks: 1, zero_stage: 1, offload: Offload::Optimizer }, Precision::Bf16),
        (DataParallel { ranks: 2, zero_stage: 3, offload: Offload::OptimizerAndParams }, Precision::Bf16),
        (DataParallel { ranks: 2, zero_stage: 3, offload: Offload::OptimizerAndParams }, Precision::F32),
    ];
    for (dp, precision) in cases {
        let plan = copy_plan(dp, precision);
        assert!(!plan.is_empty(), "{dp:?} {precision:?}: no host↔device copy");
        for &(route, persistent) in &plan {
            let staged = matches!(route, Route::Up | Route::Down);
            assert_eq!(
                staged, persistent,
                "{dp:?} {precision:?}: {route:?} for a copy whose host side is in a slot: {persistent}"
            );
            assert_ne!(route, Route::Cpu, "{dp:?} {precision:?}: a host↔device copy left to the CPU");
        }
        let count = |r: Route| plan.iter().filter(|(x, _)| *x == r).count();
        eprintln!(
            "{dp:?} {precision:?}: {} up through staging, {} down through staging, {} by plain DMA",
            count(Route::Up),
            count(Route::Down),
            count(Route::Dma)
        );
        assert!(count(Route::Dma) > 0, "{dp:?} {precision:?}: the gradients go down to the pinned arena by DMA");
        if dp.offload == Offload::OptimizerAndParams {
            assert!(
                count(Route::Up) > 0,
                "{dp:?} {precision:?}: the offloaded parameter shards go up from their slots"
            );
        }
    }
}
