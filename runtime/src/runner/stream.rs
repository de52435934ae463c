//! The communication streams: a rank's collectives run in schedule order
//! on threads of their own while its compute goes on, as NCCL's streams
//! run beside the compute stream on a GPU, and as the plan's simulation
//! (`zeroplan_passes::cost::simulate`) assumes when it overlaps a
//! reduce-scatter with the rest of the backward. Each group — data
//! parallel, tensor parallel — has its stream, so a gradient reduce-scatter
//! does not hold up the sequence all-gather the next GEMM waits for.
//!
//! Ordering is by byte ranges. A collective is submitted when the schedule
//! reaches it (its inputs are ready: compute runs in schedule order before
//! it, and so does every collective of the other group it conflicts with).
//! Before a compute instruction runs, every in-flight collective it
//! conflicts with is waited for: one whose output it reads (read after
//! write) or also writes, and one whose input it overwrites (the memory
//! plan may give a dead input's bytes to a later value: write after read).
//! A group's collectives stay in order among themselves, so every member
//! calls them in the same order; and since a rank only ever waits for a
//! collective the schedule put earlier, the earliest unfinished one has
//! been submitted by every member and runs. The step's results are
//! therefore the bits a sequential run gives; only the waiting changes.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::Scope;
use std::time::{Duration, Instant};

use zeroplan_ir::interp::Feeds;

use super::profile::Track;
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

/// A finished collective: its step, result, the stream and when it ran.
pub struct Done {
    pub at: usize,
    pub track: Track,
    pub result: Result<(), String>,
    pub started: Instant,
    pub took: Duration,
}

/// One rank's communication streams for the duration of a step: the
/// data-parallel group's, and the tensor-parallel group's where the device
/// runs the two at once (else both groups share the first, in schedule
/// order).
pub struct CommStreams<'s> {
    data: CommStream<'s>,
    tensor: Option<CommStream<'s>>,
}

impl<'s> CommStreams<'s> {
    /// Starts the streams' threads in `scope`; `instr(at)` is the
    /// instruction of step `at`.
    pub fn start<'env, D: Device>(
        scope: &'s Scope<'s, 'env>,
        device: &'s D,
        instr: impl Fn(usize) -> &'s D::Instr + Send + Copy + 's,
        comm: &'s dyn Communicator,
        tensor: &'s dyn Communicator,
        seed: u64,
    ) -> CommStreams<'s> {
        let start = |track| CommStream::start(scope, device, instr, comm, tensor, seed, track);
        CommStreams { data: start(Track::Comm), tensor: device.concurrent_groups().then(|| start(Track::TensorComm)) }
    }

    /// Queues step `at`'s collective on its group's stream (`tensor`: the
    /// tensor-parallel group's), once every in-flight collective of the
    /// other stream that it conflicts with has finished; what finished.
    pub fn submit(&mut self, at: usize, tensor: bool, access: &'s Access, feeds: &'s Feeds) -> Vec<Done> {
        let (own, other) = match &mut self.tensor {
            Some(t) if tensor => (t, Some(&mut self.data)),
            Some(t) => (&mut self.data, Some(t)),
            None => (&mut self.data, None),
        };
        let finished = other.map(|o| o.wait_for(access)).unwrap_or_default();
        own.submit(at, access, feeds);
        finished
    }

    /// Waits for every in-flight collective `access` conflicts with (and
    /// those before it on its stream); what finished.
    pub fn wait_for(&mut self, access: &Access) -> Vec<Done> {
        let mut finished = self.data.wait_for(access);
        if let Some(t) = &mut self.tensor {
            finished.extend(t.wait_for(access));
        }
        finished
    }

    /// Waits for every in-flight collective.
    pub fn drain(&mut self) -> Vec<Done> {
        let mut finished = self.data.drain();
        if let Some(t) = &mut self.tensor {
            finished.extend(t.drain());
        }
        finished
    }
}

/// One in-order communication stream.
struct CommStream<'s> {
    jobs: Option<Sender<Job<'s>>>,
    done: Receiver<Done>,
    /// Submitted and not yet waited for, oldest first.
    in_flight: VecDeque<(usize, &'s Access)>,
}

impl<'s> CommStream<'s> {
    /// Starts the stream's thread in `scope`, its runs profiled as `track`.
    fn start<'env, D: Device>(
        scope: &'s Scope<'s, 'env>,
        device: &'s D,
        instr: impl Fn(usize) -> &'s D::Instr + Send + 's,
        comm: &'s dyn Communicator,
        tensor: &'s dyn Communicator,
        seed: u64,
        track: Track,
    ) -> CommStream<'s> {
        let (jobs, queue) = channel::<Job<'s>>();
        let (finished, done) = channel();
        scope.spawn(move || {
            for job in queue {
                let cx = Ctx { feeds: job.feeds, seed, offset: 0, comm, tensor };
                let started = Instant::now();
                let result = device.run(instr(job.at), &cx);
                let failed = result.is_err();
                let done = Done { at: job.at, track, result, started, took: started.elapsed() };
                if finished.send(done).is_err() || failed {
                    break;
                }
            }
        });
        CommStream { jobs: Some(jobs), done, in_flight: VecDeque::new() }
    }

    /// Queues step `at`'s collective.
    fn submit(&mut self, at: usize, access: &'s Access, feeds: &'s Feeds) {
        self.in_flight.push_back((at, access));
        // A closed queue means an earlier collective failed: waiting reports it.
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job { at, feeds });
        }
    }

    /// Waits for every in-flight collective `access` conflicts with (and
    /// those before it); what finished, in order.
    fn wait_for(&mut self, access: &Access) -> Vec<Done> {
        match self.in_flight.iter().rposition(|(_, a)| access.conflicts(a)) {
            Some(last) => self.wait_through(last),
            None => Vec::new(),
        }
    }

    /// Waits for every in-flight collective.
    fn drain(&mut self) -> Vec<Done> {
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
