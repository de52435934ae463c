//! Attention score ops: the padding mask and ALiBi's distance bias.

use super::nd;
use crate::tensor::Tensor;

/// `[B, H, Sq, Sk]` of attention scores, checked against `mask[B, Sk]` when given.
fn score_dims(scores: &Tensor, mask: Option<&Tensor>) -> Result<[usize; 4], String> {
    let dims: [usize; 4] = scores
        .shape()
        .try_into()
        .map_err(|_| format!("attention scores must be [batch, heads, query, key], got {:?}", scores.shape()))?;
    if let Some(mask) = mask
        && mask.shape() != [dims[0], dims[3]]
    {
        return Err(format!(
            "the mask must be [{}, {}] for scores {:?}, got {:?}",
            dims[0],
            dims[3],
            dims,
            mask.shape()
        ));
    }
    Ok(dims)
}

/// `scores` (or its gradient) with `fill` where `mask[b, j] == 0`.
fn masked(scores: &Tensor, mask: &Tensor, fill: f64) -> Result<Tensor, String> {
    let [b, h, sq, sk] = score_dims(scores, Some(mask))?;
    let (s, m) = (nd::floats(scores, "the scores")?, nd::ints(mask, "the mask")?);
    let mut out = s.to_vec();
    for (e, o) in out.iter_mut().enumerate() {
        let (j, batch) = (e % sk, e / (h * sq * sk));
        if m[batch * sk + j] == 0 {
            *o = fill;
        }
    }
    debug_assert_eq!(out.len(), b * h * sq * sk);
    Ok(nd::float(scores.shape().to_vec(), scores.dtype(), out))
}

/// Scores of keys `j` with `mask[b, j] == 0` become −∞; any nonzero mask
/// value keeps the key.
pub(super) fn attention_mask(scores: &Tensor, mask: &Tensor) -> Result<Tensor, String> {
    masked(scores, mask, f64::NEG_INFINITY)
}

/// `dy` with the masked keys' entries zeroed.
pub(super) fn attention_mask_grad(dy: &Tensor, mask: &Tensor) -> Result<Tensor, String> {
    masked(dy, mask, 0.0)
}

/// ALiBi's head slopes, as its reference code (`get_slopes`) and MosaicBERT
/// compute them: for a power of two `H`, `m_h = 2^(−8(h+1)/H)`; otherwise,
/// with `n = 2^⌊log2 H⌋`, the `n` slopes for `n` followed by the slopes for
/// `2n` at even indices (0, 2, 4, …) until there are `H`.
///
/// Each slope is evaluated in closed form, `2^(−8(i+1)/n)`, rather than as
/// the reference's running product `start·ratioⁱ`; both agree to within an
/// f64 rounding, far below f32's resolution.
pub fn alibi_slopes(heads: usize) -> Vec<f64> {
    let power_of_two = |n: usize| -> Vec<f64> { (0..n).map(|i| (-8.0 * (i + 1) as f64 / n as f64).exp2()).collect() };
    if heads == 0 {
        return Vec::new();
    }
    if heads.is_power_of_two() {
        return power_of_two(heads);
    }
    let n = 1usize << heads.ilog2();
    let mut slopes = power_of_two(n);
    slopes.extend(power_of_two(2 * n).into_iter().step_by(2).take(heads - n));
    slopes
}

/// The slopes of tensor rank `rank`'s `heads` heads of `ranks·heads`.
pub fn alibi_slopes_of_rank(heads: usize, rank: u64, ranks: u64) -> Vec<f64> {
    alibi_slopes(heads * ranks as usize).into_iter().skip(heads * rank as usize).take(heads).collect()
}

/// `scores[b,h,i,j] − m_h·|i − j|`: the symmetric ALiBi bias of
/// bidirectional encoders, on tensor rank `rank`'s heads of `ranks`.
pub(super) fn alibi_bias(scores: &Tensor, rank: u64, ranks: u64) -> Result<Tensor, String> {
    let [_, h, sq, sk] = score_dims(scores, None)?;
    let s = nd::floats(scores, "the scores")?;
    let slopes = alibi_slopes_of_rank(h, rank, ranks);
    let out = s
        .iter()
        .enumerate()
        .map(|(e, &x)| {
            let (j, i, head) = (e % sk, (e / sk) % sq, (e / (sk * sq)) % h);
            x - slopes[head] * i.abs_diff(j) as f64
        })
        .collect();
    Ok(nd::float(scores.shape().to_vec(), scores.dtype(), out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn slopes_for_8_and_12_heads() {
        // H = 8: 2^-1, 2^-2, …, 2^-8.
        let eight: Vec<f64> = (1..=8).map(|i| 1.0 / f64::from(1u32 << i)).collect();
        assert_eq!(alibi_slopes(8), eight);
        // H = 12: the 8 above, then slopes 0, 2, 4, 6 of H = 16 (2^-0.5·(i+1)):
        // 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
        let mut twelve = eight.clone();
        let r = std::f64::consts::FRAC_1_SQRT_2;
        twelve.extend([r, r / 2.0, r / 4.0, r / 8.0]);
        let got = alibi_slopes(12);
        assert_eq!(got.len(), 12);
        for (g, w) in got.iter().zip(&twelve) {
            assert!((g - w).abs() < 1e-16, "{got:?}");
        }
        assert_eq!(alibi_slopes(1), vec![1.0 / 256.0]);
        assert_eq!(alibi_slopes(2), vec![1.0 / 16.0, 1.0 / 256.0]);
    }

    #[test]
    fn bias_is_minus_slope_times_distance() {
        // B = 1, H = 2 (slopes 1/16, 1/256), Sq = Sk = 3, zero scores.
        let scores = nd::float(vec![1, 2, 3, 3], DType::F32, vec![0.0; 18]);
        let out = alibi_bias(&scores, 0, 1).unwrap();
        let d = [0.0, 1.0, 2.0, 1.0, 0.0, 1.0, 2.0, 1.0, 0.0];
        let want: Vec<f64> = d.iter().map(|x| -x / 16.0).chain(d.iter().map(|x| -x / 256.0)).collect();
        assert_eq!(out.floats().unwrap(), want.as_slice());
    }

    #[test]
    fn mask_sets_minus_infinity_and_its_gradient_zero() {
        // B = 2, H = 1, Sq = 1, Sk = 3; batch 0 masks key 2, batch 1 key 0.
        let scores = nd::float(vec![2, 1, 1, 3], DType::F32, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let mask = Tensor::int(vec![2, 3], DType::I64, vec![1, 1, 0, 0, 1, 2]).unwrap();
        let ninf = f64::NEG_INFINITY;
        assert_eq!(attention_mask(&scores, &mask).unwrap().floats().unwrap(), &[1.0, 2.0, ninf, ninf, 5.0, 6.0]);
        assert_eq!(attention_mask_grad(&scores, &mask).unwrap().floats().unwrap(), &[1.0, 2.0, 0.0, 0.0, 5.0, 6.0]);
        let wrong = Tensor::int(vec![2, 2], DType::I64, vec![1; 4]).unwrap();
        assert!(attention_mask(&scores, &wrong).is_err());
    }
}
