//! zeroplan's driver: what turns a model and its data into work for the
//! runtime, as a library the CLI calls.
//!
//! - [`program`]: a model compiled for the host — the pass pipeline, the
//!   memory plan and the program for one batch × sequence length (the only
//!   place outside the planner that runs `zeroplan-passes`);
//! - [`train`]: training on the runtime — the ranks of this process,
//!   their batches, checkpoints, divergence diagnosis, one process per rank;
//! - [`data`]: training data (masked-LM text, GLUE TSVs) tokenised, batched
//!   and padded;
//! - [`model_dir`]: Hugging Face model directories;
//! - [`embed`]: sentence embeddings; [`classify`]: sequence classification
//!   and fine-tuning; [`metrics`]: the GLUE tasks' dev metrics;
//! - [`deepspeed`]: a plan as a DeepSpeed configuration, and back.

// Public items are not all documented yet: the lint is enforced crate by crate.
#![allow(missing_docs)]

pub mod classify;
pub mod data;
pub mod deepspeed;
pub mod embed;
pub mod metrics;
pub mod model_dir;
pub mod program;
pub mod train;
