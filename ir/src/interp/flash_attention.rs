//! `flash_attention` and `flash_attention_grad`, the reference forms.
//!
//! These are deliberately *not* the flash algorithm: per (batch, head) they
//! materialise the `[S, S]` scores and run the unfused chain's own steps in
//! its own order — `scale·q·kᵀ` summed in increasing `d`, minus ALiBi's
//! `m_h·|i − j|`, −∞ on masked keys, [`softmax_row`], dropout on the flat
//! `[B, H, S, S]` index, the product with `v` in increasing `j` — so in
//! `Rounding::F64` the fused op is the unfused graph bit for bit. The
//! backward recomputes everything from `q, k, v` (the `out` and `lse`
//! operands are what a kernel reads instead; here they are only checked for
//! shape) and applies the unfused chain's adjoints: the product's, dropout's
//! (the same mask), `softmax_grad`'s `y·(dy − Σ dy·y)`, the mask's (zero on
//! masked keys), the scale's.

use super::attention::alibi_slopes_of_rank;
use super::nd;
use super::random::dropout_keeps;
use super::rows::softmax_row;
use crate::tensor::Tensor;

/// Dropout on the probabilities: drop probability, stream, seed and offset.
#[derive(Clone, Copy, Debug)]
pub struct AttentionDropout {
    pub p: f64,
    pub stream: u32,
    pub seed: u64,
    pub offset: u64,
}

/// What one fused attention computes, besides its tensors: the shape
/// `[B, H, S, D]`, the score scale, this rank's ALiBi slopes (one per head)
/// when biased, and dropout when `p > 0`.
#[derive(Clone, Debug)]
pub struct AttentionProblem<'a> {
    pub dims: [usize; 4],
    pub scale: f64,
    pub slopes: Option<&'a [f64]>,
    pub dropout: Option<AttentionDropout>,
}

impl AttentionProblem<'_> {
    /// The scores of head `(b, h)`: `[S, S]`, scaled, biased and masked.
    fn scores(&self, b: usize, h: usize, q: &[f64], k: &[f64], mask: &[i64]) -> Vec<f64> {
        let [_, _, s, d] = self.dims;
        let mut out = vec![0.0; s * s];
        for i in 0..s {
            for j in 0..s {
                let mut dot = 0.0;
                for e in 0..d {
                    dot += q[i * d + e] * k[j * d + e];
                }
                let mut x = dot * self.scale;
                if let Some(slopes) = self.slopes {
                    x -= slopes[h] * i.abs_diff(j) as f64;
                }
                if mask[b * s + j] == 0 {
                    x = f64::NEG_INFINITY;
                }
                out[i * s + j] = x;
            }
        }
        out
    }

    /// Dropout of the value `x` at probability `(b, h, i, j)`, as
    /// [`super::random`]'s dropout computes it: `x·1/(1−p)` kept, 0 dropped;
    /// `x` itself without dropout.
    fn drop(&self, b: usize, h: usize, i: usize, j: usize, x: f64) -> f64 {
        let [_, heads, s, _] = self.dims;
        match self.dropout {
            Some(dr) if dr.p > 0.0 => {
                let index = (((b * heads + h) * s + i) * s + j) as u64;
                if dropout_keeps(dr.seed, dr.stream, dr.offset, index, dr.p) { x * (1.0 / (1.0 - dr.p)) } else { 0.0 }
            }
            _ => x,
        }
    }

    /// The probabilities of head `(b, h)`, `[S, S]`, before dropout.
    fn probabilities(&self, scores: &[f64]) -> Vec<f64> {
        let s = self.dims[2];
        let mut p = Vec::with_capacity(s * s);
        for row in scores.chunks(s.max(1)) {
            softmax_row(row, &mut p);
        }
        p
    }
}

/// `log Σ exp(row)`: −∞ for an all −∞ row (every key masked), NaN for a row holding a NaN.
fn log_sum_exp(row: &[f64]) -> f64 {
    if row.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln()
}

/// `(out[B,H,S,D], lse[B,H,S])` of fused attention over flat row-major slices.
pub fn forward(pb: &AttentionProblem, q: &[f64], k: &[f64], v: &[f64], mask: &[i64]) -> (Vec<f64>, Vec<f64>) {
    let [batch, heads, s, d] = pb.dims;
    let mut out = vec![0.0; batch * heads * s * d];
    let mut lse = vec![0.0; batch * heads * s];
    for b in 0..batch {
        for h in 0..heads {
            let at = (b * heads + h) * s * d;
            let (qh, kh, vh) = (&q[at..][..s * d], &k[at..][..s * d], &v[at..][..s * d]);
            let scores = pb.scores(b, h, qh, kh, mask);
            let probs = pb.probabilities(&scores);
            let oh = &mut out[at..][..s * d];
            for i in 0..s {
                lse[(b * heads + h) * s + i] = log_sum_exp(&scores[i * s..][..s]);
                for j in 0..s {
                    let pij = pb.drop(b, h, i, j, probs[i * s + j]);
                    for e in 0..d {
                        oh[i * d + e] += pij * vh[j * d + e];
                    }
                }
            }
        }
    }
    (out, lse)
}

/// `(dq, dk, dv)` of fused attention for the output gradient `dout`,
/// recomputed from `q, k, v` by the unfused chain's adjoints.
pub fn backward(
    pb: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    mask: &[i64],
    dout: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let [batch, heads, s, d] = pb.dims;
    let n = batch * heads * s * d;
    let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for b in 0..batch {
        for h in 0..heads {
            let at = (b * heads + h) * s * d;
            let (qh, kh, vh, doh) = (&q[at..][..s * d], &k[at..][..s * d], &v[at..][..s * d], &dout[at..][..s * d]);
            let probs = pb.probabilities(&pb.scores(b, h, qh, kh, mask));
            // The dropped-out probabilities, and the scores' gradient.
            let mut dropped = vec![0.0; s * s];
            let mut ds = vec![0.0; s * s];
            for i in 0..s {
                let mut dp = vec![0.0; s];
                for (j, g) in dp.iter_mut().enumerate() {
                    dropped[i * s + j] = pb.drop(b, h, i, j, probs[i * s + j]);
                    let mut dot = 0.0;
                    for e in 0..d {
                        dot += doh[i * d + e] * vh[j * d + e];
                    }
                    // Dropout's adjoint is dropout with the same mask.
                    *g = pb.drop(b, h, i, j, dot);
                }
                let row = &probs[i * s..][..s];
                let weighted: f64 = row.iter().zip(&dp).map(|(y, g)| y * g).sum();
                for j in 0..s {
                    let grad = row[j] * (dp[j] - weighted);
                    ds[i * s + j] = if mask[b * s + j] == 0 { 0.0 } else { grad * pb.scale };
                }
            }
            let (dqh, dkh, dvh) = (&mut dq[at..][..s * d], &mut dk[at..][..s * d], &mut dv[at..][..s * d]);
            // dq = ds·k; dk = dsᵀ·q; dv = dropped(P)ᵀ·dout, each summed in increasing j or i.
            for i in 0..s {
                for j in 0..s {
                    for e in 0..d {
                        dqh[i * d + e] += ds[i * s + j] * kh[j * d + e];
                    }
                }
            }
            for j in 0..s {
                for i in 0..s {
                    let (g, pij) = (ds[i * s + j], dropped[i * s + j]);
                    for e in 0..d {
                        dkh[j * d + e] += g * qh[i * d + e];
                        dvh[j * d + e] += pij * doh[i * d + e];
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}

/// `[B, H, S, D]` of `q`, checked against `k`, `v` and `mask[B, S]`.
fn dims_of(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<[usize; 4], String> {
    let dims: [usize; 4] =
        q.shape().try_into().map_err(|_| format!("q must be [batch, heads, seq, head_dim], got {:?}", q.shape()))?;
    nd::same_shape(q, k, "q and k")?;
    nd::same_shape(q, v, "q and v")?;
    if mask.shape() != [dims[0], dims[2]] {
        return Err(format!("the mask must be [{}, {}] for q {:?}, got {:?}", dims[0], dims[2], dims, mask.shape()));
    }
    Ok(dims)
}

/// The interpreter's `flash_attention` on tensor rank 0 (the dispatcher
/// refuses ALiBi over several tensor ranks): `[out, lse]`.
pub(super) fn flash_attention(
    x: &[&Tensor],
    scale: f64,
    alibi_ranks: Option<u64>,
    dropout: AttentionDropout,
) -> Result<Vec<Tensor>, String> {
    let (q, k, v, mask) = (x[0], x[1], x[2], x[3]);
    let dims = dims_of(q, k, v, mask)?;
    let slopes = alibi_ranks.map(|ranks| alibi_slopes_of_rank(dims[1], 0, ranks));
    let pb = AttentionProblem { dims, scale, slopes: slopes.as_deref(), dropout: Some(dropout) };
    let (out, lse) =
        forward(&pb, nd::floats(q, "q")?, nd::floats(k, "k")?, nd::floats(v, "v")?, nd::ints(mask, "the mask")?);
    Ok(vec![
        nd::float(q.shape().to_vec(), q.dtype(), out),
        nd::float(dims[..3].to_vec(), crate::dtype::DType::F32, lse),
    ])
}

/// The interpreter's `flash_attention_grad`: `[dq, dk, dv]`.
pub(super) fn flash_attention_grad(
    x: &[&Tensor],
    scale: f64,
    alibi_ranks: Option<u64>,
    dropout: AttentionDropout,
) -> Result<Vec<Tensor>, String> {
    let (q, k, v, mask, out, lse, dout) = (x[0], x[1], x[2], x[3], x[4], x[5], x[6]);
    let dims = dims_of(q, k, v, mask)?;
    nd::same_shape(q, out, "q and the forward output")?;
    nd::same_shape(q, dout, "q and the output gradient")?;
    if lse.shape() != &dims[..3] {
        return Err(format!("lse must be {:?}, got {:?}", &dims[..3], lse.shape()));
    }
    let slopes = alibi_ranks.map(|ranks| alibi_slopes_of_rank(dims[1], 0, ranks));
    let pb = AttentionProblem { dims, scale, slopes: slopes.as_deref(), dropout: Some(dropout) };
    let (dq, dk, dv) = backward(
        &pb,
        nd::floats(q, "q")?,
        nd::floats(k, "k")?,
        nd::floats(v, "v")?,
        nd::ints(mask, "the mask")?,
        nd::floats(dout, "the output gradient")?,
    );
    let t = |values| nd::float(q.shape().to_vec(), dout.dtype(), values);
    Ok(vec![t(dq), t(dk), t(dv)])
}
