//! `flash_attention` and `flash_attention_grad` on the host: the
//! FlashAttention algorithm in f32 (Dao et al., 2022; FlashAttention-2,
//! 2023), parallel over (batch, head) with rayon.
//!
//! Each task owns one head and walks its queries in blocks of [`BLOCK`]
//! rows: the block's scores `q·kᵀ` (a `gemm` into a `BLOCK × S` scratch
//! tile), then per row the scale, ALiBi, mask, max, `exp` and sum in cache,
//! the log-sum-exp, dropout on the probabilities, and the block's output
//! `P·v` (another `gemm`). No `[S, S]` matrix is ever whole, let alone
//! `[B, H, S, S]`: a thread holds one `BLOCK × S` tile (two in the
//! backward).
//!
//! The backward recomputes each block's probabilities, then
//! `dv += drop(P)ᵀ·dout`, `dP = drop(dout·vᵀ)`, `D_i = Σ_j P·dP`,
//! `dS = P·(dP − D)·scale`, `dq = dS·k`, `dk += dSᵀ·q`. A block holds
//! whole key rows, so it renormalises each row itself (max, `exp`, sum, as
//! the forward did) rather than taking `P = exp(s − lse)` from the stored
//! f32 log-sum-exp, and sums the row term `D_i` from the tile rather than
//! as FlashAttention-2's `Σ_d dout·out`: an f32 `lse` of a few units is off
//! by ~1e-7 of itself, which scales a whole row of `P`, and a 16-bit `out`
//! puts its rounding into `dP − D`, a difference of close terms. Both cost
//! `O(S)` per row against the `O(S·D)` of the products. So the host reads
//! neither of the forward's outputs; a GPU kernel tiling the keys needs them.
//!
//! Semantics are the IR's ([`zeroplan_ir::Op::FlashAttention`]): dropout
//! draws element `((b·H + h)·S + i)·S + j` of the `[B, H, S, S]`
//! probabilities exactly as the interpreter's dropout does
//! ([`dropout_keeps`]); a row whose every key is masked gives `out = 0`,
//! `lse = −∞` and zero gradients.

use gemm::Parallelism;
use rayon::prelude::*;
use zeroplan_ir::interp::random::dropout_keeps;

use zeroplan_exec::Attention;

use super::rowmath;

/// Query rows per block: a `64 × S` f32 tile is 32 KiB at S = 128 and
/// 128 KiB at S = 512, within a core's L2.
pub const BLOCK: usize = 64;

/// The operands of one fused attention: `q, k, v` (`[B, H, S, D]`, f32)
/// and `mask[B, S]`; or, inside a task, one head's `[S, D]` and its batch's
/// `[S]` mask.
#[derive(Clone, Copy, Debug)]
pub struct Operands<'a> {
    /// The queries.
    pub q: &'a [f32],
    /// The keys.
    pub k: &'a [f32],
    /// The values.
    pub v: &'a [f32],
    /// The padding mask per key: 0 where the key is padding, which no
    /// query attends to.
    pub mask: &'a [i64],
}

/// The run's randomness: the seed and the dropout offset of this pass.
#[derive(Clone, Copy, Debug)]
pub struct Draw {
    /// The run's seed, dropout's key.
    pub seed: u64,
    /// Dropout's counter word for this pass, so each micro-batch draws its
    /// own masks and a recomputed forward redraws the same.
    pub offset: u64,
}

/// The host's FlashAttention over one [`Attention`]'s shape and parameters.
pub struct Routine<'a>(pub &'a Attention);

impl std::ops::Deref for Routine<'_> {
    type Target = Attention;

    fn deref(&self) -> &Attention {
        self.0
    }
}

impl Routine<'_> {
    /// Element counts of `[B, H, S, D]` and `[B, H, S]`.
    fn sizes(&self) -> (usize, usize) {
        let [b, h, s, d] = self.dims;
        (b * h * s * d, b * h * s)
    }

    /// Head `bh = b·H + h`'s operands.
    fn head<'a>(&self, x: Operands<'a>, bh: usize) -> Operands<'a> {
        let [_, heads, s, d] = self.dims;
        let at = bh * s * d;
        let [q, k, v] = [x.q, x.k, x.v].map(|t| &t[at..][..s * d]);
        Operands { q, k, v, mask: &x.mask[(bh / heads) * s..][..s] }
    }

    /// The block's scores of head `bh` (its operands `x`), rows
    /// `i0..i0 + rows`, into `tile` (`rows × S`): `scale·q·kᵀ`, minus
    /// ALiBi's penalty, −∞ on masked keys.
    fn scores(&self, bh: usize, x: Operands, i0: usize, rows: usize, tile: &mut [f32]) {
        let [_, heads, s, d] = self.dims;
        // k is S × D row-major: kᵀ (D × S) has row stride 1, column stride D;
        // the scale is the product's factor.
        gemm_into(rows, s, d, tile, false, self.scale, &x.q[i0 * d..], (d, 1), x.k, (1, d));
        for (r, row) in tile.chunks_mut(s).take(rows).enumerate() {
            if let Some(slopes) = &self.slopes {
                let (i, slope) = (i0 + r, slopes[bh % heads]);
                for (j, score) in row.iter_mut().enumerate() {
                    *score -= slope * (i.abs_diff(j) as i32) as f32;
                }
            }
            for (score, &m) in row.iter_mut().zip(x.mask) {
                *score = if m == 0 { f32::NEG_INFINITY } else { *score };
            }
        }
    }

    /// Dropout's factor for each probability of the block (`1/(1−p)` kept,
    /// 0 dropped), or `None` without dropout.
    fn keep(&self, bh: usize, i0: usize, rows: usize, draw: Draw, factors: &mut Vec<f32>) -> bool {
        if self.dropout <= 0.0 {
            return false;
        }
        let s = self.dims[2];
        let kept = (1.0 / (1.0 - self.dropout)) as f32;
        factors.clear();
        for i in i0..i0 + rows {
            let base = ((bh * s + i) * s) as u64;
            factors.extend((0..s as u64).map(|j| {
                if dropout_keeps(draw.seed, self.stream, draw.offset, base + j, self.dropout) { kept } else { 0.0 }
            }));
        }
        true
    }

    /// `(out, lse)` of the operands `x`.
    pub fn forward(&self, x: Operands, draw: Draw, out: &mut [f32], lse: &mut [f32]) {
        let [b, _, s, d] = self.dims;
        let (n, rows_total) = self.sizes();
        assert!([x.q, x.k, x.v].iter().all(|t| t.len() == n) && x.mask.len() == b * s);
        assert!(out.len() == n && lse.len() == rows_total);
        if n == 0 {
            lse.fill(f32::NEG_INFINITY);
            return;
        }
        out.par_chunks_mut(s * d).zip(lse.par_chunks_mut(s)).enumerate().for_each(|(bh, (out, lse))| {
            let x = self.head(x, bh);
            let mut tile = vec![0.0f32; BLOCK.min(s) * s];
            let mut factors = Vec::new();
            for i0 in (0..s).step_by(BLOCK) {
                let rows = BLOCK.min(s - i0);
                self.scores(bh, x, i0, rows, &mut tile);
                let dropped = self.keep(bh, i0, rows, draw, &mut factors);
                for (r, row) in tile.chunks_mut(s).take(rows).enumerate() {
                    lse[i0 + r] = softmax_in_place(row);
                    if dropped {
                        for (p, f) in row.iter_mut().zip(&factors[r * s..][..s]) {
                            *p *= f;
                        }
                    }
                }
                // out rows = P (rows × S) · v (S × D).
                gemm_into(rows, d, s, &mut out[i0 * d..][..rows * d], false, 1.0, &tile, (s, 1), x.v, (d, 1));
            }
        });
    }

    /// `(dq, dk, dv)` from the forward's operands and `dout` (the forward's
    /// outputs are not needed: see the module docs).
    pub fn backward(&self, x: Operands, dout: &[f32], draw: Draw, grads: [&mut [f32]; 3]) {
        let [b, _, s, d] = self.dims;
        let n = self.sizes().0;
        let [dq, dk, dv] = grads;
        assert!([x.q, x.k, x.v, dout].iter().all(|t| t.len() == n) && x.mask.len() == b * s);
        assert!(dq.len() == n && dk.len() == n && dv.len() == n);
        if n == 0 {
            return;
        }
        let chunks = dq.par_chunks_mut(s * d).zip(dk.par_chunks_mut(s * d)).zip(dv.par_chunks_mut(s * d));
        chunks.enumerate().for_each(|(bh, ((dq, dk), dv))| {
            let (x, dout) = (self.head(x, bh), &dout[bh * s * d..][..s * d]);
            let mut probs = vec![0.0f32; BLOCK.min(s) * s];
            let mut dprobs = vec![0.0f32; BLOCK.min(s) * s];
            let mut factors = Vec::new();
            dk.fill(0.0);
            dv.fill(0.0);
            for i0 in (0..s).step_by(BLOCK) {
                let rows = BLOCK.min(s - i0);
                self.scores(bh, x, i0, rows, &mut probs);
                for row in probs.chunks_mut(s).take(rows) {
                    softmax_in_place(row);
                }
                let dropped = self.keep(bh, i0, rows, draw, &mut factors);
                let block_dout = &dout[i0 * d..][..rows * d];
                // dv += drop(P)ᵀ · dout; drop(P) is built in `dprobs`, free until dP.
                let dropped_probs: &[f32] = if dropped {
                    for (x, (p, f)) in dprobs.iter_mut().zip(probs.iter().zip(&factors)) {
                        *x = p * f;
                    }
                    &dprobs
                } else {
                    &probs
                };
                gemm_into(s, d, rows, dv, true, 1.0, dropped_probs, (1, s), block_dout, (d, 1));
                // dP = drop(dout · vᵀ).
                gemm_into(rows, s, d, &mut dprobs, false, 1.0, block_dout, (d, 1), x.v, (1, d));
                for r in 0..rows {
                    let (p, dp) = (&probs[r * s..][..s], &mut dprobs[r * s..][..s]);
                    if dropped {
                        for (g, f) in dp.iter_mut().zip(&factors[r * s..][..s]) {
                            *g *= f;
                        }
                    }
                    // The row term Σ_j P·dP, from the whole row this tile holds.
                    let row_term = rowmath::dot(p, dp) as f32;
                    for (g, &pj) in dp.iter_mut().zip(p) {
                        // dS (unscaled: the scale is the next products' factor);
                        // masked keys have P = 0 and so dS = 0.
                        *g = pj * (*g - row_term);
                    }
                }
                // dq = scale · dS · k; dk += scale · dSᵀ · q.
                gemm_into(rows, d, s, &mut dq[i0 * d..][..rows * d], false, self.scale, &dprobs, (s, 1), x.k, (d, 1));
                gemm_into(s, d, rows, dk, true, self.scale, &dprobs, (1, s), &x.q[i0 * d..][..rows * d], (d, 1));
            }
        });
    }
}

/// Softmax of one row in place; returns its log-sum-exp. An all −∞ row
/// (every key masked) becomes zeros with log-sum-exp −∞; a NaN spreads.
/// On x86-64 with AVX2 and FMA the same code is compiled for them (8 lanes
/// instead of SSE2's 4; Rust never contracts `a·b + c` into an FMA, so the
/// bits are the same either way).
fn softmax_in_place(row: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { softmax_avx2(row) };
    }
    softmax_lanes(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_avx2(row: &mut [f32]) -> f32 {
    softmax_lanes(row)
}

#[inline(always)]
fn softmax_lanes(row: &mut [f32]) -> f32 {
    let max = rowmath::max(row);
    if max == f32::NEG_INFINITY && !row.iter().any(|x| x.is_nan()) {
        row.fill(0.0);
        return f32::NEG_INFINITY;
    }
    for x in row.iter_mut() {
        *x = rowmath::exp(*x - max);
    }
    // The sum in f64: S terms, at no cost next to the row's products.
    let sum = rowmath::sum(row);
    let inv = (1.0 / sum) as f32;
    for x in row.iter_mut() {
        *x *= inv;
    }
    (f64::from(max) + sum.ln()) as f32
}

/// `c (m × n, row-major) = [c +] factor · a · b` on this thread, where `a` is
/// `m × k` and `b` is `k × n`, each read with its (row, column) strides.
#[allow(clippy::too_many_arguments)]
fn gemm_into(
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    accumulate: bool,
    factor: f32,
    a: &[f32],
    (a_rs, a_cs): (usize, usize),
    b: &[f32],
    (b_rs, b_cs): (usize, usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rs: usize, cs: usize, rows: usize, cols: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(c.len() >= m * n, "gemm output of {} for {m} × {n}", c.len());
    if k == 0 {
        if !accumulate {
            c[..m * n].fill(0.0);
        }
        return;
    }
    assert!(a.len() > last(a_rs, a_cs, m, k) && b.len() > last(b_rs, b_cs, k, n), "gemm operand out of bounds");
    // SAFETY: the asserts keep every index the strides reach inside the
    // slices; `c` is a distinct, exclusively borrowed slice.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            if accumulate { 1.0 } else { 0.0 },
            factor,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeroplan_ir::interp::flash_attention::{self as reference, AttentionDropout, AttentionProblem};

    /// Values in [−2, 2) from an LCG, per salt.
    fn random(n: usize, salt: u64) -> Vec<f32> {
        let mut x = 0x2545_F491_4F6C_DD1Du64 ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    fn wide(v: &[f32]) -> Vec<f64> {
        v.iter().map(|&x| f64::from(x)).collect()
    }

    /// Largest |a − b| over the largest |b|.
    fn relative(a: &[f32], b: &[f64]) -> f64 {
        let norm = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
        a.iter().zip(b).map(|(&x, y)| (f64::from(x) - y).abs()).fold(0.0, f64::max) / norm
    }

    /// The host routines against the interpreter's reference (plain softmax
    /// over materialised f64 scores) on random inputs: two query blocks, the
    /// second partial (S = 70); padded keys; a batch with every key masked;
    /// ALiBi over 3 heads as tensor rank 1 of 2; dropout. f32 within 1e-5
    /// relative of the f64 reference.
    #[test]
    fn forward_and_backward_match_the_reference() {
        let dims = [3, 3, 70, 8];
        let [b, h, s, d] = dims;
        let n = b * h * s * d;
        let mut mask = vec![1i64; b * s];
        mask[s - 5..s].fill(0); // batch 0 pads its last five keys
        mask[2 * s..3 * s].fill(0); // batch 2 masks every key
        mask[s + 3] = 0; // batch 1 a key in the middle
        let (q, k, v, dout) = (random(n, 1), random(n, 2), random(n, 3), random(n, 4));
        let slopes: Vec<f64> = zeroplan_ir::interp::alibi_slopes_of_rank(h, 1, 2);
        let draw = Draw { seed: 17, offset: 5 };
        for (alibi, p) in [(false, 0.0), (true, 0.0), (true, 0.2)] {
            let attention = Attention {
                dims,
                scale: 0.35,
                slopes: alibi.then(|| slopes.iter().map(|&m| m as f32).collect()),
                dropout: p,
                stream: 9,
            };
            let problem = AttentionProblem {
                dims,
                scale: f64::from(0.35f32),
                slopes: alibi.then_some(slopes.as_slice()),
                dropout: Some(AttentionDropout { p, stream: 9, seed: 17, offset: 5 }),
            };
            let (mut out, mut lse) = (vec![f32::NAN; n], vec![f32::NAN; b * h * s]);
            let x = Operands { q: &q, k: &k, v: &v, mask: &mask };
            Routine(&attention).forward(x, draw, &mut out, &mut lse);
            let (want_out, want_lse) = reference::forward(&problem, &wide(&q), &wide(&k), &wide(&v), &mask);
            let what = format!("alibi {alibi}, dropout {p}");
            assert!(relative(&out, &want_out) < 1e-5, "{what}: out {:e}", relative(&out, &want_out));
            let masked_rows = 2 * h * s..;
            assert!(lse[masked_rows.clone()].iter().all(|&x| x == f32::NEG_INFINITY), "{what}");
            assert!(out[2 * h * s * d..].iter().all(|&x| x == 0.0), "{what}");
            let finite = ..2 * h * s;
            assert!(relative(&lse[finite], &want_lse[finite]) < 1e-6, "{what}: lse");

            let mut grads = [vec![f32::NAN; n], vec![f32::NAN; n], vec![f32::NAN; n]];
            let [dq, dk, dv] = &mut grads;
            Routine(&attention).backward(x, &dout, draw, [dq, dk, dv]);
            let want = reference::backward(&problem, &wide(&q), &wide(&k), &wide(&v), &mask, &wide(&dout));
            for (name, got, want) in [("dq", dq, want.0), ("dk", dk, want.1), ("dv", dv, want.2)] {
                let err = relative(got, &want);
                assert!(err < 1e-5, "{what}: {name} relative error {err:e}");
                assert!(got[2 * h * s * d..].iter().all(|&x| x == 0.0), "{what}: {name} of the masked batch");
            }
        }
    }

    #[test]
    fn a_changed_scale_is_caught() {
        // The comparison above can fail: a scale off by 1% is far outside it.
        let dims = [1, 2, 9, 4];
        let n = 72;
        let (q, k, v) = (random(n, 5), random(n, 6), random(n, 7));
        let mask = vec![1i64; 9];
        let attention = Attention { dims, scale: 0.5 * 1.01, slopes: None, dropout: 0.0, stream: 0 };
        let problem = AttentionProblem { dims, scale: 0.5, slopes: None, dropout: None };
        let (mut out, mut lse) = (vec![0.0; n], vec![0.0; 18]);
        let x = Operands { q: &q, k: &k, v: &v, mask: &mask };
        Routine(&attention).forward(x, Draw { seed: 0, offset: 0 }, &mut out, &mut lse);
        let (want, _) = reference::forward(&problem, &wide(&q), &wide(&k), &wide(&v), &mask);
        assert!(relative(&out, &want) > 1e-4);
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// `cargo test --release -p zeroplan-runtime --lib attention_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn attention_speed() {
        let dims = [32, 12, 128, 32];
        let n: usize = dims.iter().product();
        let q: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let mask = vec![1i64; 32 * 128];
        let a = Attention { dims, scale: 0.17, slopes: None, dropout: 0.0, stream: 0 };
        let x = Operands { q: &q, k: &q, v: &q, mask: &mask };
        let (mut out, mut lse) = (vec![0.0; n], vec![0.0; n / 32]);
        let draw = Draw { seed: 0, offset: 0 };
        let mut g = [vec![0.0; n], vec![0.0; n], vec![0.0; n]];
        for _ in 0..3 {
            let t = std::time::Instant::now();
            Routine(&a).forward(x, draw, &mut out, &mut lse);
            let f = t.elapsed();
            let [dq, dk, dv] = &mut g;
            let t = std::time::Instant::now();
            Routine(&a).backward(x, &out, draw, [dq, dk, dv]);
            eprintln!("forward {:?} backward {:?}", f, t.elapsed());
        }
    }
}
