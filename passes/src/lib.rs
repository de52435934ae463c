//! zeroplan's graph passes.
//!
//! Each pass lives in its own file behind one small trait (autodiff,
//! rewrite, fuse, recompute, partition, schedule, memory; see DESIGN.md).
//! None is written yet: the training-graph and optimisation issues add them.
