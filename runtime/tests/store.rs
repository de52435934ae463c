//! The rendezvous store: set, get (waiting for another rank's set), add,
//! wait; timeouts that name the key or the address; a server that goes
//! away is an error on its clients, not a hang.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use zeroplan_runtime::comm::{Store, StoreError, StoreServer};

const SHORT: Duration = Duration::from_secs(1);

fn server() -> (StoreServer, String) {
    let server = StoreServer::bind("127.0.0.1:0").unwrap();
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
    let a = Store::connect(&addr, SHORT).unwrap();
    let b = Store::connect(&addr, Duration::from_secs(10)).unwrap();
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
    let store = Store::connect(&addr, SHORT).unwrap();
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
        move || Store::connect(&addr, Duration::from_millis(500)).err().expect("nothing listens there")
    });
    assert!(matches!(&e, StoreError::Unreachable { addr: a, .. } if *a == addr), "{e:?}");
    assert!(e.to_string().contains(&addr) && e.to_string().contains("MASTER_ADDR"), "{e}");
    let e = within(|| Store::connect("no-such-host.invalid:29500", Duration::from_millis(300)).err().unwrap());
    assert!(matches!(e, StoreError::Unreachable { .. }), "{e:?}");
}

#[test]
fn clients_retry_until_the_server_comes_up() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let client = std::thread::spawn({
        let addr = addr.clone();
        move || Store::connect(&addr, Duration::from_secs(20)).map(|s| s.get("up"))
    });
    std::thread::sleep(Duration::from_millis(300));
    let first = Store::serve(&addr, &addr, SHORT).unwrap();
    first.set("up", b"yes").unwrap();
    assert_eq!(client.join().unwrap().unwrap().unwrap(), b"yes");
    // The port is now taken: a second server is refused, naming it.
    let e = StoreServer::bind(&addr).err().unwrap();
    assert!(matches!(&e, StoreError::Bind { addr: a, .. } if *a == addr) && e.to_string().contains("MASTER_PORT"));
}

#[test]
fn a_server_that_dies_is_an_error_on_its_clients_not_a_hang() {
    let (server, addr) = server();
    let store = Store::connect(&addr, Duration::from_secs(60)).unwrap();
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
