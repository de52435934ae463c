//! DeepSpeed interoperation: a plan as the DeepSpeed configuration JSON
//! that trains the same way ([`export`]), and a DeepSpeed configuration as
//! the pins and training spec that plan it as given ([`import`]).
//!
//! Field names and meanings follow DeepSpeed's configuration reference
//! (deepspeed.ai/docs/config-json). What maps:
//!
//! | zeroplan | DeepSpeed |
//! | --- | --- |
//! | global batch, micro-batch, micro-batches | `train_batch_size`, `train_micro_batch_size_per_gpu`, `gradient_accumulation_steps` |
//! | ZeRO stage | `zero_optimization.stage` |
//! | offload `optimizer` / `optimizer+params` | `offload_optimizer` / and `offload_param`, `device: "cpu"` |
//! | offload to the NVMe tier (ZeRO-Infinity) | the same with `device: "nvme"`, `nvme_path`, buffers, and the `aio` block |
//! | flat buckets, one per layer and decay group | `reduce_bucket_size`, `allgather_bucket_size`, `stage3_prefetch_bucket_size` (elements) |
//! | recompute `full` | `activation_checkpointing` (every layer checkpointed) |
//! | precision bf16 / f16 with dynamic loss scaling | `bf16.enabled` / `fp16` (`loss_scale: 0`) |
//! | AdamW, schedule, clipping | `optimizer`, `scheduler` (`WarmupLR`, `WarmupDecayLR`, linear), `gradient_clipping` |
//!
//! DeepSpeed has no selective or budgeted recomputation: such a plan is
//! exported with `activation_checkpointing` (the nearest DeepSpeed can do,
//! and never more memory) and its policy under a top-level `zeroplan` key,
//! which DeepSpeed does not read and `import` does.

pub mod export;
pub mod import;
mod values;

/// The top-level key of what only zeroplan reads.
pub const ZEROPLAN_KEY: &str = "zeroplan";

/// Where `path` (`zero_optimization.offload_optimizer.device`) is written
/// in the JSON `text`, as `line:column`, found by following its keys in
/// order; `None` where a key is not found.
pub fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let mut at = 0;
    for key in path.split('.') {
        let quoted = format!("\"{key}\"");
        let mut from = at;
        loop {
            let found = from + text[from..].find(&quoted)?;
            let after = found + quoted.len();
            if text[after..].trim_start().starts_with(':') {
                at = found;
                break;
            }
            from = after;
        }
    }
    let line = text[..at].matches('\n').count() + 1;
    let column = text[text[..at].rfind('\n').map_or(0, |i| i + 1)..at].chars().count() + 1;
    Some((line, column))
}

#[cfg(test)]
mod tests {
    use super::locate;

    #[test]
    fn locate_follows_the_keys_in_order() {
        let text = "{\n  \"stage\": 1,\n  \"zero_optimization\": {\n    \"stage\": 3\n  }\n}";
        assert_eq!(locate(text, "stage"), Some((2, 3)));
        assert_eq!(locate(text, "zero_optimization.stage"), Some((4, 5)));
        assert_eq!(locate(text, "zero_optimization.offload_param"), None);
    }
}
