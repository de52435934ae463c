//! Where a step's time goes: wall time per instruction, summed by kind.
//!
//! Off by default (two clock reads per instruction are cheap, but a step
//! should not pay for what nobody reads). [`super::HostProgram::profile`]
//! turns it on; [`Profile::by_kind`] then gives the time of every
//! instruction kind (`matmul`, `transpose`, each generated kernel's family…)
//! over the steps run since, which is what a speed hunt starts from.

use std::collections::BTreeMap;
use std::time::Duration;

use super::select::Instr;

/// Accumulated time of one kind of instruction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Entry {
    pub calls: u64,
    pub seconds: f64,
    /// Floating-point operations done (GEMMs only; 0 elsewhere).
    pub flops: f64,
}

/// Timings of the instructions run while profiling was on.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    kinds: BTreeMap<String, Entry>,
}

impl Profile {
    pub(super) fn record(&mut self, instr: &Instr, took: Duration) {
        let e = self.kinds.entry(kind(instr)).or_default();
        e.calls += 1;
        e.seconds += took.as_secs_f64();
        if let Instr::MatMul { shape, .. } = instr {
            e.flops += shape.flops();
        }
    }

    /// Every kind with its time, the slowest first.
    pub fn by_kind(&self) -> Vec<(String, Entry)> {
        let mut v: Vec<(String, Entry)> = self.kinds.iter().map(|(k, e)| (k.clone(), e.clone())).collect();
        v.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
        v
    }

    /// The time of all recorded instructions.
    pub fn total_seconds(&self) -> f64 {
        self.kinds.values().map(|e| e.seconds).sum()
    }
}

/// The kind an instruction is counted under: its variant, and for a
/// generated kernel its name less the layer number (so `layer3.attn.softmax`
/// and `layer4.attn.softmax` add up), for a matmul its m×n×k.
fn kind(instr: &Instr) -> String {
    match instr {
        Instr::Kernel { kernel, .. } => format!("kernel {}", strip_layer(kernel.name())),
        Instr::MatMul { shape, .. } => format!(
            "matmul {}x{}x{}{}{} ×{}",
            shape.m,
            shape.n,
            shape.k,
            if shape.transpose_a { " Aᵀ" } else { "" },
            if shape.transpose_b { " Bᵀ" } else { "" },
            shape.batches.len()
        ),
        other => other.name().to_string(),
    }
}

/// `layer12_attn_softmax` → `layer*_attn_softmax`: digits after `layer` dropped.
fn strip_layer(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find("layer") {
        out.push_str(&rest[..at + 5]);
        rest = &rest[at + 5..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            out.push('*');
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::strip_layer;

    #[test]
    fn layer_numbers_are_folded() {
        assert_eq!(strip_layer("zeroplan_kernel_layer11_attn_softmax"), "zeroplan_kernel_layer*_attn_softmax");
        assert_eq!(strip_layer("mlm_logits_back1"), "mlm_logits_back1");
        assert_eq!(strip_layer("layers"), "layers");
    }
}
