//! Training on the runtime: a program loaded once for every rank this
//! process runs (all of them as threads, or its own one when it is one
//! process per rank), stepped on its batches, checkpointed, and a step
//! that diverges diagnosed. The CLI's `train` and `finetune` draw progress
//! and print the log lines; the work is here.
//!
//! - [`Trainer`]: the ranks, their batches and one step of all of them;
//! - [`batches`]: fixed, synthetic, or dataset batches;
//! - [`checkpoints`]: training checkpoints, resuming, Hugging Face weights;
//! - [`divergence`]: why a step's loss or gradients are not finite;
//! - [`process`]: this process as one rank of several (torchrun's
//!   environment, the rendezvous, TCP or NCCL);
//! - [`plan_file`]: the head and vocabulary a plan file trains.

pub mod batches;
pub mod checkpoints;
pub mod divergence;
pub mod plan_file;
pub mod process;

use std::path::PathBuf;
use std::time::Instant;

use zeroplan_ir::interp::{Feeds, State};
use zeroplan_ir::plan::Program;
use zeroplan_runtime::checkpoint::training::Cursor;
use zeroplan_runtime::comm::InProcess;
use zeroplan_runtime::reference::{StepLog, data_parallel_ranks, tensor_parallel_ranks};
use zeroplan_runtime::runner::{Device, GraphMode, Nvme, Runner};

use batches::Batches;
use checkpoints::Saver;
use process::ProcessRank;

/// A run's ranks in this process, the batches they draw, and where the
/// run's ranks stand: this process's ranks are `first_rank..first_rank +
/// ranks.len()` of `world`.
pub struct Trainer<D: Device> {
    ranks: Vec<Runner<D>>,
    process: Option<ProcessRank>,
    batches: Batches,
    batch: usize,
    seq: usize,
    /// The last step's micro-batches per rank, for [`Trainer::diagnose`].
    feeds: Vec<Vec<Feeds>>,
}

/// One step of every rank, as the log reports it.
pub struct Stepped {
    /// Rank 0's log, with the ranks' mean loss.
    pub log: StepLog,
    /// Wall time of the ranks' step, the drawing of batches excluded.
    pub seconds: f64,
    /// Tokens of every replica's micro-batches per second of `seconds`.
    pub tokens_per_s: f64,
}

impl<D: Device<Instr: Send> + Send> Trainer<D> {
    /// Loads `program` on the ranks of this process: every rank it was
    /// planned for (`d` data-parallel × `t` tensor-parallel, in global rank
    /// order `data·t + tensor`, joined by in-process groups), or, given
    /// `process`, that process's own rank, joined to its peers. Each rank's
    /// state comes from `states` where given (a resumed run: every rank's,
    /// or the process's own), else is initialised from `seed`. With `nvme`,
    /// each rank keeps its host-placed params and states in a file there
    /// (`Runner::load_tiered`).
    pub fn load(
        program: Program,
        seed: u64,
        mut process: Option<ProcessRank>,
        states: Option<Vec<State>>,
        batches: Batches,
        nvme: Option<&Nvme>,
    ) -> Result<Trainer<D>, String> {
        let (batch, seq) = (program.batch as usize, program.seq as usize);
        let d = data_parallel_ranks(&program.graph) as usize;
        let t = tensor_parallel_ranks(&program.graph) as usize;
        let none = State::new();
        let given = |r: usize| states.as_ref().map_or(&none, |s| &s[r]);
        let ranks = match process.as_mut() {
            Some(p) => {
                let groups = p.groups(d, t)?;
                vec![Runner::load_tiered(program, seed, groups, given(0), nvme).map_err(|e| e.to_string())?]
            }
            None => InProcess::grid(d, t)
                .into_iter()
                .enumerate()
                .map(|(r, groups)| {
                    Runner::load_tiered(program.clone(), seed, groups, given(r), nvme).map_err(|e| e.to_string())
                })
                .collect::<Result<_, _>>()?,
        };
        Ok(Trainer { ranks, process, batches, batch, seq, feeds: Vec::new() })
    }

    /// This process's ranks.
    pub fn ranks(&self) -> &[Runner<D>] {
        &self.ranks
    }

    /// This process's ranks, to set their state.
    pub fn ranks_mut(&mut self) -> &mut [Runner<D>] {
        &mut self.ranks
    }

    /// This process as one rank of several, if it is.
    pub fn process(&self) -> Option<&ProcessRank> {
        self.process.as_ref()
    }

    /// The global rank of this process's first rank.
    pub fn first_rank(&self) -> usize {
        self.process.as_ref().map_or(0, |p| p.world.rank)
    }

    /// Every rank of the run, in every process.
    pub fn world(&self) -> usize {
        self.process.as_ref().map_or(self.ranks.len(), |p| p.world.world_size)
    }

    /// Steps done: the run's (every rank stands at the same step).
    pub fn steps_done(&self) -> u64 {
        self.ranks[0].steps_done()
    }

    /// Continues a saved run: its step count, and the data where it stood
    /// (`None`: the save has no data position, and `--data` starts from its
    /// top; returned as `false`).
    pub fn resume_at(&mut self, step: u64, data: Option<Cursor>) -> bool {
        for rank in &mut self.ranks {
            rank.set_steps_done(step);
        }
        match (&mut self.batches, data) {
            (Batches::Data(d), Some(cursor)) => {
                d.seek(cursor);
                true
            }
            (Batches::Data(_), None) => false,
            (Batches::Fixed(_), _) => true,
        }
    }

    /// Before the first step: only the scalars the log needs come back
    /// from the device (not the logits), each instruction is timed when
    /// `profiling`, and a device with graphs records and replays them as
    /// `graphs` says (`train --cuda-graphs`).
    pub fn prepare(&mut self, profiling: bool, graphs: GraphMode) -> Result<(), String> {
        let graph = &self.ranks[0].program().graph;
        let logged: Vec<&str> =
            StepLog::OUTPUTS.into_iter().filter(|name| graph.outputs.iter().any(|(o, _)| o == name)).collect();
        for rank in &mut self.ranks {
            rank.fetch(&logged).map_err(|e| format!("error: {e}"))?;
            rank.set_profiling(profiling);
            rank.set_graphs(graphs);
        }
        Ok(())
    }

    /// Every rank's profile emptied ([`Runner::restart_profile`]): after
    /// a warm-up step, so the profile shows steady steps.
    pub fn restart_profiles(&mut self) {
        for rank in &mut self.ranks {
            rank.restart_profile();
        }
    }

    /// One step of every rank, each on its own thread with its own
    /// micro-batches: a replica's tensor ranks share its batches, the data
    /// ranks draw their own. Every replica's batches are drawn here, also
    /// in a process that runs one rank, so the data stays in step across
    /// processes; the log's loss is the mean over every rank of the run.
    pub fn step(&mut self) -> Result<Stepped, String> {
        let (first_rank, world) = (self.first_rank(), self.world());
        let k = self.ranks[0].micro_batches() as usize;
        let t = tensor_parallel_ranks(&self.ranks[0].program().graph) as usize;
        let replicas = world / t;
        let drawn: Vec<Vec<Feeds>> =
            (0..replicas).map(|_| (0..k).map(|_| self.batches.next(self.batch)).collect()).collect();
        self.feeds = (first_rank..first_rank + self.ranks.len()).map(|r| drawn[r / t].clone()).collect();
        let started = Instant::now();
        let outputs: Vec<_> = std::thread::scope(|s| {
            let running: Vec<_> =
                self.ranks.iter_mut().zip(&self.feeds).map(|(rank, feeds)| s.spawn(move || rank.step(feeds))).collect();
            running.into_iter().map(|r| r.join().expect("a rank's thread panicked")).collect()
        });
        let seconds = started.elapsed().as_secs_f64();
        let mut logs = Vec::with_capacity(world);
        for out in outputs {
            let out = out.map_err(|e| format!("error: {e}"))?;
            logs.push(
                StepLog::from_rank_outputs(self.steps_done(), &out.outputs, replicas as u64)
                    .map_err(|e| format!("error: {e}"))?,
            );
        }
        let mut log = logs[0].clone();
        let losses: Vec<f64> = logs.iter().map(|l| l.loss).collect();
        let losses = match &self.process {
            Some(p) => p.gather(&losses)?,
            None => losses,
        };
        log.loss = losses.iter().sum::<f64>() / world as f64;
        let tokens_per_s = (self.batch * self.seq * k * replicas) as f64 / seconds;
        Ok(Stepped { log, seconds, tokens_per_s })
    }

    /// Why the last step diverged ([`divergence::diverges`]): it is run
    /// again with every value checked; `saver` says what the last save holds.
    pub fn diagnose(&mut self, log: &StepLog, saver: Option<&Saver>) -> String {
        let first = self.first_rank();
        divergence::diverged(&mut self.ranks, first, &self.feeds, log, saver)
    }

    /// Saves every rank's state and the data position under `saver`'s
    /// directory; the step's directory.
    pub fn save(&self, saver: &Saver) -> Result<PathBuf, String> {
        let cursor = match &self.batches {
            Batches::Data(d) => Some(d.cursor()),
            Batches::Fixed(_) => None,
        };
        saver.save(&self.ranks, cursor, self.process.as_ref())
    }
}
