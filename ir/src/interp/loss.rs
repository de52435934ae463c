//! Losses and their gradients: `cross_entropy`, `mse`. Both are f32 scalars.
//!
//! With no counted row (every label `ignore_index`), cross-entropy is 0 and
//! its gradient 0, where PyTorch gives NaN: a fully padded micro-batch then
//! adds nothing to the accumulated gradient instead of poisoning it.
//! Likewise `mse` of zero rows is 0.

use super::nd;
use super::rows::softmax_row;
use crate::tensor::Tensor;

/// Each row's class among `c`: `None` where the label is `ignore_index`; a
/// label outside `[0, c)` is an error naming its row. Shared with the
/// compiled runtimes, so every backend refuses the same labels.
pub fn label_classes(labels: &[i64], c: usize, ignore_index: i64) -> Result<Vec<Option<usize>>, String> {
    labels
        .iter()
        .enumerate()
        .map(|(row, &label)| {
            if label == ignore_index {
                return Ok(None);
            }
            usize::try_from(label).ok().filter(|&k| k < c).map(Some).ok_or_else(|| {
                format!("label {label} of row {row} is outside [0, {c}) and is not ignore_index {ignore_index}")
            })
        })
        .collect()
}

/// `(rows, classes)` of `[N, C]` logits and the labels checked against them:
/// `Some(class)` for a counted row, `None` for an ignored one.
fn counted_labels(logits: &Tensor, labels: &Tensor, ignore_index: i64) -> Result<(usize, Vec<Option<usize>>), String> {
    let (n, c) = match logits.shape() {
        [n, c] => (*n, *c),
        shape => return Err(format!("logits must be [rows, classes], got {shape:?}")),
    };
    let l = nd::ints(labels, "the labels")?;
    if labels.shape() != [n] {
        return Err(format!("labels must be [{n}] for logits {:?}, got {:?}", logits.shape(), labels.shape()));
    }
    let classes = label_classes(l, c, ignore_index)?;
    Ok((c, classes))
}

/// The mean over counted rows of `logsumexp(row) − row[label]`; 0 with no counted row.
pub(super) fn cross_entropy(logits: &Tensor, labels: &Tensor, ignore_index: i64) -> Result<Tensor, String> {
    let (c, classes) = counted_labels(logits, labels, ignore_index)?;
    let v = nd::floats(logits, "the logits")?;
    let (mut total, mut count) = (0.0, 0usize);
    for (row, class) in v.chunks(c.max(1)).zip(&classes) {
        let Some(class) = class else { continue };
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        total += lse - row[*class];
        count += 1;
    }
    Ok(nd::scalar(if count == 0 { 0.0 } else { total / count as f64 }))
}

/// `dloss·(softmax(row) − onehot(label))/count` on counted rows, 0 elsewhere.
pub(super) fn cross_entropy_grad(
    logits: &Tensor,
    labels: &Tensor,
    dloss: &Tensor,
    ignore_index: i64,
) -> Result<Tensor, String> {
    let (c, classes) = counted_labels(logits, labels, ignore_index)?;
    let v = nd::floats(logits, "the logits")?;
    let d = nd::item(dloss, "dloss")?;
    let count = classes.iter().filter(|k| k.is_some()).count();
    let mut out = Vec::with_capacity(v.len());
    for (row, class) in v.chunks(c.max(1)).zip(&classes) {
        match class {
            None => out.extend(row.iter().map(|_| 0.0)),
            Some(class) => {
                let start = out.len();
                softmax_row(row, &mut out);
                out[start + class] -= 1.0;
                for g in &mut out[start..] {
                    *g *= d / count as f64;
                }
            }
        }
    }
    Ok(nd::float(logits.shape().to_vec(), logits.dtype(), out))
}

/// The two rank-1 operands of `mse`, checked to agree.
fn pair<'t>(p: &'t Tensor, t: &'t Tensor) -> Result<(&'t [f64], &'t [f64]), String> {
    if p.shape().len() != 1 || p.shape() != t.shape() {
        return Err(format!("mse needs two rank-1 tensors of one shape, got {:?} and {:?}", p.shape(), t.shape()));
    }
    Ok((nd::floats(p, "the prediction")?, nd::floats(t, "the target")?))
}

/// `Σ(p − t)²/N`; 0 when `N = 0`.
pub(super) fn mse(prediction: &Tensor, target: &Tensor) -> Result<Tensor, String> {
    let (p, t) = pair(prediction, target)?;
    let sum: f64 = p.iter().zip(t).map(|(p, t)| (p - t) * (p - t)).sum();
    Ok(nd::scalar(if p.is_empty() { 0.0 } else { sum / p.len() as f64 }))
}

/// `dloss·2(p − t)/N`.
pub(super) fn mse_grad(prediction: &Tensor, target: &Tensor, dloss: &Tensor) -> Result<Tensor, String> {
    let (p, t) = pair(prediction, target)?;
    let d = nd::item(dloss, "dloss")?;
    let n = p.len() as f64;
    let out = p.iter().zip(t).map(|(p, t)| d * 2.0 * (p - t) / n).collect();
    Ok(nd::float(prediction.shape().to_vec(), prediction.dtype(), out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn logits() -> Tensor {
        // Row 0: [0, ln 3] → softmax [1/4, 3/4]; row 1: [ln 2, ln 2] → [1/2, 1/2].
        nd::float(vec![2, 2], DType::F32, vec![0.0, 3f64.ln(), 2f64.ln(), 2f64.ln()])
    }

    fn labels(v: &[i64]) -> Tensor {
        Tensor::int(vec![v.len()], DType::I64, v.to_vec()).unwrap()
    }

    #[test]
    fn cross_entropy_by_hand_with_ignored_rows() {
        // Row 0 label 1: −ln(3/4); row 1 label 0: −ln(1/2). Mean = (ln 4/3 + ln 2)/2.
        let both = cross_entropy(&logits(), &labels(&[1, 0]), -100).unwrap().item().unwrap();
        assert!((both - ((4.0f64 / 3.0).ln() + 2f64.ln()) / 2.0).abs() < 1e-15);
        // Ignoring row 1 leaves ln(4/3).
        let one = cross_entropy(&logits(), &labels(&[1, -100]), -100).unwrap().item().unwrap();
        assert!((one - (4.0f64 / 3.0).ln()).abs() < 1e-15);
        // No counted row: 0.
        assert_eq!(cross_entropy(&logits(), &labels(&[-100, -100]), -100).unwrap().item(), Some(0.0));
        let err = cross_entropy(&logits(), &labels(&[2, 0]), -100).unwrap_err();
        assert!(err.contains("label 2 of row 0"), "{err}");
        assert!(cross_entropy(&logits(), &labels(&[-1, 0]), -100).is_err());
        // A huge logit does not overflow: [1000, 0], label 0 → −ln(1/(1+e^−1000)) ≈ 0.
        let big = nd::float(vec![1, 2], DType::F32, vec![1000.0, 0.0]);
        assert_eq!(cross_entropy(&big, &labels(&[0]), -100).unwrap().item(), Some(0.0));
    }

    #[test]
    fn cross_entropy_grad_by_hand() {
        // dloss = 2, one counted row (row 0, label 1): 2·([1/4, 3/4] − [0, 1])/1; row 1 zero.
        let dloss = nd::scalar(2.0);
        let g = cross_entropy_grad(&logits(), &labels(&[1, -100]), &dloss, -100).unwrap();
        let v = g.floats().unwrap();
        assert!((v[0] - 0.5).abs() < 1e-15 && (v[1] + 0.5).abs() < 1e-15, "{v:?}");
        assert_eq!(&v[2..], &[0.0, 0.0]);
        // Two counted rows: each divided by 2.
        let g = cross_entropy_grad(&logits(), &labels(&[1, 0]), &nd::scalar(1.0), -100).unwrap();
        let v = g.floats().unwrap();
        let want = [0.125, -0.125, -0.25, 0.25];
        assert!(v.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-15), "{v:?}");
    }

    #[test]
    fn mse_and_its_gradient_by_hand() {
        let p = nd::float(vec![3], DType::F32, vec![1.0, 2.0, 4.0]);
        let t = nd::float(vec![3], DType::F32, vec![0.0, 2.0, 1.0]);
        // (1 + 0 + 9)/3
        assert!((mse(&p, &t).unwrap().item().unwrap() - 10.0 / 3.0).abs() < 1e-15);
        // 3·2·(p − t)/3 = [2, 0, 6]
        assert_eq!(mse_grad(&p, &t, &nd::scalar(3.0)).unwrap().floats().unwrap(), &[2.0, 0.0, 6.0]);
    }
}
