//! `zeroplan devices`.

use crate::cli::DevicesArgs;
use crate::output::emit;
use zeroplan_runtime::{FoundDevice, devices};

pub fn run(args: &DevicesArgs) -> Result<(), String> {
    let found = devices();
    if args.json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&found).expect("serialisable")), None);
    }
    let mut text = String::new();
    for d in &found.devices {
        text += &match d {
            FoundDevice::Host { target, threads } => format!("host   {target}, {threads} threads\n"),
            FoundDevice::Cuda { ordinal, name, memory_bytes, compute_capability } => format!(
                "cuda:{ordinal} {name}, {:.1} GiB, compute capability {compute_capability}\n",
                *memory_bytes as f64 / (1u64 << 30) as f64
            ),
        };
    }
    if let Some(note) = &found.cuda_note {
        text += &format!("(no CUDA device: {note})\n");
    }
    emit(&text, None)
}
