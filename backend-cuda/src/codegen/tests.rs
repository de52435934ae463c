//! Launch shapes and errors of hand-built kernels (the fuse pass's kernels
//! are covered by `tests/snapshots.rs` and `tests/nvrtc.rs`).

use zeroplan_ir::kernel::{Binary, Expr, Kernel, KernelBuilder};
use zeroplan_ir::{DType, Dim, Shape, TensorType};

use super::*;

fn ty(dims: &[Dim], dtype: DType) -> TensorType {
    TensorType::new(Shape::new(dims.iter().cloned()), dtype)
}

/// `out0 = x − Σx/H` over `[batch, H]`, and `out1 = Σ_rows x` along `H` when `dbias`.
fn centre(h: u64, dtype: DType, dbias: bool) -> Kernel {
    let dims = [Dim::symbol("batch"), Dim::from(h)];
    let mut k = KernelBuilder::new("centre", Shape::new(dims.iter().cloned()));
    let x = k.load("x", ty(&dims, dtype), vec![0, 1]);
    let sum = k.push(Expr::ReduceSum(x));
    let n = k.push(Expr::RowLen);
    let mean = k.binary(Binary::Div, sum, n);
    let y = k.binary(Binary::Sub, x, mean);
    k.store("y", ty(&dims, dtype), y);
    if dbias {
        k.store_sum("dbias", ty(&dims[1..], dtype), vec![1], x);
    }
    k.finish().unwrap()
}

#[test]
fn one_block_per_row_with_a_thread_per_vector_step() {
    let g = generate(&centre(384, DType::F32, false), &[10, 384], &DeviceProperties::H100_SXM).unwrap();
    // 384 floats = 96 float4 steps = 3 warps.
    assert_eq!((g.launch.grid, g.launch.block, g.launch.rows_per_block), (10, 96, 1));
    assert_eq!(g.launch.shared_bytes, 128);
    assert_eq!((g.launch.scratch_bytes, g.launch.finish), (0, None));
    assert_eq!(g.inputs[0].alignment, 16);
    // bf16: 8 per 16-byte step, 48 steps → 2 warps.
    let g = generate(&centre(384, DType::BF16, false), &[10, 384], &DeviceProperties::H100_SXM).unwrap();
    assert_eq!(g.launch.block, 64);
    assert!(g.source.contains("zp_ld8(in0_r + col, x0);"), "{}", g.source);
    // A width that is not a multiple of the vector: scalar rows, a warp at least.
    let g = generate(&centre(30, DType::F32, false), &[7, 30], &DeviceProperties::H100_SXM).unwrap();
    assert_eq!((g.launch.block, g.inputs[0].alignment), (32, 4));
    assert!(!g.source.contains("zp_ld4(in0_r"), "{}", g.source);
}

#[test]
fn long_rows_loop_and_cross_row_grids_are_capped() {
    let device = DeviceProperties { multiprocessors: 4, ..DeviceProperties::H100_SXM };
    let g = generate(&centre(8192, DType::F32, true), &[1000, 8192], &device).unwrap();
    assert_eq!(g.launch.block, 256);
    // Two blocks per SM for the partial sums: 8 blocks of 125 rows.
    assert_eq!((g.launch.grid, g.launch.rows_per_block), (8, 125));
    assert_eq!(g.launch.scratch_bytes, 8 * 8192 * 8);
    // The finish: a block per 32 of the 8,192 sums.
    assert_eq!(g.launch.finish, Some((256, 256)));
    assert!(g.outputs[1].cross_row && !g.outputs[0].cross_row);
    assert_eq!(g.finish_entry.as_deref(), Some("zp_centre_finish"));
    // Fewer rows than blocks: every block has a row.
    let g = generate(&centre(64, DType::F32, true), &[3, 64], &device).unwrap();
    assert_eq!((g.launch.grid, g.launch.rows_per_block), (3, 1));
    // No rows: nothing to launch but the finish kernel, which writes zeros.
    let g = generate(&centre(64, DType::F32, true), &[0, 64], &device).unwrap();
    assert_eq!((g.launch.grid, g.launch.scratch_bytes), (0, 0));
    assert!(g.launch.finish.is_some());
}

#[test]
fn a_single_row_uses_vectors_and_a_scalar_tail() {
    let g = generate(&centre(1001, DType::F32, false), &[1, 1001], &DeviceProperties::H100_SXM).unwrap();
    assert!(g.source.contains("col < 1000; col += 1024"), "{}", g.source);
    assert!(g.source.contains("for (long long col = 1000 + threadIdx.x; col < 1001; col += 256)"), "{}", g.source);
}

/// `Σ g²` and `2g` over a flat `[n]` buffer (a parameter group's gradient).
fn flat(n: u64) -> Kernel {
    let dims = [Dim::from(n)];
    let mut k = KernelBuilder::new("flat", Shape::new(dims.iter().cloned()));
    let g = k.load("g", ty(&dims, DType::BF16), vec![0]);
    let sq = k.binary(Binary::Mul, g, g);
    let two = k.constant(2.0);
    let doubled = k.binary(Binary::Mul, g, two);
    k.store("doubled", ty(&dims, DType::F32), doubled);
    k.store_sum("sq", ty(&[], DType::F32), vec![], sq);
    k.finish().unwrap()
}

#[test]
fn one_long_row_is_split_over_the_gpu() {
    let g = generate(&flat(7_077_888), &[7_077_888], &DeviceProperties::H100_SXM).unwrap();
    // [1728, 4096]: the partial sums cap the grid at 2 blocks per SM (264),
    // so 7 rows a block, 247 blocks.
    assert_eq!((g.launch.grid, g.launch.rows_per_block, g.launch.block), (247, 7, 256));
    assert_eq!(g.dims, [7_077_888]);
    assert_eq!((g.inputs[0].len, g.outputs[0].len, g.outputs[1].len), (7_077_888, 7_077_888, 1));
    // A short row stays whole, and so does a row its body reduces.
    let g = generate(&flat(6000), &[6000], &DeviceProperties::H100_SXM).unwrap();
    assert_eq!(g.launch.grid, 1);
    let g = generate(&centre(65_536, DType::F32, false), &[1, 65_536], &DeviceProperties::H100_SXM).unwrap();
    assert_eq!(g.launch.grid, 1);
    // Enough rows already (4 per SM): no split.
    let g = generate(&centre(8192, DType::F32, true), &[528, 8192], &DeviceProperties::H100_SXM).unwrap();
    assert_eq!((g.dims.as_slice(), g.launch.grid, g.launch.rows_per_block), (&[528, 8192][..], 264, 2));
}

#[test]
fn bad_dims_and_devices_are_errors() {
    let k = centre(64, DType::F32, false);
    let e = generate(&k, &[2, 65], &DeviceProperties::H100_SXM).unwrap_err();
    assert!(matches!(e, CodegenError::Dims { .. }), "{e}");
    assert!(e.to_string().contains("constant 64"), "{e}");
    assert!(matches!(generate(&k, &[2], &DeviceProperties::H100_SXM), Err(CodegenError::Dims { .. })));
    let e = generate(&k, &[usize::MAX / 2, 64], &DeviceProperties::H100_SXM).unwrap_err();
    assert!(e.to_string().contains("fit in memory"), "{e}");
    let tiny = DeviceProperties { max_threads_per_block: 16, ..DeviceProperties::H100_SXM };
    assert!(matches!(generate(&k, &[2, 64], &tiny), Err(CodegenError::Device { .. })));
    let no_shared = DeviceProperties { shared_memory_per_block: 64, ..DeviceProperties::H100_SXM };
    assert!(matches!(generate(&k, &[2, 64], &no_shared), Err(CodegenError::Device { .. })));
    let mut broken = k.clone();
    broken.body.push(Expr::ReduceSum(99));
    assert!(matches!(generate(&broken, &[2, 64], &DeviceProperties::H100_SXM), Err(CodegenError::Invalid { .. })));
}

#[test]
fn names_cannot_break_out_of_comments_or_symbols() {
    let mut k = centre(8, DType::F32, false);
    k.name = "evil */ name\\\nwith \"quotes\"".into();
    k.inputs[0].name = "x */ int oops; /*".into();
    let g = generate(&k, &[1, 8], &DeviceProperties::H100_SXM).unwrap();
    assert!(g.entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{}", g.entry);
    // Outside `//` comments, the name's `*/` is defused.
    let code = g.source.lines().filter(|l| !l.trim_start().starts_with("//"));
    assert!(code.clone().all(|l| !l.contains("*/ int oops")), "{}", g.source);
    assert!(g.source.lines().filter(|l| l.starts_with("//")).all(|l| !l.ends_with('\\')));
}
