//! The rendezvous: a small TCP key-value store, as torchrun's `TCPStore`.
//!
//! Rank 0 serves it ([`StoreServer`], a thread per connection) at
//! `MASTER_ADDR:MASTER_PORT`; every rank, rank 0 included, is a client
//! ([`Store`]) that connects with retries until a deadline (the ranks start
//! in any order). The ranks publish what the others need to join them — a
//! TCP communicator's listening address, an NCCL unique id — with
//! [`Store::set`], and [`Store::get`] waits for a key another rank sets.
//! Every wait has the store's timeout and fails naming what it waited for,
//! so a rank that never comes (a bad argument, a crash before the
//! rendezvous) is an error on the others, not a hang; a server that goes
//! away (rank 0 died) is an error on the next call.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::wire::{read_bytes, read_u8, read_u64, write_bytes, write_u8, write_u64};

/// The first bytes of a client's connection: a stray connection is dropped.
const MAGIC: &[u8; 4] = b"ZPS1";

const SET: u8 = b'S';
const GET: u8 = b'G';
const ADD: u8 = b'A';
const FOUND: u8 = 0;
const TIMED_OUT: u8 = 1;

/// Why a store call failed, naming the address and what to do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    #[error(
        "could not reach the rendezvous store at {addr} within {secs} s ({cause}): is rank 0 running, and are \
         MASTER_ADDR and MASTER_PORT the same on every rank?"
    )]
    Unreachable { addr: String, secs: u64, cause: String },
    #[error(
        "waited {secs} s at the rendezvous store {addr} for `{key}`, which another rank sets: that rank has not \
         started or has failed (see its error); raise {timeout_var} if ranks start slowly",
        timeout_var = super::world::TIMEOUT_VAR
    )]
    Timeout { addr: String, key: String, secs: u64 },
    #[error("lost the rendezvous store at {addr} ({cause}): rank 0, which serves it, has stopped (see its error)")]
    Lost { addr: String, cause: String },
    #[error(
        "could not serve the rendezvous store on {addr} ({cause}): is the port taken? Choose another \
         (MASTER_PORT, or `zeroplan launch --master-port P`)"
    )]
    Bind { addr: String, cause: String },
}

/// What the server's connection threads share.
struct Shared {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    stopping: AtomicBool,
    /// Every accepted connection, to shut down when the server stops.
    connections: Mutex<Vec<TcpStream>>,
}

/// The store's server (rank 0's): stops, closing every client's
/// connection, when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Serves on `addr` (port 0: any free port; see [`StoreServer::addr`]).
    pub fn bind(addr: &str) -> Result<StoreServer, StoreError> {
        let fail = |e: io::Error| StoreError::Bind { addr: addr.to_string(), cause: e.to_string() };
        let listener = TcpListener::bind(addr).map_err(fail)?;
        let local = listener.local_addr().map_err(fail)?;
        let shared = Arc::new(Shared {
            map: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
        });
        let accepting = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("store-accept".into())
            .spawn(move || accept_loop(&listener, &accepting))
            .map_err(fail)?;
        Ok(StoreServer { addr: local, shared, accept: Some(accept) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for c in self.shared.connections.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = c.shutdown(Shutdown::Both);
        }
        self.shared.changed.notify_all();
        // Wakes the accept loop, which then sees `stopping`.
        let wake = match self.addr.ip() {
            ip if ip.is_unspecified() => SocketAddr::new(IpAddr::from([127, 0, 0, 1]), self.addr.port()),
            _ => self.addr,
        };
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let Ok(kept) = conn.try_clone() else { continue };
        shared.connections.lock().unwrap_or_else(|e| e.into_inner()).push(kept);
        let shared = Arc::clone(shared);
        // A connection ends with its client; its thread with it.
        let _ = std::thread::Builder::new().name("store-conn".into()).spawn(move || {
            let _ = serve(conn, &shared);
        });
    }
}

/// Answers one client's requests until it disconnects.
fn serve(conn: TcpStream, shared: &Shared) -> io::Result<()> {
    conn.set_nodelay(true)?;
    let mut r = BufReader::new(conn.try_clone()?);
    let mut w = BufWriter::new(conn);
    let mut magic = [0; 4];
    std::io::Read::read_exact(&mut r, &mut magic)?;
    if &magic != MAGIC {
        return Ok(());
    }
    let map = || shared.map.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let op = match read_u8(&mut r) {
            Ok(op) => op,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let key = String::from_utf8_lossy(&read_bytes(&mut r)?).into_owned();
        match op {
            SET => {
                let value = read_bytes(&mut r)?;
                map().insert(key, value);
                shared.changed.notify_all();
                write_u8(&mut w, FOUND)?;
            }
            GET => {
                let deadline = Instant::now() + Duration::from_millis(read_u64(&mut r)?);
                let mut m = map();
                let found = loop {
                    if let Some(v) = m.get(&key) {
                        break Some(v.clone());
                    }
                    let now = Instant::now();
                    if now >= deadline || shared.stopping.load(Ordering::SeqCst) {
                        break None;
                    }
                    m = shared.changed.wait_timeout(m, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
                };
                drop(m);
                match found {
                    // Stopping: the client learns it from the closed connection.
                    None if shared.stopping.load(Ordering::SeqCst) => return Ok(()),
                    Some(v) => {
                        write_u8(&mut w, FOUND)?;
                        write_bytes(&mut w, &v)?;
                    }
                    None => write_u8(&mut w, TIMED_OUT)?,
                }
            }
            ADD => {
                let delta = read_u64(&mut r)? as i64;
                let mut m = map();
                let old =
                    m.get(&key).and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok()).map_or(0, i64::from_le_bytes);
                let new = old.wrapping_add(delta);
                m.insert(key, new.to_le_bytes().to_vec());
                drop(m);
                shared.changed.notify_all();
                write_u64(&mut w, new as u64)?;
            }
            _ => return Ok(()),
        }
        w.flush()?;
    }
}

/// A rank's connection to the store. Rank 0's also owns the server, which
/// lives as long as it does.
pub struct Store {
    conn: Mutex<(BufReader<TcpStream>, BufWriter<TcpStream>)>,
    addr: String,
    timeout: Duration,
    local_ip: IpAddr,
    _server: Option<StoreServer>,
}

impl Store {
    /// Connects to the store at `addr` (`host:port`), retrying until
    /// `timeout` has passed: the server may not be up yet. Every later wait
    /// for a key has the same timeout.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Store, StoreError> {
        let deadline = Instant::now() + timeout;
        let secs = timeout.as_secs();
        let mut pause = Duration::from_millis(20);
        let conn = loop {
            let cause = match connect_once(addr, deadline) {
                Ok(conn) => break conn,
                Err(e) => e.to_string(),
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Unreachable { addr: addr.to_string(), secs, cause });
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(500));
        };
        let lost = |e: io::Error| StoreError::Lost { addr: addr.to_string(), cause: e.to_string() };
        conn.set_nodelay(true).map_err(lost)?;
        // A server that stops answering (but keeps the connection) is lost too.
        conn.set_read_timeout(Some(timeout + Duration::from_secs(10))).map_err(lost)?;
        let local_ip = conn.local_addr().map_err(lost)?.ip();
        let mut w = BufWriter::new(conn.try_clone().map_err(lost)?);
        w.write_all(MAGIC).and_then(|()| w.flush()).map_err(lost)?;
        let r = BufReader::new(conn);
        Ok(Store { conn: Mutex::new((r, w)), addr: addr.to_string(), timeout, local_ip, _server: None })
    }

    /// Serves the store on `bind` and connects to it at `addr` (rank 0).
    pub fn serve(bind: &str, addr: &str, timeout: Duration) -> Result<Store, StoreError> {
        let server = StoreServer::bind(bind)?;
        let mut store = Store::connect(addr, timeout)?;
        store._server = Some(server);
        Ok(store)
    }

    /// The address of this host's end of the connection: the interface the
    /// other ranks can reach it by (where its TCP communicator listens).
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    /// The address the store was reached at.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.call(|r, w| {
            write_u8(w, SET)?;
            write_bytes(w, key.as_bytes())?;
            write_bytes(w, value)?;
            w.flush()?;
            read_u8(r).map(|_| ())
        })
    }

    /// `key`'s value, waiting up to the store's timeout for a rank to set it.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let millis = self.timeout.as_millis().min(u128::from(u64::MAX)) as u64;
        let found = self.call(|r, w| {
            write_u8(w, GET)?;
            write_bytes(w, key.as_bytes())?;
            write_u64(w, millis)?;
            w.flush()?;
            match read_u8(r)? {
                FOUND => read_bytes(r).map(Some),
                _ => Ok(None),
            }
        })?;
        found.ok_or_else(|| StoreError::Timeout {
            addr: self.addr.clone(),
            key: key.to_string(),
            secs: self.timeout.as_secs(),
        })
    }

    /// Adds `delta` to the counter `key` (0 when unset); its new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.call(|r, w| {
            write_u8(w, ADD)?;
            write_bytes(w, key.as_bytes())?;
            write_u64(w, delta as u64)?;
            w.flush()?;
            read_u64(r).map(|v| v as i64)
        })
    }

    /// Waits until every key in `keys` is set.
    pub fn wait(&self, keys: &[&str]) -> Result<(), StoreError> {
        keys.iter().try_for_each(|k| self.get(k).map(|_| ()))
    }

    /// Runs one request and its reply on the connection.
    fn call<T>(
        &self,
        f: impl FnOnce(&mut BufReader<TcpStream>, &mut BufWriter<TcpStream>) -> io::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let (r, w) = &mut *conn;
        f(r, w).map_err(|e| {
            let cause = match e.kind() {
                io::ErrorKind::UnexpectedEof => "the connection was closed".to_string(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "no reply".to_string(),
                _ => e.to_string(),
            };
            StoreError::Lost { addr: self.addr.clone(), cause }
        })
    }
}

impl zeroplan_exec::comm::Rendezvous for Store {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), String> {
        Store::set(self, key, value).map_err(|e| e.to_string())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, String> {
        Store::get(self, key).map_err(|e| e.to_string())
    }
}

/// One attempt at each address `addr` resolves to.
fn connect_once(addr: &str, deadline: Instant) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("`{addr}` resolves to no address"));
    for a in addr.to_socket_addrs()? {
        let left =
            deadline.saturating_duration_since(Instant::now()).clamp(Duration::from_millis(10), Duration::from_secs(2));
        match TcpStream::connect_timeout(&a, left) {
            Ok(c) => return Ok(c),
            Err(e) => last = e,
        }
    }
    Err(last)
}
