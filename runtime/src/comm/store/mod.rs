//! The rendezvous: a small TCP key-value store, as torchrun's `TCPStore`,
//! open only to the job's own ranks.
//!
//! Rank 0 serves it ([`StoreServer`], a thread per connection) at
//! `MASTER_ADDR:MASTER_PORT`; every rank, rank 0 included, is a client
//! ([`Store`]) that connects with retries until a deadline (the ranks start
//! in any order). Every connection opens with the job's challenge–response
//! ([`super::auth`]): a process without the job token is refused before it
//! can read or write a key — the addresses the ranks connect to for their
//! gradients are among them — and a rank will not talk to a server that
//! cannot prove it holds the token either. The ranks publish what the
//! others need to join them — a TCP communicator's listening address, an
//! NCCL unique id — with [`Store::set`], and [`Store::get`] waits for a
//! key another rank sets. Every wait has the store's timeout and fails
//! naming what it waited for, so a rank that never comes (a bad argument, a
//! crash before the rendezvous) is an error on the others, not a hang; a
//! server that goes away (rank 0 died) is an error on the next call.

mod server;

use std::io::{self, BufReader, BufWriter, Write};
use std::net::{IpAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::auth::{self, STORE};
use super::token::JobToken;
use super::wire::{read_bytes, read_u8, read_u64, write_bytes, write_u8, write_u64};

pub use server::StoreServer;

/// Who a client believes it reached, under the handshake's MACs.
const SERVER_IDENTITY: &[u8] = b"store";

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
         (MASTER_PORT, or `zeroplan launch --master-port P`). Is MASTER_ADDR an address of this host? The store \
         serves on it alone unless {bind_var} names another (0.0.0.0 or [::] for every interface)",
        bind_var = super::world::STORE_BIND_VAR
    )]
    Bind { addr: String, cause: String },
    #[error(
        "the rendezvous store at {addr} did not admit this rank: {cause}. Every rank of a job needs the same job \
         token: start them with one `zeroplan launch` (it draws one for its ranks), or give every node the same \
         secret (`zeroplan launch --token-file FILE`, or {token_var} / {file_var})",
        token_var = super::token::TOKEN_VAR,
        file_var = super::token::TOKEN_FILE_VAR
    )]
    Unauthenticated { addr: String, cause: String },
}

/// How long a handshake may take, and a connection stay silent in the
/// middle of a request, before it is dropped (on either end).
pub const DEFAULT_IDLE: Duration = Duration::from_secs(10);
/// The most connections a server holds at once, handshaking or admitted.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// What a job's store connections share: the secret, and the limits that
/// keep a stranger from holding the store up.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// The job's secret, which every connection proves it holds.
    pub token: JobToken,
    /// How long a rendezvous wait may take: reaching the store, each key.
    pub timeout: Duration,
    /// The idle timeout: how long a handshake may take, and a connection
    /// stay silent mid-request ([`DEFAULT_IDLE`]). The mesh's handshakes
    /// take it too.
    pub idle: Duration,
    /// The most connections the server holds at once ([`DEFAULT_MAX_CONNECTIONS`]).
    pub max_connections: usize,
}

impl StoreConfig {
    /// `token` and `timeout`, with the default idle timeout and connection limit.
    pub fn new(token: JobToken, timeout: Duration) -> StoreConfig {
        StoreConfig { token, timeout, idle: DEFAULT_IDLE, max_connections: DEFAULT_MAX_CONNECTIONS }
    }
}

/// A rank's connection to the store. Rank 0's also owns the server, which
/// lives as long as it does.
pub struct Store {
    conn: Mutex<(BufReader<TcpStream>, BufWriter<TcpStream>)>,
    addr: String,
    config: StoreConfig,
    local_ip: IpAddr,
    _server: Option<StoreServer>,
}

impl Store {
    /// Connects to the store at `addr` (`host:port`) and proves this rank
    /// holds `config`'s token, retrying until `config.timeout` has passed:
    /// the server may not be up yet, or be busy. A server that refuses the
    /// token, or cannot prove it holds it, is an error at once. Every later
    /// wait for a key has the same timeout.
    pub fn connect(addr: &str, config: &StoreConfig) -> Result<Store, StoreError> {
        let deadline = Instant::now() + config.timeout;
        let secs = config.timeout.as_secs();
        let mut pause = Duration::from_millis(20);
        let conn = loop {
            let cause = match connect_once(addr, deadline) {
                Ok(conn) => {
                    let within = config.idle.min(deadline.saturating_duration_since(Instant::now()));
                    let within = within.max(Duration::from_millis(100));
                    match auth::initiate(&conn, &config.token, &STORE, b"", SERVER_IDENTITY, within) {
                        Ok(()) => break conn,
                        Err(e) if e.is_final() => {
                            return Err(StoreError::Unauthenticated { addr: addr.to_string(), cause: e.to_string() });
                        }
                        Err(e) => e.to_string(),
                    }
                }
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
        conn.set_read_timeout(Some(config.timeout + Duration::from_secs(10))).map_err(lost)?;
        let local_ip = conn.local_addr().map_err(lost)?.ip();
        let w = BufWriter::new(conn.try_clone().map_err(lost)?);
        let r = BufReader::new(conn);
        Ok(Store { conn: Mutex::new((r, w)), addr: addr.to_string(), config: config.clone(), local_ip, _server: None })
    }

    /// Serves the store on `bind` and connects to it at `addr` (rank 0).
    pub fn serve(bind: &str, addr: &str, config: &StoreConfig) -> Result<Store, StoreError> {
        let server = StoreServer::bind(bind, config)?;
        let mut store = Store::connect(addr, config)?;
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

    /// The token and limits it connected with (a rank's mesh takes them too).
    pub fn config(&self) -> &StoreConfig {
        &self.config
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
        let millis = self.config.timeout.as_millis().min(u128::from(u64::MAX)) as u64;
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
            secs: self.config.timeout.as_secs(),
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
            // A client retrying before its server binds can connect to
            // itself (TCP's simultaneous open, where the kernel picks the
            // server's port as the client's own), and that socket then holds
            // the port the server is about to bind: dropped, and tried again.
            Ok(c) if c.local_addr().ok() == Some(a) => {
                last = io::Error::new(io::ErrorKind::ConnectionRefused, format!("`{a}` answered as this very socket"));
            }
            Ok(c) => return Ok(c),
            Err(e) => last = e,
        }
    }
    Err(last)
}
