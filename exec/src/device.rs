//! What the runner needs from the machine that executes a rank's program.
//!
//! A [`Device`] owns the rank's memory (the plan's arenas) and turns each
//! scheduled node into an instruction it can run; the runtime's `Runner`
//! walks the schedule — micro-batches, optimizer phase, deferred updates,
//! outputs — without knowing which device is behind it. The host CPU
//! (`zeroplan_backend_cpu::device::Host`: Cranelift kernels, GEMMs, host
//! routines) is one; `zeroplan_backend_cuda::device::Cuda` (NVRTC kernels,
//! cuBLAS/cuBLASLt GEMMs, multi-tensor AdamW) is another.

use std::collections::HashMap;

use zeroplan_ir::interp::Feeds;
use zeroplan_ir::plan::Program;
use zeroplan_ir::{Bindings, Graph, NodeIndex, Tensor, Value};

use crate::buffers::{Buf, Rank, SelectError};
use crate::comm::Communicator;
use crate::graphs::Capture;
use crate::nvme::Tier;

/// What an instruction may need besides its buffers.
pub struct Ctx<'a> {
    /// The tensors fed to the program's inputs for this micro-batch, by name.
    pub feeds: &'a Feeds,
    /// The run's random seed, which dropout's masks are drawn from.
    pub seed: u64,
    /// Dropout's counter word for this pass.
    pub offset: u64,
    /// This rank's handle on its data-parallel group.
    pub comm: &'a dyn Communicator,
    /// This rank's handle on its tensor-parallel group (its model replica).
    pub tensor: &'a dyn Communicator,
}

/// A scheduled node and what runs for it.
pub struct Step<I> {
    /// The graph node it runs.
    pub node: NodeIndex,
    /// Runs once per optimizer step (else once per micro-batch).
    pub optimizer: bool,
    /// `None` for a view of its operand's buffer and for params and states,
    /// and where a device moved the node's work elsewhere ([`Written`]).
    pub instr: Option<I>,
    /// Where the node's results are written.
    pub written: Written,
}

/// Where a node's results are written, once a device's passes may have run
/// several nodes as one instruction. The runner reads a value for a capture
/// or a finite check right after the instruction that writes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Written {
    /// By this step's instruction (with none: a view, a param or a state,
    /// whose bytes are already there).
    #[default]
    Here,
    /// Completely only once step `at`'s instruction ran, which took this
    /// node's work or part of it (an AdamW update in a multi-tensor launch,
    /// this step left empty; a bias gradient summed in its weight
    /// gradient's GEMM, this step's kernel computing the rest).
    At(usize),
    /// Never as the graph defines it: the device fused the work so that the
    /// result itself is not needed (a matmul's product inside a whole
    /// cuBLASLt epilogue: not written; with the bias added in the GEMM: the
    /// biased product in its place). A capture of it is refused.
    Never,
}

/// An instruction as a profile counts it.
pub trait Instruction {
    /// The kind it is counted under (e.g. `matmul 4096x384x384 Bᵀ ×1`).
    fn kind(&self) -> String;
    /// Floating-point operations it does (0 where not counted).
    fn flops(&self) -> f64;
    /// The buffers it reads (`false`) and writes (`true`). A device may run
    /// several nodes as one instruction (a GEMM with its epilogue kernel,
    /// one launch over many parameters), standing at one node's step and
    /// touching buffers that node does not name; the communication
    /// stream's hazards must see them. Empty: only its node's own.
    fn touches(&self) -> Vec<(Buf, bool)> {
        Vec::new()
    }
}

/// A loaded device and its schedule of instructions.
pub type Loaded<D> = (D, Vec<Step<<D as Device>::Instr>>);

/// A machine that runs one rank's program on the plan's buffers.
///
/// `Sync`: the rank's communication stream runs collectives from a thread
/// of its own while compute goes on, on buffers the runner keeps apart.
pub trait Device: Sized + Sync {
    /// The device's instruction: an [`crate::Instr`] over its compiled
    /// kernel, or what its step passes made of several.
    type Instr: Instruction + Sync;

    /// Allocates the program's arenas at the plan's sizes, every byte zero
    /// (the runner writes no `zeros` state), and selects the instruction of
    /// every node of `order` (the schedule).
    fn load(
        program: &Program,
        order: &[NodeIndex],
        bufs: &HashMap<Value, Buf>,
        bindings: &Bindings,
        rank: Rank,
    ) -> Result<Loaded<Self>, SelectError>;

    /// Runs one instruction on the device's memory; the error says why it
    /// could not (a missing feed, a failed collective or launch).
    fn run(&self, instr: &Self::Instr, cx: &Ctx) -> Result<(), String>;

    /// Whether `instr` can be recorded into a graph that later steps
    /// replay ([`crate::graphs`]): asynchronous work on the device's own
    /// streams, the same every step. The default: every instruction is
    /// launched eagerly.
    fn capture(&self, instr: &Self::Instr) -> Capture {
        let _ = instr;
        Capture::Breaks("this device launches every instruction eagerly".into())
    }

    /// Runs `instrs`, one segment of the capture plan (their steps in
    /// schedule order), with `cx`'s dropout counter word. A device with
    /// graphs records them as one on the first call with `key` and replays
    /// it on later ones — falling back to eager launches, with the reason
    /// logged, where recording is refused; the default launches each. An
    /// error names the instruction (its index in `instrs`) and why.
    fn run_segment(&self, key: usize, instrs: &[&Self::Instr], cx: &Ctx) -> Result<(), (usize, String)> {
        let _ = key;
        instrs.iter().enumerate().try_for_each(|(i, instr)| self.run(instr, cx).map_err(|e| (i, e)))
    }

    /// Whether the data-parallel and the tensor-parallel group's
    /// collectives may run at once, each on a thread (and communicator
    /// stream) of its own, as the plan's cost model times them. A device
    /// that answers `false` runs every collective on one thread, in
    /// schedule order. The default: they may.
    fn concurrent_groups(&self) -> bool {
        true
    }

    /// Drops the graphs recorded so far: the runner's plan changed, and
    /// its keys name other segments from now on.
    fn forget_graphs(&mut self) {}

    /// Waits until every instruction run so far has finished. A device that
    /// queues work (a GPU stream) returns from [`Device::run`] before the
    /// work is done; a profile times each instruction to here. A device
    /// that runs synchronously has nothing to wait for.
    fn synchronize(&self) -> Result<(), String> {
        Ok(())
    }

    /// `buf` as a tensor of `shape` (f64 or i64 values, as the interpreter's).
    fn read(&self, buf: Buf, shape: Vec<usize>) -> Tensor;
    /// Writes `t` into `buf`, rounded to the buffer's dtype.
    fn write(&self, buf: Buf, t: &Tensor);
    /// Copies `from`'s bytes into `to`, across places where they differ:
    /// how the runner commits a state update.
    fn copy(&self, from: Buf, to: Buf);
    /// Sets every element of `buf` to `value`: how the runner commits a
    /// constant state update (an accumulator's zeroing).
    fn fill(&self, buf: Buf, value: f64);

    /// Keeps the host buffers of `tier`'s slots there from now on: the
    /// device reaches their bytes in the slots, and `read`, `write`,
    /// `copy` and `fill` bring the slots they touch in from the file and
    /// back. The runner moves the slots along the schedule's windows. A
    /// device without an NVMe tier says so.
    fn attach_tier(&mut self, tier: Tier) -> Result<(), String> {
        drop(tier);
        Err("this device cannot keep states on NVMe yet (--nvme-dir): use --backend cpu".into())
    }

    /// The NVMe tier attached, if any.
    fn tier(&self) -> Option<&Tier> {
        None
    }
}

/// A device's rewrite of a rank's selected steps at load, as a graph pass
/// rewrites the graph: steps the device runs better together become one
/// instruction (a GEMM with its epilogue kernel, one launch over many
/// parameter updates), the steps whose work moved left without one and
/// marked [`Written::At`] or [`Written::Never`]. `Cx` is what the device
/// lends its passes: its memory, libraries and compilers.
pub trait StepPass<I, Cx> {
    /// The pass's name, as logs spell it.
    fn name(&self) -> &'static str;

    /// Rewrites `steps`, the schedule of `graph`'s nodes.
    fn run(&self, graph: &Graph, steps: &mut [Step<I>], cx: &mut Cx) -> Result<Rewrites, SelectError>;
}

/// What a [`StepPass`] did: how many groups it rewrote, and each candidate
/// it left as it was with the reason, for the load's debug log.
#[derive(Debug, Default)]
pub struct Rewrites {
    /// The groups of steps it rewrote into one instruction.
    pub taken: usize,
    /// `(what, why)`: a kernel or node name and why it kept its steps.
    pub left: Vec<(String, String)>,
}
