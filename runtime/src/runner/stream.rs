//! The communication stream: a rank's collectives run in schedule order on
//! a thread of their own while its compute goes on, as NCCL's stream runs
//! beside the compute stream on a GPU, and as the plan's simulation
//! (`zeroplan_passes::cost::simulate`) assumes when it overlaps a
//! reduce-scatter with the rest of the backward.
//!
//! Ordering is by byte ranges. A collective is submitted when the schedule
//! reaches it (its inputs are ready: compute runs in schedule order before
//! it). Before a compute instruction runs, every in-flight collective it
//! conflicts with is waited for: one whose output it reads (read after
//! write) or also writes, and one whose input it overwrites (the memory
//! plan may give a dead input's bytes to a later value: write after read).
//! Collectives stay in order among themselves, so every rank calls them in
//! the same order. The step's results are therefore the bits a sequential
//! run gives; only the waiting changes.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::Scope;
use std::time::{Duration, Instant};

use zeroplan_ir::interp::Feeds;

use crate::comm::Communicator;
use zeroplan_exec::{Buf, Ctx, Device};

/// The buffers a scheduled instruction reads and writes.
#[derive(Clone, Debug, Default)]
pub struct Access {
    pub reads: Vec<Buf>,
    pub writes: Vec<Buf>,
}

impl Access {
    /// Whether running `self` while `other` runs could change either's result.
    fn conflicts(&self, other: &Access) -> bool {
        let any = |a: &[Buf], b: &[Buf]| a.iter().any(|x| b.iter().any(|y| x.overlaps(y)));
        any(&self.reads, &other.writes) || any(&self.writes, &other.writes) || any(&self.writes, &other.reads)
    }
}

/// A collective handed to the stream: the schedule position of its step.
struct Job<'s> {
    at: usize,
    feeds: &'s Feeds,
}

/// A finished collective: its step, result, and when it ran.
pub struct Done {
    pub at: usize,
    pub result: Result<(), String>,
    pub started: Instant,
    pub took: Duration,
}

/// One rank's communication stream for the duration of a step.
pub struct CommStream<'s> {
    jobs: Option<Sender<Job<'s>>>,
    done: Receiver<Done>,
    /// Submitted and not yet waited for, oldest first.
    in_flight: VecDeque<(usize, &'s Access)>,
}

impl<'s> CommStream<'s> {
    /// Starts the stream's thread in `scope`; `instr(at)` is the
    /// instruction of step `at`.
    pub fn start<'env, D: Device>(
        scope: &'s Scope<'s, 'env>,
        device: &'s D,
        instr: impl Fn(usize) -> &'s D::Instr + Send + 's,
        comm: &'s dyn Communicator,
        tensor: &'s dyn Communicator,
        seed: u64,
    ) -> CommStream<'s> {
        let (jobs, queue) = channel::<Job<'s>>();
        let (finished, done) = channel();
        scope.spawn(move || {
            for job in queue {
                let cx = Ctx { feeds: job.feeds, seed, offset: 0, comm, tensor };
                let started = Instant::now();
                let result = device.run(instr(job.at), &cx);
                let failed = result.is_err();
                if finished.send(Done { at: job.at, result, started, took: started.elapsed() }).is_err() || failed {
                    break;
                }
            }
        });
        CommStream { jobs: Some(jobs), done, in_flight: VecDeque::new() }
    }

    /// Queues step `at`'s collective.
    pub fn submit(&mut self, at: usize, access: &'s Access, feeds: &'s Feeds) {
        self.in_flight.push_back((at, access));
        // A closed queue means an earlier collective failed: waiting reports it.
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job { at, feeds });
        }
    }

    /// Waits for every in-flight collective `access` conflicts with (and
    /// those before it); what finished, in order.
    pub fn wait_for(&mut self, access: &Access) -> Vec<Done> {
        match self.in_flight.iter().rposition(|(_, a)| access.conflicts(a)) {
            Some(last) => self.wait_through(last),
            None => Vec::new(),
        }
    }

    /// Waits for every in-flight collective.
    pub fn drain(&mut self) -> Vec<Done> {
        match self.in_flight.len() {
            0 => Vec::new(),
            n => self.wait_through(n - 1),
        }
    }

    /// Waits for the first `last + 1` in-flight collectives. A failed one
    /// ends the list (the thread stops after it).
    fn wait_through(&mut self, last: usize) -> Vec<Done> {
        let mut finished = Vec::with_capacity(last + 1);
        for _ in 0..=last {
            self.in_flight.pop_front();
            match self.done.recv() {
                Ok(done) => {
                    let failed = done.result.is_err();
                    finished.push(done);
                    if failed {
                        self.in_flight.clear();
                        break;
                    }
                }
                Err(_) => {
                    self.in_flight.clear();
                    break;
                }
            }
        }
        finished
    }
}

impl Drop for CommStream<'_> {
    /// Closes the queue, so the thread ends once it has run what it holds.
    fn drop(&mut self) {
        self.jobs.take();
    }
}
