//! The in-process communicator's collectives: milliseconds per all-reduce,
//! reduce-scatter and all-gather of a MiniLM-sized gradient (22.7 M f32) on
//! 2 and 4 ranks (threads). `cargo bench -p zeroplan-runtime --bench comm`.

use std::time::Instant;

use zeroplan_runtime::comm::{Communicator, InProcess};

const ELEMENTS: usize = 22_713_216;
const RUNS: usize = 5;

/// The median over `RUNS` of the slowest rank's time for `op`, in ms.
fn time(ranks: usize, op: impl Fn(&InProcess, &mut Vec<f32>, &mut Vec<f32>) + Sync) -> f64 {
    let group = InProcess::group(ranks);
    let mut times: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = group
            .iter()
            .map(|c| {
                let op = &op;
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

fn main() {
    println!("{ELEMENTS} f32, median of {RUNS}, slowest rank");
    for ranks in [2, 4] {
        let all_reduce = time(ranks, |c, data, _| c.all_reduce(data).unwrap());
        let reduce_scatter = time(ranks, |c, data, out| {
            let n = data.len() / c.ranks();
            c.reduce_scatter(&data[..n * c.ranks()], &mut out[..n]).unwrap()
        });
        let all_gather = time(ranks, |c, data, out| {
            let n = data.len() / c.ranks();
            c.all_gather(&data[..n], &mut out[..n * c.ranks()]).unwrap()
        });
        println!(
            "{ranks} ranks: all_reduce {all_reduce:.1} ms  reduce_scatter {reduce_scatter:.1} ms  all_gather {all_gather:.1} ms"
        );
    }
}
