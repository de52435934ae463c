//! Training specs: optimizer, schedule, precision, accumulation.
//!
//! Defaults follow Hugging Face's `Trainer` (AdamW, betas 0.9/0.999, eps 1e-8,
//! weight decay 0.01 on weight matrices and embeddings only, clip at global
//! norm 1.0, linear schedule). MosaicBERT's MNLI fine-tuning, for example, is
//! `(lr: 5e-5, betas: (0.9, 0.98), eps: 1e-6, weight_decay: 5e-6)`.

use serde::{Deserialize, Serialize};

use super::error::{FieldProblem, SpecError};

/// How a training step is computed and applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingSpec {
    /// Peak learning rate.
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    /// Decoupled weight decay (AdamW).
    pub weight_decay: f64,
    /// Also decay biases and LayerNorm parameters (Hugging Face does not).
    pub decay_norms_and_biases: bool,
    /// Linear warm-up from 0 over this many optimizer steps.
    pub warmup_steps: u64,
    /// Linear decay to 0 at this step; `None` keeps the peak after warm-up.
    pub total_steps: Option<u64>,
    /// Clip gradients to this global L2 norm; `None` does not clip.
    pub max_grad_norm: Option<f64>,
    /// Micro-batches whose gradients are summed before each optimizer step.
    pub micro_batches: u64,
    pub precision: Precision,
    /// Overrides the model's hidden and attention dropout (0 disables).
    pub dropout: Option<f64>,
}

impl Default for TrainingSpec {
    fn default() -> TrainingSpec {
        TrainingSpec {
            lr: 5e-5,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            decay_norms_and_biases: false,
            warmup_steps: 0,
            total_steps: None,
            max_grad_norm: Some(1.0),
            micro_batches: 1,
            precision: Precision::F32,
            dropout: None,
        }
    }
}

/// Compute precision. Mixed precision keeps fp32 master weights and fp32
/// optimizer moments, and computes in 16 bits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Precision {
    F32,
    Bf16,
    /// fp16 needs dynamic loss scaling against gradient underflow.
    F16(LossScaling),
}

/// Dynamic loss scaling (as PyTorch's `GradScaler`): on overflow the step is
/// skipped and the scale multiplied by `backoff`; after `growth_interval`
/// clean steps it is multiplied by `growth`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LossScaling {
    pub initial_scale: f64,
    pub growth_interval: u64,
    pub growth: f64,
    pub backoff: f64,
}

impl Default for LossScaling {
    fn default() -> LossScaling {
        LossScaling { initial_scale: 65536.0, growth_interval: 2000, growth: 2.0, backoff: 0.5 }
    }
}

impl TrainingSpec {
    /// Reads a RON training spec; `file` names it in errors. Missing fields
    /// take their defaults.
    pub fn from_ron(text: &str, file: &str) -> Result<TrainingSpec, SpecError> {
        super::from_ron(text, file, TrainingSpec::validate)
    }

    /// Loads a RON training spec from a file.
    pub fn load(path: &std::path::Path) -> Result<TrainingSpec, SpecError> {
        let (text, file) = super::read(path)?;
        TrainingSpec::from_ron(&text, &file)
    }

    /// Every problem with the values.
    pub fn validate(&self) -> Result<(), Vec<FieldProblem>> {
        let mut problems = Vec::new();
        let mut problem = |field: &'static str, message: String, help: &str| {
            problems.push(FieldProblem { field, message, help: help.to_string() });
        };
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            problem(
                "lr",
                format!("learning rate {} is not a finite number ≥ 0", self.lr),
                "BERT fine-tuning uses 2e-5 to 5e-5",
            );
        }
        let (b1, b2) = self.betas;
        if !((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2)) {
            problem("betas", format!("betas ({b1}, {b2}) are not both in [0, 1)"), "AdamW's defaults are (0.9, 0.999)");
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            problem("eps", format!("eps {} is not positive", self.eps), "use 1e-8 or 1e-6");
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            problem(
                "weight_decay",
                format!("weight decay {} is negative", self.weight_decay),
                "use 0.01, or 0 for none",
            );
        }
        if let Some(total) = self.total_steps
            && total < self.warmup_steps.max(1)
        {
            problem(
                "total_steps",
                format!("total_steps {total} is shorter than the warm-up ({})", self.warmup_steps),
                "make total_steps ≥ warmup_steps, or None for no decay",
            );
        }
        if self.max_grad_norm.is_some_and(|n| !(n > 0.0 && n.is_finite())) {
            problem(
                "max_grad_norm",
                format!("max_grad_norm {} is not positive", self.max_grad_norm.unwrap_or_default()),
                "use 1.0 (`max_grad_norm: Some(1.0)` in a training spec), or `None` for no clipping",
            );
        }
        if self.micro_batches == 0 {
            problem("micro_batches", "micro_batches is 0".into(), "use 1 for no gradient accumulation");
        }
        if let Precision::F16(s) = self.precision {
            let valid = s.initial_scale > 0.0
                && s.initial_scale.is_finite()
                && s.growth_interval > 0
                && s.growth >= 1.0
                && s.backoff > 0.0
                && s.backoff < 1.0;
            if !valid {
                problem(
                    "precision",
                    format!(
                        "loss scaling (initial_scale {}, growth_interval {}, growth {}, backoff {}) is out of range: \
                         the scale must be positive and finite, the interval at least 1, growth at least 1 and \
                         backoff in (0, 1)",
                        s.initial_scale, s.growth_interval, s.growth, s.backoff
                    ),
                    "use F16((initial_scale: 65536.0, growth_interval: 2000, growth: 2.0, backoff: 0.5))",
                );
            }
        }
        if self.dropout.is_some_and(|p| !(0.0..1.0).contains(&p)) {
            problem(
                "dropout",
                format!("dropout {} is not a probability in [0, 1)", self.dropout.unwrap_or_default()),
                "use 0.1, or 0 to turn dropout off (`dropout: Some(0.1)` in a training spec, `--dropout 0.1` on the command line)",
            );
        }
        if problems.is_empty() { Ok(()) } else { Err(problems) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_spec_takes_the_defaults() {
        assert_eq!(TrainingSpec::from_ron("()", "t.ron").unwrap(), TrainingSpec::default());
    }

    #[test]
    fn mosaicbert_mnli_settings_parse() {
        let spec = TrainingSpec::from_ron(
            "(lr: 5e-5, betas: (0.9, 0.98), eps: 1e-6, weight_decay: 5e-6, precision: Bf16)",
            "mnli.ron",
        )
        .unwrap();
        assert_eq!((spec.betas, spec.eps, spec.precision), ((0.9, 0.98), 1e-6, Precision::Bf16));
    }

    #[test]
    fn bad_values_point_at_their_fields() {
        let err = TrainingSpec::from_ron("(\n  lr: 1e-4,\n  betas: (0.9, 1.5),\n)", "t.ron").unwrap_err().to_string();
        assert!(err.starts_with("t.ron:3:3: error: betas (0.9, 1.5)"), "{err}");
        let err = TrainingSpec::from_ron("(micro_batches: 0)", "t.ron").unwrap_err().to_string();
        assert!(err.contains("micro_batches is 0"), "{err}");
    }
}
