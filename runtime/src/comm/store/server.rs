//! The store's server (rank 0's): a thread per connection, each admitted
//! only once it has proved it holds the job token ([`auth::respond`]).
//!
//! Network input is hostile until then: at most `max_connections` are open
//! at once (the next is told it is busy and closed), a handshake must
//! finish within `idle`, and a request once begun may not fall silent for
//! longer; between requests an admitted rank may stay quiet as long as it
//! likes (ranks keep their connection for the whole run). A refused
//! connection is reported naming its address, and the job goes on.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::super::auth::{self, STORE};
use super::super::wire::{read_bytes, read_u8, read_u64, write_bytes, write_u8, write_u64};
use super::{ADD, FOUND, GET, SERVER_IDENTITY, SET, StoreConfig, StoreError, TIMED_OUT};

/// What the server's connection threads share.
struct Shared {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    stopping: AtomicBool,
    /// The open connections by number, to shut down when the server stops;
    /// each is removed when its thread ends, so their count is the limit's.
    connections: Mutex<HashMap<u64, TcpStream>>,
    next: AtomicU64,
    config: StoreConfig,
}

/// The store's server (rank 0's): stops, closing every client's
/// connection, when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Serves on `addr` (port 0: any free port; see [`StoreServer::addr`])
    /// to the holders of `config`'s token, within its limits.
    pub fn bind(addr: &str, config: &StoreConfig) -> Result<StoreServer, StoreError> {
        let fail = |e: io::Error| StoreError::Bind { addr: addr.to_string(), cause: e.to_string() };
        let listener = TcpListener::bind(addr).map_err(fail)?;
        let local = listener.local_addr().map_err(fail)?;
        let shared = Arc::new(Shared {
            map: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            connections: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            config: config.clone(),
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
        for c in self.shared.connections().values() {
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

impl Shared {
    fn connections(&self) -> std::sync::MutexGuard<'_, HashMap<u64, TcpStream>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let Ok(peer) = conn.peer_addr() else { continue };
        let id = shared.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut open = shared.connections();
            if open.len() >= shared.config.max_connections {
                drop(open);
                auth::busy(&conn, &STORE);
                continue;
            }
            let Ok(kept) = conn.try_clone() else { continue };
            open.insert(id, kept);
        }
        let serving = Arc::clone(shared);
        // A connection ends with its client (or its handshake); its thread with it.
        let spawned = std::thread::Builder::new().name("store-conn".into()).spawn(move || {
            let _ = serve(&conn, peer, &serving);
            serving.connections().remove(&id);
        });
        if spawned.is_err() {
            shared.connections().remove(&id);
        }
    }
}

/// Admits one client, then answers its requests until it disconnects.
fn serve(conn: &TcpStream, peer: SocketAddr, shared: &Shared) -> io::Result<()> {
    let config = &shared.config;
    if let Err(e) = auth::respond(conn, &config.token, &STORE, SERVER_IDENTITY, config.idle) {
        if !shared.stopping.load(Ordering::SeqCst) {
            auth::report("the rendezvous store", peer, &e);
        }
        return Ok(());
    }
    conn.set_nodelay(true)?;
    // A client that stops reading its replies is dropped too.
    conn.set_write_timeout(Some(config.idle))?;
    let mut r = BufReader::new(conn.try_clone()?);
    let mut w = BufWriter::new(conn.try_clone()?);
    let map = || shared.map.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        conn.set_read_timeout(None)?;
        let op = match read_u8(&mut r) {
            Ok(op) => op,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        // The rest of the request must follow without a long pause.
        conn.set_read_timeout(Some(config.idle))?;
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
