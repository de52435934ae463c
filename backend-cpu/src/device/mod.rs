//! The host device: a rank's program on this machine's CPU.
//!
//! [`Host`] is the [`Device`] the runtime's `Runner` drives here: one arena
//! per place at the plan's size ([`arena`]), the instructions
//! `zeroplan_exec::select` picks, with this crate's Cranelift-compiled row
//! kernels, GEMMs through the `gemm` crate and the host routines
//! ([`crate::routines`]) for embeddings, losses and layout, executed in
//! place ([`exec`]).

mod arena;
pub mod exec;

use std::collections::HashMap;
use std::sync::Arc;

use zeroplan_exec::nvme::Tier;
use zeroplan_exec::{Buf, Ctx, Device, KernelCompile, Loaded, Named, Rank, SelectError, select};
use zeroplan_ir::kernel::Kernel;
use zeroplan_ir::plan::Program;
use zeroplan_ir::{Bindings, NodeIndex, Tensor, Value};

pub use arena::{Arena, Memory};

use crate::kernel::{CompiledKernel, KernelCompiler};

/// An instruction of the host: row kernels compiled by Cranelift.
pub type Instr = zeroplan_exec::Instr<Arc<CompiledKernel>>;

impl Named for CompiledKernel {
    fn name(&self) -> &str {
        CompiledKernel::name(self)
    }
}

impl KernelCompile for KernelCompiler {
    type Kernel = Arc<CompiledKernel>;

    fn compile(&mut self, kernel: &Kernel, dims: &[usize], _: &[Buf]) -> Result<Self::Kernel, String> {
        KernelCompiler::compile(self, kernel, dims).map_err(|e| e.to_string())
    }
}

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
        let steps = select(&program.graph, order, bufs, bindings, rank, &mut compiler)?;
        let size = |n: u64| usize::try_from(n).map_err(|_| fail(format!("{n} bytes do not fit this host")));
        let memory = Memory {
            device: Arena::new(size(program.arena_bytes)?).map_err(fail)?,
            host: Arena::new(size(program.host_arena_bytes)?).map_err(fail)?,
            nvme: None,
        };
        Ok((Host { memory }, steps))
    }

    fn run(&self, instr: &Instr, cx: &Ctx) -> Result<(), String> {
        exec::run(instr, &self.memory, cx)
    }

    fn read(&self, buf: Buf, shape: Vec<usize>) -> Tensor {
        self.held(&[(buf, false)], || exec::read_tensor(&self.memory, buf, shape))
    }

    fn write(&self, buf: Buf, t: &Tensor) {
        self.held(&[(buf, true)], || exec::write_tensor(&self.memory, buf, t))
    }

    fn copy(&self, from: Buf, to: Buf) {
        self.held(&[(from, false), (to, true)], || self.memory.copy(from, to))
    }

    fn fill(&self, buf: Buf, value: f64) {
        self.held(&[(buf, true)], || exec::fill(&self.memory, buf, value))
    }

    fn attach_tier(&mut self, tier: Tier) -> Result<(), String> {
        self.memory.nvme = Some(tier);
        Ok(())
    }

    fn tier(&self) -> Option<&Tier> {
        self.memory.nvme.as_ref()
    }
}

impl Host {
    /// Whether the guards around the rank's arenas are untouched: no
    /// instruction wrote outside them ([`Arena::guards_intact`]).
    pub fn guards_intact(&self) -> bool {
        self.memory.guards_intact()
    }

    /// Runs `access` with the NVMe tier slots its buffers overlap resident
    /// (`(buffer, written)`): reads and writes outside the step's schedule
    /// (loading, checkpoints, phase-end copies) reach the states in the file.
    fn held<T>(&self, bufs: &[(Buf, bool)], access: impl FnOnce() -> T) -> T {
        match &self.memory.nvme {
            Some(tier) => tier.held(bufs, access),
            None => access(),
        }
    }
}
