//! zeroplan's graph passes.
//!
//! Each pass lives in its own file and turns one verified graph into
//! another. Today: the training step — [`mixed_precision`] (fp32 master
//! weights behind 16-bit working copies), [`autodiff`] (reverse mode), and
//! [`optimizer`] (clipping, AdamW, schedule, loss scaling, accumulation),
//! put together by [`training::training_graph`]. [`accounting`] reads the
//! model-state bytes back out of a training graph; [`memory`] plans every
//! buffer's offset and the peak.

pub mod accounting;
pub mod autodiff;
pub mod manager;
pub mod memory;
pub mod mixed_precision;
pub mod optimizer;
mod rebuild;
pub mod training;
