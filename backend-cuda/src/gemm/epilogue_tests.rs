use super::*;
use cudarc::cublaslt::sys::cublasLtEpilogue_t as E;

fn gemm(m: usize, n: usize, k: usize, ta: bool, tb: bool, batches: &[(usize, usize)]) -> Gemm<'_> {
    Gemm { m, n, k, transpose_a: ta, transpose_b: tb, batches, dtype: DType::BF16 }
}

const TANH: GeluApproximation = GeluApproximation::Tanh;

#[test]
fn a_linear_layer_with_bias_and_gelu_keeps_its_pre_activation() {
    // y[tokens × out] = x[tokens × in]·Wᵀ + b, W stored [out × in]: m = 32 tokens, n = 64 out, k = 16 in.
    let g = gemm(32, 64, 16, false, true, &[(0, 0)]);
    let plan =
        LtGemm { gemm: g, epilogue: Epilogue::Gelu { bias: true, aux: true, approximation: TANH } }.plan().unwrap();
    assert_eq!(plan.epilogue, E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
    assert_eq!((plan.transa, plan.transb), (true, false));
    // cuBLASLt's A is W read column-major: k × n, ld k; its B is x: k × m, ld k; D is n × m.
    assert_eq!(plan.a, LtLayout { rows: 16, cols: 64, ld: 16, batch_stride: 0 });
    assert_eq!(plan.b, LtLayout { rows: 16, cols: 32, ld: 16, batch_stride: 0 });
    assert_eq!(plan.d, LtLayout { rows: 64, cols: 32, ld: 64, batch_stride: 2048 });
    assert_eq!(plan.bias, Some(LtExtra { len: 64, batch_stride: 0, written: false }));
    assert_eq!(plan.aux, Some(LtExtra { len: 64, batch_stride: 2048, written: true }));
    assert_eq!(plan.data_type, sys::cudaDataType::CUDA_R_16BF);
}

#[test]
fn weight_gradients_take_the_bias_gradient_from_the_right_operand() {
    // dW[out × in] = dYᵀ·X: A = dY [tokens × out] transposed; db[out] = Σ_tokens dY = Σ_k op(A).
    let g = gemm(64, 16, 32, true, false, &[(0, 0)]);
    let plan = LtGemm { gemm: g, epilogue: Epilogue::BiasGradA }.plan().unwrap();
    assert_eq!(plan.epilogue, E::CUBLASLT_EPILOGUE_BGRADB);
    assert_eq!(plan.bias, Some(LtExtra { len: 64, batch_stride: 0, written: true }));
    // dW[in × out] = Xᵀ·dY: db[out] = Σ_k op(B).
    let g = gemm(16, 64, 32, true, false, &[(0, 0)]);
    let plan = LtGemm { gemm: g, epilogue: Epilogue::BiasGradB }.plan().unwrap();
    assert_eq!(plan.epilogue, E::CUBLASLT_EPILOGUE_BGRADA);
    assert_eq!(plan.bias.unwrap().len, 64);
    // The GELU backward reads the saved pre-activation and writes the bias gradient.
    let g = gemm(32, 64, 16, false, false, &[(0, 0)]);
    let plan = LtGemm { gemm: g, epilogue: Epilogue::DGelu { bias_grad: true, approximation: TANH } }.plan().unwrap();
    assert_eq!(plan.epilogue, E::CUBLASLT_EPILOGUE_DGELU_BGRAD);
    assert_eq!((plan.bias.unwrap().written, plan.aux.unwrap().written), (true, false));
}

#[test]
fn batches_step_through_their_operands_and_share_the_bias() {
    let g = gemm(4, 8, 2, false, false, &[(0, 0), (1, 0), (2, 0)]);
    let plan = LtGemm { gemm: g, epilogue: Epilogue::Bias }.plan().unwrap();
    assert_eq!(plan.batch, 3);
    assert_eq!((plan.a.batch_stride, plan.b.batch_stride, plan.d.batch_stride), (0, 8, 32));
    assert_eq!(plan.bias.unwrap().batch_stride, 0);
}

#[test]
fn unsupported_combinations_are_clear_errors() {
    let one = [(0, 0)];
    let erf = Epilogue::Gelu { bias: true, aux: false, approximation: GeluApproximation::Erf };
    let e = LtGemm { gemm: gemm(8, 64, 8, false, false, &one), epilogue: erf }.plan().unwrap_err();
    assert!(e.to_string().contains("tanh approximation"), "{e}");
    let aux = Epilogue::Gelu { bias: false, aux: true, approximation: TANH };
    let e = LtGemm { gemm: gemm(8, 12, 8, false, false, &one), epilogue: aux }.plan().unwrap_err();
    assert!(e.to_string().contains("multiple of 8"), "{e}");
    let batched = [(0, 0), (1, 1)];
    let e = LtGemm { gemm: gemm(8, 8, 8, false, false, &batched), epilogue: Epilogue::BiasGradA }.plan().unwrap_err();
    assert!(e.to_string().contains("batched product"), "{e}");
    let broadcast = [(0, 0), (0, 1), (1, 0), (1, 1)];
    let e = LtGemm { gemm: gemm(8, 8, 8, false, false, &broadcast), epilogue: Epilogue::Bias }.plan().unwrap_err();
    assert!(e.to_string().contains("broadcast batch list"), "{e}");
    let ints = Gemm { dtype: DType::I32, ..gemm(8, 8, 8, false, false, &one) };
    assert!(LtGemm { gemm: ints, epilogue: Epilogue::Default }.plan().is_err());
}

/// cuBLASLt's documented semantics on host memory: `D = op(A)·op(B)` on
/// column-major layouts, per batch; then BIAS adds `bias[row of D]`,
/// BGRADB writes `Σ_k op(B)[k][col of D]`, BGRADA `Σ_k op(A)[row][k]`.
fn cublaslt_on_the_host(plan: &LtPlan, a: &[f64], b: &[f64], bias: &mut [f64]) -> Vec<f64> {
    let at = |l: &LtLayout, mem: &[f64], batch: usize, r: usize, c: usize| {
        mem[batch * l.batch_stride as usize + c * l.ld as usize + r]
    };
    let (n, m) = (plan.d.rows as usize, plan.d.cols as usize);
    let k = if plan.transa { plan.a.rows } else { plan.a.cols } as usize;
    let op_a = |batch, i, kk| if plan.transa { at(&plan.a, a, batch, kk, i) } else { at(&plan.a, a, batch, i, kk) };
    let op_b = |batch, kk, j| if plan.transb { at(&plan.b, b, batch, j, kk) } else { at(&plan.b, b, batch, kk, j) };
    let mut d = vec![0.0; plan.batch as usize * m * n];
    for batch in 0..plan.batch as usize {
        for i in 0..n {
            for j in 0..m {
                let mut sum: f64 = (0..k).map(|kk| op_a(batch, i, kk) * op_b(batch, kk, j)).sum();
                if plan.epilogue == E::CUBLASLT_EPILOGUE_BIAS {
                    sum += bias[i];
                }
                d[batch * plan.d.batch_stride as usize + j * n + i] = sum;
            }
        }
    }
    if plan.epilogue == E::CUBLASLT_EPILOGUE_BGRADB {
        for (j, out) in bias.iter_mut().enumerate() {
            *out = (0..k).map(|kk| op_b(0, kk, j)).sum();
        }
    }
    if plan.epilogue == E::CUBLASLT_EPILOGUE_BGRADA {
        for (i, out) in bias.iter_mut().enumerate() {
            *out = (0..k).map(|kk| op_a(0, i, kk)).sum();
        }
    }
    d
}

#[test]
fn the_swapped_column_major_call_computes_the_row_major_product() {
    let (m, n, k) = (3, 5, 4);
    let value = |seed: usize| ((seed * 7919) % 23) as f64 - 11.0;
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        for batches in [vec![(0, 0)], vec![(0, 0), (1, 1)], vec![(0, 0), (0, 1)]] {
            let count = batches.len();
            let a: Vec<f64> = (0..2 * m * k).map(value).collect();
            let b: Vec<f64> = (0..2 * k * n).map(|i| value(i + 1000)).collect();
            // Row-major op(A)[i][kk], op(B)[kk][j] of batch matrices.
            let ra = |mat: usize, i: usize, kk: usize| {
                if ta { a[mat * m * k + kk * m + i] } else { a[mat * m * k + i * k + kk] }
            };
            let rb = |mat: usize, kk: usize, j: usize| {
                if tb { b[mat * k * n + j * k + kk] } else { b[mat * k * n + kk * n + j] }
            };
            let bias_in: Vec<f64> = (0..n).map(|j| j as f64 * 0.5).collect();
            let plain = Gemm { dtype: DType::F32, ..gemm(m, n, k, ta, tb, &batches) };
            for epilogue in [Epilogue::Default, Epilogue::Bias, Epilogue::BiasGradA, Epilogue::BiasGradB] {
                let Ok(plan) = (LtGemm { gemm: plain, epilogue }).plan() else {
                    assert!(count > 1 && matches!(epilogue, Epilogue::BiasGradA | Epilogue::BiasGradB));
                    continue;
                };
                let mut bias = match epilogue {
                    Epilogue::Bias => bias_in.clone(),
                    _ => vec![0.0; plan.bias.map_or(0, |x| x.len as usize)],
                };
                // cuBLASLt's A is our B, its B our A.
                let d = cublaslt_on_the_host(&plan, &b, &a, &mut bias);
                for (c, &(ia, ib)) in batches.iter().enumerate() {
                    for i in 0..m {
                        for j in 0..n {
                            let mut want: f64 = (0..k).map(|kk| ra(ia, i, kk) * rb(ib, kk, j)).sum();
                            if epilogue == Epilogue::Bias {
                                want += bias_in[j];
                            }
                            assert_eq!(
                                d[c * m * n + i * n + j],
                                want,
                                "{ta} {tb} {batches:?} {epilogue:?} C[{c}][{i}][{j}]"
                            );
                        }
                    }
                }
                if epilogue == Epilogue::BiasGradA {
                    let want: Vec<f64> = (0..m).map(|i| (0..k).map(|kk| ra(0, i, kk)).sum()).collect();
                    assert_eq!(bias, want, "{ta} {tb}");
                }
                if epilogue == Epilogue::BiasGradB {
                    let want: Vec<f64> = (0..n).map(|j| (0..k).map(|kk| rb(0, kk, j)).sum()).collect();
                    assert_eq!(bias, want, "{ta} {tb}");
                }
            }
        }
    }
}
