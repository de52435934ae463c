//! Fused attention's test cases and its independent `f64` reference: plain
//! softmax attention over materialised `[S, S]` scores per head, and its
//! textbook adjoint (the softmax's `P·(dP − Σ_k P·dP)`, not the kernels'
//! FlashAttention-2 row term `dout·out`), for the host emulation and GPU tests.

use zeroplan_backend_cuda::attention::{AttentionArgs, AttentionKernel, AttentionShape, FlashAttention};
use zeroplan_ir::DType;
use zeroplan_ir::interp::alibi_slopes_of_rank;
use zeroplan_ir::interp::random::dropout_keeps;

use super::Rng;

/// One attention problem: the op, its specialisation and the run's values.
#[derive(Clone, Debug)]
pub struct AttentionCase {
    pub name: String,
    pub op: FlashAttention,
    pub kernel: AttentionKernel,
    pub batch: usize,
    pub heads: usize,
    pub seq: usize,
    /// This tensor rank (of `op.alibi_ranks`).
    pub rank: u64,
    pub seed: u64,
    pub offset: u64,
}

/// A case's operands, exactly representable in the case's dtype.
#[derive(Clone, Debug)]
pub struct AttentionData {
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub dout: Vec<f64>,
    /// `[B, S]`: 0 masks the key; 1 and 2 keep it.
    pub mask: Vec<i64>,
}

/// What the op computes: `out, dq, dk, dv` `[B, H, S, D]`, `lse` `[B, H, S]`.
#[derive(Clone, Debug, Default)]
pub struct AttentionOutputs {
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

impl AttentionOutputs {
    pub fn named(&self) -> [(&'static str, &Vec<f64>); 5] {
        [("out", &self.out), ("lse", &self.lse), ("dq", &self.dq), ("dk", &self.dk), ("dv", &self.dv)]
    }
}

/// `x` rounded to `dtype`'s storage, to nearest even (the IR's rounding;
/// `half`'s `from_f64` drops the low mantissa bits first, so a value just
/// past a halfway point can land on the wrong neighbour).
pub fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::BF16 => zeroplan_ir::to_bf16(x).to_f64(),
        DType::F16 => zeroplan_ir::to_f16(x).to_f64(),
        _ => x as f32 as f64,
    }
}

impl AttentionCase {
    /// A case of `kernel`'s specialisation: the scale `1/√D`, ALiBi over
    /// `alibi_ranks` when the kernel has it, dropout 0.2 on stream 3 when it has it.
    pub fn new(
        name: &str,
        kernel: AttentionKernel,
        [batch, heads, seq]: [usize; 3],
        alibi_ranks: u64,
        rank: u64,
    ) -> AttentionCase {
        let op = FlashAttention {
            scale: 1.0 / (kernel.head_dim as f64).sqrt(),
            alibi_ranks: kernel.alibi.then_some(alibi_ranks),
            dropout: if kernel.dropout { 0.2 } else { 0.0 },
            stream: 3,
        };
        AttentionCase { name: name.into(), op, kernel, batch, heads, seq, rank, seed: 0x1234_5678_9ABC_DEF0, offset: 5 }
    }

    pub fn shape(&self) -> AttentionShape {
        AttentionShape { batch: self.batch, heads: self.heads, seq: self.seq }
    }

    pub fn elements(&self) -> usize {
        self.batch * self.heads * self.seq * self.kernel.head_dim
    }

    pub fn args(&self) -> AttentionArgs {
        self.op.args(&self.kernel, self.shape(), self.rank).unwrap()
    }

    /// Random operands: q, k, v in [−2, 2), dout in [−1, 1); about a
    /// quarter of the keys masked, and every key of the last batch entry
    /// (rows with nothing to attend to).
    pub fn data(&self, seed: u64) -> AttentionData {
        let mut rng = Rng::new(seed);
        let n = self.elements();
        let dtype = self.kernel.dtype;
        let mut uniform = |lo: f64, hi: f64| (0..n).map(|_| round_to(dtype, rng.uniform(lo, hi))).collect::<Vec<_>>();
        let (q, k, v, dout) = (uniform(-2.0, 2.0), uniform(-2.0, 2.0), uniform(-2.0, 2.0), uniform(-1.0, 1.0));
        let mut mask = Vec::with_capacity(self.batch * self.seq);
        for b in 0..self.batch {
            for _ in 0..self.seq {
                let r = rng.next() % 8;
                mask.push(if (b + 1 == self.batch && self.batch > 1) || r < 2 {
                    0
                } else if r == 7 {
                    2
                } else {
                    1
                });
            }
        }
        AttentionData { q, k, v, dout, mask }
    }

    /// The mask as the kernel's integer storage.
    pub fn mask_bytes(&self, mask: &[i64]) -> Vec<u8> {
        match self.kernel.mask {
            DType::I32 => mask.iter().flat_map(|&m| (m as i32).to_le_bytes()).collect(),
            _ => mask.iter().flat_map(|&m| m.to_le_bytes()).collect(),
        }
    }
}

/// The reference answer in `f64`.
pub fn reference(case: &AttentionCase, x: &AttentionData) -> AttentionOutputs {
    let (bn, hn, s, d) = (case.batch, case.heads, case.seq, case.kernel.head_dim);
    let slopes = case.op.alibi_ranks.map(|ranks| alibi_slopes_of_rank(hn, case.rank, ranks));
    let p_drop = case.op.dropout;
    let mut o = AttentionOutputs {
        out: vec![0.0; bn * hn * s * d],
        lse: vec![0.0; bn * hn * s],
        dq: vec![0.0; bn * hn * s * d],
        dk: vec![0.0; bn * hn * s * d],
        dv: vec![0.0; bn * hn * s * d],
    };
    for b in 0..bn {
        for h in 0..hn {
            let bh = b * hn + h;
            let row = |t: &[f64], i: usize| t[(bh * s + i) * d..][..d].to_vec();
            let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
            // Scores, probabilities, dropout factors: [S, S].
            let mut p = vec![0.0; s * s];
            let mut z = vec![1.0; s * s];
            for i in 0..s {
                let scores: Vec<f64> = (0..s)
                    .map(|j| {
                        if x.mask[b * s + j] == 0 {
                            return f64::NEG_INFINITY;
                        }
                        let bias = slopes.as_ref().map_or(0.0, |m| m[h] * i.abs_diff(j) as f64);
                        dot(&row(&x.q, i), &row(&x.k, j)) * case.op.scale - bias
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    o.lse[bh * s + i] = f64::NEG_INFINITY;
                    continue;
                }
                let sum: f64 = scores.iter().map(|x| (x - max).exp()).sum();
                o.lse[bh * s + i] = max + sum.ln();
                for j in 0..s {
                    p[i * s + j] = (scores[j] - max).exp() / sum;
                    if p_drop > 0.0 {
                        let e = ((bh * s + i) * s + j) as u64;
                        let keep = dropout_keeps(case.seed, case.op.stream, case.offset, e, p_drop);
                        z[i * s + j] = if keep { 1.0 / (1.0 - p_drop) } else { 0.0 };
                    }
                }
            }
            for i in 0..s {
                let dout_i = row(&x.dout, i);
                // dP_ij = z_ij·(dout_i·v_j); dS_ij = P_ij·(dP_ij − Σ_k P_ik·dP_ik).
                let dp: Vec<f64> = (0..s).map(|j| z[i * s + j] * dot(&dout_i, &row(&x.v, j))).collect();
                let weighted: f64 = (0..s).map(|j| p[i * s + j] * dp[j]).sum();
                for j in 0..s {
                    let (pij, zij) = (p[i * s + j], z[i * s + j]);
                    let ds = pij * (dp[j] - weighted) * case.op.scale;
                    let (vj, kj, qi) = (row(&x.v, j), row(&x.k, j), row(&x.q, i));
                    for e in 0..d {
                        o.out[(bh * s + i) * d + e] += pij * zij * vj[e];
                        o.dq[(bh * s + i) * d + e] += ds * kj[e];
                        o.dk[(bh * s + j) * d + e] += ds * qi[e];
                        o.dv[(bh * s + j) * d + e] += pij * zij * dout_i[e];
                    }
                }
            }
        }
    }
    o
}
