//! The host device: a rank's program on this machine's CPU.
//!
//! [`Host`] is the [`Device`] the [`Runner`] drives here: one arena per
//! place at the plan's size ([`arena`]), instructions selected per node
//! ([`select`]: Cranelift-compiled kernels through `zeroplan-backend-cpu`,
//! compiled once per program; GEMMs through the `gemm` crate; host routines
//! for embeddings, losses and layout) and executed in place ([`exec`]).
//! [`HostProgram`] is the runner on it, what the CLI, the benches and the
//! tests load.

mod access;
mod arena;
pub(crate) mod exec;
pub mod ops;
pub(crate) mod select;

use std::collections::HashMap;

use zeroplan_backend_cpu::KernelCompiler;
use zeroplan_ir::plan::Program;
use zeroplan_ir::{Bindings, NodeIndex, Tensor, Value};

pub use access::Access;
pub use arena::{Arena, Memory};
pub use select::{Instr, KernelCompile, Named};

use crate::runner::{Buf, Ctx, Device, Loaded, Rank, Runner, SelectError};

/// A plan's program loaded on the host, with its parameters and state.
pub type HostProgram = Runner<Host>;

/// This machine's CPU and one rank's memory on it.
pub struct Host {
    memory: Memory,
}

impl Device for Host {
    type Instr = Instr;

    fn load(
        program: &Program,
        order: &[NodeIndex],
        bufs: &HashMap<Value, Buf>,
        bindings: &Bindings,
        rank: Rank,
    ) -> Result<Loaded<Host>, SelectError> {
        let fail = |message: String| SelectError::Device(message);
        let mut compiler = KernelCompiler::new().map_err(|e| fail(e.to_string()))?;
        let steps = select::select(&program.graph, order, bufs, bindings, rank, &mut compiler)?;
        let size = |n: u64| usize::try_from(n).map_err(|_| fail(format!("{n} bytes do not fit this host")));
        let memory = Memory {
            device: Arena::new(size(program.arena_bytes)?).map_err(fail)?,
            host: Arena::new(size(program.host_arena_bytes)?).map_err(fail)?,
        };
        Ok((Host { memory }, steps))
    }

    fn run(&self, instr: &Instr, cx: &Ctx) -> Result<(), String> {
        exec::run(instr, &self.memory, cx)
    }

    fn read(&self, buf: Buf, shape: Vec<usize>) -> Tensor {
        exec::read_tensor(&self.memory, buf, shape)
    }

    fn write(&self, buf: Buf, t: &Tensor) {
        exec::write_tensor(&self.memory, buf, t)
    }

    fn copy(&self, from: Buf, to: Buf) {
        self.memory.copy(from, to)
    }

    fn fill(&self, buf: Buf, value: f64) {
        exec::fill(&self.memory, buf, value)
    }
}
