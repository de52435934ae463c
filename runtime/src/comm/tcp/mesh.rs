//! Connecting a group's ranks to each other: one TCP connection per pair,
//! each opened by the job's challenge–response ([`auth`]).
//!
//! Each rank listens on the interface it reaches the store by, publishes
//! `ip:port` under `tcp/GROUP/RANK`, connects to every lower rank (after
//! reading its address) and accepts every higher one. A connection's
//! handshake names the group and both ranks under its MACs, so the acceptor
//! knows who connected and the connector that it reached the rank it
//! dialled; anyone else who finds the listener is refused (and reported),
//! and the group still forms. Handshakes run on their own threads, each
//! within the store's idle timeout, so a stranger that connects and stalls
//! holds up no rank. A connect completes in the peer's backlog before it
//! accepts, so no order of arrival deadlocks.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::super::auth::{self, AuthError, MESH};
use super::super::store::{Store, StoreConfig};

/// The most handshakes a listener runs at once; past it a new connection
/// is told the listener is busy (a rank tries again).
const HANDSHAKES: usize = 64;

/// The connection to each other rank of the group (`None` at this rank).
pub fn connect(store: &Store, group: &str, rank: usize, ranks: usize) -> Result<Vec<Option<TcpStream>>, String> {
    let mut peers: Vec<Option<TcpStream>> = (0..ranks).map(|_| None).collect();
    if ranks == 1 {
        return Ok(peers);
    }
    if identity(group, ranks).len() > auth::MAX_CLAIM {
        return Err(format!("a group name of {} bytes: at most {} fit a handshake", group.len(), auth::MAX_CLAIM - 21));
    }
    let config = store.config();
    let deadline = Instant::now() + config.timeout;
    let listener = TcpListener::bind((store.local_ip(), 0))
        .map_err(|e| format!("could not listen on {} for the group's peers: {e}", store.local_ip()))?;
    let here = listener.local_addr().map_err(|e| e.to_string())?;
    let key = |r: usize| format!("tcp/{group}/{r}");
    store.set(&key(rank), here.to_string().as_bytes()).map_err(|e| e.to_string())?;
    for (q, peer) in peers.iter_mut().enumerate().take(rank) {
        let addr = String::from_utf8_lossy(&store.get(&key(q)).map_err(|e| e.to_string())?).into_owned();
        let addr: SocketAddr = addr.parse().map_err(|_| format!("rank {q} published `{addr}`, not an address"))?;
        let conn = dial(addr, config, group, rank, q, deadline)
            .map_err(|e| format!("could not join rank {q} of the group at {addr}: {e}"))?;
        *peer = Some(conn);
    }
    accept_higher(&listener, config, group, rank, &mut peers, deadline)?;
    for conn in peers.iter().flatten() {
        conn.set_nodelay(true).map_err(|e| e.to_string())?;
    }
    Ok(peers)
}

/// Who rank `rank` of `group` is in a handshake.
fn identity(group: &str, rank: usize) -> Vec<u8> {
    format!("{group}/{rank}").into_bytes()
}

/// Connects to rank `q` at `addr` as rank `rank` and authenticates both
/// ways, trying a busy or slow listener again until `deadline`; a refused
/// token, or a listener that cannot prove it holds it, is final.
fn dial(
    addr: SocketAddr,
    config: &StoreConfig,
    group: &str,
    rank: usize,
    q: usize,
    deadline: Instant,
) -> Result<TcpStream, String> {
    loop {
        let conn = connect_until(addr, deadline).map_err(|e| e.to_string())?;
        let within =
            config.idle.min(deadline.saturating_duration_since(Instant::now())).max(Duration::from_millis(100));
        match auth::initiate(&conn, &config.token, &MESH, &identity(group, rank), &identity(group, q), within) {
            Ok(()) => return Ok(conn),
            Err(e) if e.is_final() || Instant::now() >= deadline => return Err(e.to_string()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A finished handshake: who connected, and what it proved.
type Handshake = (SocketAddr, TcpStream, Result<Vec<u8>, AuthError>);

/// Accepts every rank above `rank`, each identified by its handshake.
fn accept_higher(
    listener: &TcpListener,
    config: &StoreConfig,
    group: &str,
    rank: usize,
    peers: &mut [Option<TcpStream>],
    deadline: Instant,
) -> Result<(), String> {
    let ranks = peers.len();
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let place = format!("rank {rank} of group `{group}`");
    let me = identity(group, rank);
    let (done, finished) = mpsc::channel::<Handshake>();
    let running = Arc::new(AtomicUsize::new(0));
    let mut refused = 0;
    let missing = |peers: &[Option<TcpStream>]| (rank + 1..ranks).filter(|q| peers[*q].is_none()).collect::<Vec<_>>();
    while !missing(peers).is_empty() {
        while let Ok((peer, conn, proved)) = finished.try_recv() {
            match proved {
                Ok(claim) => {
                    let q = claimed_rank(&claim, group).filter(|q| (rank + 1..ranks).contains(q));
                    if let Some(q) = q
                        && peers[q].is_none()
                    {
                        peers[q] = Some(conn);
                    }
                }
                Err(e) => {
                    refused += 1;
                    auth::report(&place, peer, &e);
                }
            }
        }
        match listener.accept() {
            Ok((conn, peer)) => {
                if running.load(Ordering::SeqCst) >= HANDSHAKES {
                    auth::busy(&conn, &MESH);
                    continue;
                }
                // Accepted from a non-blocking listener; the handshake blocks, with timeouts.
                if conn.set_nonblocking(false).is_err() {
                    continue;
                }
                running.fetch_add(1, Ordering::SeqCst);
                let (done, running) = (done.clone(), Arc::clone(&running));
                let (token, idle, me) = (config.token.clone(), config.idle, me.clone());
                // Left to finish on its own once the group has formed: a
                // stalled stranger's thread ends at the idle timeout.
                std::thread::spawn(move || {
                    let proved = auth::respond(&conn, &token, &MESH, &me, idle);
                    running.fetch_sub(1, Ordering::SeqCst);
                    let _ = done.send((peer, conn, proved));
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let list: Vec<String> = missing(peers).iter().map(usize::to_string).collect();
                    let strangers = match refused {
                        0 => String::new(),
                        n => format!("; {n} connection(s) that did not hold the job token were refused meanwhile"),
                    };
                    return Err(format!(
                        "rank(s) {} of the group never connected to this one (rank {rank}): they have not started \
                         or have failed (see their errors){strangers}",
                        list.join(", ")
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(format!("accepting the group's peers: {e}")),
        }
    }
    Ok(())
}

/// The rank in a proved claim `GROUP/RANK`, if it is `group`'s.
fn claimed_rank(claim: &[u8], group: &str) -> Option<usize> {
    let claim = std::str::from_utf8(claim).ok()?;
    claim.strip_prefix(group)?.strip_prefix('/')?.parse().ok()
}

/// Connects to `addr`, retrying until `deadline` (its listener is up: it
/// published the address, but a busy backlog may refuse for a moment).
fn connect_until(addr: SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.clamp(Duration::from_millis(10), Duration::from_secs(2))) {
            Ok(c) => return Ok(c),
            Err(e) if left.is_zero() => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
