//! The plan IR: what the planner decided and what it predicts.

mod strategy;

pub use strategy::{DataParallel, Offload};
