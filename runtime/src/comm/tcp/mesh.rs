//! Connecting a group's ranks to each other: one TCP connection per pair.
//!
//! Each rank listens on the interface it reaches the store by, publishes
//! `ip:port` under `tcp/GROUP/RANK`, connects to every lower rank (after
//! reading its address) and accepts every higher one. A connection opens
//! with a hello — magic, group, rank — so the acceptor knows who it is;
//! a stray connection is dropped. A connect completes in the peer's
//! backlog before it accepts, so no order of arrival deadlocks.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::super::store::Store;
use super::super::wire::{read_bytes, read_u64, write_bytes, write_u64};

const HELLO: &[u8; 4] = b"ZPT1";

/// The connection to each other rank of the group (`None` at this rank).
pub fn connect(store: &Store, group: &str, rank: usize, ranks: usize) -> Result<Vec<Option<TcpStream>>, String> {
    let mut peers: Vec<Option<TcpStream>> = (0..ranks).map(|_| None).collect();
    if ranks == 1 {
        return Ok(peers);
    }
    let deadline = Instant::now() + store.timeout();
    let listener = TcpListener::bind((store.local_ip(), 0))
        .map_err(|e| format!("could not listen on {} for the group's peers: {e}", store.local_ip()))?;
    let here = listener.local_addr().map_err(|e| e.to_string())?;
    let key = |r: usize| format!("tcp/{group}/{r}");
    store.set(&key(rank), here.to_string().as_bytes()).map_err(|e| e.to_string())?;
    for (q, peer) in peers.iter_mut().enumerate().take(rank) {
        let addr = String::from_utf8_lossy(&store.get(&key(q)).map_err(|e| e.to_string())?).into_owned();
        let addr: SocketAddr = addr.parse().map_err(|_| format!("rank {q} published `{addr}`, not an address"))?;
        let mut conn =
            connect_until(addr, deadline).map_err(|e| format!("could not connect to rank {q} at {addr}: {e}"))?;
        let mut hello = || -> io::Result<()> {
            conn.write_all(HELLO)?;
            write_bytes(&mut conn, group.as_bytes())?;
            write_u64(&mut conn, rank as u64)
        };
        hello().map_err(|e| format!("greeting rank {q} at {addr}: {e}"))?;
        *peer = Some(conn);
    }
    accept_higher(&listener, group, rank, &mut peers, deadline)?;
    for conn in peers.iter().flatten() {
        conn.set_nodelay(true).map_err(|e| e.to_string())?;
    }
    Ok(peers)
}

/// Accepts every rank above `rank`, each identified by its hello.
fn accept_higher(
    listener: &TcpListener,
    group: &str,
    rank: usize,
    peers: &mut [Option<TcpStream>],
    deadline: Instant,
) -> Result<(), String> {
    let ranks = peers.len();
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let missing = |peers: &[Option<TcpStream>]| (rank + 1..ranks).filter(|q| peers[*q].is_none()).collect::<Vec<_>>();
    while !missing(peers).is_empty() {
        match listener.accept() {
            Ok((conn, _)) => {
                let known = hello(&conn, group, deadline).filter(|q| (rank + 1..ranks).contains(q));
                if let Some(q) = known
                    && peers[q].is_none()
                {
                    peers[q] = Some(conn);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let list: Vec<String> = missing(peers).iter().map(usize::to_string).collect();
                    return Err(format!(
                        "rank(s) {} of the group never connected to this one (rank {rank}): they have not started \
                         or have failed (see their errors)",
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

/// The rank a new connection says it is, if it is one of `group`'s.
fn hello(conn: &TcpStream, group: &str, deadline: Instant) -> Option<usize> {
    conn.set_nonblocking(false).ok()?;
    let wait = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
    conn.set_read_timeout(Some(wait)).ok()?;
    let mut r = conn;
    let mut magic = [0; 4];
    r.read_exact(&mut magic).ok()?;
    let said = (&magic == HELLO).then(|| read_bytes(&mut r).ok()).flatten()?;
    let rank = read_u64(&mut r).ok()?;
    conn.set_read_timeout(None).ok()?;
    (said == group.as_bytes()).then_some(rank as usize)
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
