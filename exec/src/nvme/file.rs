//! One rank's state file on the NVMe tier, and its asynchronous reads and
//! writes.
//!
//! The file is preallocated at its full size when it is created
//! (`posix_fallocate`), so a disk without room is an error at load, before
//! the first step, and no later write needs a new block: a full disk can
//! never leave a step half-written. I/O goes through Linux io_uring
//! (`io-uring`, the tokio-rs bindings) with `O_DIRECT`, as DeepSpeed's
//! ZeRO-Infinity swapper does with libaio: the page cache would otherwise
//! keep a second copy of the states in RAM. Two fallbacks, each logged
//! once: a file system that refuses `O_DIRECT` (tmpfs) gets buffered I/O,
//! and a kernel that refuses io_uring (a seccomp filter) gets positioned
//! reads and writes done at submission on the calling thread.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use io_uring::{IoUring, opcode, types};

/// The alignment of every offset, length and memory address of a direct
/// transfer: 4096 bytes, the page size and the largest logical block size
/// of NVMe drives in use (`O_DIRECT` needs the device's logical block).
pub const BLOCK: usize = 4096;

/// The most bytes one io_uring entry moves: its length is 32 bits, and a
/// state (a ZeRO-1 master of a whole large model) may be more.
const PIECE: usize = 1 << 30;

/// Entries of the submission queue: more transfers in flight than one
/// rank's schedule ever keeps (a state being read ahead, a few written back).
const QUEUE_DEPTH: u32 = 64;

/// How a state file asks to be read and written. A run asks for both;
/// each is given up where refused. Tests turn them off to reach the
/// fallbacks on a machine that grants both (tmpfs takes `O_DIRECT` since
/// Linux 6.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Io {
    /// Open with `O_DIRECT` (bypassing the page cache).
    pub direct: bool,
    /// Transfer through an io_uring (asynchronously).
    pub io_uring: bool,
}

impl Default for Io {
    fn default() -> Io {
        Io { direct: true, io_uring: true }
    }
}

/// A transfer between memory and the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// File to memory.
    Read,
    /// Memory to file.
    Write,
}

/// A finished transfer, by the tag it was submitted with.
#[derive(Debug)]
pub struct Completion {
    /// The caller's tag.
    pub tag: u64,
    /// Whether it moved every byte; the error names the file.
    pub result: Result<(), String>,
}

/// How transfers run.
enum Engine {
    /// Queued on an io_uring; completions reaped later.
    Uring(Box<IoUring>),
    /// Done at submission (io_uring refused); completions queued.
    Blocking(VecDeque<Completion>),
}

/// What a submitted transfer was, to finish a short one and name it.
#[derive(Clone, Copy)]
struct Pending {
    transfer: Transfer,
    at: u64,
    ptr: *mut u8,
    len: usize,
}

/// One rank's state file, preallocated, open for direct I/O where the file
/// system allows it.
pub struct StateFile {
    path: PathBuf,
    file: File,
    direct: bool,
    engine: Engine,
    /// io_uring entries in flight, by their own id: the transfer's tag and piece.
    pending: HashMap<u64, (u64, Pending)>,
    /// Per tag: pieces still in flight, and the first error among those done.
    parts: HashMap<u64, (usize, Result<(), String>)>,
    next_id: u64,
}

// The raw pointers in `pending` are the caller's memory, which it keeps
// valid until their completion is reaped (see `submit`).
unsafe impl Send for StateFile {}

impl StateFile {
    /// Creates (or truncates) `dir/name` at `bytes` bytes, all allocated.
    /// A missing directory, a full disk, and a file size limit are errors
    /// naming `dir` and the fix.
    pub fn create(dir: &Path, name: &str, bytes: u64, io: Io) -> Result<StateFile, String> {
        if !dir.is_dir() {
            return Err(format!(
                "--nvme-dir {}: no such directory: create it (on the NVMe drive the states should live on) first",
                dir.display()
            ));
        }
        let path = dir.join(name);
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(true).create(true).truncate(true);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(&path)
        };
        let (file, direct) = match open(io.direct) {
            Ok(f) => (f, io.direct),
            // EINVAL: the file system does not do direct I/O.
            Err(e) if io.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                (open(false).map_err(|e| format!("{}: could not create it: {e}", path.display()))?, false)
            }
            Err(e) => return Err(format!("{}: could not create it: {e}", path.display())),
        };
        allocate(&file, bytes).map_err(|e| {
            let _ = std::fs::remove_file(&path);
            format!(
                "--nvme-dir {}: could not allocate {bytes} bytes for this rank's states in {}: {e}: free space there \
                 (or raise the file size limit), or choose another --nvme-dir",
                dir.display(),
                path.display()
            )
        })?;
        let ring = if io.io_uring { IoUring::new(QUEUE_DEPTH) } else { Err(std::io::Error::other("not asked for")) };
        let engine = match ring {
            Ok(ring) => Engine::Uring(Box::new(ring)),
            Err(e) => {
                tracing::warn!("NVMe tier: io_uring is not used ({e}): reads and writes run synchronously");
                Engine::Blocking(VecDeque::new())
            }
        };
        if !direct {
            tracing::warn!(
                "NVMe tier: {} is read and written buffered (O_DIRECT {}), so the page cache may hold a copy of the states",
                dir.display(),
                if io.direct { "refused by its file system" } else { "not asked for" }
            );
        }
        Ok(StateFile { path, file, direct, engine, pending: HashMap::new(), parts: HashMap::new(), next_id: 0 })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether transfers bypass the page cache (`O_DIRECT`).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Whether transfers are asynchronous (io_uring) rather than done at
    /// submission.
    pub fn asynchronous(&self) -> bool {
        matches!(self.engine, Engine::Uring(_))
    }

    /// Starts moving `len` bytes between `ptr` and the file at `at`;
    /// [`StateFile::reap`] gives its completion under `tag`.
    ///
    /// # Safety
    /// `ptr..ptr+len` stays valid, and is neither read (for a read) nor
    /// written (either way) by anyone else, until the completion is reaped.
    /// `ptr`, `at` and `len` are multiples of [`BLOCK`].
    pub unsafe fn submit(&mut self, transfer: Transfer, tag: u64, at: u64, ptr: *mut u8, len: usize) {
        let pending = Pending { transfer, at, ptr, len };
        match &mut self.engine {
            Engine::Blocking(done) => {
                // SAFETY: the caller's contract.
                let result = unsafe { blocking(&self.file, &self.path, pending, 0) };
                done.push_back(Completion { tag, result });
            }
            Engine::Uring(ring) => {
                let fd = types::Fd(self.file.as_raw_fd());
                let pieces = len.div_ceil(PIECE).max(1);
                self.parts.insert(tag, (pieces, Ok(())));
                for k in 0..pieces {
                    let (start, n) = (k * PIECE, (len - k * PIECE).min(PIECE));
                    // SAFETY: inside the caller's range.
                    let piece = Pending { transfer, at: at + start as u64, ptr: unsafe { ptr.add(start) }, len: n };
                    let entry = match transfer {
                        Transfer::Read => opcode::Read::new(fd, piece.ptr, n as u32).offset(piece.at).build(),
                        Transfer::Write => opcode::Write::new(fd, piece.ptr, n as u32).offset(piece.at).build(),
                    }
                    .user_data(self.next_id);
                    self.pending.insert(self.next_id, (tag, piece));
                    self.next_id += 1;
                    // SAFETY: the caller keeps the memory valid until the completion.
                    while unsafe { ring.submission().push(&entry) }.is_err() {
                        // The queue is full: make room by submitting what is queued.
                        let _ = ring.submit();
                    }
                }
                let _ = ring.submit();
            }
        }
    }

    /// Transfers submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        match &self.engine {
            Engine::Blocking(done) => done.len(),
            Engine::Uring(_) => self.parts.len(),
        }
    }

    /// The finished transfers; with `wait`, at least one (none when
    /// nothing is in flight).
    pub fn reap(&mut self, wait: bool) -> Vec<Completion> {
        let Engine::Uring(ring) = &mut self.engine else {
            let Engine::Blocking(done) = &mut self.engine else { unreachable!() };
            return done.drain(..).collect();
        };
        if wait
            && !self.pending.is_empty()
            && ring.completion().is_empty()
            && let Err(e) = ring.submit_and_wait(1)
        {
            // The ring itself failed: every transfer in flight is lost.
            let message = format!("{}: io_uring failed: {e}", self.path.display());
            self.pending.clear();
            return self.parts.drain().map(|(tag, _)| Completion { tag, result: Err(message.clone()) }).collect();
        }
        let finished: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        let mut out = Vec::new();
        for (id, res) in finished {
            let Some((tag, p)) = self.pending.remove(&id) else { continue };
            let result = if res < 0 {
                Err(describe(&self.path, p.transfer, std::io::Error::from_raw_os_error(-res)))
            } else if (res as usize) < p.len {
                // A short transfer: finish it here.
                // SAFETY: the memory is still the caller's, as `submit` required.
                unsafe { blocking(&self.file, &self.path, p, res as usize) }
            } else {
                Ok(())
            };
            let Some((left, first)) = self.parts.get_mut(&tag) else { continue };
            *left -= 1;
            if first.is_ok() {
                *first = result;
            }
            if *left == 0 {
                let (_, result) = self.parts.remove(&tag).expect("present");
                out.push(Completion { tag, result });
            }
        }
        out
    }
}

impl Drop for StateFile {
    /// Waits for the transfers in flight (their memory must outlive them),
    /// then removes the file: it is a cache of the states, never read by
    /// another run.
    fn drop(&mut self) {
        while !self.pending.is_empty() {
            let before = self.pending.len();
            self.reap(true);
            if self.pending.len() == before {
                break;
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Allocates the file's blocks: `posix_fallocate`, or setting its length
/// where the file system cannot allocate ahead.
fn allocate(file: &File, bytes: u64) -> std::io::Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: a plain call on an open descriptor.
    let err = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, bytes as libc::off_t) };
    match err {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::ENOSYS => file.set_len(bytes),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Moves the bytes of `p` from `done` on with positioned reads or writes.
///
/// # Safety
/// `p.ptr..p.ptr+p.len` is valid memory the caller owns for the call.
unsafe fn blocking(file: &File, path: &Path, p: Pending, done: usize) -> Result<(), String> {
    let at = p.at + done as u64;
    let len = p.len - done;
    // SAFETY: the caller's contract.
    let result = unsafe {
        match p.transfer {
            Transfer::Read => file.read_exact_at(std::slice::from_raw_parts_mut(p.ptr.add(done), len), at),
            Transfer::Write => file.write_all_at(std::slice::from_raw_parts(p.ptr.add(done), len), at),
        }
    };
    result.map_err(|e| describe(path, p.transfer, e))
}

fn describe(path: &Path, transfer: Transfer, e: std::io::Error) -> String {
    let what = match transfer {
        Transfer::Read => "reading",
        Transfer::Write => "writing",
    };
    format!("{}: {what} the states failed: {e}", path.display())
}
