//! Which routines of real tiny-model training steps (selected on the host,
//! no GPU) the kernels take, what stays staged, and the refusals.

use zeroplan_ir::spec::{Precision, TrainingSpec};
use zeroplan_ir::{DType, Place};

use super::staged_summary;
use crate::device::testing::{model, selected};
use crate::routines::plan::{host_fill, is_routine, supported};
use zeroplan_exec::{Buf, Instr};

fn train(precision: Precision) -> TrainingSpec {
    TrainingSpec { precision, ..TrainingSpec::default() }
}

fn buf(offset: usize, len: usize, dtype: DType) -> Buf {
    Buf { place: Place::Device, offset, len, dtype }
}

/// Every routine of a tiny-bert and a tiny-mosaicbert step, in f32, bf16
/// and f16, runs as kernels: the loss, the embeddings, the scalar
/// broadcasts that sum the gradients' norms, the parameters' casts to the
/// compute dtype and the optimizer's scalars (fp16's loss scale among
/// them). Nothing stages but fused attention, which is the fused-attention
/// pass's.
#[test]
fn every_routine_of_a_bert_step_is_taken() {
    for name in ["tiny-bert", "tiny-mosaicbert"] {
        for precision in [Precision::F32, Precision::Bf16, Precision::F16(Default::default())] {
            let mut s = selected(&model(name), &train(precision));
            let mut kinds = std::collections::BTreeSet::new();
            for step in &mut s.steps {
                let Some(instr) = &step.instr else { continue };
                if is_routine(instr) {
                    supported(instr).unwrap_or_else(|why| panic!("{name} {precision:?}: {}: {why}", instr.name()));
                    kinds.insert(instr.name());
                    step.instr = None;
                }
            }
            let mut expected = vec!["cross_entropy", "cross_entropy_grad", "embedding", "embedding_grad"];
            expected.extend(["broadcast", "lr_schedule", "grad_scale"]);
            if precision != Precision::F32 {
                expected.push("cast");
            }
            if matches!(precision, Precision::F16(_)) {
                expected.push("loss_scale_update");
            }
            for kind in expected {
                assert!(kinds.contains(kind), "{name} {precision:?} has no {kind}: {kinds:?}");
            }
            if let Some((_, left)) = staged_summary(&s.steps) {
                for kind in left.split(", ") {
                    let kind = kind.split(' ').next().unwrap();
                    assert!(
                        ["flash_attention", "flash_attention_grad"].contains(&kind),
                        "{name} {precision:?} stages {left}"
                    );
                }
            }
        }
    }
}

#[test]
fn offloaded_overlapping_or_mixed_routines_stay_staged() {
    let x = buf(0, 12, DType::F32);
    let out = buf(64, 12, DType::F32);
    let t = |x: Buf, out: Buf| Instr::<()>::Transpose { x, shape: vec![3, 4], perm: vec![1, 0], out };
    assert!(supported(&t(x, out)).is_ok());
    assert!(supported(&t(Buf { place: Place::Host, ..x }, out)).unwrap_err().contains("host"));
    assert!(supported(&t(x, buf(8, 12, DType::F32))).unwrap_err().contains("overlapping"));
    assert!(supported(&t(x, Buf { dtype: DType::BF16, ..out })).is_err());
    let ce = Instr::<()>::CrossEntropy {
        logits: x,
        labels: buf(128, 3, DType::I64),
        classes: 4,
        ignore_index: -100,
        out: buf(256, 1, DType::BF16),
    };
    assert!(supported(&ce).is_err(), "the loss is an f32 scalar");
    let step = buf(512, 1, DType::F32);
    let add = |b: Buf, out: Buf| Instr::<()>::Broadcast {
        op: zeroplan_exec::Arith::Add,
        a: step,
        a_shape: vec![],
        b,
        b_shape: vec![],
        shape: vec![],
        out,
    };
    assert!(supported(&add(buf(576, 1, DType::F32), step)).is_ok(), "a counter updated in place");
    assert!(supported(&add(step, buf(576, 1, DType::F32))).is_ok(), "a counter doubled");
    let row = Instr::<()>::Broadcast {
        op: zeroplan_exec::Arith::Add,
        a: buf(0, 4, DType::F32),
        a_shape: vec![4],
        b: x,
        b_shape: vec![3, 4],
        shape: vec![3, 4],
        out: buf(0, 12, DType::F32),
    };
    assert!(supported(&row).unwrap_err().contains("overlapping"), "a broadcast operand overwritten");
    let int = Instr::<()>::SumTo { x: buf(0, 12, DType::I32), x_shape: vec![3, 4], shape: vec![4], out };
    assert!(supported(&int).is_err(), "integer sums have no host routine");
    let alibi = |heads: usize| Instr::<()>::AlibiBias {
        x: buf(0, 2 * heads * 9, DType::F32),
        shape: [2, heads, 3, 3],
        slopes: vec![0.5; heads],
        out: buf(8192, 2 * heads * 9, DType::F32),
    };
    assert!(supported(&alibi(64)).is_ok());
    assert!(supported(&alibi(65)).is_err(), "more heads than the kernel's slopes");
    let flat = Instr::<()>::Flatten { parts: vec![x, buf(128, 4, DType::F32)], out: buf(256, 15, DType::F32) };
    assert!(supported(&flat).is_err(), "16 elements do not fit 15");
}

#[test]
fn fills_write_the_host_routines_bytes() {
    assert_eq!(host_fill(buf(0, 5, DType::BF16), 1.0).unwrap(), 0x3f80u16.to_le_bytes());
    assert_eq!(host_fill(buf(0, 5, DType::I32), -2.7).unwrap(), (-2i32).to_le_bytes());
    assert_eq!(host_fill(buf(0, 5, DType::I64), 3.0).unwrap(), 3i64.to_le_bytes());
}
