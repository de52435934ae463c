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

/// Every routine of a tiny-bert and a tiny-mosaicbert step, in f32 and
/// bf16, that the kernels cover runs as kernels; what a step still stages
/// is the broadcasts no row kernel took, casts, sums and the optimizer's
/// scalars (fused attention is the fused-attention pass's, not staged).
#[test]
fn every_routine_of_a_bert_step_is_taken() {
    for name in ["tiny-bert", "tiny-mosaicbert"] {
        for precision in [Precision::F32, Precision::Bf16] {
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
            for kind in ["cross_entropy", "cross_entropy_grad", "embedding", "embedding_grad"] {
                assert!(kinds.contains(kind), "{name} {precision:?} has no {kind}: {kinds:?}");
            }
            if let Some((_, left)) = staged_summary(&s.steps) {
                for kind in left.split(", ") {
                    let kind = kind.split(' ').next().unwrap();
                    assert!(
                        [
                            "lr_schedule",
                            "grad_scale",
                            "loss_scale_update",
                            "cast",
                            "sum_to",
                            "broadcast",
                            "flash_attention",
                            "flash_attention_grad"
                        ]
                        .contains(&kind),
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
    let flat = Instr::<()>::Flatten { parts: vec![x, buf(128, 4, DType::F32)], out: buf(256, 15, DType::F32) };
    assert!(supported(&flat).is_err(), "16 elements do not fit 15");
}

#[test]
fn fills_write_the_host_routines_bytes() {
    assert_eq!(host_fill(buf(0, 5, DType::BF16), 1.0).unwrap(), 0x3f80u16.to_le_bytes());
    assert_eq!(host_fill(buf(0, 5, DType::I32), -2.7).unwrap(), (-2i32).to_le_bytes());
    assert_eq!(host_fill(buf(0, 5, DType::I64), 3.0).unwrap(), 3i64.to_le_bytes());
}
