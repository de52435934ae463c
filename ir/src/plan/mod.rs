//! The plan IR: what the planner decided, what it predicts, and the
//! program the runtime executes.

mod file;
mod strategy;
mod summary;

pub use file::{
    Buffer, Candidate, ClusterDescription, PLAN_FORMAT, Plan, PlanFileError, Program, RunnerUp, StatesExceed, Strategy,
    Workload, offload_label,
};
pub use strategy::{Attention, DataParallel, Offload, OffloadTo};
pub use summary::{CollectiveTraffic, CommSummary, Launches, MemorySummary, Predicted, Reserve};
