//! `flash_attention` and `flash_attention_grad` against the unfused chain
//! they replace, op by op in the reference interpreter: `matmul(q, kᵀ) →
//! scale → (alibi_bias) → attention_mask → softmax → (dropout) → matmul(·,
//! v)` forward, and its adjoints by hand (the product rules, dropout,
//! `softmax_grad`, `attention_mask_grad`, scale) backward — on random inputs
//! with padded keys, with and without ALiBi and dropout. `F64` must agree
//! within 1e-12 relative (the reference runs the same steps in the same
//! order, so in practice bit for bit), `Native` f32 within 1e-5 relative
//! (the unfused graph rounds every intermediate, the fused op only its
//! outputs). The gradients are also checked against central differences,
//! which know nothing of either form.

use zeroplan_ir::interp::{Feeds, Interpreter, Rounding, Values};
use zeroplan_ir::{DType, Dim, Graph, Op, Shape, Tensor, TensorType, Value};

const B: usize = 2;
const H: usize = 3;
const S: usize = 6;
const D: usize = 4;

/// What varies between cases.
#[derive(Clone, Copy, Debug)]
struct Case {
    alibi: bool,
    dropout: f64,
}

const CASES: [Case; 4] = [
    Case { alibi: false, dropout: 0.0 },
    Case { alibi: true, dropout: 0.0 },
    Case { alibi: false, dropout: 0.3 },
    Case { alibi: true, dropout: 0.3 },
];

const STREAM: u32 = 7;

fn scale() -> f64 {
    1.0 / (D as f64).sqrt()
}

fn fused_op(case: Case, grad: bool) -> Op {
    let (scale, alibi_ranks, dropout, stream) = (scale(), case.alibi.then_some(1), case.dropout, STREAM);
    if grad {
        Op::FlashAttentionGrad { scale, alibi_ranks, dropout, stream }
    } else {
        Op::FlashAttention { scale, alibi_ranks, dropout, stream }
    }
}

fn bhsd(dtype: DType) -> TensorType {
    let dims = [B, H, S, D].iter().map(|&n| Dim::constant(n as u64)).collect();
    TensorType::new(Shape(dims), dtype)
}

/// Inputs `q, k, v, mask, dout` of a fresh graph.
fn inputs(g: &mut Graph) -> [Value; 5] {
    let mask_ty = TensorType::new(Shape(vec![Dim::constant(B as u64), Dim::constant(S as u64)]), DType::I64);
    [
        g.input("q", bhsd(DType::F32)).unwrap(),
        g.input("k", bhsd(DType::F32)).unwrap(),
        g.input("v", bhsd(DType::F32)).unwrap(),
        g.input("mask", mask_ty).unwrap(),
        g.input("dout", bhsd(DType::F32)).unwrap(),
    ]
}

/// The unfused forward and its adjoints, as the builder and autodiff write them.
fn unfused(case: Case) -> Graph {
    let mut g = Graph::new("unfused");
    let [q, k, v, mask, dout] = inputs(&mut g);
    let scores = g.add("scores", Op::MatMul { transpose_a: false, transpose_b: true }, &[q, k]).unwrap();
    let mut s = g.add("scaled", Op::Scale { factor: scale() }, &[scores]).unwrap();
    if case.alibi {
        s = g.add("alibi", Op::AlibiBias { ranks: 1 }, &[s]).unwrap();
    }
    let masked = g.add("masked", Op::AttentionMask, &[s, mask]).unwrap();
    let probs = g.add("probs", Op::Softmax, &[masked]).unwrap();
    let dropout = Op::Dropout { p: case.dropout, stream: STREAM };
    let dropped = if case.dropout > 0.0 { g.add("dropped", dropout.clone(), &[probs]).unwrap() } else { probs };
    let out = g.add("out", Op::MatMul { transpose_a: false, transpose_b: false }, &[dropped, v]).unwrap();
    // Backward.
    let dv = g.add("dv", Op::MatMul { transpose_a: true, transpose_b: false }, &[dropped, dout]).unwrap();
    let mut dp = g.add("ddropped", Op::MatMul { transpose_a: false, transpose_b: true }, &[dout, v]).unwrap();
    if case.dropout > 0.0 {
        dp = g.add("dprobs", dropout, &[dp]).unwrap();
    }
    let dmasked = g.add("dmasked", Op::SoftmaxGrad, &[probs, dp]).unwrap();
    let ds = g.add("ds", Op::AttentionMaskGrad, &[dmasked, mask]).unwrap();
    let dscores = g.add("dscores", Op::Scale { factor: scale() }, &[ds]).unwrap();
    let dq = g.add("dq", Op::MatMul { transpose_a: false, transpose_b: false }, &[dscores, k]).unwrap();
    let dk = g.add("dk", Op::MatMul { transpose_a: true, transpose_b: false }, &[dscores, q]).unwrap();
    for (name, v) in [("out", out), ("dq", dq), ("dk", dk), ("dv", dv)] {
        g.set_output(name, v);
    }
    g.verify().unwrap();
    g
}

fn fused(case: Case) -> Graph {
    let mut g = Graph::new("fused");
    let [q, k, v, mask, dout] = inputs(&mut g);
    let fwd = g.add_multi("attention", fused_op(case, false), &[q, k, v, mask]).unwrap();
    let grads = g.add_multi("attention.back", fused_op(case, true), &[q, k, v, mask, fwd[0], fwd[1], dout]).unwrap();
    for (name, v) in [("out", fwd[0]), ("lse", fwd[1]), ("dq", grads[0]), ("dk", grads[1]), ("dv", grads[2])] {
        g.set_output(name, v);
    }
    g.verify().unwrap();
    g
}

/// Uniform values in [−2, 2) from a fixed LCG, per input.
fn random(n: usize, salt: u64) -> Vec<f64> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((x >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect()
}

/// Batch 0 keeps every key; batch 1 pads its last two.
fn feeds(mask: &[i64]) -> Feeds {
    let t = |salt| Tensor::float(vec![B, H, S, D], DType::F32, random(B * H * S * D, salt)).unwrap();
    let mut feeds = Feeds::new();
    for (i, name) in ["q", "k", "v", "dout"].into_iter().enumerate() {
        feeds.insert(name.into(), t(i as u64 + 1));
    }
    feeds.insert("mask".into(), Tensor::int(vec![B, S], DType::I64, mask.to_vec()).unwrap());
    feeds
}

const PADDED: [i64; B * S] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0];

fn run(g: &Graph, rounding: Rounding, feeds: &Feeds) -> Values {
    // Offset 3: dropout's mask depends on it, and both forms must use it alike.
    Interpreter::new(rounding, 11).evaluate(g, &Default::default(), feeds, 3).unwrap()
}

fn output<'v>(g: &Graph, values: &'v Values, name: &str) -> &'v [f64] {
    values.graph_output(g, name).unwrap().floats().unwrap()
}

/// Largest |a − b| relative to the largest |b| (so near-zero entries do not dominate).
fn relative_error(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let norm = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / norm
}

#[test]
fn fused_matches_the_unfused_chain_forward_and_backward() {
    for case in CASES {
        let (u, f) = (unfused(case), fused(case));
        let feeds = feeds(&PADDED);
        for (precision, tolerance) in [(Rounding::F64, 1e-12), (Rounding::Native, 1e-5)] {
            let (uv, fv) = (run(&u, precision, &feeds), run(&f, precision, &feeds));
            for name in ["out", "dq", "dk", "dv"] {
                let err = relative_error(output(&f, &fv, name), output(&u, &uv, name));
                assert!(err <= tolerance, "{case:?} {precision:?} {name}: relative error {err:e}");
            }
        }
    }
}

#[test]
fn dropout_draws_the_unfused_mask_and_changes_the_result() {
    // Agreement above with p = 0.3 could not happen with another mask; and
    // the dropout must actually bite, or the comparison proves nothing.
    let feeds = feeds(&PADDED);
    let with = run(&fused(CASES[2]), Rounding::F64, &feeds);
    let without = run(&fused(CASES[0]), Rounding::F64, &feeds);
    let err = relative_error(output(&fused(CASES[2]), &with, "out"), output(&fused(CASES[0]), &without, "out"));
    assert!(err > 0.1, "dropout changed the output by only {err}");
}

#[test]
fn lse_is_the_log_sum_exp_of_the_masked_scores() {
    // Recomputed here by hand for one row of each batch: batch 1's two
    // padded keys must not count.
    let case = CASES[1];
    let f = fused(case);
    let feeds = feeds(&PADDED);
    let values = run(&f, Rounding::F64, &feeds);
    let lse = output(&f, &values, "lse");
    let (q, k) = (feeds["q"].floats().unwrap(), feeds["k"].floats().unwrap());
    let slopes = zeroplan_ir::interp::alibi_slopes(H);
    for (b, h, i) in [(0, 2, 1), (1, 1, 4)] {
        let row: Vec<f64> = (0..S)
            .filter(|&j| PADDED[b * S + j] != 0)
            .map(|j| {
                let at = |t: &[f64], r: usize, e: usize| t[((b * H + h) * S + r) * D + e];
                let dot: f64 = (0..D).map(|e| at(q, i, e) * at(k, j, e)).sum();
                dot * scale() - slopes[h] * i.abs_diff(j) as f64
            })
            .collect();
        let want = row.iter().map(|x| x.exp()).sum::<f64>().ln();
        let got = lse[(b * H + h) * S + i];
        assert!((got - want).abs() < 1e-12, "({b}, {h}, {i}): {got} vs {want}");
    }
}

#[test]
fn a_row_with_every_key_masked_gives_zero_output_minus_infinite_lse_and_zero_gradients() {
    // Batch 1 masks every key: the unfused softmax gives zeros, so out = 0.
    let mask = [1, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0];
    let feeds = feeds(&mask);
    for case in CASES {
        let (u, f) = (unfused(case), fused(case));
        let (uv, fv) = (run(&u, Rounding::F64, &feeds), run(&f, Rounding::F64, &feeds));
        for name in ["out", "dq", "dk", "dv"] {
            let got = output(&f, &fv, name);
            assert_eq!(got, output(&u, &uv, name), "{case:?} {name}");
            assert!(got[H * S * D..].iter().all(|&x| x == 0.0), "{case:?} {name}: batch 1 is not zero");
            assert!(got.iter().all(|x| x.is_finite()), "{case:?} {name}");
        }
        let lse = output(&f, &fv, "lse");
        assert!(lse[H * S..].iter().all(|&x| x == f64::NEG_INFINITY), "{lse:?}");
        assert!(lse[..H * S].iter().all(|x| x.is_finite()));
    }
}

#[test]
fn gradients_match_central_differences() {
    // L = Σ dout·out; dL/dx by central differences of the fused forward
    // alone. Dropout's mask does not move with the inputs, so it is included.
    for case in [CASES[1], CASES[3]] {
        let f = fused(case);
        let base = feeds(&PADDED);
        let values = run(&f, Rounding::F64, &base);
        let dout = base["dout"].floats().unwrap().to_vec();
        let loss = |feeds: &Feeds| -> f64 {
            let out = run(&f, Rounding::F64, feeds);
            output(&f, &out, "out").iter().zip(&dout).map(|(a, b)| a * b).sum()
        };
        for (input, grad) in [("q", "dq"), ("k", "dk"), ("v", "dv")] {
            let analytic = output(&f, &values, grad).to_vec();
            // A handful of elements in each batch, padded keys included.
            for e in [0, 5, 37, 71, 100, 130, 141, 143] {
                let nudged = |delta: f64| {
                    let mut fd = base.clone();
                    let t = fd.get_mut(input).unwrap();
                    t.floats_mut().unwrap()[e] += delta;
                    loss(&fd)
                };
                let h = 1e-6;
                let numeric = (nudged(h) - nudged(-h)) / (2.0 * h);
                assert!(
                    (analytic[e] - numeric).abs() < 1e-7 * (1.0 + numeric.abs()),
                    "{case:?} {grad}[{e}]: {} vs {numeric}",
                    analytic[e]
                );
            }
        }
    }
}

#[test]
fn bad_operands_are_errors_naming_what_is_wrong() {
    let mut g = Graph::new("bad");
    let [q, k, _, mask, _] = inputs(&mut g);
    let short = g.input("short", TensorType::new(Shape(vec![Dim::constant(B as u64)]), DType::F32)).unwrap();
    let op = fused_op(CASES[0], false);
    let err = g.add_multi("a", op.clone(), &[q, k, short, mask]).unwrap_err().to_string();
    assert!(err.contains("q, k and v"), "{err}");
    let err = g.add_multi("b", op.clone(), &[q, k, k, q]).unwrap_err().to_string();
    assert!(err.contains("mask"), "{err}");
    let err = g
        .add_multi("c", Op::FlashAttention { scale: 1.0, alibi_ranks: None, dropout: 1.0, stream: 0 }, &[q, k, k, mask])
        .unwrap_err()
        .to_string();
    assert!(err.contains("dropout"), "{err}");
    let err = g
        .add_multi(
            "d",
            Op::FlashAttention { scale: 1.0, alibi_ranks: Some(0), dropout: 0.0, stream: 0 },
            &[q, k, k, mask],
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("ALiBi"), "{err}");
    // The gradient's `lse` must be the forward's f32 [B, H, S].
    let fwd = g.add_multi("e", op, &[q, k, k, mask]).unwrap();
    let err =
        g.add_multi("f", fused_op(CASES[0], true), &[q, k, k, mask, fwd[0], fwd[0], fwd[0]]).unwrap_err().to_string();
    assert!(err.contains("lse"), "{err}");
}

#[test]
fn text_and_ron_forms_carry_the_attributes() {
    let g = fused(CASES[3]);
    let text = g.to_text();
    assert!(
        text.contains("flash_attention(%q, %k, %v, %mask) {scale=0.5, alibi_ranks=1, dropout=0.3, stream=7}"),
        "{text}"
    );
    assert!(
        text.contains("%attention.back: (f32[2, 3, 6, 4], f32[2, 3, 6, 4], f32[2, 3, 6, 4]) = flash_attention_grad(")
    );
    let back = Graph::from_ron(&g.to_ron()).unwrap();
    assert_eq!(back.to_text(), text);
    // Without ALiBi or dropout the attributes say so by their absence.
    assert!(fused(CASES[0]).to_text().contains("flash_attention(%q, %k, %v, %mask) {scale=0.5}\n"));
}
