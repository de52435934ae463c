use super::*;

const H100: DeviceProperties = DeviceProperties::H100_SXM;
/// A Turing device: no bf16 `mma.sync`.
const SM75: DeviceProperties = DeviceProperties { compute_capability: (7, 5), ..H100 };

fn op() -> FlashAttention {
    FlashAttention { scale: 0.125, alibi_ranks: None, dropout: 0.0, stream: 0 }
}

fn shape(batch: usize, heads: usize, seq: usize) -> AttentionShape {
    AttentionShape { batch, heads, seq }
}

fn kernel(head_dim: usize, dtype: DType) -> AttentionKernel {
    AttentionKernel { head_dim, dtype, mask: DType::I64, alibi: true, dropout: true, tensor_cores: false }
}

fn mma_kernel(head_dim: usize, dtype: DType) -> AttentionKernel {
    AttentionKernel { tensor_cores: true, ..kernel(head_dim, dtype) }
}

#[test]
fn unsupported_specialisations_are_clear_errors() {
    let e = op().kernel(48, DType::BF16, DType::I64, &H100).unwrap_err();
    assert_eq!(e, AttentionError::HeadDim(48));
    assert!(e.to_string().contains("head dims 32 and 64 (and 128 on tensor cores"), "{e}");
    // Head dim 128 has tiles on tensor cores only.
    assert_eq!(op().kernel(128, DType::F32, DType::I64, &H100), Err(AttentionError::HeadDim(128)));
    assert_eq!(op().kernel(128, DType::BF16, DType::I64, &SM75), Err(AttentionError::HeadDim(128)));
    assert_eq!(op().kernel(64, DType::I32, DType::I64, &H100), Err(AttentionError::Dtype(DType::I32)));
    assert_eq!(op().kernel(64, DType::F32, DType::F32, &H100), Err(AttentionError::MaskDtype(DType::F32)));
    for p in [1.0, -0.1, f64::NAN] {
        let e = FlashAttention { dropout: p, ..op() }.kernel(64, DType::F32, DType::I64, &H100).unwrap_err();
        assert!(matches!(e, AttentionError::Dropout(_)), "{p}: {e}");
    }
    assert!(kernel(16, DType::BF16).render(Pass::Forward).is_err());
    // f32 operands on tensor cores, tensor-core kernels on Turing.
    assert_eq!(mma_kernel(64, DType::F32).check(), Err(AttentionError::TensorCoreDtype(DType::F32)));
    let e = mma_kernel(64, DType::BF16).launch(Pass::Forward, shape(1, 1, 8), &SM75).unwrap_err();
    assert_eq!(e, AttentionError::TensorCoreArch((7, 5)));
    assert!(e.to_string().contains("sm_80 or newer") && e.to_string().contains("sm_75"), "{e}");
}

#[test]
fn tensor_cores_serve_bf16_and_f16_from_sm_80() {
    for (dtype, device, want) in [
        (DType::BF16, H100, true),
        (DType::F16, DeviceProperties { compute_capability: (8, 0), ..H100 }, true),
        (DType::F32, H100, false),
        (DType::BF16, SM75, false),
        (DType::F16, SM75, false),
    ] {
        for d in [32, 64] {
            let k = op().kernel(d, dtype, DType::I64, &device).unwrap();
            assert_eq!(k.tensor_cores, want, "{dtype:?} D={d} on {:?}", device.compute_capability);
        }
    }
    assert!(op().kernel(128, DType::F16, DType::I64, &H100).unwrap().tensor_cores);
}

#[test]
fn the_op_decides_alibi_and_dropout() {
    let k = op().kernel(64, DType::BF16, DType::I64, &H100).unwrap();
    assert!(!k.alibi && !k.dropout);
    let k = FlashAttention { alibi_ranks: Some(1), dropout: 0.1, ..op() }
        .kernel(32, DType::F16, DType::I32, &H100)
        .unwrap();
    assert!(k.alibi && k.dropout);
}

#[test]
fn arguments_carry_the_rank_offset_and_the_dropout_threshold() {
    let fa = FlashAttention { scale: 0.125, alibi_ranks: Some(4), dropout: 0.5, stream: 7 };
    let k = fa.kernel(64, DType::F32, DType::I64, &H100).unwrap();
    let a = fa.args(&k, shape(2, 3, 100), 2).unwrap();
    assert_eq!((a.heads, a.seq, a.head_offset, a.total_heads), (3, 100, 6, 12));
    assert_eq!((a.keep_threshold, a.keep_scale, a.stream), (1 << 23, 2.0, 7));
    assert_eq!(a.scale, 0.125);
    // Without ALiBi the rank does not matter; without dropout nothing is dropped.
    let plain = op().kernel(64, DType::F32, DType::I64, &H100).unwrap();
    let a = op().args(&plain, shape(2, 3, 100), 0).unwrap();
    assert_eq!((a.head_offset, a.total_heads, a.keep_threshold, a.keep_scale), (0, 3, 0, 1.0));
    // A rank outside the group, a kernel of another op, shapes CUDA cannot launch.
    assert_eq!(fa.args(&k, shape(2, 3, 100), 4), Err(AttentionError::TensorRank { rank: 4, ranks: 4 }));
    assert!(matches!(fa.args(&plain, shape(2, 3, 100), 0), Err(AttentionError::Mismatch(_))));
    assert!(matches!(fa.args(&k, shape(0, 3, 100), 0), Err(AttentionError::Shape { .. })));
    let e = fa.args(&k, shape(70_000, 1, 8), 0).unwrap_err();
    assert!(e.to_string().contains("65,535"), "{e}");
}

#[test]
fn launch_shapes_cover_every_row_and_fit_the_device() {
    let cases = [(kernel(32, DType::BF16), 16), (kernel(64, DType::F32), 16)];
    let mma = [32, 64, 128].map(|d| (mma_kernel(d, DType::BF16), 64));
    for (k, rows) in cases.into_iter().chain(mma) {
        assert_eq!(k.rows_per_block(), rows);
        for seq in [1, 16, 17, 64, 65, 512] {
            let fwd = k.launch(Pass::Forward, shape(3, 12, seq), &H100).unwrap();
            let bwd = k.launch(Pass::Backward, shape(3, 12, seq), &H100).unwrap();
            assert_eq!(fwd.kernels.len(), 1);
            assert_eq!(
                bwd.kernels.iter().map(|l| l.entry).collect::<Vec<_>>(),
                [Entry::BackwardDq, Entry::BackwardDkDv]
            );
            for l in fwd.kernels.iter().chain(&bwd.kernels) {
                assert_eq!(l.grid, (seq.div_ceil(rows) as u32, 36));
                assert!(l.grid.0 as usize * rows >= seq && (l.grid.0 as usize - 1) * rows < seq);
                assert_eq!(l.block, THREADS);
                assert!(l.shared_bytes <= 48 << 10, "{k:?} {l:?}");
            }
        }
    }
    // CUDA cores: 16 own rows of D floats; the forward's tiles of 64 rows,
    // the backward's of 32, of D + 1 floats where read across lanes.
    assert_eq!([Pass::Forward, Pass::Backward].map(|p| kernel(64, DType::F32).tile(p)), [64, 32]);
    assert_eq!(kernel(64, DType::F32).shared_bytes(Entry::Forward), 38_144);
    assert_eq!(kernel(64, DType::F32).shared_bytes(Entry::BackwardDq), (2 * 16 * 64 + 2 * 32 * 65 + 4 * 32) * 4);
    assert_eq!(kernel(64, DType::F32).shared_bytes(Entry::BackwardDkDv), (2 * 16 * 64 + 2 * 32 * 65 + 10 * 32) * 4);
    // Tensor cores: 64 own rows and tiles of rows of D + 8 16-bit values
    // (D = 64: 144 B); the tiles shrink as D grows.
    let tiles = |d| [Pass::Forward, Pass::Backward].map(|p| mma_kernel(d, DType::BF16).tile(p));
    assert_eq!([32, 64, 128].map(tiles), [[64, 32], [32, 32], [16, 16]]);
    assert_eq!(mma_kernel(64, DType::BF16).shared_bytes(Entry::Forward), (64 + 2 * 32) * 144 + 32);
    assert_eq!(mma_kernel(64, DType::BF16).shared_bytes(Entry::BackwardDq), (128 + 2 * 32) * 144 + 512 + 32);
    assert_eq!(mma_kernel(64, DType::BF16).shared_bytes(Entry::BackwardDkDv), (128 + 2 * 32) * 144 + 256);
    assert_eq!(mma_kernel(128, DType::F16).shared_bytes(Entry::Forward), (64 + 2 * 16) * 272 + 16);
    // Head dim 128: the backward's other-side operands take turns in one buffer.
    assert!(!mma_kernel(64, DType::F16).one_operand_buffer() && mma_kernel(128, DType::F16).one_operand_buffer());
    assert_eq!(mma_kernel(128, DType::F16).shared_bytes(Entry::BackwardDq), (128 + 16) * 272 + 512 + 16);
    assert_eq!(mma_kernel(128, DType::F16).shared_bytes(Entry::BackwardDkDv), (128 + 16) * 272 + 128);
    assert!(!mma_kernel(32, DType::F16).split_dk_dv() && mma_kernel(64, DType::F16).split_dk_dv());
    // Every kernel fits 4 blocks in an A100's 164 KiB (1 KiB reserved a
    // block): the attention floor of 25% of the warp slots.
    for k in
        [32, 64].map(|d| kernel(d, DType::F32)).into_iter().chain([32, 64, 128].map(|d| mma_kernel(d, DType::BF16)))
    {
        for entry in [Entry::Forward, Entry::BackwardDq, Entry::BackwardDkDv] {
            assert!(4 * (k.shared_bytes(entry) + 1024) <= 164 << 10, "{k:?} {entry:?}");
        }
    }
    let small = crate::DeviceProperties { shared_memory_per_block: 24 << 10, ..H100 };
    let e = kernel(64, DType::F32).launch(Pass::Backward, shape(1, 1, 8), &small).unwrap_err();
    assert!(matches!(e, AttentionError::SharedMemory { entry: "dQ", .. }), "{e}");
}

#[test]
fn every_specialisation_has_its_own_symbols() {
    let mut seen = std::collections::HashSet::new();
    let mut specialisations = 0;
    for d in [32, 64, 128] {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for mask in [DType::I32, DType::I64] {
                for (alibi, dropout) in [(false, false), (true, false), (false, true), (true, true)] {
                    for tensor_cores in [false, true] {
                        let k = AttentionKernel { head_dim: d, dtype, mask, alibi, dropout, tensor_cores };
                        if k.check().is_err() {
                            continue;
                        }
                        specialisations += 1;
                        for pass in [Pass::Forward, Pass::Backward] {
                            let r = k.render(pass).unwrap();
                            for (_, symbol) in &r.entries {
                                assert!(seen.insert(symbol.clone()), "{symbol} twice");
                                assert!(r.source.contains(&format!(") {symbol}(")), "{symbol} defined");
                            }
                            assert!(!r.source.contains('$'), "an unrendered placeholder");
                            assert_eq!(r.source.contains("mma.sync"), tensor_cores);
                        }
                    }
                }
            }
        }
    }
    // CUDA cores: D 32/64 × 3 dtypes; tensor cores: D 32/64/128 × bf16/f16.
    assert_eq!(specialisations, (2 * 3 + 3 * 2) * 2 * 4);
    assert_eq!(seen.len(), 3 * specialisations);
}
