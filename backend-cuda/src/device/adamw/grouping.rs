//! Which AdamW updates share one multi-tensor launch: plain data in, groups
//! out, so the boundaries are unit-tested.

use std::collections::HashMap;

use zeroplan_ir::kernel::adamw_operands;
use zeroplan_ir::{DType, Graph, Place, Value};

use super::super::schedule;
use super::hyper;
use zeroplan_exec::Instr;
use zeroplan_exec::{Buf, Step};

/// What every update of one launch shares: the hyper-parameters but the
/// weight decay (per tensor), the gradients' dtype, and the device scalars
/// `lr, step, multiplier, finite` (one f32 each).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Key {
    /// The first moment's decay rate.
    pub beta1: f64,
    /// The second moment's decay rate.
    pub beta2: f64,
    /// The denominator's ε.
    pub eps: f64,
    /// The gradients' dtype, which the kernel is specialised on.
    pub grad: DType,
    /// The buffers of `lr, step, multiplier, finite`.
    pub scalars: [Buf; 4],
}

/// One parameter's AdamW update as the multi-tensor kernel takes it: all
/// on the device, the f32 parameter, `m` and `v` updated in place.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    /// Its step in the schedule.
    pub step: usize,
    /// What it must share with the other updates of its launch.
    pub key: Key,
    /// Its own weight decay, which the launch's table holds per tensor.
    pub weight_decay: f64,
    /// The f32 parameter (the master weights under mixed precision),
    /// updated in place.
    pub param: Buf,
    /// Its gradient, read.
    pub grad: Buf,
    /// The first moment, f32, updated in place.
    pub m: Buf,
    /// The second moment, f32, updated in place.
    pub v: Buf,
}

impl Update {
    /// What the update reads only.
    pub fn reads(&self) -> impl Iterator<Item = Buf> + '_ {
        std::iter::once(self.grad).chain(self.key.scalars)
    }

    /// What it reads and writes.
    pub fn writes(&self) -> [Buf; 3] {
        [self.param, self.m, self.v]
    }
}

/// Step `at` as an [`Update`], if it is an AdamW update the multi-tensor
/// kernel can run: an `adamw` node or its fused kernel (recognised by
/// `zeroplan_ir::kernel::adamw_operands`), selected as a device kernel
/// (`on_gpu`; host-placed, offloaded updates keep the host's Cranelift
/// kernel), in place (the plan gave the new `p, m, v` the old ones'
/// buffers), f32 state and scalars, an f32/bf16/f16 gradient.
pub fn update<K>(
    graph: &Graph,
    steps: &[Step<Instr<K>>],
    at: usize,
    bufs: &HashMap<Value, Buf>,
    on_gpu: impl Fn(&K) -> bool,
) -> Option<Update> {
    let step = &steps[at];
    let Some(Instr::Kernel { kernel, .. }) = &step.instr else { return None };
    let operands = adamw_operands(graph, step.node)?;
    if !step.optimizer || !on_gpu(kernel) || operands.len() != 8 {
        return None;
    }
    let [beta1, beta2, eps, weight_decay] = match &graph.node(step.node).op {
        zeroplan_ir::Op::AdamW { beta1, beta2, eps, weight_decay } => [*beta1, *beta2, *eps, *weight_decay],
        zeroplan_ir::Op::Fused { kernel } => hyper::of_kernel(kernel)?,
        _ => return None,
    };
    let x: Vec<Buf> = operands.iter().map(|v| bufs[v]).collect();
    let out = |output: u32| bufs[&Value { node: step.node, output }];
    let (param, grad, m, v) = (x[0], x[1], x[2], x[3]);
    let scalars = [x[4], x[5], x[6], x[7]];
    let in_place = out(0) == param && out(1) == m && out(2) == v;
    let f32_state = [param, m, v].iter().all(|b| b.dtype == DType::F32 && b.len == param.len);
    let f32_scalars = scalars.iter().all(|b| b.dtype == DType::F32 && b.len == 1);
    let grad_ok = matches!(grad.dtype, DType::F32 | DType::BF16 | DType::F16) && grad.len == param.len;
    let on_device = x.iter().all(|b| b.place == Place::Device);
    if !(in_place && f32_state && f32_scalars && grad_ok && on_device && weight_decay.is_finite()) {
        return None;
    }
    let key = Key { beta1, beta2, eps, grad: grad.dtype, scalars };
    Some(Update { step: at, key, weight_decay, param, grad, m, v })
}

/// Splits `updates` (in schedule order) into launches. An update joins the
/// open group when it shares its [`Key`], writes nothing the group touches,
/// and every step since the group's last update is an optimizer step (the
/// runner applies the micro-batch's updates after the last other one) that
/// neither writes what the group reads nor reads or writes what it writes:
/// the launch runs at the group's last step, so each update moves past
/// those steps. Anything else closes the group. `touched` is
/// [`schedule::touches`] of the steps, `optimizer` their phase flags.
/// Groups of one are left out (the update keeps its own kernel).
pub fn groups(updates: &[Update], touched: &[Vec<(Buf, bool)>], optimizer: &[bool]) -> Vec<Vec<Update>> {
    let mut done: Vec<Vec<Update>> = Vec::new();
    let mut open: Vec<Update> = Vec::new();
    for u in updates {
        let joins = open.last().is_some_and(|last| {
            let between = last.step + 1..u.step;
            let reads: Vec<Buf> = open.iter().flat_map(Update::reads).collect();
            let writes: Vec<Buf> = open.iter().flat_map(Update::writes).collect();
            let apart = u
                .writes()
                .iter()
                .all(|w| !writes.iter().any(|x| x.overlaps(w)) && !reads.iter().any(|x| x.overlaps(w)))
                && u.reads().all(|r| !writes.iter().any(|x| x.overlaps(&r)));
            last.key == u.key
                && apart
                && optimizer[between.clone()].iter().all(|&o| o)
                && schedule::first_conflict(touched, between, &reads, &writes).is_none()
        });
        if !joins {
            done.push(std::mem::take(&mut open));
        }
        open.push(u.clone());
    }
    done.push(open);
    done.retain(|g| g.len() > 1);
    done
}
