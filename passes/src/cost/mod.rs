//! Cost models of a planned step.

pub mod comm;
