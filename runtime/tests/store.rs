//! The rendezvous store: set, get (waiting for another rank's set), add,
//! wait; timeouts that name the key or the address; a server that goes
//! away is an error on its clients, not a hang. And its door: a client
//! without the job token is refused while the job goes on, a recorded
//! handshake replayed is refused, no stranger can overwrite a key, a server
//! that cannot prove it holds the token is not trusted, and clients that
//! connect and stall are dropped at the idle timeout, even when they fill
//! the connection limit.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zeroplan_runtime::comm::{JobToken, Store, StoreConfig, StoreError, StoreServer};

const SHORT: Duration = Duration::from_secs(1);

/// The tests' job token (another job's: [`stranger`]).
fn token() -> JobToken {
    JobToken::parse("this job's token: 32 characters at least", "the tests").unwrap()
}

fn stranger() -> JobToken {
    JobToken::parse("another job's token, as long as this one's", "the tests").unwrap()
}

/// The job's token and `timeout`, default limits.
fn config(timeout: Duration) -> StoreConfig {
    StoreConfig::new(token(), timeout)
}

fn server() -> (StoreServer, String) {
    let server = StoreServer::bind("127.0.0.1:0", &config(SHORT)).unwrap();
    let addr = server.addr().to_string();
    (server, addr)
}

/// A port nothing listens on (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs `f` on a thread; fails the test if it has not returned in 30 s.
fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(Duration::from_secs(30)).expect("hung: no answer within 30 s")
}

#[test]
fn set_get_add_and_wait_between_clients() {
    let (_server, addr) = server();
    let a = Store::connect(&addr, &config(SHORT)).unwrap();
    let b = Store::connect(&addr, &config(Duration::from_secs(10))).unwrap();
    a.set("x", b"hello").unwrap();
    assert_eq!(b.get("x").unwrap(), b"hello");
    a.set("x", b"").unwrap();
    assert_eq!(b.get("x").unwrap(), b"", "an empty value is a value, and a set overwrites");
    assert_eq!(a.add("n", 2).unwrap(), 2);
    assert_eq!(b.add("n", -5).unwrap(), -3);
    // `get` waits for a key another client sets later.
    let later = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        a.set("late", &[1, 2, 3]).unwrap();
        a.set("also", &[]).unwrap();
    });
    let start = Instant::now();
    assert_eq!(b.get("late").unwrap(), [1, 2, 3]);
    assert!(start.elapsed() >= Duration::from_millis(150), "returned before the set");
    b.wait(&["late", "also", "x"]).unwrap();
    later.join().unwrap();
    assert!(b.local_ip().is_loopback());
}

#[test]
fn a_key_nobody_sets_times_out_naming_it() {
    let (_server, addr) = server();
    let store = Store::connect(&addr, &config(SHORT)).unwrap();
    let start = Instant::now();
    let e = store.get("tcp/data0/1").unwrap_err();
    assert!(start.elapsed() >= SHORT, "gave up early");
    assert_eq!(e, StoreError::Timeout { addr: addr.clone(), key: "tcp/data0/1".into(), secs: 1 });
    let text = e.to_string();
    assert!(text.contains("`tcp/data0/1`") && text.contains("ZEROPLAN_RENDEZVOUS_TIMEOUT"), "{text}");
    // The connection is still good after a timeout.
    store.set("k", b"v").unwrap();
    assert_eq!(store.get("k").unwrap(), b"v");
}

#[test]
fn an_unreachable_store_is_an_error_naming_its_address() {
    let addr = format!("127.0.0.1:{}", free_port());
    let e = within({
        let addr = addr.clone();
        move || Store::connect(&addr, &config(Duration::from_millis(500))).err().expect("nothing listens there")
    });
    assert!(matches!(&e, StoreError::Unreachable { addr: a, .. } if *a == addr), "{e:?}");
    assert!(e.to_string().contains(&addr) && e.to_string().contains("MASTER_ADDR"), "{e}");
    let e = within(|| Store::connect("no-such-host.invalid:29500", &config(Duration::from_millis(300))).err().unwrap());
    assert!(matches!(e, StoreError::Unreachable { .. }), "{e:?}");
}

#[test]
fn clients_retry_until_the_server_comes_up() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let client = std::thread::spawn({
        let addr = addr.clone();
        move || Store::connect(&addr, &config(Duration::from_secs(20))).map(|s| s.get("up"))
    });
    std::thread::sleep(Duration::from_millis(300));
    let first = Store::serve(&addr, &addr, &config(SHORT)).unwrap();
    first.set("up", b"yes").unwrap();
    assert_eq!(client.join().unwrap().unwrap().unwrap(), b"yes");
    // The port is now taken: a second server is refused, naming it.
    let e = StoreServer::bind(&addr, &config(SHORT)).err().unwrap();
    assert!(matches!(&e, StoreError::Bind { addr: a, .. } if *a == addr) && e.to_string().contains("MASTER_PORT"));
}

#[test]
fn a_server_that_dies_is_an_error_on_its_clients_not_a_hang() {
    let (server, addr) = server();
    let store = Store::connect(&addr, &config(Duration::from_secs(60))).unwrap();
    store.set("k", b"v").unwrap();
    // A client waiting for a key when the server goes away.
    let waiting = std::thread::spawn(move || {
        let e = store.get("never").unwrap_err();
        (e, store.set("k", b"w").unwrap_err())
    });
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    drop(server);
    let (e, again) = within(move || waiting.join().unwrap());
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(matches!(&e, StoreError::Lost { addr: a, .. } if *a == addr), "{e:?}");
    assert!(e.to_string().contains("rank 0"), "{e}");
    assert!(matches!(again, StoreError::Lost { .. }), "{again:?}");
}

#[test]
fn a_client_without_the_token_is_refused_and_the_job_goes_on() {
    let (_server, addr) = server();
    let rank = Store::connect(&addr, &config(SHORT)).unwrap();
    rank.set("tcp/data0/1", b"127.0.0.1:4000").unwrap();
    let start = Instant::now();
    let e = Store::connect(&addr, &StoreConfig::new(stranger(), Duration::from_secs(20))).err().expect("admitted");
    assert!(start.elapsed() < Duration::from_secs(5), "refused only after {:?}: not at once", start.elapsed());
    assert!(matches!(&e, StoreError::Unauthenticated { addr: a, .. } if *a == addr), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&addr) && text.contains("refused this process's job token"), "{text}");
    assert!(text.contains("zeroplan launch") && text.contains("ZEROPLAN_JOB_TOKEN"), "{text}");
    // The job goes on: its ranks read, write and join as before.
    assert_eq!(rank.get("tcp/data0/1").unwrap(), b"127.0.0.1:4000");
    let late = Store::connect(&addr, &config(SHORT)).unwrap();
    late.set("tcp/data0/2", b"x").unwrap();
    rank.wait(&["tcp/data0/2"]).unwrap();
}

/// Relays one connection from a listener of its own to `to`, keeping what
/// the client sent. Returns the relay's address and the bytes kept.
fn recording_relay(to: &str) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap().to_string();
    let kept = Arc::new(Mutex::new(Vec::new()));
    let (to, record) = (to.to_string(), Arc::clone(&kept));
    std::thread::spawn(move || {
        let (mut client, _) = listener.accept().unwrap();
        let mut server = TcpStream::connect(&to).unwrap();
        let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || std::io::copy(&mut s2, &mut c2));
        let mut buf = [0; 4096];
        while let Ok(n @ 1..) = client.read(&mut buf) {
            record.lock().unwrap().extend_from_slice(&buf[..n]);
            if server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    (at, kept)
}

/// Sends `handshake` on a new connection to `addr` and reads until the
/// server closes it (failing the test if it has not within 5 s), then
/// sends `request` after it. What the server said.
fn send_raw(addr: &str, handshake: &[u8], request: &[u8]) -> Vec<u8> {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = conn.write_all(handshake);
    let (mut got, mut buf) = (Vec::new(), [0; 256]);
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // Closed with our bytes unread.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server kept the connection open: {e}"),
        }
    }
    let _ = conn.write_all(request);
    got
}

/// What a client sends first: magic, claim length (0), nonce, proof.
const HANDSHAKE: usize = 4 + 2 + 32 + 32;

#[test]
fn a_replayed_handshake_is_refused() {
    let (_server, addr) = server();
    // A rank's session, recorded on the way: its handshake, then a set.
    let (relay, recorded) = recording_relay(&addr);
    let rank = Store::connect(&relay, &config(SHORT)).unwrap();
    rank.set("tcp/data0/1", b"127.0.0.1:4000").unwrap();
    drop(rank);
    let recorded = recorded.lock().unwrap().clone();
    assert!(recorded.len() > 64 && recorded.windows(11).any(|w| w == b"tcp/data0/1"), "{recorded:?}");
    // The job moves on; then the whole session is played back.
    let job = Store::connect(&addr, &config(SHORT)).unwrap();
    job.set("tcp/data0/1", b"127.0.0.1:5000").unwrap();
    let answer = send_raw(&addr, &recorded[..HANDSHAKE], &recorded[HANDSHAKE..]);
    assert_eq!(answer.len(), 4 + 1 + 32 + 1, "hello, then the verdict, then closed: {answer:?}");
    assert_eq!(answer.last(), Some(&1), "refused");
    assert_eq!(job.get("tcp/data0/1").unwrap(), b"127.0.0.1:5000", "the replayed set took effect");
}

/// A store set request, as the client frames it.
fn set_request(key: &str, value: &[u8]) -> Vec<u8> {
    let mut r = vec![b'S'];
    r.extend((key.len() as u64).to_le_bytes());
    r.extend(key.as_bytes());
    r.extend((value.len() as u64).to_le_bytes());
    r.extend(value);
    r
}

#[test]
fn an_unauthenticated_client_cannot_overwrite_a_key() {
    let (_server, addr) = server();
    let job = Store::connect(&addr, &config(SHORT)).unwrap();
    job.set("tcp/data0/0", b"127.0.0.1:4000").unwrap();
    let evil = set_request("tcp/data0/0", b"203.0.113.9:4000");
    // The old, open protocol's greeting and a set.
    send_raw(&addr, b"ZPS1", &evil);
    // This protocol's greeting with a made-up proof, then a set.
    let forged = [&b"ZPS2"[..], &0u16.to_le_bytes(), &[7; 32], &[0; 32]].concat();
    assert_eq!(send_raw(&addr, &forged, &evil).last(), Some(&1), "refused");
    // A set straight away.
    send_raw(&addr, &evil, &evil);
    // Another job's token.
    assert!(Store::connect(&addr, &StoreConfig::new(stranger(), SHORT)).is_err());
    assert_eq!(job.get("tcp/data0/0").unwrap(), b"127.0.0.1:4000");
}

#[test]
fn a_server_that_cannot_prove_it_holds_the_token_is_not_trusted() {
    // It greets as a store does, reads the client's proof and says "accepted".
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(&[&b"ZPS2"[..], &[0], &[3; 32]].concat()).unwrap();
        let mut proof = [0; HANDSHAKE];
        conn.read_exact(&mut proof).unwrap();
        conn.write_all(&[0; 33]).unwrap();
        std::thread::sleep(Duration::from_secs(2));
    });
    let e = within(move || Store::connect(&addr, &config(Duration::from_secs(20))).err().expect("trusted"));
    assert!(matches!(e, StoreError::Unauthenticated { .. }) && e.to_string().contains("did not prove"), "{e}");
}

#[test]
fn clients_that_connect_and_stall_are_dropped_at_the_idle_timeout() {
    let idle = Duration::from_secs(1);
    let limits = StoreConfig { idle, max_connections: 3, ..config(Duration::from_secs(20)) };
    let server = StoreServer::bind("127.0.0.1:0", &limits).unwrap();
    let addr = server.addr().to_string();
    let stall = || {
        let s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    // One stalled stranger holds up no one.
    let mut first = stall();
    let start = Instant::now();
    let rank = Store::connect(&addr, &limits).unwrap();
    rank.set("k", b"v").unwrap();
    assert!(start.elapsed() < idle, "a rank waited {:?} behind a stalled stranger", start.elapsed());
    // One more fills the limit (3 with the rank): the next connection is
    // told the store is busy, and a rank tries again until the strangers
    // are dropped.
    let mut second = stall();
    std::thread::sleep(Duration::from_millis(50));
    let mut third = stall();
    let mut busy = Vec::new();
    third.read_to_end(&mut busy).expect("a connection past the limit was kept");
    assert_eq!(busy, [&b"ZPS2"[..], &[1]].concat(), "told it is busy, then closed");
    let start = Instant::now();
    let late = Store::connect(&addr, &limits).unwrap();
    assert_eq!(late.get("k").unwrap(), b"v");
    let waited = start.elapsed();
    assert!(waited > idle / 4 && waited < Duration::from_secs(5), "admitted after {waited:?}");
    // Each stranger got the greeting, and then the connection was closed.
    for s in [&mut first, &mut second] {
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("a stalled connection was kept");
        assert_eq!(got.len(), 4 + 1 + 32);
    }
}
