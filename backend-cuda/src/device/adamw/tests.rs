//! Recognising AdamW updates on real plans (selected on the host, no GPU),
//! reading the fused kernels' hyper-parameters back, and the grouping's
//! boundaries.

use zeroplan_ir::kernel::Expr;
use zeroplan_ir::plan::{DataParallel, Offload};
use zeroplan_ir::spec::{Precision, TrainingSpec};
use zeroplan_ir::{DType, Op, Place};

use super::grouping::{Key, Update, groups, update};
use super::hyper;
use crate::device::schedule;
use crate::device::testing::{Ir, Selected, model, selected, selected_with};
use zeroplan_exec::Buf;

fn updates(s: &Selected) -> Vec<Update> {
    (0..s.steps.len()).filter_map(|at| update(&s.program.graph, &s.steps, at, &s.bufs, |k: &Ir| k.on_device)).collect()
}

fn grouped(s: &Selected) -> Vec<Vec<Update>> {
    let touched = schedule::touches(&s.steps);
    let optimizer: Vec<bool> = s.steps.iter().map(|st| st.optimizer).collect();
    groups(&updates(s), &touched, &optimizer)
}

fn params(s: &Selected) -> usize {
    s.program.graph.params().len()
}

#[test]
fn every_fused_adamw_kernel_reads_back_its_hyper_parameters() {
    let train = TrainingSpec { betas: (0.85, 0.995), eps: 1e-7, weight_decay: 0.05, ..TrainingSpec::default() };
    let s = selected(&model("tiny-bert"), &train);
    let mut seen = 0;
    for n in s.program.graph.node_indices() {
        let Op::Fused { kernel } = &s.program.graph.node(n).op else { continue };
        if kernel.pattern.as_deref() != Some("adamw") {
            assert_eq!(hyper::of_kernel(kernel), None, "{}", kernel.name);
            continue;
        }
        let [b1, b2, eps, wd] = hyper::of_kernel(kernel).unwrap_or_else(|| panic!("{}", kernel.name));
        assert_eq!((b1, b2, eps), (0.85, 0.995, 1e-7), "{}", kernel.name);
        // Biases and LayerNorm parameters are not decayed by default.
        assert!(wd == 0.05 || wd == 0.0, "{}: {wd}", kernel.name);
        seen += 1;
        // A kernel that is not the lowering of its constants is refused.
        let mut other = (**kernel).clone();
        let c = other.body.iter().position(|e| *e == Expr::Const(1e-7)).unwrap();
        other.body[c] = Expr::Const(2e-7);
        other.body.push(Expr::Const(1e-7));
        assert_eq!(hyper::of_kernel(&other), None);
    }
    assert_eq!(seen, params(&s));
}

#[test]
fn one_rank_f32_and_bf16_plans_step_every_parameter_in_one_launch() {
    for precision in [Precision::F32, Precision::Bf16] {
        let s = selected(&model("tiny-bert"), &TrainingSpec { precision, ..TrainingSpec::default() });
        let found = updates(&s);
        assert_eq!(found.len(), params(&s), "{precision:?}: every update is in place on the device");
        let groups = grouped(&s);
        assert_eq!(groups.len(), 1, "{precision:?}: {:?}", groups.iter().map(Vec::len).collect::<Vec<_>>());
        assert_eq!(groups[0].len(), params(&s));
        let grad = if precision == Precision::F32 { DType::F32 } else { DType::BF16 };
        assert!(groups[0].iter().all(|u| u.key.grad == grad && u.param.dtype == DType::F32));
        // Weight decays differ per tensor inside the one launch.
        assert!(groups[0].iter().any(|u| u.weight_decay == 0.0) && groups[0].iter().any(|u| u.weight_decay > 0.0));
    }
}

#[test]
fn offloaded_updates_keep_the_host_kernel() {
    let dp = DataParallel { ranks: 1, zero_stage: 1, offload: Offload::Optimizer };
    let train = TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() };
    let s = selected_with(&model("tiny-bert"), &train, Some(dp));
    let host_updates = s
        .steps
        .iter()
        .filter(|st| zeroplan_ir::kernel::adamw_operands(&s.program.graph, st.node).is_some())
        .filter(|st| matches!(&st.instr, Some(zeroplan_exec::Instr::Kernel { kernel, .. }) if !kernel.on_device))
        .count();
    assert!(host_updates > 0, "the offloaded plan has no host AdamW");
    assert!(updates(&s).iter().all(|u| [u.param, u.grad, u.m, u.v].iter().all(|b| b.place == Place::Device)));
    assert!(updates(&s).len() + host_updates <= params(&s));
}

#[test]
fn zero_shards_step_in_one_launch() {
    // From stage 1 on each rank updates its flat shards in place (stages 1–2
    // gather them in the next step's forward, not after the update).
    for stage in 1..=3 {
        let dp = DataParallel { ranks: 2, zero_stage: stage, offload: Offload::None };
        let s = selected_with(&model("tiny-bert"), &TrainingSpec::default(), Some(dp));
        let found = updates(&s);
        // One update per flat shard (decay / no decay per layer group), in place.
        assert_eq!(found.len(), 8, "stage {stage}");
        let groups = grouped(&s);
        assert_eq!(sizes(&groups), [found.iter().map(|u| u.step).collect::<Vec<_>>()], "stage {stage}");
    }
}

// ── Boundaries on plain data ──

fn buf(offset: usize) -> Buf {
    Buf { place: Place::Device, offset, len: 16, dtype: DType::F32 }
}

fn key(grad: DType) -> Key {
    let scalars = [buf(0), buf(64), buf(128), buf(192)];
    Key { beta1: 0.9, beta2: 0.999, eps: 1e-8, grad, scalars }
}

/// The update at `step` of parameter `i` (its four buffers apart from all others').
fn upd(step: usize, i: usize) -> Update {
    let base = 1024 * (i + 1);
    Update {
        step,
        key: key(DType::F32),
        weight_decay: 0.01,
        param: buf(base),
        grad: buf(base + 256),
        m: buf(base + 512),
        v: buf(base + 768),
    }
}

fn sizes(groups: &[Vec<Update>]) -> Vec<Vec<usize>> {
    groups.iter().map(|g| g.iter().map(|u| u.step).collect()).collect()
}

#[test]
fn groups_end_where_something_between_touches_a_member() {
    let n = 8;
    let quiet = vec![Vec::new(); n];
    let opt = vec![true; n];
    let all = [upd(0, 0), upd(2, 1), upd(3, 2), upd(5, 3), upd(6, 4)];
    assert_eq!(sizes(&groups(&all, &quiet, &opt)), [vec![0, 2, 3, 5, 6]]);
    // A step reading an updated parameter (a ZeRO all-gather of it).
    let mut t = quiet.clone();
    t[4] = vec![(all[1].param, false), (buf(1 << 20), true)];
    assert_eq!(sizes(&groups(&all, &t, &opt)), [vec![0, 2, 3], vec![5, 6]]);
    // A step writing an earlier member's gradient (the memory plan reusing
    // its bytes): the earlier update must run first.
    let mut t = quiet.clone();
    t[1] = vec![(all[0].grad, true)];
    assert_eq!(sizes(&groups(&all, &t, &opt)), [vec![2, 3, 5, 6]]);
    // A step producing a later member's gradient is fine: that one does not move.
    let mut t = quiet.clone();
    t[4] = vec![(all[3].grad, true)];
    assert_eq!(sizes(&groups(&all, &t, &opt)), [vec![0, 2, 3, 5, 6]]);
    // Reading a gradient between is fine; a step of the micro-batch is not.
    let mut t = quiet.clone();
    t[1] = vec![(all[0].grad, false)];
    let mut phases = opt.clone();
    phases[4] = false;
    assert_eq!(sizes(&groups(&all, &t, &phases)), [vec![0, 2, 3], vec![5, 6]]);
}

#[test]
fn groups_share_hyper_parameters_dtypes_and_scalars_and_hold_two_or_more() {
    let quiet = vec![Vec::new(); 8];
    let opt = vec![true; 8];
    let mut bf16 = upd(3, 2);
    bf16.key.grad = DType::BF16;
    let mut other_eps = upd(5, 3);
    other_eps.key.eps = 1e-6;
    let all = [upd(0, 0), upd(1, 1), bf16.clone(), other_eps, upd(6, 4)];
    assert_eq!(sizes(&groups(&all, &quiet, &opt)), [vec![0, 1]]);
    let mut decays = [upd(0, 0), upd(1, 1)];
    decays[1].weight_decay = 0.0;
    assert_eq!(sizes(&groups(&decays, &quiet, &opt)), [vec![0, 1]]);
    // Two updates of overlapping state cannot share a launch.
    let mut twice = [upd(0, 0), upd(1, 1)];
    twice[1].m = twice[0].m;
    assert!(groups(&twice, &quiet, &opt).is_empty());
}
