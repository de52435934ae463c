//! zeroplan's graph passes.
//!
//! Each pass implements [`manager::Pass`] in its own file or folder and
//! turns one verified graph into another; [`pipeline`] orders them:
//! [`rewrite`] (egg: merge matmuls that share an input, by cost),
//! [`attention`] (each attention chain into one fused, FlashAttention-style op),
//! [`tiling`] (ZeRO-Infinity's memory-centric tiling of large operators),
//! [`training::MixedPrecision`] (fp32 master weights behind 16-bit working
//! copies), [`training::TrainingStep`] ([`autodiff`] and [`optimizer`]:
//! clipping, AdamW, schedule, loss scaling, accumulation), [`recompute`]
//! (activation checkpointing: full or selective), [`regather`] (with
//! sequence parallelism, the backward gathers a GEMM's input again instead
//! of storing it whole), [`collective_matmul`] (with sequence parallelism,
//! each gather → GEMM and GEMM → reduce-scatter cut into chunks that
//! overlap), [`partition`] (ZeRO
//! stages 0–3 and offload over flat buffers), and [`fuse`]
//! (memory-bound ops into kernel-IR kernels). [`accounting`] reads the
//! model-state bytes back out of a training graph; [`memory`] plans every
//! buffer's offset and the peak.

// Public items are not all documented yet: the lint is enforced crate by crate.
#![allow(missing_docs)]

pub mod accounting;
pub mod attention;
pub mod autodiff;
pub mod backward_clones;
pub mod collective_matmul;
pub mod cost;
pub mod fuse;
pub mod manager;
pub mod memory;
pub mod mixed_precision;
mod names;
pub mod optimizer;
pub mod partition;
pub mod pipeline;
pub mod planner;
mod rebuild;
pub mod recompute;
pub mod regather;
pub mod rewrite;
pub mod tiling;
pub mod training;
mod value_table;
