//! Ranks as processes (on one node or many) joined by TCP: a
//! [`Communicator`] over one connection per pair of ranks ([`mesh`]).
//!
//! The collectives give the **same bits** as [`super::InProcess`]: each
//! element of a sum is added in rank order in `f64` by the rank that owns
//! its chunk. An all-reduce is a reduce-scatter then an all-gather, as the
//! ring algorithm is, and moves what the ring moves — each rank sends and
//! receives `(n−1)/n` of the buffer in each half — but as a pairwise
//! exchange rather than around a ring: the owner of chunk `j` receives
//! every rank's chunk `j` and adds them in rank order (a ring would add
//! them in ring order, starting at `j+1`, and round differently).
//!
//! A collective starts with a small header to every peer (operation,
//! sequence number, length): the ranks check they run the same program
//! (the header exchange is also the barrier). Payloads then travel in
//! pieces of [`PIECE`] elements: at step `s` of piece `k`, rank `r` sends
//! to `r+s` and receives from `r−s`, a writer thread sending while this
//! thread receives, so the schedule is a permutation at every step and
//! cannot deadlock, and a receiver holds at most one piece per peer.
//!
//! A peer that dies closes its connections: its peers' reads see the end
//! of stream and fail with [`CommError::PeerLost`]; a rank that fails
//! shuts down its own connections ([`Communicator::abort`], and on any
//! error of its own), so the failure reaches every rank of the group
//! instead of leaving one waiting.

mod mesh;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::in_process::chunk;
use super::store::Store;
use super::wire::{f32_bytes, f32_bytes_mut};
use super::{CommError, Communicator, Groups};

/// Elements per message piece (1 MiB of f32).
pub const PIECE: usize = 1 << 18;

/// One rank's handle on a group of processes.
pub struct Tcp {
    rank: usize,
    ranks: usize,
    links: Mutex<Links>,
    /// Every connection, to shut down from [`Communicator::abort`] while a
    /// collective blocks on it.
    sockets: Vec<TcpStream>,
    failed: AtomicBool,
}

/// Each peer's connection, split for a writer thread and a reader.
struct Links {
    readers: Vec<Option<TcpStream>>,
    writers: Vec<Option<TcpStream>>,
    /// Collectives called so far (checked against the peers').
    sequence: u64,
}

/// What a rank says before a collective.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Header {
    op: u8,
    sequence: u64,
    len: u64,
    root: u64,
}

impl Header {
    const BYTES: usize = 25;

    fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0; Self::BYTES];
        b[0] = self.op;
        b[1..9].copy_from_slice(&self.sequence.to_le_bytes());
        b[9..17].copy_from_slice(&self.len.to_le_bytes());
        b[17..25].copy_from_slice(&self.root.to_le_bytes());
        b
    }

    fn decode(b: &[u8; Self::BYTES]) -> Header {
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        Header { op: b[0], sequence: word(1), len: word(9), root: word(17) }
    }
}

const OPS: [&str; 5] = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"];

fn op_code(op: &str) -> u8 {
    OPS.iter().position(|o| *o == op).expect("a known collective") as u8
}

/// A failed transfer: the peer, and what the socket said.
type Failure = (usize, std::io::Error);

impl Tcp {
    /// Joins group `group` (a name every member uses) as rank `rank` of
    /// `ranks`, through the store: waits until every member has connected.
    pub fn join(store: &Store, group: &str, rank: usize, ranks: usize) -> Result<Tcp, CommError> {
        assert!(rank < ranks, "rank {rank} of a group of {ranks}");
        let peers = mesh::connect(store, group, rank, ranks).map_err(|message| CommError::Join {
            group: group.to_string(),
            rank,
            message,
        })?;
        let io = |e: std::io::Error| CommError::Join { group: group.to_string(), rank, message: e.to_string() };
        let mut sockets = Vec::new();
        let mut readers = Vec::new();
        let mut writers = Vec::new();
        for peer in peers {
            match peer {
                Some(conn) => {
                    sockets.push(conn.try_clone().map_err(io)?);
                    writers.push(Some(conn.try_clone().map_err(io)?));
                    readers.push(Some(conn));
                }
                None => {
                    readers.push(None);
                    writers.push(None);
                }
            }
        }
        let links = Mutex::new(Links { readers, writers, sequence: 0 });
        Ok(Tcp { rank, ranks, links, sockets, failed: AtomicBool::new(false) })
    }

    /// Global rank `global` of `data_ranks × tensor_ranks` processes as
    /// [`Groups`], as [`super::InProcess::grid`] lays them out: data group
    /// `global mod t` (rank `global / t` of `d`) and tensor group
    /// `global / t` (rank `global mod t` of `t`).
    pub fn grid(store: &Store, global: usize, data_ranks: usize, tensor_ranks: usize) -> Result<Groups, CommError> {
        let (d, t) = (data_ranks.max(1), tensor_ranks.max(1));
        let data = Tcp::join(store, &format!("data{}", global % t), global / t, d)?;
        let tensor = Tcp::join(store, &format!("tensor{}", global / t), global % t, t)?;
        Ok(Groups { data: Arc::new(data), tensor: Arc::new(tensor) })
    }

    fn shutdown(&self) {
        self.failed.store(true, Ordering::SeqCst);
        for s in &self.sockets {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn lost(&self, op: &'static str, (peer, e): Failure) -> CommError {
        self.shutdown();
        CommError::PeerLost { op, peer, cause: cause(&e) }
    }

    /// Sends this rank's header to every peer and reads theirs (by rank;
    /// this rank's own included): returns once every rank has arrived.
    fn headers(&self, links: &mut Links, op: &'static str, len: usize, root: usize) -> Result<Vec<Header>, CommError> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(CommError::PeerFailed { op });
        }
        let mine = Header { op: op_code(op), sequence: links.sequence, len: len as u64, root: root as u64 };
        links.sequence += 1;
        let bytes = mine.encode();
        // A header fits any socket buffer, and the previous collective left
        // the connections empty: writing them all first cannot block.
        for (q, w) in links.writers.iter_mut().enumerate() {
            if let Some(w) = w {
                w.write_all(&bytes).map_err(|e| self.lost(op, (q, e)))?;
            }
        }
        let mut all = vec![mine; self.ranks];
        for (q, r) in links.readers.iter_mut().enumerate() {
            if let Some(r) = r {
                let mut b = [0; Header::BYTES];
                r.read_exact(&mut b).map_err(|e| self.lost(op, (q, e)))?;
                all[q] = Header::decode(&b);
            }
        }
        for (q, h) in all.iter().enumerate() {
            if h.op != mine.op || h.sequence != mine.sequence || h.root != mine.root {
                let theirs = OPS.get(h.op as usize).copied().unwrap_or("an unknown operation");
                return Err(CommError::Diverged {
                    op,
                    peer: q,
                    theirs: format!("{theirs} #{} (root {})", h.sequence, h.root),
                    ours: format!("{op} #{} (root {})", mine.sequence, mine.root),
                });
            }
        }
        Ok(all)
    }

    /// Runs `send` on a writer thread while `recv` runs on this one; the
    /// first failure shuts the group's connections (so neither side waits
    /// on the other) and is returned.
    fn transfer(
        &self,
        links: &mut Links,
        op: &'static str,
        send: impl FnOnce(&mut [Option<TcpStream>]) -> Result<(), Failure> + Send,
        recv: impl FnOnce(&mut [Option<TcpStream>]) -> Result<(), Failure>,
    ) -> Result<(), CommError> {
        let Links { readers, writers, .. } = links;
        let (sent, received) = std::thread::scope(|s| {
            let writer = s.spawn(|| {
                let sent = send(writers);
                if sent.is_err() {
                    self.shutdown();
                }
                sent
            });
            let received = recv(readers);
            if received.is_err() {
                self.shutdown();
            }
            (writer.join().unwrap_or_else(|_| Err((self.rank, std::io::Error::other("the writer panicked")))), received)
        });
        received.and(sent).map_err(|f| self.lost(op, f))
    }

    /// `to`'s peer at step `s` of a rotation, and `from`.
    fn step(&self, s: usize) -> (usize, usize) {
        ((self.rank + s) % self.ranks, (self.rank + self.ranks - s) % self.ranks)
    }

    /// Receives every rank's part of `mine` (a chunk of `data`, which this
    /// rank owns) and sums them in rank order in f64 into `out`.
    fn reduce_chunks(
        &self,
        links: &mut Links,
        op: &'static str,
        data: &[f32],
        out: &mut [f32],
    ) -> Result<(), CommError> {
        let (n, len) = (self.ranks, data.len());
        let pieces = chunk(len, n, 0).len().div_ceil(PIECE).max(1);
        let mine = chunk(len, n, self.rank);
        let send = |writers: &mut [Option<TcpStream>]| {
            for k in 0..pieces {
                for s in 1..n {
                    let (to, _) = self.step(s);
                    let range = piece(chunk(len, n, to), pieces, k);
                    write(writers, to, f32_bytes(&data[range]))?;
                }
            }
            Ok(())
        };
        let recv = |readers: &mut [Option<TcpStream>]| {
            let mut parts: Vec<Vec<f32>> = (0..n).map(|_| Vec::new()).collect();
            for k in 0..pieces {
                let range = piece(mine.clone(), pieces, k);
                for s in 1..n {
                    let (_, from) = self.step(s);
                    parts[from].resize(range.len(), 0.0);
                    read(readers, from, f32_bytes_mut(&mut parts[from]))?;
                }
                let at = range.start - mine.start;
                let sources: Vec<&[f32]> =
                    (0..n).map(|q| if q == self.rank { &data[range.clone()] } else { &parts[q][..] }).collect();
                sum_in_rank_order(&sources, &mut out[at..at + range.len()]);
            }
            Ok(())
        };
        self.transfer(links, op, send, recv)
    }

    /// Sends `mine` (chunk `self.rank` of `len` elements) to every peer and
    /// receives theirs into their chunks of `all`.
    fn gather_chunks(
        &self,
        links: &mut Links,
        op: &'static str,
        mine: &[f32],
        all: &mut [f32],
        chunk_of: impl Fn(usize) -> std::ops::Range<usize> + Sync,
    ) -> Result<(), CommError> {
        let n = self.ranks;
        let pieces = chunk_of(0).len().div_ceil(PIECE).max(1);
        let send = |writers: &mut [Option<TcpStream>]| {
            for k in 0..pieces {
                for s in 1..n {
                    let (to, _) = self.step(s);
                    write(writers, to, f32_bytes(&mine[chunk(mine.len(), pieces, k)]))?;
                }
            }
            Ok(())
        };
        let recv = |readers: &mut [Option<TcpStream>]| {
            for k in 0..pieces {
                for s in 1..n {
                    let (_, from) = self.step(s);
                    let range = piece(chunk_of(from), pieces, k);
                    read(readers, from, f32_bytes_mut(&mut all[range]))?;
                }
            }
            Ok(())
        };
        self.transfer(links, op, send, recv)?;
        all[chunk_of(self.rank)].copy_from_slice(mine);
        Ok(())
    }

    /// The first rank whose length differs from rank 0's, as [`CommError::Mismatch`].
    fn same_lengths(op: &'static str, headers: &[Header]) -> Result<(), CommError> {
        let expected = headers[0].len;
        match headers.iter().position(|h| h.len != expected) {
            Some(rank) => {
                Err(CommError::Mismatch { op, rank, got: headers[rank].len as usize, expected: expected as usize })
            }
            None => Ok(()),
        }
    }

    fn links(&self) -> std::sync::MutexGuard<'_, Links> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Piece `k` of `pieces` of `range`.
fn piece(range: std::ops::Range<usize>, pieces: usize, k: usize) -> std::ops::Range<usize> {
    let p = chunk(range.len(), pieces, k);
    range.start + p.start..range.start + p.end
}

/// `out[i] = Σ_rank sources[rank][i]`, in rank order in f64: the sum
/// [`super::InProcess`] computes, to the bit.
fn sum_in_rank_order(sources: &[&[f32]], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = sources.iter().map(|s| f64::from(s[i])).sum::<f64>() as f32;
    }
}

fn write(writers: &mut [Option<TcpStream>], to: usize, bytes: &[u8]) -> Result<(), Failure> {
    let w = writers[to].as_mut().expect("a peer's connection");
    w.write_all(bytes).map_err(|e| (to, e))
}

fn read(readers: &mut [Option<TcpStream>], from: usize, bytes: &mut [u8]) -> Result<(), Failure> {
    let r = readers[from].as_mut().expect("a peer's connection");
    r.read_exact(bytes).map_err(|e| (from, e))
}

/// What a failed socket call means, in words.
fn cause(e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof => "it closed the connection".into(),
        ConnectionReset | ConnectionAborted | BrokenPipe => "the connection was reset".into(),
        _ => e.to_string(),
    }
}

impl Communicator for Tcp {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn all_reduce(&self, data: &mut [f32]) -> Result<(), CommError> {
        let op = "all_reduce";
        let mut links = self.links();
        let headers = self.headers(&mut links, op, data.len(), 0)?;
        Tcp::same_lengths(op, &headers)?;
        let (n, len) = (self.ranks, data.len());
        let mine = chunk(len, n, self.rank);
        let mut reduced = vec![0.0; mine.len()];
        self.reduce_chunks(&mut links, op, data, &mut reduced)?;
        self.gather_chunks(&mut links, op, &reduced, data, |q| chunk(len, n, q))
    }

    fn reduce_scatter(&self, data: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        let (op, n) = ("reduce_scatter", self.ranks);
        if !data.len().is_multiple_of(n) || out.len() != data.len() / n {
            return Err(CommError::Uneven { op, len: data.len(), ranks: n });
        }
        let mut links = self.links();
        let headers = self.headers(&mut links, op, data.len(), 0)?;
        Tcp::same_lengths(op, &headers)?;
        self.reduce_chunks(&mut links, op, data, out)
    }

    fn all_gather(&self, part: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        let (op, n) = ("all_gather", self.ranks);
        if out.len() != part.len() * n {
            return Err(CommError::Uneven { op, len: out.len(), ranks: n });
        }
        let mut links = self.links();
        let headers = self.headers(&mut links, op, part.len(), 0)?;
        Tcp::same_lengths(op, &headers)?;
        let m = part.len();
        self.gather_chunks(&mut links, op, part, out, |q| q * m..(q + 1) * m)
    }

    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<(), CommError> {
        let (op, n) = ("broadcast", self.ranks);
        if root >= n {
            return Err(CommError::NoRoot { op, root, ranks: n });
        }
        let mut links = self.links();
        let headers = self.headers(&mut links, op, data.len(), root)?;
        let expected = headers[root].len;
        if let Some(rank) = headers.iter().position(|h| h.len != expected) {
            let got = headers[rank].len as usize;
            return Err(CommError::Mismatch { op, rank, got, expected: expected as usize });
        }
        let pieces = data.len().div_ceil(PIECE).max(1);
        let len = data.len();
        if self.rank == root {
            let data = &*data;
            let send = |writers: &mut [Option<TcpStream>]| {
                for k in 0..pieces {
                    for to in (0..n).filter(|q| *q != root) {
                        write(writers, to, f32_bytes(&data[chunk(len, pieces, k)]))?;
                    }
                }
                Ok(())
            };
            self.transfer(&mut links, op, send, |_| Ok(()))
        } else {
            let recv = |readers: &mut [Option<TcpStream>]| {
                for k in 0..pieces {
                    read(readers, root, f32_bytes_mut(&mut data[chunk(len, pieces, k)]))?;
                }
                Ok(())
            };
            self.transfer(&mut links, op, |_| Ok(()), recv)
        }
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.headers(&mut self.links(), "barrier", 0, 0).map(|_| ())
    }

    fn abort(&self) {
        self.shutdown();
    }
}
