//! The host communicators' collectives: milliseconds per all-reduce,
//! reduce-scatter and all-gather of a MiniLM-sized gradient (22.7 M f32) on
//! 2 and 4 ranks — `InProcess` (ranks as threads sharing memory) and `Tcp`
//! (each rank with its own sockets over localhost, as processes would be;
//! here threads of one process). `cargo bench -p zeroplan-runtime --bench comm`.

use std::time::{Duration, Instant};

use zeroplan_runtime::comm::{Communicator, InProcess, JobToken, Store, StoreConfig, StoreServer, Tcp};

const ELEMENTS: usize = 22_713_216;
const RUNS: usize = 5;

type Op = dyn Fn(&dyn Communicator, &mut Vec<f32>, &mut Vec<f32>) + Sync;

/// The median over `RUNS` of the slowest rank's time for `op`, in ms.
fn time<C: Communicator>(group: &[C], op: &Op) -> f64 {
    let mut times: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = group
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut data = vec![c.rank() as f32 + 0.5; ELEMENTS];
                    let mut out = vec![0.0; ELEMENTS];
                    (0..RUNS)
                        .map(|_| {
                            c.barrier().unwrap();
                            let start = Instant::now();
                            op(c, &mut data, &mut out);
                            start.elapsed().as_secs_f64() * 1e3
                        })
                        .collect::<Vec<f64>>()
                })
            })
            .collect();
        let per_rank: Vec<Vec<f64>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (0..RUNS).map(|i| per_rank.iter().map(|t| t[i]).fold(0.0, f64::max)).collect()
    });
    times.sort_by(f64::total_cmp);
    times[RUNS / 2]
}

/// A TCP group of `ranks` over localhost, each rank with its own store connection.
fn tcp_group(ranks: usize) -> (StoreServer, Vec<Tcp>) {
    let config = StoreConfig::new(JobToken::generate().unwrap(), Duration::from_secs(30));
    let server = StoreServer::bind("127.0.0.1:0", &config).unwrap();
    let addr = server.addr().to_string();
    let group = std::thread::scope(|s| {
        let joining: Vec<_> = (0..ranks)
            .map(|rank| {
                let (addr, config) = (&addr, &config);
                s.spawn(move || {
                    let store = Store::connect(addr, config).unwrap();
                    Tcp::join(&store, "bench", rank, ranks).unwrap()
                })
            })
            .collect();
        joining.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (server, group)
}

fn row<C: Communicator>(name: &str, group: &[C]) {
    let all_reduce = time(group, &|c, data, _| c.all_reduce(data).unwrap());
    let reduce_scatter = time(group, &|c, data, out| {
        let n = data.len() / c.ranks();
        c.reduce_scatter(&data[..n * c.ranks()], &mut out[..n]).unwrap()
    });
    let all_gather = time(group, &|c, data, out| {
        let n = data.len() / c.ranks();
        c.all_gather(&data[..n], &mut out[..n * c.ranks()]).unwrap()
    });
    println!(
        "{name:>9} {} ranks: all_reduce {all_reduce:.1} ms  reduce_scatter {reduce_scatter:.1} ms  all_gather \
         {all_gather:.1} ms",
        group.len()
    );
}

fn main() {
    println!("{ELEMENTS} f32, median of {RUNS}, slowest rank");
    for ranks in [2, 4] {
        row("InProcess", &InProcess::group(ranks));
        let (_server, tcp) = tcp_group(ranks);
        row("Tcp", &tcp);
    }
}
