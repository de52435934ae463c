//! Running a plan's program: one rank's schedule on a [`Device`].
//!
//! [`Runner::load_rank`] gives every tensor the buffer the plan placed it
//! in ([`buffers`]), lets the device allocate its arenas at the plan's sizes
//! and select its instructions, and initialises parameters and optimizer
//! state as the reference interpreter does (same seed, same values; a
//! sharded flat buffer as this rank's slice). [`Runner::step`] then runs one
//! training step with the reference interpreter's semantics (see
//! `zeroplan_ir::interp`):
//!
//! - micro-batch `i` of `k` runs the forward and backward instructions in
//!   schedule order with dropout offset `(step·ranks + rank)·k + i` (so R
//!   ranks of k micro-batches draw the masks one rank of R·k would); the
//!   last micro-batch also runs the optimizer's instructions where the
//!   schedule puts them;
//! - updates the memory plan made in place need nothing; the others are
//!   copied into their target when their phase ends (the plan keeps the new
//!   value alive until then);
//! - collectives run on the rank's communication stream, data-parallel
//!   ones through its data group and tensor-parallel ones (Megatron-LM's
//!   `g`, sequence parallelism's gathers and reduce-scatters) through its
//!   tensor group; the compute that reads a result waits for it. The one
//!   stream issues both groups' collectives in schedule order on every
//!   member, so the two groups cannot wait on each other in a cycle: a
//!   rank only ever waits for peers to reach a point of the schedule it
//!   has reached itself. Ranks may load different plan files,
//!   so before the first step every group checks that its members' steps
//!   make the same collective calls ([`agree`]); a rank that fails to load
//!   or to step aborts its groups, so no peer waits for it.
//!
//! Nothing is allocated per step besides small temporaries of the device's
//! routines, so the arena's size is the device memory the plan predicted.
//!
//! With an NVMe tier ([`Runner::load_tiered`], `train --nvme-dir`) the
//! host-placed params and states live in a file; each is brought in before
//! its window of the schedule opens (the next one read ahead while the
//! current one is in use) and written back and released after it closes
//! ([`tier`]).

mod agree;
mod graphs;
mod profile;
mod stream;
mod tier;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use zeroplan_ir::interp::{Feeds, InitRank, Interpreter, Rounding, State, StepOutputs};
use zeroplan_ir::plan::Program;
use zeroplan_ir::{Bindings, Graph, Init, NodeIndex, Op, Phase, Place, Tensor, Value};

/// The arenas of a rank, in `Runner::high_water`'s order.
const PLACES: [Place; 2] = [Place::Device, Place::Host];

pub use profile::{Entry as ProfileEntry, Profile, Span, Track};
use stream::{Access, CommStreams};
use zeroplan_exec::buffers::{concrete, constant_update};
pub use zeroplan_exec::graphs::GraphMode;
use zeroplan_exec::graphs::{Masks, Pass};
use zeroplan_exec::validate;
pub use zeroplan_exec::{Buf, Ctx, Device, Instruction, Loaded, Rank, SelectError, Step, Written};

use crate::comm::{Communicator, Groups, InProcess};
pub use zeroplan_exec::nvme::Nvme;
use zeroplan_exec::nvme::Windows;

/// Why a program could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error("{0}")]
    Load(String),
    #[error("node `{node}`: {message}")]
    Run { node: String, message: String },
    #[error("initialising the parameters: {0}")]
    Init(#[from] zeroplan_ir::interp::InterpError),
    /// The NVMe tier failed: a transfer, a vanished directory, a full disk.
    #[error("{0}")]
    Tier(String),
    #[error("{count} micro-batches given, the program accumulates {expected}")]
    MicroBatches { count: usize, expected: u64 },
    /// Before the first step: a peer's program would call other collectives
    /// than this rank's ([`agree`]), so neither runs.
    #[error(
        "the ranks' programs differ: {0}: every rank must load the same plan (`zeroplan compile` writes one for \
         all ranks)"
    )]
    Diverged(String),
    #[error("state `{name}`: {message}")]
    State { name: String, message: String },
    #[error(
        "the schedule runs optimizer node `{reader}` before `{update}`, whose micro-batch update it must see: \
         the plan's order is not executable"
    )]
    Order { reader: String, update: String },
    /// With [`Runner::set_finite_checks`]: the first value of the step that
    /// is not finite.
    #[error("`{node}` is the first value that is not finite ({what}, micro-batch {micro_batch})")]
    NonFinite { node: String, micro_batch: usize, what: &'static str },
}

/// An update that takes effect when its phase ends: a copy of a value the
/// plan did not compute in place, or a constant written into its target.
struct DeferredUpdate {
    what: Commit,
    to: Buf,
    optimizer: bool,
}

enum Commit {
    Copy(Buf),
    Fill(f64),
}

/// A plan's program loaded on a device, with its parameters and state.
pub struct Runner<D: Device> {
    program: Program,
    bindings: Bindings,
    device: D,
    steps: Vec<Step<D::Instr>>,
    bufs: HashMap<Value, Buf>,
    updates: Vec<DeferredUpdate>,
    micro_batches: u64,
    seed: u64,
    steps_done: u64,
    /// Values copied out right after they are computed, per micro-batch.
    captures: Vec<Value>,
    /// The highest byte of the device and host arenas any executed node's
    /// output reached, and each step's own (fixed by the plan, so computed
    /// once at load).
    high_water: [usize; 2],
    step_ends: Vec<[usize; 2]>,
    /// What each step reads and writes (for the communication stream).
    access: Vec<Access>,
    /// Per-instruction timings, while profiling is on.
    profile: Option<Profile>,
    /// This rank's handles on its data-parallel and tensor-parallel groups.
    groups: Groups,
    /// Check every computed value for NaN and infinities (slow: a diagnosis).
    check_finite: bool,
    /// The outputs a step reads back (`None`: all). A masked-LM's logits are
    /// half a gigabyte at MiniLM's size; a trainer wants only the scalars.
    fetches: Option<BTreeSet<String>>,
    /// With an NVMe tier: each slot's window over the schedule.
    windows: Option<Windows>,
    /// Whether to record and replay graphs ([`Runner::set_graphs`]).
    graph_mode: GraphMode,
    /// The capture plan, made at the next step when graphs are wanted
    /// (`None` again whenever what it depends on changes).
    graphs: Option<graphs::Graphs>,
    /// Whether the group's ranks have agreed on their collectives ([`agree`]).
    agreed: bool,
}

/// What a step returns: [`StepOutputs`] as the interpreter gives them, and
/// the captured values (per micro-batch, by value name).
pub struct StepResult {
    pub outputs: StepOutputs,
    pub captured: Vec<BTreeMap<String, Tensor>>,
}

impl<D: Device> Runner<D> {
    /// Loads a single-rank `program`: arenas, buffers, kernels, and the
    /// initial state from `seed`.
    pub fn load(program: Program, seed: u64) -> Result<Runner<D>, RunError> {
        Runner::load_with(program, seed, &State::new())
    }

    /// As [`Runner::load`], with the params and states in `given` (by name)
    /// taken from there instead of drawn: loading a checkpoint this way skips
    /// initialising what it would overwrite.
    pub fn load_with(program: Program, seed: u64, given: &State) -> Result<Runner<D>, RunError> {
        let alone = InProcess::group(1).pop().expect("a group of one");
        Runner::load_rank_with(program, seed, Arc::new(alone), given)
    }

    /// Loads `program` as rank `comm.rank()` of a data-parallel group: its
    /// shards are its slices of the flat buffers, and its collectives go
    /// through `comm`. Every rank starts from the same `seed`.
    pub fn load_rank(program: Program, seed: u64, comm: Arc<dyn Communicator>) -> Result<Runner<D>, RunError> {
        Runner::load_rank_with(program, seed, comm, &State::new())
    }

    /// As [`Runner::load_rank`], with the params and states in `given`.
    pub fn load_rank_with(
        program: Program,
        seed: u64,
        comm: Arc<dyn Communicator>,
        given: &State,
    ) -> Result<Runner<D>, RunError> {
        Runner::load_groups_with(program, seed, Groups::data_parallel(comm), given)
    }

    /// Loads `program` as one rank of tensor × data parallelism: tensor rank
    /// `groups.tensor.rank()` (its Megatron-LM shards, drawn as slices of
    /// the whole parameters, and its vocabulary slice) of data rank
    /// `groups.data.rank()` (its ZeRO shards), with the params and states in
    /// `given` taken from there.
    ///
    /// A tensor rank draws its own dropout masks at the sites the builder
    /// marked sharded ([`Rank::specialise`]: Megatron-LM's model-parallel RNG
    /// tracker), so its streams are rewritten here, before instruction
    /// selection; replicated sites keep theirs.
    pub fn load_groups_with(program: Program, seed: u64, groups: Groups, given: &State) -> Result<Runner<D>, RunError> {
        Runner::load_tiered(program, seed, groups, given, None)
    }

    /// As [`Runner::load_groups_with`], with the host-placed params and
    /// states (fp32 masters, AdamW's moments, offloaded parameter shards)
    /// kept on `nvme`'s tier rather than in the host arena, when given.
    ///
    /// A rank that fails to load aborts its groups, so that peers already
    /// running end their first step with an error instead of waiting for it.
    pub fn load_tiered(
        program: Program,
        seed: u64,
        groups: Groups,
        given: &State,
        nvme: Option<&Nvme>,
    ) -> Result<Runner<D>, RunError> {
        let peers = groups.clone();
        Runner::load_unaborted(program, seed, groups, given, nvme).inspect_err(|_| peers.abort())
    }

    fn load_unaborted(
        mut program: Program,
        seed: u64,
        groups: Groups,
        given: &State,
        nvme: Option<&Nvme>,
    ) -> Result<Runner<D>, RunError> {
        let (data, tensor) = (&groups.data, &groups.tensor);
        let rank =
            Rank { index: data.rank(), ranks: data.ranks(), tensor: tensor.rank(), tensor_ranks: tensor.ranks() };
        rank.specialise(&mut program.graph).map_err(RunError::Load)?;
        let g = &program.graph;
        let bindings: Bindings = [("batch".to_string(), program.batch), ("seq".to_string(), program.seq)].into();
        let order = g.topo_order();
        // The load-time gate (`zeroplan_exec::validate`): nothing reaches a device unchecked.
        let bufs = validate::buffers(&program, &order, &bindings, rank)?;
        let (device, steps) = D::load(&program, &order, &bufs, &bindings, rank)?;
        let micro_batches = crate::reference::micro_batches(g);
        let updates = deferred_updates(g, &order, &bufs)?;
        let mut runner = Runner {
            bindings,
            device,
            steps,
            bufs,
            updates,
            micro_batches,
            seed,
            steps_done: 0,
            captures: Vec::new(),
            high_water: [0, 0],
            step_ends: Vec::new(),
            access: Vec::new(),
            profile: None,
            fetches: None,
            check_finite: false,
            groups,
            program,
            windows: None,
            graph_mode: GraphMode::default(),
            graphs: None,
            agreed: false,
        };
        runner.step_ends = runner.steps.iter().map(|s| PLACES.map(|place| runner.end_in(s.node, place))).collect();
        runner.access = accesses(&runner.program.graph, &runner.steps, &runner.bufs);
        if let Some(nvme) = nvme {
            runner.windows = tier::attach(
                &mut runner.device,
                nvme,
                rank,
                &runner.program.graph,
                &runner.bufs,
                &runner.steps,
                &runner.access,
            )?;
        }
        let init_rank = InitRank { data: Some(rank.index as u64), tensor: Some(rank.tensor as u64) };
        // A fresh arena reads as zero (`Device::load`), so the `zeros`
        // states (AdamW's moments, the counters) need no writing, except
        // where the NVMe tier holds states in files it may have reused.
        let fresh_zeros = runner.device.tier().is_none();
        let interp = Interpreter::new(Rounding::Native, seed);
        let skip = |name: &str, init: &Init| given.contains_key(name) || (fresh_zeros && *init == Init::Zeros);
        interp.init_each(&runner.program.graph, init_rank, skip, |name, t| runner.write_state(name, &t))?;
        runner.set_state(given)?;
        Ok(runner)
    }

    /// The NVMe tier's state: an error if a transfer failed or its
    /// directory vanished. Checked around every step and after every state
    /// write; a checkpoint save checks it after reading the state, so a
    /// failed read never becomes a checkpoint.
    pub fn check_tier(&self) -> Result<(), RunError> {
        match self.device.tier() {
            Some(t) => t.settle().and_then(|()| t.check()).map_err(RunError::Tier),
            None => Ok(()),
        }
    }

    /// The NVMe tier's measured high water: the most bytes of its slots in
    /// memory (or in flight) at once; `None` without a tier.
    pub fn tier_high_water_bytes(&self) -> Option<u64> {
        self.device.tier().map(|t| t.high_water_bytes() as u64)
    }

    /// The NVMe tier's slot bytes in memory (or in flight) now; between
    /// steps, after [`Runner::check_tier`] (which waits for the writes), 0.
    pub fn tier_resident_bytes(&self) -> Option<u64> {
        self.device.tier().map(|t| t.resident_bytes() as u64)
    }

    /// The bytes the NVMe tier keeps (its file's size); `None` without one.
    pub fn tier_bytes(&self) -> Option<u64> {
        self.device.tier().map(|t| t.bytes() as u64)
    }

    /// The NVMe tier's state file, if any.
    pub fn tier_file(&self) -> Option<std::path::PathBuf> {
        self.device.tier().map(|t| t.path())
    }

    /// The device the program runs on: its own counts and settings, and
    /// the host's arena guards for the plan-mutation checks.
    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Optimizer steps run so far.
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// Continues a run from a checkpoint of `steps` steps: the next step
    /// draws the dropout masks step `steps + 1` of an uninterrupted run
    /// would. The state itself comes from [`Runner::set_state`].
    pub fn set_steps_done(&mut self, steps: u64) {
        self.steps_done = steps;
    }

    /// Micro-batches per step.
    pub fn micro_batches(&self) -> u64 {
        self.micro_batches
    }

    /// Copies `values` out of the arena as soon as each is computed (their
    /// buffers are reused later in the step), to [`StepResult::captured`].
    /// A value the device never writes (a matmul product that a CUDA rank
    /// fuses into a whole cuBLASLt epilogue) is an error naming it.
    pub fn capture(&mut self, values: Vec<Value>) -> Result<(), RunError> {
        let g = &self.program.graph;
        for v in &values {
            if self.steps.iter().any(|s| s.node == v.node && s.written == Written::Never) {
                return Err(RunError::State {
                    name: g.value_ref(*v),
                    message: "this device never writes it (its work is fused into another instruction, which does \
                              not need it): capture the fused instruction's output, or run on the host backend"
                        .into(),
                });
            }
        }
        self.captures = values;
        self.replan();
        Ok(())
    }

    /// Makes [`Runner::step`] read back only the outputs named (all of
    /// them until this is called); an unknown name is an error listing the
    /// program's outputs.
    pub fn fetch<S: AsRef<str>>(&mut self, names: &[S]) -> Result<(), RunError> {
        let outputs = &self.program.graph.outputs;
        let mut fetches = BTreeSet::new();
        for name in names.iter().map(AsRef::as_ref) {
            if !outputs.iter().any(|(o, _)| o == name) {
                let known: Vec<&str> = outputs.iter().map(|(o, _)| o.as_str()).collect();
                return Err(RunError::State {
                    name: name.to_string(),
                    message: format!("not an output of the program; it has {}", known.join(", ")),
                });
            }
            fetches.insert(name.to_string());
        }
        self.fetches = Some(fetches);
        Ok(())
    }

    /// Makes [`Runner::step`] check every value as it is computed and fail
    /// with [`RunError::NonFinite`] at the first NaN or infinity (masked
    /// attention scores are −∞ by design and pass), as PyTorch's anomaly
    /// detection does: where a diverging run went wrong. Collectives then
    /// run one at a time.
    pub fn set_finite_checks(&mut self, on: bool) {
        self.check_finite = on;
        self.replan();
    }

    /// Starts timing every instruction (from an empty profile), or stops.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(Profile::default);
        self.replan();
    }

    /// Whether a device with graphs (CUDA) records runs of the schedule
    /// once and replays them on later steps ([`zeroplan_exec::graphs`]);
    /// `Auto` by default. Profiling, finite checks and an NVMe tier launch
    /// every instruction eagerly whatever the mode: they need the host
    /// between instructions. A device without graphs ignores it.
    pub fn set_graphs(&mut self, mode: GraphMode) {
        self.graph_mode = mode;
        self.replan();
    }

    /// The capture plan the next step runs with (`None`: every instruction
    /// eagerly), made now if it is due.
    pub fn capture_plan(&mut self) -> Option<&zeroplan_exec::graphs::CapturePlan> {
        self.plan_graphs();
        self.graphs.as_ref().map(|g| &g.plan)
    }

    /// Drops the capture plan and the device's graphs: what they were made
    /// for changed.
    fn replan(&mut self) {
        if self.graphs.take().is_some() {
            self.device.forget_graphs();
        }
    }

    /// Makes the capture plan if graphs are wanted and none is made.
    fn plan_graphs(&mut self) {
        let eager = self.profile.is_some() || self.check_finite || self.windows.is_some();
        if self.graph_mode == GraphMode::Off || self.graphs.is_some() {
            return;
        }
        if eager {
            if self.graph_mode == GraphMode::On {
                tracing::warn!(
                    "--cuda-graphs on: profiling, finite checks or the NVMe tier launch every instruction \
                                eagerly"
                );
            }
            return;
        }
        let g = &self.program.graph;
        // A captured value is read after the step that writes it.
        let mut read_after = vec![false; self.steps.len()];
        for v in &self.captures {
            for (at, s) in self.steps.iter().enumerate().filter(|(_, s)| s.node == v.node) {
                match s.written {
                    Written::Here => read_after[at] = true,
                    Written::At(by) => read_after[by] = true,
                    Written::Never => {}
                }
            }
        }
        let updates_after =
            self.updates.iter().any(|u| !u.optimizer).then(|| self.steps.iter().rposition(|s| !s.optimizer)).flatten();
        let host = graphs::HostWork { read_after: &read_after, updates_after };
        self.graphs = Some(graphs::plan(&self.device, g, &self.steps, &self.access, self.micro_batches, &host));
    }

    /// Empties the profile, keeping profiling on: the steps before (the
    /// first, which loads library kernels lazily and runs cuBLASLt's
    /// heuristics) are left out of what it shows.
    pub fn restart_profile(&mut self) {
        if let Some(profile) = &mut self.profile {
            *profile = Profile::default();
        }
    }

    /// The timings since profiling was turned on or restarted; `None` when it is off.
    pub fn profile(&self) -> Option<&Profile> {
        self.profile.as_ref()
    }

    /// Every param and state node's value, by name.
    pub fn state(&self) -> State {
        let g = &self.program.graph;
        g.node_indices()
            .filter(|&n| matches!(g.node(n).op, Op::Param { .. } | Op::State { .. }))
            .map(|n| (g.node(n).name.to_string(), self.read(Value { node: n, output: 0 })))
            .collect()
    }

    /// The parameters alone, by name.
    pub fn weights(&self) -> BTreeMap<String, Tensor> {
        let g = &self.program.graph;
        g.params().into_iter().map(|n| (g.node(n).name.to_string(), self.read(Value { node: n, output: 0 }))).collect()
    }

    /// Overwrites params and states by name; each must exist and match its shape.
    pub fn set_state(&self, state: &State) -> Result<(), RunError> {
        for (name, t) in state {
            self.write_state(name, t)?;
        }
        self.check_tier()
    }

    /// Writes one parameter or state, checked against the program; the
    /// NVMe tier's transfers are checked by the caller, once for many.
    fn write_state(&self, name: &str, t: &Tensor) -> Result<(), RunError> {
        let g = &self.program.graph;
        let fail = |message: String| RunError::State { name: name.to_string(), message };
        let n = g.node_by_name(name).ok_or_else(|| fail("the program has no such parameter or state".into()))?;
        if !matches!(g.node(n).op, Op::Param { .. } | Op::State { .. }) {
            return Err(fail("not a parameter or state".into()));
        }
        let v = Value { node: n, output: 0 };
        let want = concrete(&g.value_type(v).shape, &self.bindings).unwrap_or_default();
        if t.shape() != want.as_slice() {
            return Err(fail(format!("shape {:?}, the program's is {want:?}", t.shape())));
        }
        self.device.write(self.bufs[&v], t);
        Ok(())
    }

    fn read(&self, v: Value) -> Tensor {
        read_value(&self.device, &self.program.graph, &self.bindings, &self.bufs, v)
    }

    /// One optimizer step over `micro_batches` (as many as the program
    /// accumulates). Collectives run on the rank's communication stream
    /// ([`stream`]), overlapping the compute that does not depend on them.
    /// Before the first, the ranks of each group check that their programs
    /// call the same collectives ([`agree`]). A step that fails aborts the
    /// rank's groups: its peers end with an error rather than wait for it.
    pub fn step(&mut self, micro_batches: &[Feeds]) -> Result<StepResult, RunError> {
        let result = self.step_unaborted(micro_batches);
        if result.is_err() {
            self.groups.abort();
        }
        result
    }

    /// Checks with every peer that its program calls the collectives this
    /// rank's does, in the same order ([`agree`]).
    fn agree(&self) -> Result<(), RunError> {
        let (g, bufs) = (&self.program.graph, &self.bufs);
        let steps = self.steps.iter().map(|s| (s.node, s.optimizer));
        let calls = agree::calls(g, steps, |v| bufs.get(&v).map_or(0, |b| b.len as u64));
        for (comm, group) in [(&self.groups.data, agree::Group::Data), (&self.groups.tensor, agree::Group::Tensor)] {
            agree::agree(comm.as_ref(), group, &calls, self.micro_batches).map_err(|e| match e {
                agree::Disagreement::Differs(message) => RunError::Diverged(message),
                agree::Disagreement::Comm(e) => {
                    RunError::Load(format!("agreeing with the peers on the step's collectives: {e}"))
                }
            })?;
        }
        Ok(())
    }

    fn step_unaborted(&mut self, micro_batches: &[Feeds]) -> Result<StepResult, RunError> {
        let k = micro_batches.len();
        if k as u64 != self.micro_batches {
            return Err(RunError::MicroBatches { count: k, expected: self.micro_batches });
        }
        if !self.agreed {
            self.agree()?;
            self.agreed = true;
        }
        self.check_tier()?;
        self.plan_graphs();
        let Runner {
            program,
            bindings,
            device,
            steps,
            bufs,
            updates,
            seed,
            steps_done,
            captures,
            high_water,
            graphs,
            ..
        } = self;
        let tier = device.tier().zip(self.windows.as_ref());
        let (step_ends, access, groups) = (&self.step_ends, &self.access, &self.groups);
        let (comm, tensor) = (groups.data.as_ref(), groups.tensor.as_ref());
        let (profile, fetches, check_finite) = (&mut self.profile, &self.fetches, self.check_finite);
        let g = &program.graph;
        let read = |v: Value| read_value(device, g, bindings, bufs, v);
        let fetched = |name: &str| fetches.as_ref().is_none_or(|f| f.contains(name));
        let phase = |v: &Value| g.node(v.node).phase;
        // A param or state output (fp16's `loss_scale`) is the value the
        // micro-batch ran with, as the interpreter gives it: read before the
        // micro-batch runs, since the optimizer updates it in place.
        let persistent = |v: &Value| matches!(g.node(v.node).op, Op::Param { .. } | Op::State { .. });
        let micro_batch_outputs = |state: bool| {
            g.outputs
                .iter()
                .filter(move |(name, v)| phase(v) != Phase::Optimizer && persistent(v) == state && fetched(name))
        };
        let fail = |at: usize, message: String| {
            // The peers must not wait for this rank's next collective.
            groups.abort();
            RunError::Run { node: g.node(steps[at].node).name.to_string(), message }
        };
        // The nodes whose work a device moved into each step's instruction.
        let mut moved_here: Vec<Vec<NodeIndex>> = vec![Vec::new(); steps.len()];
        for s in steps.iter() {
            if let Written::At(at) = s.written {
                moved_here[at].push(s.node);
            }
        }
        let mut out = StepResult { outputs: StepOutputs::default(), captured: Vec::new() };
        let last_micro_batch_step = steps.iter().rposition(|s| !s.optimizer);
        std::thread::scope(|scope| -> Result<(), RunError> {
            let steps_ref: &[Step<D::Instr>] = steps;
            let collective = move |at: usize| steps_ref[at].instr.as_ref().expect("a collective has an instruction");
            let mut stream = CommStreams::start(scope, &*device, collective, comm, tensor, *seed);
            let finish = |done: Vec<stream::Done>, profile: &mut Option<Profile>| -> Result<(), RunError> {
                for d in done {
                    d.result.map_err(|message| fail(d.at, message))?;
                    if let (Some(p), Some(instr)) = (profile.as_mut(), &steps[d.at].instr) {
                        p.record(instr, steps[d.at].node, d.track, d.started, d.took);
                    }
                }
                Ok(())
            };
            for (i, feeds) in micro_batches.iter().enumerate() {
                let last = i + 1 == k;
                let pass = if last { Pass::Last } else { Pass::MicroBatch };
                // Steps before this one were launched with their segment's graph.
                let mut launched_until = 0;
                // Dropout counts micro-batches over the whole group, so R ranks of
                // k micro-batches draw the masks one rank of R·k would.
                let global = steps_done.wrapping_mul(comm.ranks() as u64) + comm.rank() as u64;
                let cx = Ctx { feeds, seed: *seed, offset: global.wrapping_mul(k as u64) + i as u64, comm, tensor };
                let mut captured = BTreeMap::new();
                let mut results: BTreeMap<String, Tensor> =
                    micro_batch_outputs(true).map(|(name, v)| (name.clone(), read(*v))).collect();
                if let Some((t, w)) = tier {
                    tier::start(t, w);
                }
                for (at, step) in steps.iter().enumerate() {
                    if step.optimizer && !last {
                        continue;
                    }
                    if let Some((t, w)) = tier {
                        tier::open(t, w, at).map_err(|message| fail(at, message))?;
                    }
                    for (water, end) in high_water.iter_mut().zip(step_ends[at]) {
                        *water = (*water).max(end);
                    }
                    if let Some(instr) = &step.instr {
                        let op = &g.node(step.node).op;
                        if on_stream(op) {
                            finish(stream.submit(at, op.is_tensor_collective(), &access[at], feeds), profile)?;
                            if check_finite {
                                finish(stream.drain(), profile)?;
                            }
                        } else if at < launched_until {
                            // Queued with its segment.
                        } else if let Some(key) =
                            graphs.as_ref().and_then(|gr| gr.starting_at(pass, at)).map(|(s, ..)| s.key)
                        {
                            let gr = graphs.as_mut().expect("a capture plan");
                            let first = gr.first_launch(key);
                            let (segment, members, joined) = gr.starting_at(pass, at).expect("the segment");
                            finish(stream.wait_for(joined), profile)?;
                            if first {
                                // The device may record: nothing else may queue work meanwhile.
                                finish(stream.drain(), profile)?;
                            }
                            let offset =
                                if segment.masks == Masks::Optimizer { cx.offset - i as u64 } else { cx.offset };
                            let cx = Ctx { offset, ..cx };
                            let instrs: Vec<&D::Instr> =
                                members.iter().filter_map(|&m| steps[m].instr.as_ref()).collect();
                            device.run_segment(key, &instrs, &cx).map_err(|(j, message)| fail(members[j], message))?;
                            launched_until = segment.steps.end;
                        } else {
                            finish(stream.wait_for(&access[at]), profile)?;
                            let cx =
                                Ctx { offset: if step.optimizer { cx.offset - i as u64 } else { cx.offset }, ..cx };
                            let start = profile.is_some().then(std::time::Instant::now);
                            device.run(instr, &cx).map_err(|message| fail(at, message))?;
                            if let (Some(p), Some(start)) = (profile.as_mut(), start) {
                                // A queued instruction's time is its run, not its launch.
                                device.synchronize().map_err(|message| fail(at, message))?;
                                p.record(instr, step.node, Track::Compute, start, start.elapsed());
                            }
                        }
                        if check_finite {
                            let own = (step.written == Written::Here).then_some(&step.node);
                            for &n in own.into_iter().chain(&moved_here[at]) {
                                if let Some(what) = non_finite(g, n, read) {
                                    groups.abort();
                                    let node = g.node(n).name.to_string();
                                    return Err(RunError::NonFinite { node, micro_batch: i, what });
                                }
                            }
                        }
                    }
                    if let Some((t, w)) = tier {
                        let closing = tier::closing(w, at, last);
                        if !closing.is_empty() {
                            let slots = Access {
                                reads: Vec::new(),
                                writes: closing.iter().map(|&s| t.slots()[s].buf).collect(),
                            };
                            finish(stream.wait_for(&slots), profile)?;
                            closing.into_iter().for_each(|s| t.evict(s));
                        }
                    }
                    let here =
                        |n: NodeIndex| (n == step.node && step.written == Written::Here) || moved_here[at].contains(&n);
                    let wanted: Vec<&Value> = captures.iter().filter(|v| here(v.node)).collect();
                    if !wanted.is_empty() {
                        finish(stream.drain(), profile)?;
                    }
                    for &v in wanted {
                        captured.insert(g.value_ref(v), read(v));
                    }
                    if Some(at) == last_micro_batch_step {
                        // The micro-batch's updates take effect.
                        finish(stream.drain(), profile)?;
                        apply_updates(device, updates, false);
                    }
                }
                finish(stream.drain(), profile)?;
                results.extend(micro_batch_outputs(false).map(|(name, v)| (name.clone(), read(*v))));
                out.outputs.micro_batches.push(results);
                out.captured.push(captured);
            }
            finish(stream.drain(), profile)
        })?;
        apply_updates(device, updates, true);
        if let Some(t) = device.tier() {
            t.check().map_err(RunError::Tier)?;
        }
        out.outputs.optimizer = g
            .outputs
            .iter()
            .filter(|(name, v)| phase(v) == Phase::Optimizer && fetched(name))
            .map(|(name, v)| (name.clone(), read(*v)))
            .collect();
        *steps_done += 1;
        Ok(out)
    }

    /// The measured peak: the highest byte of the device arena that a
    /// buffer written so far reaches (parameters and state count from the
    /// start). Equal to the plan's arena size once every tensor has been
    /// written, which shows the plan's offsets are the ones in use.
    pub fn high_water_bytes(&self) -> u64 {
        self.measured_peak(Place::Device)
    }

    /// As [`Runner::high_water_bytes`], for the host arena (offloaded
    /// optimizer state and parameters): against the plan's `host_arena_bytes`.
    pub fn host_high_water_bytes(&self) -> u64 {
        self.measured_peak(Place::Host)
    }

    fn measured_peak(&self, place: Place) -> u64 {
        let g = &self.program.graph;
        let persistent = g
            .node_indices()
            .filter(|&n| matches!(g.node(n).op, Op::Param { .. } | Op::State { .. }))
            .map(|n| self.end_in(n, place))
            .max()
            .unwrap_or(0);
        let i = PLACES.iter().position(|&p| p == place).expect("a place");
        self.high_water[i].max(persistent) as u64
    }

    /// The end of the highest buffer in `place` among `n`'s outputs.
    fn end_in(&self, n: NodeIndex, place: Place) -> usize {
        let outputs = self.program.graph.node(n).outputs.len() as u32;
        (0..outputs)
            .map(|output| self.bufs[&Value { node: n, output }])
            .filter(|b| b.place == place)
            .map(|b| b.offset + b.bytes())
            .max()
            .unwrap_or(0)
    }
}

/// Whether `op` runs on the communication stream: every collective, of
/// either group. A sequence-parallel chunk's gather or reduce-scatter
/// (`collective-matmul`) runs there while the compute thread multiplies
/// the chunk before it; a collective whose result the next node reads
/// (a tensor all-reduce) makes that node wait, as a data-parallel one
/// does. One thread issues both groups' collectives in schedule order, so
/// every member of a group calls its collectives in the same order.
fn on_stream(op: &Op) -> bool {
    op.is_collective()
}

/// What is wrong with `n`'s outputs, if any holds a NaN or an infinity
/// (but an attention mask's −∞, which softmax turns into zeros).
fn non_finite(g: &Graph, n: NodeIndex, read: impl Fn(Value) -> Tensor) -> Option<&'static str> {
    let node = g.node(n);
    for output in 0..node.outputs.len() as u32 {
        let t = read(Value { node: n, output });
        let Some(values) = t.floats() else { continue };
        if values.iter().any(|x| x.is_nan()) {
            return Some("NaN");
        }
        if values.iter().any(|x| x.is_infinite()) && !matches!(node.op, Op::AttentionMask) {
            return Some("infinity");
        }
    }
    None
}

/// `v`'s buffer as a tensor of its concrete shape.
fn read_value<D: Device>(device: &D, g: &Graph, bindings: &Bindings, bufs: &HashMap<Value, Buf>, v: Value) -> Tensor {
    let shape = concrete(&g.value_type(v).shape, bindings).unwrap_or_default();
    device.read(bufs[&v], shape)
}

/// Makes the deferred updates of the micro-batch (or, with `optimizer`,
/// the optimizer phase) take effect.
fn apply_updates<D: Device>(device: &D, updates: &[DeferredUpdate], optimizer: bool) {
    for u in updates.iter().filter(|u| u.optimizer == optimizer) {
        match u.what {
            Commit::Copy(from) => device.copy(from, u.to),
            Commit::Fill(value) => device.fill(u.to, value),
        }
    }
}

/// What each step reads and writes: its operands' and outputs' buffers,
/// and whatever else its instruction touches ([`Instruction::touches`]:
/// a device instruction standing for several nodes), for the
/// communication stream's hazards.
fn accesses<I: Instruction>(g: &Graph, steps: &[Step<I>], bufs: &HashMap<Value, Buf>) -> Vec<Access> {
    steps
        .iter()
        .map(|s| {
            let mut access = Access {
                reads: g.operands(s.node).iter().map(|v| bufs[v]).collect(),
                writes: (0..g.node(s.node).outputs.len() as u32)
                    .map(|output| bufs[&Value { node: s.node, output }])
                    .collect(),
            };
            for (b, write) in s.instr.as_ref().map(Instruction::touches).unwrap_or_default() {
                let list = if write { &mut access.writes } else { &mut access.reads };
                if !list.contains(&b) {
                    list.push(b);
                }
            }
            access
        })
        .collect()
}

/// The updates the memory plan did not make in place, and a check that the
/// schedule lets them take effect where the interpreter's semantics say.
fn deferred_updates(
    g: &zeroplan_ir::Graph,
    order: &[NodeIndex],
    bufs: &HashMap<Value, Buf>,
) -> Result<Vec<DeferredUpdate>, RunError> {
    let position: HashMap<NodeIndex, usize> = order.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let micro_batch_end = order.iter().rposition(|&n| g.node(n).phase != Phase::Optimizer).unwrap_or(0);
    let mut deferred = Vec::new();
    for (target, v) in &g.updates {
        let (from, to) = (bufs[v], bufs[&Value { node: *target, output: 0 }]);
        let optimizer = g.node(v.node).phase == Phase::Optimizer;
        if let Some(value) = constant_update(g, v.node) {
            deferred.push(DeferredUpdate { what: Commit::Fill(value), to, optimizer });
            continue;
        }
        if !optimizer {
            // Optimizer readers of the target must see the micro-batch's update.
            let done = if from == to { position[&v.node] } else { micro_batch_end };
            let early =
                g.users(*target).iter().copied().find(|r| g.node(*r).phase == Phase::Optimizer && position[r] < done);
            if let Some(r) = early {
                return Err(RunError::Order {
                    reader: g.node(r).name.to_string(),
                    update: g.node(v.node).name.to_string(),
                });
            }
        }
        if from != to {
            deferred.push(DeferredUpdate { what: Commit::Copy(from), to, optimizer });
        }
    }
    Ok(deferred)
}
