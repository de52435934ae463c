//! `comm::Tcp` against `comm::InProcess`: the same bits for every
//! collective on random data over 2–4 ranks (threads of this test process
//! connected over localhost, each with its own store connection and
//! sockets, as processes would be), the tensor × data grid, and failures —
//! mismatched programs, an aborted or vanished peer — as errors, not hangs;
//! and strangers at a rank's listener (silent, speaking the old open hello,
//! or holding another token) refused while the group forms.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zeroplan_runtime::comm::{
    CommError, Communicator, Groups, InProcess, JobToken, Store, StoreConfig, StoreServer, Tcp, all_gather_f64,
};

/// The job's store settings: its token, `timeout`, the default limits.
fn config(timeout: Duration) -> StoreConfig {
    StoreConfig::new(JobToken::parse("the tcp tests' job token, long enough", "the tests").unwrap(), timeout)
}

/// Runs `f` on each rank of a TCP group of `ranks` (one thread per rank)
/// and returns the results in rank order; fails if any rank takes 60 s.
fn on_tcp<T: Send + 'static>(ranks: usize, f: impl Fn(Tcp) -> T + Send + Sync + 'static) -> Vec<T> {
    let server = StoreServer::bind("127.0.0.1:0", &config(Duration::from_secs(20))).unwrap();
    let addr = server.addr().to_string();
    let f = Arc::new(f);
    let (tx, rx) = std::sync::mpsc::channel();
    for rank in 0..ranks {
        let (tx, f, addr) = (tx.clone(), Arc::clone(&f), addr.clone());
        std::thread::spawn(move || {
            let store = Store::connect(&addr, &config(Duration::from_secs(20))).unwrap();
            let comm = Tcp::join(&store, "g", rank, ranks).unwrap();
            let _ = tx.send((rank, f(comm)));
        });
    }
    let mut out: Vec<Option<T>> = (0..ranks).map(|_| None).collect();
    for _ in 0..ranks {
        let (rank, value) = rx.recv_timeout(Duration::from_secs(60)).expect("a rank hung for 60 s");
        out[rank] = Some(value);
    }
    drop(server);
    out.into_iter().map(|v| v.expect("every rank answered")).collect()
}

/// The same on an in-process group.
fn on_threads<T: Send>(ranks: usize, f: impl Fn(&InProcess) -> T + Sync) -> Vec<T> {
    let group = InProcess::group(ranks);
    std::thread::scope(|s| {
        let handles: Vec<_> = group.iter().map(|c| s.spawn(|| f(c))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Seeded values whose sums depend on their order: at each element, about
/// half the ranks give ±2^e (e in 60..100, shared by every rank at that
/// element, so they cancel) and the others small values (2^-30..2^30),
/// which an f64 sum keeps or loses depending on whether a large value
/// cancelled before they were added.
fn random(seed: u64, len: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let sign = if (x >> 40) & 1 == 1 { -1.0 } else { 1.0 };
            if x & 1 == 0 {
                return sign * 2f32.powi(60 + (i * 7919 % 40) as i32);
            }
            let mantissa = (x % 1_000_000) as f32 / 1_000_000.0 + 0.5;
            let exponent = ((x >> 20) % 61) as i32 - 30;
            sign * mantissa * 2f32.powi(exponent)
        })
        .collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Every collective's output on rank `rank` of `ranks` for buffers of `len`.
fn collectives(c: &dyn Communicator, len: usize) -> Vec<Vec<u32>> {
    let (r, n) = (c.rank(), c.ranks());
    let mut summed = random(r as u64 + 1, len);
    c.all_reduce(&mut summed).unwrap();
    let whole = random(100 + r as u64, len / n * n);
    let mut slice = vec![0.0; len / n];
    c.reduce_scatter(&whole, &mut slice).unwrap();
    let part = random(200 + r as u64, len / n);
    let mut gathered = vec![0.0; len / n * n];
    c.all_gather(&part, &mut gathered).unwrap();
    let mut shared = random(300 + r as u64, len);
    c.broadcast(&mut shared, n - 1).unwrap();
    c.barrier().unwrap();
    vec![bits(&summed), bits(&slice), bits(&gathered), bits(&shared)]
}

#[test]
fn the_data_is_such_that_the_order_of_a_sum_changes_its_bits() {
    // Else the next test could not tell rank order from another (a ring's,
    // which starts each chunk's sum at the rank after its owner).
    let parts: Vec<Vec<f32>> = (1..=4).map(|r| random(r, 1000)).collect();
    let sum = |order: &[usize], i: usize| order.iter().map(|&r| f64::from(parts[r][i])).sum::<f64>() as f32;
    let differ = (0..1000).filter(|&i| sum(&[0, 1, 2, 3], i).to_bits() != sum(&[1, 2, 3, 0], i).to_bits()).count();
    assert!(differ > 100, "only {differ} of 1000 sums depend on the order");
}

#[test]
fn every_collective_gives_the_in_process_bits_on_2_to_4_ranks() {
    // Lengths: empty, shorter than the group, uneven, and several pieces.
    let lengths = [0, 1, 3, 1000, 2 * zeroplan_runtime::comm::TCP_PIECE + 7];
    for ranks in 2..=4 {
        for len in lengths {
            let tcp = on_tcp(ranks, move |c| collectives(&c, len));
            let threads = on_threads(ranks, |c| collectives(c, len));
            for rank in 0..ranks {
                for (what, (t, i)) in ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]
                    .iter()
                    .zip(tcp[rank].iter().zip(&threads[rank]))
                {
                    assert!(t == i, "{what} of {len} on rank {rank} of {ranks}: other bits than InProcess");
                }
            }
        }
    }
}

#[test]
fn the_bits_do_not_depend_on_timing() {
    let results = on_tcp(3, |c| {
        let r = c.rank() as u64;
        std::thread::sleep(Duration::from_millis(20 * (3 - r)));
        let mut x = random(7 + r, 5000);
        c.all_reduce(&mut x).unwrap();
        std::thread::sleep(Duration::from_millis(10 * r));
        c.all_reduce(&mut x).unwrap();
        bits(&x)
    });
    let threads = on_threads(3, |c| {
        let mut x = random(7 + c.rank() as u64, 5000);
        c.all_reduce(&mut x).unwrap();
        c.all_reduce(&mut x).unwrap();
        bits(&x)
    });
    assert!(results == threads, "timing changed the sum");
}

#[test]
fn the_tensor_by_data_grid_matches_in_process_groups() {
    let (d, t) = (2, 2);
    let server = StoreServer::bind("127.0.0.1:0", &config(Duration::from_secs(20))).unwrap();
    let addr = server.addr().to_string();
    let run = |g: &Groups| {
        let global = g.global_rank();
        let mut data = random(global as u64 + 11, 777);
        g.data.all_reduce(&mut data).unwrap();
        let mut tensor = random(global as u64 + 50, 333);
        g.tensor.all_reduce(&mut tensor).unwrap();
        (global, g.data.rank(), g.tensor.rank(), bits(&data), bits(&tensor))
    };
    let tcp: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..d * t)
            .map(|global| {
                let addr = &addr;
                s.spawn(move || {
                    let store = Store::connect(addr, &config(Duration::from_secs(20))).unwrap();
                    run(&Tcp::grid(&store, global, d, t).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let groups = InProcess::grid(d, t);
    let threads: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = groups.iter().map(|g| s.spawn(|| run(g))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(tcp.iter().map(|x| (x.0, x.1, x.2)).collect::<Vec<_>>(), [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]);
    assert!(tcp == threads, "the grid's collectives differ from InProcess::grid's");
}

#[test]
fn f64_values_gather_exactly() {
    let values = |r: usize| vec![0.1 * r as f64 + 1e-300, -0.0, f64::from_bits(0x7ff8_0000_dead_beef), 1.0 / 3.0];
    let got = on_tcp(3, move |c| all_gather_f64(&c, &values(c.rank())).unwrap());
    let want: Vec<u64> = (0..3).flat_map(values).map(f64::to_bits).collect();
    for g in got {
        assert_eq!(g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
    }
}

#[test]
fn mismatched_programs_are_errors_on_every_rank() {
    // Lengths: as InProcess says it.
    let results = on_tcp(3, |c| {
        let mut x = vec![0.0; 2 + usize::from(c.rank() == 2)];
        c.all_reduce(&mut x)
    });
    for r in &results {
        assert_eq!(r, &Err(CommError::Mismatch { op: "all_reduce", rank: 2, got: 3, expected: 2 }));
    }
    // Different collectives at the same point of the schedule.
    let results = on_tcp(2, |c| if c.rank() == 0 { c.all_reduce(&mut [1.0]) } else { c.barrier() });
    assert!(results.iter().all(|r| matches!(r, Err(CommError::Diverged { .. }))), "{results:?}");
    let text = results[0].as_ref().unwrap_err().to_string();
    assert!(text.contains("rank 1 called barrier") && text.contains("different programs"), "{text}");
}

#[test]
fn an_aborted_rank_unblocks_its_peers() {
    // Rank 2 fails before its all-reduce; ranks 0 and 1 wait in theirs.
    let results = on_tcp(3, |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(200));
            c.abort();
            return Err(CommError::PeerFailed { op: "test" });
        }
        let mut x = random(1, 1 << 20);
        c.all_reduce(&mut x)?;
        c.barrier()
    });
    for (rank, r) in results.iter().enumerate().take(2) {
        assert!(matches!(r, Err(CommError::PeerLost { .. } | CommError::PeerFailed { .. })), "rank {rank}: {r:?}");
    }
    let text = results[0].as_ref().unwrap_err().to_string();
    assert!(text.contains("all_reduce") && text.contains("failed"), "{text}");
}

#[test]
fn a_rank_that_vanishes_mid_run_is_an_error_on_the_others() {
    // Rank 1 drops its communicator (a process's sockets close as it dies)
    // after one collective.
    let results = on_tcp(2, |c| {
        let mut x = vec![1.0; 10];
        c.all_reduce(&mut x).unwrap();
        if c.rank() == 1 {
            drop(c);
            return None;
        }
        Some(c.all_gather(&[1.0, 2.0], &mut [0.0; 4]))
    });
    let e = results[0].clone().unwrap().unwrap_err();
    assert!(matches!(e, CommError::PeerLost { op: "all_gather", peer: 1, .. }), "{e:?}");
    assert!(e.to_string().contains("lost rank 1"), "{e}");
}

#[test]
fn a_rank_that_never_joins_is_a_timeout_naming_it() {
    let server = StoreServer::bind("127.0.0.1:0", &config(Duration::from_secs(1))).unwrap();
    let store = Store::connect(&server.addr().to_string(), &config(Duration::from_secs(1))).unwrap();
    // Rank 1 of 2 joins; rank 0 never publishes its address.
    let e = Tcp::join(&store, "lonely", 1, 2).err().expect("rank 0 never came");
    let text = e.to_string();
    assert!(text.contains("joining group `lonely` as rank 1") && text.contains("`tcp/lonely/0`"), "{text}");
    // Rank 0 of 2 joins; rank 1 never connects.
    let e = Tcp::join(&store, "alone", 0, 2).err().expect("rank 1 never came");
    assert!(e.to_string().contains("rank(s) 1 of the group never connected"), "{e}");
}

#[test]
fn strangers_at_a_ranks_listener_are_refused_and_the_group_forms() {
    let idle = Duration::from_millis(500);
    let settings = StoreConfig { idle, ..config(Duration::from_secs(20)) };
    let server = StoreServer::bind("127.0.0.1:0", &settings).unwrap();
    let addr = server.addr().to_string();
    let joining = |rank: usize| {
        let (addr, settings) = (addr.clone(), settings.clone());
        std::thread::spawn(move || {
            let store = Store::connect(&addr, &settings).unwrap();
            let comm = Tcp::join(&store, "g", rank, 2)?;
            let mut x = [rank as f32 + 1.0];
            comm.all_reduce(&mut x).map(|()| x[0])
        })
    };
    let start = Instant::now();
    let rank0 = joining(0);
    // Rank 0's listener, as the store tells the job's ranks.
    let observer = Store::connect(&addr, &settings).unwrap();
    let listener = String::from_utf8(observer.get("tcp/g/0").unwrap()).unwrap();
    // One says nothing; one greets as the old, open mesh did, claiming rank 1.
    let mut silent = TcpStream::connect(&listener).unwrap();
    let mut impostor = TcpStream::connect(&listener).unwrap();
    impostor.write_all(b"ZPT1\x01\0\0\0\0\0\0\0g\x01\0\0\0\0\0\0\0").unwrap();
    let rank1 = joining(1);
    assert_eq!(rank0.join().unwrap().unwrap(), 3.0);
    assert_eq!(rank1.join().unwrap().unwrap(), 3.0);
    assert!(start.elapsed() < Duration::from_secs(5), "the group formed after {:?}", start.elapsed());
    for s in [&mut silent, &mut impostor] {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        // Greeted, then closed: at the idle timeout, or at once (a reset,
        // where the stranger's bytes were left unread).
        match s.read_to_end(&mut got) {
            Ok(_) => assert_eq!(got.len(), 4 + 1 + 32, "{got:?}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "kept open: {e}"),
        }
    }
}

#[test]
fn a_rank_with_another_token_is_refused_naming_the_rank() {
    // Rank 1 holds another token; to reach rank 0 at all it is handed rank
    // 0's address through a store of its own.
    let ours = config(Duration::from_secs(2));
    let theirs =
        StoreConfig::new(JobToken::parse("a token the job does not hold, 32+ chars", "t").unwrap(), ours.timeout);
    let (server, other) =
        (StoreServer::bind("127.0.0.1:0", &ours).unwrap(), StoreServer::bind("127.0.0.1:0", &theirs).unwrap());
    let (addr, other_addr) = (server.addr().to_string(), other.addr().to_string());
    let rank0 = std::thread::spawn({
        let ours = ours.clone();
        move || Tcp::join(&Store::connect(&addr, &ours).unwrap(), "g", 0, 2).err().expect("joined a stranger")
    });
    let store = Store::connect(&server.addr().to_string(), &ours).unwrap();
    let listener = store.get("tcp/g/0").unwrap();
    let own = Store::connect(&other_addr, &theirs).unwrap();
    own.set("tcp/g/0", &listener).unwrap();
    let e = Tcp::join(&own, "g", 1, 2).err().expect("rank 0 admitted another token");
    let text = e.to_string();
    let listener = String::from_utf8(listener).unwrap();
    assert!(text.contains(&format!("could not join rank 0 of the group at {listener}")), "{text}");
    assert!(text.contains("refused this process's job token"), "{text}");
    let e = rank0.join().unwrap().to_string();
    assert!(e.contains("rank(s) 1 of the group never connected") && e.contains("1 connection(s)"), "{e}");
}
