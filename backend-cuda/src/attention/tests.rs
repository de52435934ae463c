use super::*;

fn op() -> FlashAttention {
    FlashAttention { scale: 0.125, alibi_ranks: None, dropout: 0.0, stream: 0 }
}

fn shape(batch: usize, heads: usize, seq: usize) -> AttentionShape {
    AttentionShape { batch, heads, seq }
}

fn kernel(head_dim: usize, dtype: DType) -> AttentionKernel {
    AttentionKernel { head_dim, dtype, mask: DType::I64, alibi: true, dropout: true }
}

#[test]
fn unsupported_specialisations_are_clear_errors() {
    let e = op().kernel(48, DType::F32, DType::I64).unwrap_err();
    assert_eq!(e, AttentionError::HeadDim(48));
    assert!(e.to_string().contains("head dims 32 and 64, not 48"), "{e}");
    assert_eq!(op().kernel(64, DType::I32, DType::I64), Err(AttentionError::Dtype(DType::I32)));
    assert_eq!(op().kernel(64, DType::F32, DType::F32), Err(AttentionError::MaskDtype(DType::F32)));
    for p in [1.0, -0.1, f64::NAN] {
        let e = FlashAttention { dropout: p, ..op() }.kernel(64, DType::F32, DType::I64).unwrap_err();
        assert!(matches!(e, AttentionError::Dropout(_)), "{p}: {e}");
    }
    assert!(kernel(16, DType::BF16).render(Pass::Forward).is_err());
}

#[test]
fn the_op_decides_alibi_and_dropout() {
    let k = op().kernel(64, DType::BF16, DType::I64).unwrap();
    assert!(!k.alibi && !k.dropout);
    let k = FlashAttention { alibi_ranks: Some(1), dropout: 0.1, ..op() }.kernel(32, DType::F16, DType::I32).unwrap();
    assert!(k.alibi && k.dropout);
}

#[test]
fn arguments_carry_the_rank_offset_and_the_dropout_threshold() {
    let fa = FlashAttention { scale: 0.125, alibi_ranks: Some(4), dropout: 0.5, stream: 7 };
    let k = fa.kernel(64, DType::F32, DType::I64).unwrap();
    let a = fa.args(&k, shape(2, 3, 100), 2, 42, 9).unwrap();
    assert_eq!((a.heads, a.seq, a.head_offset, a.total_heads), (3, 100, 6, 12));
    assert_eq!((a.keep_threshold, a.keep_scale, a.stream, a.seed, a.offset), (1 << 23, 2.0, 7, 42, 9));
    assert_eq!(a.scale, 0.125);
    // Without ALiBi the rank does not matter; without dropout nothing is dropped.
    let plain = op().kernel(64, DType::F32, DType::I64).unwrap();
    let a = op().args(&plain, shape(2, 3, 100), 0, 0, 0).unwrap();
    assert_eq!((a.head_offset, a.total_heads, a.keep_threshold, a.keep_scale), (0, 3, 0, 1.0));
    // A rank outside the group, a kernel of another op, shapes CUDA cannot launch.
    assert_eq!(fa.args(&k, shape(2, 3, 100), 4, 0, 0), Err(AttentionError::TensorRank { rank: 4, ranks: 4 }));
    assert!(matches!(fa.args(&plain, shape(2, 3, 100), 0, 0, 0), Err(AttentionError::Mismatch(_))));
    assert!(matches!(fa.args(&k, shape(0, 3, 100), 0, 0, 0), Err(AttentionError::Shape { .. })));
    let e = fa.args(&k, shape(70_000, 1, 8), 0, 0, 0).unwrap_err();
    assert!(e.to_string().contains("65,535"), "{e}");
}

#[test]
fn launch_shapes_cover_every_row_and_fit_the_device() {
    let device = crate::DeviceProperties::H100_SXM;
    for d in [32, 64] {
        for seq in [1, 16, 17, 512] {
            let k = kernel(d, DType::BF16);
            let fwd = k.launch(Pass::Forward, shape(3, 12, seq), &device).unwrap();
            let bwd = k.launch(Pass::Backward, shape(3, 12, seq), &device).unwrap();
            assert_eq!(fwd.kernels.len(), 1);
            assert_eq!(
                bwd.kernels.iter().map(|l| l.entry).collect::<Vec<_>>(),
                [Entry::BackwardDq, Entry::BackwardDkDv]
            );
            for l in fwd.kernels.iter().chain(&bwd.kernels) {
                assert_eq!(l.grid, (seq.div_ceil(16) as u32, 36));
                assert!(l.grid.0 as usize * ROWS_PER_BLOCK >= seq && (l.grid.0 as usize - 1) * ROWS_PER_BLOCK < seq);
                assert_eq!(l.block, THREADS);
                assert!(l.shared_bytes <= 48 << 10, "{l:?}");
            }
        }
    }
    assert_eq!(kernel(64, DType::F32).shared_bytes(Entry::Forward), 38_144);
    assert_eq!(kernel(64, DType::F32).shared_bytes(Entry::BackwardDq), 42_496);
    assert_eq!(kernel(64, DType::F32).shared_bytes(Entry::BackwardDkDv), 44_032);
    let small = crate::DeviceProperties { shared_memory_per_block: 40 << 10, ..device };
    let e = kernel(64, DType::F32).launch(Pass::Backward, shape(1, 1, 8), &small).unwrap_err();
    assert!(matches!(e, AttentionError::SharedMemory { entry: "dQ", .. }), "{e}");
}

#[test]
fn every_specialisation_has_its_own_symbols() {
    let mut seen = std::collections::HashSet::new();
    for d in [32, 64] {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for mask in [DType::I32, DType::I64] {
                for (alibi, dropout) in [(false, false), (true, false), (false, true), (true, true)] {
                    let k = AttentionKernel { head_dim: d, dtype, mask, alibi, dropout };
                    for pass in [Pass::Forward, Pass::Backward] {
                        let r = k.render(pass).unwrap();
                        for (_, symbol) in &r.entries {
                            assert!(seen.insert(symbol.clone()), "{symbol} twice");
                            assert!(r.source.contains(&format!("void __launch_bounds__(ZP_THREADS) {symbol}(")));
                        }
                        assert!(!r.source.contains('$'), "an unrendered placeholder");
                    }
                }
            }
        }
    }
    assert_eq!(seen.len(), 2 * 3 * 2 * 4 * 3);
}
