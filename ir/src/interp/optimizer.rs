//! The optimizer ops: gradient norms, the learning-rate schedule, clipping
//! and loss-scale bookkeeping, AdamW, dynamic loss scaling.
//!
//! The scalar rules are public functions ([`lr_schedule`], [`grad_scale`])
//! so a runtime can log the same numbers the graph computes.

use super::nd;
use crate::tensor::Tensor;

/// `Σ x²`, accumulated in f64 in element order.
pub(super) fn squared_sum(x: &Tensor) -> Result<Tensor, String> {
    Ok(nd::scalar(nd::floats(x, "the operand")?.iter().map(|v| v * v).sum()))
}

/// The learning rate after `s` completed steps (Hugging Face's
/// `get_linear_schedule_with_warmup`): `peak·s/W` while `s < W` (when
/// `W > 0`); then `peak·max(0, (T − s)/max(1, T − W))` with a total `T`, or
/// `peak` without one.
pub fn lr_schedule(s: f64, peak: f64, warmup_steps: u64, total_steps: Option<u64>) -> f64 {
    let w = warmup_steps as f64;
    if warmup_steps > 0 && s < w {
        return peak * s / w;
    }
    match total_steps {
        Some(t) => {
            let t = t as f64;
            peak * ((t - s) / (t - w).max(1.0)).max(0.0)
        }
        None => peak,
    }
}

/// `(multiplier, finite)` for a squared gradient norm `sq` of gradients
/// summed over `micro_batches` micro-batches and scaled by `loss_scale`:
/// `(0, 0)` when `sq` is not finite; else, with `norm = √sq/(S·k)`,
/// `clip = min(1, max_norm/(norm + 1e-6))` (1 without `max_norm`, as
/// PyTorch's `clip_grad_norm_`) and `multiplier = clip/(S·k)`.
pub fn grad_scale(sq: f64, loss_scale: f64, max_norm: Option<f64>, micro_batches: u64) -> (f64, f64) {
    if !sq.is_finite() {
        return (0.0, 0.0);
    }
    let divisor = loss_scale * micro_batches as f64;
    let norm = sq.sqrt() / divisor;
    let clip = max_norm.map_or(1.0, |m| (m / (norm + 1e-6)).min(1.0));
    (clip / divisor, 1.0)
}

/// The AdamW hyper-parameters.
#[derive(Clone, Copy, Debug)]
pub(super) struct AdamW {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// `(p, g, m, v, lr, t, multiplier, finite) → (p, m, v)`: one AdamW step on
/// `g·multiplier` (PyTorch's order: decay, moments, bias-corrected update);
/// the identity when `finite == 0`.
pub(super) fn adamw(h: AdamW, x: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let [p, g, m, v, lr, t, multiplier, finite] = x else {
        return Err(format!("adamw takes 8 operands, got {}", x.len()));
    };
    for (what, other) in [("the gradient", g), ("m", m), ("v", v)] {
        nd::same_shape(p, other, &format!("the parameter and {what}"))?;
    }
    let (lr, t) = (nd::item(lr, "lr")?, nd::item(t, "the step")?);
    let (multiplier, finite) = (nd::item(multiplier, "the multiplier")?, nd::item(finite, "finite")?);
    if finite == 0.0 {
        return Ok(vec![(*p).clone(), (*m).clone(), (*v).clone()]);
    }
    let (pv, gv) = (nd::floats(p, "the parameter")?, nd::floats(g, "the gradient")?);
    let (mv, vv) = (nd::floats(m, "m")?, nd::floats(v, "v")?);
    let (bc1, bc2) = (1.0 - h.beta1.powf(t), 1.0 - h.beta2.powf(t));
    let n = pv.len();
    let (mut p_out, mut m_out, mut v_out) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let grad = gv[i] * multiplier;
        let decayed = pv[i] * (1.0 - lr * h.weight_decay);
        let m1 = h.beta1 * mv[i] + (1.0 - h.beta1) * grad;
        let v1 = h.beta2 * vv[i] + (1.0 - h.beta2) * grad * grad;
        p_out.push(decayed - lr * (m1 / bc1) / ((v1 / bc2).sqrt() + h.eps));
        m_out.push(m1);
        v_out.push(v1);
    }
    let shape = p.shape().to_vec();
    Ok(vec![
        nd::float(shape.clone(), p.dtype(), p_out),
        nd::float(shape.clone(), m.dtype(), m_out),
        nd::float(shape, v.dtype(), v_out),
    ])
}

/// `(scale, good_steps, finite) → (scale, good_steps)`: if `finite ≠ 0`,
/// `good + 1`, and on reaching `growth_interval` the scale grows by `growth`
/// and the count restarts at 0; else the scale shrinks by `backoff` and the
/// count restarts at 0.
pub fn loss_scale_update(
    scale: f64,
    good: f64,
    finite: f64,
    growth_interval: u64,
    growth: f64,
    backoff: f64,
) -> (f64, f64) {
    if finite == 0.0 {
        return (scale * backoff, 0.0);
    }
    let good = good + 1.0;
    if good >= growth_interval as f64 { (scale * growth, 0.0) } else { (scale, good) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn squared_sum_by_hand() {
        let x = nd::float(vec![3], DType::BF16, vec![1.0, -2.0, 3.0]);
        assert_eq!(squared_sum(&x).unwrap().item(), Some(14.0));
        assert_eq!(squared_sum(&x).unwrap().dtype(), DType::F32);
    }

    #[test]
    fn lr_schedule_at_the_boundaries() {
        let lr = |s: f64| lr_schedule(s, 1e-3, 10, Some(110));
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-18, "{a} vs {b}");
        close(lr(0.0), 0.0);
        close(lr(5.0), 5e-4);
        close(lr(9.0), 9e-4); // last warm-up step
        close(lr(10.0), 1e-3); // warm-up done: (110 − 10)/100
        close(lr(11.0), 0.99e-3); // first decay step: 99/100
        close(lr(60.0), 5e-4); // halfway down
        close(lr(110.0), 0.0);
        close(lr(200.0), 0.0); // past the end: clamped at 0
        // No warm-up: decays from step 0; no total: constant after warm-up.
        assert_eq!(lr_schedule(0.0, 2.0, 0, Some(4)), 2.0);
        assert_eq!(lr_schedule(1.0, 2.0, 0, Some(4)), 1.5);
        assert_eq!(lr_schedule(1.0, 2.0, 4, None), 0.5);
        assert_eq!(lr_schedule(1000.0, 2.0, 4, None), 2.0);
        // T = W: max(1, ·) as Hugging Face, no division by zero.
        assert_eq!(lr_schedule(4.0, 2.0, 4, Some(4)), 0.0);
    }

    #[test]
    fn grad_scale_clips_unscales_and_detects_overflow() {
        // sq = 2500 → √ = 50; S = 5, k = 2 → norm = 5; max_norm 1 → clip = 1/(5 + 1e-6).
        let (mult, finite) = grad_scale(2500.0, 5.0, Some(1.0), 2);
        assert_eq!(finite, 1.0);
        assert!((mult - 1.0 / (5.0 + 1e-6) / 10.0).abs() < 1e-18);
        // Below the max norm: no clipping.
        assert_eq!(grad_scale(2500.0, 5.0, Some(10.0), 2), (0.1, 1.0));
        assert_eq!(grad_scale(2500.0, 5.0, None, 2), (0.1, 1.0));
        assert_eq!(grad_scale(f64::INFINITY, 5.0, Some(1.0), 2), (0.0, 0.0));
        assert_eq!(grad_scale(f64::NAN, 5.0, None, 1), (0.0, 0.0));
    }

    fn adamw_step(p: f64, g: f64, m: f64, v: f64, t: f64, multiplier: f64, finite: f64) -> Vec<f64> {
        let h = AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 };
        let s = |x: f64| nd::float(vec![1], DType::F32, vec![x]);
        let ops = [s(p), s(g), s(m), s(v), nd::scalar(0.1), nd::scalar(t), nd::scalar(multiplier), nd::scalar(finite)];
        let refs: Vec<&Tensor> = ops.iter().collect();
        adamw(h, &refs).unwrap().iter().map(|t| t.floats().unwrap()[0]).collect()
    }

    #[test]
    fn adamw_first_step_by_hand() {
        // p = 1, g = 4 with multiplier 0.5 → g' = 2; lr = 0.1, wd = 0.01, t = 1.
        // decay: 1·(1 − 0.001) = 0.999; m = 0.1·2 = 0.2; v = 0.001·4 = 0.004;
        // m̂ = 0.2/0.1 = 2; v̂ = 0.004/0.001 = 4; p = 0.999 − 0.1·2/(2 + 1e-8).
        let out = adamw_step(1.0, 4.0, 0.0, 0.0, 1.0, 0.5, 1.0);
        assert!((out[0] - (0.999 - 0.2 / (2.0 + 1e-8))).abs() < 1e-15, "{out:?}");
        assert!((out[1] - 0.2).abs() < 1e-16 && (out[2] - 0.004).abs() < 1e-17, "{out:?}");
        // Second step from there with g' = 1, t = 2:
        // m = 0.9·0.2 + 0.1 = 0.28; v = 0.999·0.004 + 0.001 = 0.004996;
        // m̂ = 0.28/0.19; v̂ = 0.004996/0.001999.
        let out2 = adamw_step(out[0], 1.0, out[1], out[2], 2.0, 1.0, 1.0);
        let want = out[0] * 0.999 - 0.1 * (0.28 / 0.19) / ((0.004996f64 / 0.001999).sqrt() + 1e-8);
        assert!((out2[0] - want).abs() < 1e-14, "{out2:?} vs {want}");
        // Not finite: nothing moves, not even weight decay.
        assert_eq!(adamw_step(1.0, 4.0, 0.3, 0.2, 1.0, 0.5, 0.0), vec![1.0, 0.3, 0.2]);
    }

    #[test]
    fn loss_scaling_grows_and_backs_off() {
        // Interval 3: two good steps count up, the third doubles the scale.
        assert_eq!(loss_scale_update(1024.0, 0.0, 1.0, 3, 2.0, 0.5), (1024.0, 1.0));
        assert_eq!(loss_scale_update(1024.0, 1.0, 1.0, 3, 2.0, 0.5), (1024.0, 2.0));
        assert_eq!(loss_scale_update(1024.0, 2.0, 1.0, 3, 2.0, 0.5), (2048.0, 0.0));
        // Overflow halves it and resets the count.
        assert_eq!(loss_scale_update(1024.0, 2.0, 0.0, 3, 2.0, 0.5), (512.0, 0.0));
        // Interval 1 grows every finite step.
        assert_eq!(loss_scale_update(8.0, 0.0, 1.0, 1, 2.0, 0.5), (16.0, 0.0));
    }
}
