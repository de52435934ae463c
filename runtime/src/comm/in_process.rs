//! Ranks as threads of one process: each collective is a rendezvous over
//! shared memory.
//!
//! Every rank deposits its buffer in its slot; the ranks then read all
//! slots at once (read locks). An all-reduce is a reduce-scatter followed by
//! an all-gather, as the ring algorithm is: rank r sums only the r-th of
//! `ranks` chunks, so the ranks share the additions instead of each doing
//! all of them (and instead of queueing on each other's slot locks), and
//! then every rank copies the summed chunks. Each element is still summed in
//! rank order in `f64`, so the bits do not depend on the split or timing.

use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard};

use super::{CommError, Communicator};

/// One rank of an in-process group; [`InProcess::group`] makes them all.
pub struct InProcess {
    rank: usize,
    shared: Arc<Shared>,
}

/// What the ranks of a group share: each rank's contribution to the
/// current collective, and a barrier that a failed rank can break.
struct Shared {
    ranks: usize,
    slots: Vec<RwLock<Vec<f32>>>,
    /// Each rank's summed chunk of an all-reduce.
    reduced: Vec<RwLock<Vec<f32>>>,
    barrier: Mutex<Rendezvous>,
    arrived: Condvar,
}

struct Rendezvous {
    waiting: usize,
    generation: u64,
    failed: bool,
}

impl InProcess {
    /// A group of `ranks` (at least one), one handle per rank, in rank order.
    pub fn group(ranks: usize) -> Vec<InProcess> {
        let ranks = ranks.max(1);
        let shared = Arc::new(Shared {
            ranks,
            slots: (0..ranks).map(|_| RwLock::new(Vec::new())).collect(),
            reduced: (0..ranks).map(|_| RwLock::new(Vec::new())).collect(),
            barrier: Mutex::new(Rendezvous { waiting: 0, generation: 0, failed: false }),
            arrived: Condvar::new(),
        });
        (0..ranks).map(|rank| InProcess { rank, shared: shared.clone() }).collect()
    }

    /// The `data_ranks × tensor_ranks` ranks of tensor × data parallelism
    /// as [`super::Groups`], in global rank order (`data_rank·t +
    /// tensor_rank`): `tensor_ranks` data groups of `data_ranks` and
    /// `data_ranks` tensor groups of `tensor_ranks`.
    pub fn grid(data_ranks: usize, tensor_ranks: usize) -> Vec<super::Groups> {
        let (d, t) = (data_ranks.max(1), tensor_ranks.max(1));
        // Data group k hands out its ranks in order, one to each replica.
        let mut data: Vec<_> = (0..t).map(|_| InProcess::group(d).into_iter()).collect();
        let mut out = Vec::with_capacity(d * t);
        for replica in (0..d).map(|_| InProcess::group(t)) {
            for (tensor, group) in replica.into_iter().zip(&mut data) {
                let data = group.next().expect("a data group has a rank per replica");
                out.push(super::Groups { data: Arc::new(data), tensor: Arc::new(tensor) });
            }
        }
        out
    }

    /// Waits until every rank has arrived (or one has failed).
    fn rendezvous(&self, op: &'static str) -> Result<(), CommError> {
        let s = &self.shared;
        let mut r = s.barrier.lock().unwrap_or_else(|e| e.into_inner());
        if r.failed {
            return Err(CommError::PeerFailed { op });
        }
        r.waiting += 1;
        if r.waiting == s.ranks {
            r.waiting = 0;
            r.generation += 1;
            s.arrived.notify_all();
            return Ok(());
        }
        let generation = r.generation;
        while r.generation == generation && !r.failed {
            r = s.arrived.wait(r).unwrap_or_else(|e| e.into_inner());
        }
        if r.generation == generation { Err(CommError::PeerFailed { op }) } else { Ok(()) }
    }

    /// Puts this rank's contribution in its slot and waits for the others'.
    fn deposit(&self, op: &'static str, data: &[f32]) -> Result<(), CommError> {
        {
            let mut slot = self.shared.slots[self.rank].write().unwrap_or_else(|e| e.into_inner());
            slot.clear();
            slot.extend_from_slice(data);
        }
        self.rendezvous(op)?;
        let expected = self.slot_len(0);
        for rank in 1..self.shared.ranks {
            let got = self.slot_len(rank);
            if got != expected {
                return Err(CommError::Mismatch { op, rank, got, expected });
            }
        }
        Ok(())
    }

    fn slot(&self, rank: usize) -> RwLockReadGuard<'_, Vec<f32>> {
        self.shared.slots[rank].read().unwrap_or_else(|e| e.into_inner())
    }

    fn slot_len(&self, rank: usize) -> usize {
        self.slot(rank).len()
    }

    /// `out[i] = Σ_rank slot[rank][from + i]`, in rank order in f64.
    fn sum_into(&self, from: usize, out: &mut [f32]) {
        let slots: Vec<_> = (0..self.shared.ranks).map(|r| self.slot(r)).collect();
        for (i, o) in out.iter_mut().enumerate() {
            *o = slots.iter().map(|s| f64::from(s[from + i])).sum::<f64>() as f32;
        }
    }
}

/// Rank `rank`'s chunk of `len` elements split over `ranks`: the first
/// `len % ranks` chunks one element longer.
pub(super) fn chunk(len: usize, ranks: usize, rank: usize) -> std::ops::Range<usize> {
    let (base, extra) = (len / ranks, len % ranks);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

impl Communicator for InProcess {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.shared.ranks
    }

    fn all_reduce(&self, data: &mut [f32]) -> Result<(), CommError> {
        let (op, ranks) = ("all_reduce", self.shared.ranks);
        self.deposit(op, data)?;
        let len = data.len();
        let mine = chunk(len, ranks, self.rank);
        {
            let mut reduced = self.shared.reduced[self.rank].write().unwrap_or_else(|e| e.into_inner());
            reduced.resize(mine.len(), 0.0);
            self.sum_into(mine.start, &mut reduced);
        }
        self.rendezvous(op)?;
        for rank in 0..ranks {
            let part = self.shared.reduced[rank].read().unwrap_or_else(|e| e.into_inner());
            data[chunk(len, ranks, rank)].copy_from_slice(&part);
        }
        // Nobody refills a slot before every rank has read them all.
        self.rendezvous(op)
    }

    fn reduce_scatter(&self, data: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        let (op, ranks) = ("reduce_scatter", self.shared.ranks);
        if !data.len().is_multiple_of(ranks) || out.len() != data.len() / ranks {
            return Err(CommError::Uneven { op, len: data.len(), ranks });
        }
        self.deposit(op, data)?;
        self.sum_into(self.rank * out.len(), out);
        self.rendezvous(op)
    }

    fn all_gather(&self, part: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        let (op, ranks) = ("all_gather", self.shared.ranks);
        if out.len() != part.len() * ranks {
            return Err(CommError::Uneven { op, len: out.len(), ranks });
        }
        self.deposit(op, part)?;
        for (rank, chunk) in out.chunks_mut(part.len().max(1)).enumerate() {
            chunk.copy_from_slice(&self.slot(rank));
        }
        self.rendezvous(op)
    }

    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<(), CommError> {
        let (op, ranks) = ("broadcast", self.shared.ranks);
        if root >= ranks {
            return Err(CommError::NoRoot { op, root, ranks });
        }
        if self.rank == root {
            let mut slot = self.shared.slots[root].write().unwrap_or_else(|e| e.into_inner());
            slot.clear();
            slot.extend_from_slice(data);
        }
        self.rendezvous(op)?;
        let got = self.slot_len(root);
        if got != data.len() {
            return Err(CommError::Mismatch { op, rank: self.rank, got: data.len(), expected: got });
        }
        if self.rank != root {
            data.copy_from_slice(&self.slot(root));
        }
        self.rendezvous(op)
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.rendezvous("barrier")
    }

    fn abort(&self) {
        let mut r = self.shared.barrier.lock().unwrap_or_else(|e| e.into_inner());
        r.failed = true;
        self.shared.arrived.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on every rank of a group of `ranks`, each on its own thread.
    fn on_ranks<T: Send>(ranks: usize, f: impl Fn(&InProcess) -> T + Sync) -> Vec<T> {
        let group = InProcess::group(ranks);
        std::thread::scope(|s| {
            let handles: Vec<_> = group.iter().map(|c| s.spawn(|| f(c))).collect();
            handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
        })
    }

    #[test]
    fn collectives_give_every_rank_the_sum_its_slice_and_the_concatenation() {
        let results = on_ranks(3, |c| {
            let r = c.rank() as f32;
            let mut summed = vec![r, 10.0 * r, 1.0];
            c.all_reduce(&mut summed).unwrap();
            let mut slice = vec![0.0; 2];
            c.reduce_scatter(&[r, r, 1.0, 1.0, 2.0 * r, 0.0], &mut slice).unwrap();
            let mut gathered = vec![0.0; 6];
            c.all_gather(&[r, -r], &mut gathered).unwrap();
            (summed, slice, gathered)
        });
        for (rank, (summed, slice, gathered)) in results.into_iter().enumerate() {
            assert_eq!(summed, [3.0, 30.0, 3.0]);
            assert_eq!(slice, [[3.0, 3.0], [3.0, 3.0], [6.0, 0.0]][rank]);
            assert_eq!(gathered, [0.0, -0.0, 1.0, -1.0, 2.0, -2.0]);
        }
    }

    #[test]
    fn broadcast_copies_the_roots_data_and_barrier_waits_for_all() {
        let arrived = std::sync::atomic::AtomicUsize::new(0);
        let results = on_ranks(3, |c| {
            let mut x = vec![c.rank() as f32; 2];
            c.broadcast(&mut x, 2).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2 * c.rank() as u64));
            arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            c.barrier().unwrap();
            // Nobody passes the barrier before everyone reached it.
            (x, arrived.load(std::sync::atomic::Ordering::SeqCst))
        });
        assert!(results.iter().all(|(x, n)| x == &[2.0, 2.0] && *n == 3), "{results:?}");
        let err = on_ranks(1, |c| c.broadcast(&mut [0.0], 1));
        assert_eq!(err[0], Err(CommError::NoRoot { op: "broadcast", root: 1, ranks: 1 }));
    }

    #[test]
    fn chunks_cover_the_buffer_in_order() {
        for (len, ranks) in [(10, 3), (2, 4), (0, 2), (12, 4)] {
            let chunks: Vec<_> = (0..ranks).map(|r| chunk(len, ranks, r)).collect();
            assert_eq!(chunks[0].start, 0);
            assert!(chunks.windows(2).all(|w| w[0].end == w[1].start));
            assert_eq!(chunks[ranks - 1].end, len);
        }
    }

    #[test]
    fn the_sum_is_the_same_bits_on_every_rank_whatever_the_timing() {
        let results = on_ranks(4, |c| {
            std::thread::sleep(std::time::Duration::from_millis(3 * (4 - c.rank() as u64)));
            let mut x = vec![0.1f32 * (c.rank() as f32 + 1.0), 1e8, -1e8];
            c.all_reduce(&mut x).unwrap();
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        });
        assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
    }

    #[test]
    fn mismatched_programs_and_failed_peers_are_errors_not_hangs() {
        let results = on_ranks(2, |c| {
            let mut x = vec![0.0; 2 + c.rank()];
            c.all_reduce(&mut x)
        });
        assert!(results.iter().all(|r| matches!(r, Err(CommError::Mismatch { rank: 1, got: 3, expected: 2, .. }))));

        let results = on_ranks(2, |c| {
            if c.rank() == 1 {
                c.abort();
                return Err(CommError::PeerFailed { op: "test" });
            }
            c.all_reduce(&mut [1.0])
        });
        assert_eq!(results[0], Err(CommError::PeerFailed { op: "all_reduce" }));
    }
}
