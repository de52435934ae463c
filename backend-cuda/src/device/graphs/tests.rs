//! What the CUDA device records of real plans, without a GPU: the verdicts
//! over steps selected with the stand-in compiler (a kernel on the device
//! is a GPU kernel, a routine the routine kernels cover is theirs), then
//! the capture plan.

use zeroplan_exec::Buf;
use zeroplan_exec::graphs::{Masks, PlanStep, plan};
use zeroplan_ir::kernel::Expr;
use zeroplan_ir::spec::{Precision, TrainingSpec};
use zeroplan_ir::{DType, Place};

use super::*;
use crate::device::testing::{Ir, Selected, model, selected};
use crate::routines::plan::{is_routine, supported};

/// The device's verdict on a stand-in step, as `capture` gives it once
/// the device's passes made kernels of what they take.
fn stand_in(instr: &Instr<Ir>) -> Capture {
    if is_routine(instr) && supported(instr).is_ok() {
        return Capture::Recordable { draws_masks: false };
    }
    verdict(instr, |k: &Ir| {
        if k.on_device {
            Capture::Recordable { draws_masks: k.kernel.body.iter().any(|e| matches!(e, Expr::Keep { .. })) }
        } else {
            Capture::Breaks("a Cranelift kernel on the pinned arena".into())
        }
    })
}

fn plan_steps(s: &Selected) -> Vec<PlanStep> {
    let g = &s.program.graph;
    s.steps
        .iter()
        .map(|st| PlanStep {
            optimizer: st.optimizer,
            capture: st.instr.as_ref().map(|i| {
                // The runner's own verdict on the communication thread's collectives.
                if g.node(st.node).op.is_collective() { Capture::Breaks("collective".into()) } else { stand_in(i) }
            }),
            split_before: None,
        })
        .collect()
}

#[test]
fn copies_record_where_the_dma_engines_do_them() {
    let dev = Buf { place: Place::Device, offset: 0, len: 64, dtype: DType::F32 };
    let host = Buf { place: Place::Host, ..dev };
    let far = Buf { offset: 1024, ..dev };
    let copy = |from, to| verdict::<Ir>(&Instr::Copy { from, to }, |_| unreachable!());
    assert_eq!(copy(dev, far), Capture::Recordable { draws_masks: false });
    assert_eq!(copy(dev, host), Capture::Recordable { draws_masks: false });
    assert_eq!(copy(host, dev), Capture::Recordable { draws_masks: false });
    assert!(matches!(copy(dev, Buf { offset: 32, ..dev }), Capture::Breaks(w) if w.contains("through the CPU")));
    assert!(matches!(copy(host, Buf { offset: 1024, ..host }), Capture::Breaks(_)));
    let reduce = verdict::<Ir>(&Instr::AllReduce { x: dev, out: far }, |_| unreachable!());
    assert!(matches!(reduce, Capture::Breaks(w) if w.contains("collective")));
}

/// Tiny-bert on one rank: everything but the feeds and the fused attention
/// the template does not cover (tiny-bert's head dim: the host routine,
/// staged) is recorded, the feeds and each attention splitting the step
/// into graphs. Dropout's kernels are inside graphs, all at the
/// micro-batch's counter word (one micro-batch).
#[test]
fn tiny_bert_records_all_but_its_feeds_and_staged_attention() {
    for precision in [Precision::F32, Precision::Bf16] {
        let s = selected(&model("tiny-bert"), &TrainingSpec { precision, ..TrainingSpec::default() });
        let steps = plan_steps(&s);
        let p = plan(&steps, 1);
        let mut why: Vec<(String, &str)> = Vec::new();
        for (at, reason) in &p.last.eager {
            let kind = s.steps[*at].instr.as_ref().unwrap().name().to_string();
            why.push((kind, reason.as_str()));
        }
        let kinds: std::collections::BTreeSet<&str> = why.iter().map(|(k, _)| k.as_str()).collect();
        let expected = ["flash_attention", "flash_attention_grad", "input"];
        assert_eq!(kinds, expected.into_iter().collect(), "{precision:?}: {why:?}");
        // Every recordable step is in a graph (none left alone between two
        // breaks), and the backward's tail and the whole optimizer phase
        // are one graph.
        let in_graph = |at: usize| p.last.segments.iter().any(|seg| seg.steps.contains(&at));
        for (at, step) in steps.iter().enumerate() {
            if let Some(c) = &step.capture {
                assert_eq!(matches!(c, Capture::Recordable { .. }), in_graph(at), "{precision:?}: step {at}");
            }
        }
        let tail = p.last.segments.last().unwrap();
        assert!(s.steps.iter().enumerate().filter(|(_, st)| st.optimizer).all(|(at, _)| tail.steps.contains(&at)));
        assert!(tail.launches > 100, "{precision:?}: {}", tail.launches);
        let drawing: usize = (0..s.steps.len())
            .filter(|&at| matches!(steps[at].capture, Some(Capture::Recordable { draws_masks: true })))
            .count();
        assert!(drawing > 0, "dropout is on by default");
        let inside: usize = p
            .last
            .segments
            .iter()
            .flat_map(|seg| seg.steps.clone())
            .filter(|&at| matches!(steps[at].capture, Some(Capture::Recordable { draws_masks: true })))
            .count();
        assert_eq!(inside, drawing, "every dropout kernel is recorded");
        assert!(p.last.segments.iter().all(|seg| seg.masks != Masks::Optimizer));
        let (recorded, eager) = p.launches(1);
        assert_eq!(eager as usize, why.len());
        assert!(recorded > 10 * eager, "{precision:?}: {recorded} recorded, {eager} eager");
    }
}
