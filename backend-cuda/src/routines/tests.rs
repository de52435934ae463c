use super::arith;
use super::layout::{self, Axis, Transpose};
use super::{Routine, RoutineError};
use zeroplan_ir::DType;

#[test]
fn every_specialisation_names_its_kernels() {
    let r = Routine::CrossEntropyGrad { logits: DType::BF16, labels: DType::I64, dloss: DType::F32, out: DType::BF16 };
    let rendered = r.render().unwrap();
    assert_eq!(
        rendered.entries,
        ["zp_cross_entropy_grad_bf16_i64_f32_bf16_count", "zp_cross_entropy_grad_bf16_i64_f32_bf16_rows"]
    );
    assert!(rendered.source.contains("#include <cuda_bf16.h>") && !rendered.source.contains("cuda_fp16"));
    for e in &rendered.entries {
        assert!(rendered.source.contains(&format!("{e}(")), "{e}");
    }
    assert!(!rendered.source.contains("$NAME"));
    let plain = Routine::Layout { unit: 16 }.render().unwrap();
    assert!(plain.source.contains("typedef uint4 zp_unit_t;") && !plain.source.contains("#include"));
}

#[test]
fn wrong_dtypes_and_units_are_refused() {
    assert_eq!(Routine::Layout { unit: 3 }.render().unwrap_err(), RoutineError::Unit(3));
    let labels = Routine::CrossEntropy { logits: DType::F32, labels: DType::F32 };
    assert!(matches!(labels.render(), Err(RoutineError::Int { .. })));
    let ids = Routine::EmbeddingGrad { dy: DType::I32, ids: DType::I32, out: DType::F32 };
    assert!(matches!(ids.render(), Err(RoutineError::Float { .. })));
}

/// A head split `[B, S, H, D] → [B, H, S, D]` in bf16: three axes, rows of
/// `D` copied 16 bytes at a time.
#[test]
fn a_head_transpose_is_a_copy_of_vector_runs() {
    let Some(Transpose::Copy(c)) = layout::transpose(&[32, 128, 12, 64], &[0, 2, 1, 3], 2, 256, 4096).unwrap() else {
        panic!("a copy")
    };
    assert_eq!(c.unit, 16);
    assert_eq!(c.dims.rank, 4);
    assert_eq!(&c.dims.size[..4], &[32, 12, 128, 8]);
    assert_eq!(&c.dims.src[..4], &[128 * 12 * 8, 8, 12 * 8, 1]);
    assert_eq!(&c.dims.dst[..4], &[12 * 128 * 8, 128 * 8, 8, 1]);
    // Misaligned by 2 bytes: element units.
    let Some(Transpose::Copy(c)) = layout::transpose(&[2, 3, 4, 5], &[0, 2, 1, 3], 2, 2, 0).unwrap() else { panic!() };
    assert_eq!((c.unit, c.dims.count), (2, 120));
}

#[test]
fn moving_the_last_axis_tiles_and_unit_axes_vanish() {
    let Some(Transpose::Tiled(t)) = layout::transpose(&[4, 1, 6, 7], &[0, 3, 1, 2], 4, 0, 0).unwrap() else {
        panic!("tiled")
    };
    assert_eq!((t.rows, t.cols, t.src_row, t.dst_col, t.batches, t.rank), (6, 7, 7, 6, 4, 1));
    assert_eq!((t.src[0], t.dst[0]), (42, 42));
    // The identity is one flat copy.
    let Some(Transpose::Copy(c)) = layout::transpose(&[3, 5], &[0, 1], 4, 0, 0).unwrap() else { panic!() };
    assert_eq!((c.unit, c.dims.rank, c.dims.count), (4, 1, 15));
    assert_eq!(layout::transpose(&[3, 0], &[1, 0], 4, 0, 0).unwrap(), None);
}

#[test]
fn a_slice_of_the_middle_axis_is_two_axes() {
    let p = layout::slice(&[4, 10, 3], 1, 2, 5, 4);
    assert_eq!(p.src, 2 * 3 * 4);
    assert_eq!(p.axes, [Axis { size: 4, src: 30, dst: 15 }, Axis { size: 15, src: 1, dst: 1 }]);
    let c = layout::copy(&p.axes, 4, 24, 0).unwrap().unwrap();
    assert_eq!((c.unit, c.dims.rank, c.dims.count), (4, 2, 60));
    let pieces = layout::concat(&[vec![2, 3], vec![2, 5]], 1, 4);
    assert_eq!((pieces[1].dst, pieces[1].axes[0].dst), (12, 8));
}

/// A bias over `[B, S, H]` is two axes; aligned f32 rows run four wide, the
/// bias's one axis scaled; a row-wise scalar repeats one value per four.
#[test]
fn broadcasts_merge_axes_and_run_four_wide_where_aligned() {
    let p = arith::broadcast(&[2, 3, 8], &[8], &[2, 3, 8], [4; 3], [0, 64, 128]).unwrap().unwrap();
    assert!(p.vec4);
    assert_eq!(
        (p.dims.rank, &p.dims.size[..2], &p.dims.src[..2], &p.dims.dst[..2]),
        (2, &[6, 2][..], &[8, 4][..], &[0, 4][..])
    );
    let p = arith::broadcast(&[6, 16], &[6, 1], &[6, 16], [2; 3], [0, 64, 128]).unwrap().unwrap();
    assert!(p.vec4);
    assert_eq!((&p.dims.src[..2], &p.dims.dst[..2]), (&[16, 4][..], &[1, 0][..]));
    // Misaligned by one element: one output per thread.
    let p = arith::broadcast(&[2, 3, 8], &[8], &[2, 3, 8], [4; 3], [4, 64, 128]).unwrap().unwrap();
    assert!(!p.vec4 && p.dims.count == 48);
    let p = arith::broadcast(&[], &[], &[], [4; 3], [0; 3]).unwrap().unwrap();
    assert_eq!((p.dims.rank, p.dims.count, p.vec4), (1, 1, false));
    assert_eq!(arith::broadcast(&[0, 3], &[3], &[0, 3], [4; 3], [0; 3]).unwrap(), None);
}

/// A bias gradient `[N, H] → [H]` keeps the inner axis (a thread per
/// output, the rows cut into chunks to fill the GPU); a row sum takes a block
/// per row, long rows cut too.
#[test]
fn sums_choose_rows_or_columns_and_chunk_long_reductions() {
    let p = arith::sum_to(&[4096, 768], &[768], 132).unwrap().unwrap();
    assert!(!p.rows);
    assert_eq!((p.keep.count, p.reduce.count, p.reduce.src[0]), (768, 4096, 768));
    assert!(p.chunks > 1 && p.chunks * p.per >= 4096 && (p.chunks - 1) * p.per < 4096);
    let p = arith::sum_to(&[3, 9000], &[3, 1], 1).unwrap().unwrap();
    assert!(p.rows);
    assert_eq!((p.chunks, p.per), (3, 3000));
    let p = arith::sum_to(&[2, 3, 4, 5], &[3, 1, 5], 1).unwrap().unwrap();
    assert!(!p.rows);
    assert_eq!((p.keep.rank, p.reduce.rank, p.reduce.count), (2, 2, 8));
    let p = arith::sum_to(&[6, 7], &[6, 7], 1).unwrap().unwrap();
    assert_eq!((p.keep.rank, p.keep.count, p.reduce.count, p.chunks), (1, 42, 1, 1));
    assert_eq!(arith::sum_to(&[0, 7], &[7], 1).unwrap(), None);
}
