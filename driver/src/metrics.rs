//! The GLUE tasks' dev-set metrics: accuracy (MNLI, QNLI, RTE, SST-2),
//! accuracy and F1 (MRPC, QQP), Matthews correlation (CoLA), Pearson and
//! Spearman correlation (STS-B), with the conventions of the reference
//! implementations (scikit-learn, SciPy) at the edges: F1 and Matthews are
//! 0 where their denominators vanish (no positive predicted or gold; a
//! constant prediction), Spearman ranks ties by their average rank, and a
//! correlation of a constant series is undefined (an error, not a NaN).
//! [`score`] computes a task spec's [`Metric`] on a model's [`Predictions`].

use zeroplan_ir::spec::Metric;

/// Why a metric could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetricError {
    #[error("{metric}: {predicted} predictions for {gold} gold labels")]
    Lengths { metric: &'static str, predicted: usize, gold: usize },
    #[error("{metric}: no examples")]
    Empty { metric: &'static str },
    #[error("{metric}: a series is constant, so the correlation is undefined")]
    Constant { metric: &'static str },
    #[error("{metric} needs {needs}")]
    Kind { metric: &'static str, needs: &'static str },
}

/// A model's outputs on a task, or the gold labels.
#[derive(Clone, Debug, PartialEq)]
pub enum Predictions {
    /// Class indices (classification).
    Classes(Vec<usize>),
    /// Scores (regression).
    Scores(Vec<f64>),
}

/// `metric` of `predicted` against `gold`.
pub fn score(metric: Metric, predicted: &Predictions, gold: &Predictions) -> Result<f64, MetricError> {
    use Predictions::{Classes, Scores};
    match (metric, predicted, gold) {
        (Metric::Accuracy, Classes(p), Classes(g)) => accuracy(p, g),
        (Metric::F1, Classes(p), Classes(g)) => f1(p, g),
        (Metric::Matthews, Classes(p), Classes(g)) => matthews(p, g),
        (Metric::Pearson, Scores(p), Scores(g)) => pearson(p, g),
        (Metric::Spearman, Scores(p), Scores(g)) => spearman(p, g),
        (Metric::Accuracy | Metric::F1 | Metric::Matthews, ..) => {
            Err(MetricError::Kind { metric: name(metric), needs: "class predictions and labels" })
        }
        (Metric::Pearson | Metric::Spearman, ..) => {
            Err(MetricError::Kind { metric: name(metric), needs: "score predictions and labels" })
        }
    }
}

/// How reports name `metric`.
pub fn name(metric: Metric) -> &'static str {
    match metric {
        Metric::Accuracy => "accuracy",
        Metric::F1 => "f1",
        Metric::Matthews => "matthews",
        Metric::Pearson => "pearson",
        Metric::Spearman => "spearman",
    }
}

fn check<T, U>(metric: &'static str, predicted: &[T], gold: &[U]) -> Result<(), MetricError> {
    if predicted.len() != gold.len() {
        return Err(MetricError::Lengths { metric, predicted: predicted.len(), gold: gold.len() });
    }
    if gold.is_empty() {
        return Err(MetricError::Empty { metric });
    }
    Ok(())
}

/// The fraction of predictions equal to the gold label.
pub fn accuracy(predicted: &[usize], gold: &[usize]) -> Result<f64, MetricError> {
    check("accuracy", predicted, gold)?;
    Ok(predicted.iter().zip(gold).filter(|(p, g)| p == g).count() as f64 / gold.len() as f64)
}

/// Counts of a binary task with class 1 positive: (tp, fp, fn, tn).
fn confusion(predicted: &[usize], gold: &[usize]) -> (f64, f64, f64, f64) {
    let mut c = (0.0, 0.0, 0.0, 0.0);
    for (&p, &g) in predicted.iter().zip(gold) {
        match (p == 1, g == 1) {
            (true, true) => c.0 += 1.0,
            (true, false) => c.1 += 1.0,
            (false, true) => c.2 += 1.0,
            (false, false) => c.3 += 1.0,
        }
    }
    c
}

/// F1 of class 1 (MRPC's and QQP's positive class): `2tp / (2tp + fp + fn)`,
/// 0 when nothing is positive on either side.
pub fn f1(predicted: &[usize], gold: &[usize]) -> Result<f64, MetricError> {
    check("f1", predicted, gold)?;
    let (tp, fp, fn_, _) = confusion(predicted, gold);
    let denominator = 2.0 * tp + fp + fn_;
    Ok(if denominator == 0.0 { 0.0 } else { 2.0 * tp / denominator })
}

/// Matthews correlation of a binary task (CoLA):
/// `(tp·tn − fp·fn) / √((tp+fp)(tp+fn)(tn+fp)(tn+fn))`, 0 when a factor is 0
/// (a constant prediction or a constant gold).
pub fn matthews(predicted: &[usize], gold: &[usize]) -> Result<f64, MetricError> {
    check("matthews", predicted, gold)?;
    let (tp, fp, fn_, tn) = confusion(predicted, gold);
    let denominator = ((tp + fp) * (tp + fn_) * (tn + fp) * (tn + fn_)).sqrt();
    Ok(if denominator == 0.0 { 0.0 } else { (tp * tn - fp * fn_) / denominator })
}

/// Pearson's correlation of two series.
pub fn pearson(predicted: &[f64], gold: &[f64]) -> Result<f64, MetricError> {
    check("pearson", predicted, gold)?;
    let n = gold.len() as f64;
    let (mx, my) = (predicted.iter().sum::<f64>() / n, gold.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (&x, &y) in predicted.iter().zip(gold) {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
        syy += (y - my) * (y - my);
    }
    if sxx == 0.0 || syy == 0.0 {
        return Err(MetricError::Constant { metric: "pearson" });
    }
    Ok(sxy / (sxx * syy).sqrt())
}

/// Spearman's correlation: Pearson's of the ranks, ties given their
/// average rank (as `scipy.stats.spearmanr`).
pub fn spearman(predicted: &[f64], gold: &[f64]) -> Result<f64, MetricError> {
    check("spearman", predicted, gold)?;
    pearson(&ranks(predicted), &ranks(gold)).map_err(|_| MetricError::Constant { metric: "spearman" })
}

/// 1-based ranks, ties averaged.
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        // Positions i..=j share the mean of ranks i+1 ..= j+1.
        let rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            r[k] = rank;
        }
        i = j + 1;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }

    #[test]
    fn classification_metrics_match_hand_counts() {
        // tp = 2, fp = 1, fn = 1, tn = 2.
        let (p, g) = ([1, 1, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0]);
        close(accuracy(&p, &g).unwrap(), 4.0 / 6.0);
        close(f1(&p, &g).unwrap(), 4.0 / 6.0); // 2·2 / (2·2 + 1 + 1)
        close(matthews(&p, &g).unwrap(), (4.0 - 1.0) / 9.0); // (2·2 − 1·1) / √(3·3·3·3)
        close(accuracy(&[0, 2, 1], &[0, 1, 1]).unwrap(), 2.0 / 3.0);
    }

    #[test]
    fn degenerate_cases_follow_scikit_learn() {
        // A constant prediction: Matthews' denominator vanishes, the score is 0.
        close(matthews(&[1, 1, 1, 1], &[1, 0, 1, 0]).unwrap(), 0.0);
        close(matthews(&[0, 0], &[0, 0]).unwrap(), 0.0);
        // Nothing positive anywhere: F1 is 0, not NaN.
        close(f1(&[0, 0], &[0, 0]).unwrap(), 0.0);
        // Perfect and inverted predictions.
        close(matthews(&[1, 0, 1, 0], &[1, 0, 1, 0]).unwrap(), 1.0);
        close(matthews(&[0, 1, 0, 1], &[1, 0, 1, 0]).unwrap(), -1.0);
        assert_eq!(accuracy(&[], &[]), Err(MetricError::Empty { metric: "accuracy" }));
        assert!(matches!(f1(&[1], &[1, 0]), Err(MetricError::Lengths { predicted: 1, gold: 2, .. })));
    }

    #[test]
    fn score_dispatches_on_the_metric_and_refuses_the_wrong_kind() {
        let (p, g) = (Predictions::Classes(vec![1, 1, 1, 0]), Predictions::Classes(vec![1, 0, 1, 0]));
        close(score(Metric::Accuracy, &p, &g).unwrap(), 0.75);
        close(score(Metric::F1, &p, &g).unwrap(), 0.8); // 2·2 / (2·2 + 1 + 0)
        close(score(Metric::Matthews, &p, &g).unwrap(), 2.0 / 12f64.sqrt()); // (2·1 − 1·0) / √(3·2·1·2)
        let (x, y) = (Predictions::Scores(vec![1.0, 2.0, 2.0, 3.0]), Predictions::Scores(vec![1.0, 2.0, 3.0, 4.0]));
        close(score(Metric::Spearman, &x, &y).unwrap(), 4.5 / 22.5f64.sqrt());
        close(score(Metric::Pearson, &y, &y).unwrap(), 1.0);
        let wrong = score(Metric::Pearson, &p, &g).unwrap_err();
        assert_eq!(wrong, MetricError::Kind { metric: "pearson", needs: "score predictions and labels" });
        assert!(matches!(score(Metric::Accuracy, &x, &y), Err(MetricError::Kind { metric: "accuracy", .. })));
    }

    #[test]
    fn correlations_match_hand_computed_values_with_ties() {
        let (x, y) = ([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.5]);
        // Σ(x−x̄)(y−ȳ) = 10.75, Σ(x−x̄)² = 5, Σ(y−ȳ)² = 23.1875.
        close(pearson(&x, &y).unwrap(), 10.75 / (5.0f64 * 23.1875).sqrt());
        close(spearman(&x, &y).unwrap(), 1.0);
        // Ties: [1, 2, 2, 3] ranks to [1, 2.5, 2.5, 4]; against [1, 2, 3, 4]:
        // Σ(r−r̄)(s−s̄) = 4.5, Σ(r−r̄)² = 4.5, Σ(s−s̄)² = 5 → 4.5/√22.5.
        close(spearman(&[1.0, 2.0, 2.0, 3.0], &x).unwrap(), 4.5 / 22.5f64.sqrt());
        assert_eq!(ranks(&[3.0, 1.0, 3.0, 3.0]), [3.0, 1.0, 3.0, 3.0]);
        assert_eq!(pearson(&[1.0, 1.0], &[1.0, 2.0]), Err(MetricError::Constant { metric: "pearson" }));
        assert_eq!(spearman(&[1.0, 2.0], &[5.0, 5.0]), Err(MetricError::Constant { metric: "spearman" }));
    }
}
