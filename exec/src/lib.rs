//! The seam between zeroplan's runtime and its backends, as Cranelift's
//! `TargetIsa` is between its mid-end and its targets.
//!
//! The runtime (`zeroplan-runtime`) walks a rank's schedule — micro-batches,
//! the optimizer phase, deferred updates, collectives on a communication
//! stream — without knowing what executes it; a backend (`zeroplan-backend-cpu`,
//! `zeroplan-backend-cuda`) executes it without knowing the schedule. What
//! both sides must agree on lives here:
//!
//! - [`buffers`]: every value's byte range in its place's arena, as the plan
//!   placed it ([`Buf`]), and this rank among the ranks ([`Rank`]);
//! - [`validate`]: the load-time gate every plan passes before a device runs
//!   it — buffers inside their arenas, launches inside their buffers;
//! - [`instr`]: the instructions a rank runs ([`Instr`]), the same for every
//!   device, generic over the device's compiled kernel;
//! - [`select`]: turning each scheduled node into one, with the device's
//!   [`KernelCompile`] for the row kernels;
//! - [`device`]: what a machine must do to run a rank ([`Device`]), the
//!   schedule it returns ([`Step`], [`Written`]) and the device passes that
//!   rewrite it at load ([`StepPass`]);
//! - [`graphs`]: which runs of the schedule a device may record once and
//!   replay (CUDA graphs), and what breaks a run ([`graphs::plan`]);
//! - [`comm`]: collectives between ranks ([`Communicator`]) and the store
//!   through which a group's ranks first meet ([`Rendezvous`]);
//! - [`nvme`]: the NVMe tier, host-placed states kept in files and brought
//!   into memory around their uses ([`nvme::Tier`], [`nvme::windows`]).

pub mod buffers;
pub mod comm;
pub mod device;
pub mod graphs;
pub mod instr;
pub mod nvme;
pub mod select;
pub mod validate;

pub use buffers::{Buf, Rank, SelectError};
pub use comm::{CommError, Communicator, Rendezvous};
pub use device::{Ctx, Device, Instruction, Loaded, Rewrites, Step, StepPass, Written};
pub use instr::{Access, Arith, Attention, Instr, MatMulShape};
pub use select::{KernelCompile, Named, select};
