//! The three fuzz targets for a bounded time on the stable toolchain, as CI
//! can run them (it has no nightly for libFuzzer): each target replays its
//! committed corpus (`fuzz/corpus/TARGET/`, what `scripts/fuzz.sh` found
//! and minimised), then runs fresh random byte strings until its budget is
//! spent — a minute, or `ZEROPLAN_FUZZ_SECONDS`. The targets run at once,
//! one thread each. Without libFuzzer there is no coverage guidance and no
//! sanitizer, but a debug build's overflow checks: the properties are the
//! harness's own (unreadable, refused, or run with every arena's guard
//! pages intact; never left waiting), and a failing input is printed in hex
//! with the stream seed that made it, to replay through the fuzz target.
//! The stream is fixed unless `ZEROPLAN_FUZZ_SEED` (hex) sets it, so CI
//! runs the inputs that passed here.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use zeroplan_untrusted::{Choices, checkpoint, plan, ranks};

/// Each target's budget: `ZEROPLAN_FUZZ_SECONDS`, else a minute.
fn budget() -> Duration {
    let seconds = std::env::var("ZEROPLAN_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    Duration::from_secs(seconds)
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

/// Byte strings of 1 to 256 bytes from an xorshift stream started at `seed`.
struct Stream(u64);

impl Stream {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn input(&mut self) -> Vec<u8> {
        let len = 1 + (self.next() % 256) as usize;
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// Runs `one` over `target`'s corpus, then over random inputs until the
/// budget is spent; the inputs run, or the failing input in hex.
fn fuzz(target: &str, seed: u64, one: impl Fn(&[u8])) -> Result<usize, String> {
    let started = Instant::now();
    let mut stream = Stream(seed | 1);
    let corpus = corpus(target);
    let mut runs = 0;
    loop {
        let input = if runs < corpus.len() {
            corpus[runs].clone()
        } else if started.elapsed() < budget() {
            stream.input()
        } else {
            return Ok(runs);
        };
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| one(&input))) {
            let why =
                panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
            let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
            return Err(format!(
                "{target}: input {runs} (stream seed {seed:#x}) failed: {}\ninput: {hex}",
                why.unwrap_or_default()
            ));
        }
        runs += 1;
    }
}

/// Not yet in CI: on its first runs it found integer overflows a crafted
/// plan reaches (fuzz/RESULTS.md lists those still open); it joins the
/// default run once they are fixed. `cargo test -p zeroplan-untrusted
/// --test timed -- --ignored`.
#[test]
#[ignore = "finds open overflow bugs (fuzz/RESULTS.md); run with --ignored"]
fn the_fuzz_targets_hold_for_their_budget() {
    // A fixed stream unless told otherwise, so that CI replays what passed here.
    let seed =
        std::env::var("ZEROPLAN_FUZZ_SEED").ok().and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok());
    let seed = seed.unwrap_or(0x2e7f_1a35_c0de_5eed);
    eprintln!("stream seed {seed:#x}, {} s a target", budget().as_secs());
    let plans = || {
        let seeds = plan::seeds();
        fuzz("plan_mutation", seed, |data| {
            let mut choices = Choices::new(data);
            let seed = &seeds[choices.below(seeds.len())];
            let _ = plan::check(&plan::mutate(seed, &mut choices));
        })
    };
    let two_ranks = || {
        let seeds = ranks::seeds();
        fuzz("plan_mutation_ranks", seed ^ 0x5eed, |data| {
            let mut choices = Choices::new(data);
            let seed = &seeds[choices.below(seeds.len())];
            let _ = ranks::check(seed, &ranks::mutate(seed, &mut choices));
        })
    };
    let checkpoints = || {
        let root = std::env::temp_dir().join(format!("zeroplan-timed-checkpoint-{}", std::process::id()));
        let seed_dir = checkpoint::seed(&root.join("seed"));
        let into = root.join("mutant").join("step-00000000");
        let runs = fuzz("checkpoint_mutation", seed ^ 0xc4ec, |data| {
            let mutation = checkpoint::mutate(&seed_dir, &into, &mut Choices::new(data));
            // `Err`: refused, as a damaged save may be.
            let _ = checkpoint::check(&seed_dir, &into, &mutation);
        });
        let _ = std::fs::remove_dir_all(&root);
        runs
    };
    let (a, b, c) = std::thread::scope(|s| {
        let (a, b, c) = (s.spawn(plans), s.spawn(two_ranks), s.spawn(checkpoints));
        (a.join().unwrap(), b.join().unwrap(), c.join().unwrap())
    });
    for (target, result) in [("plan_mutation", a), ("plan_mutation_ranks", b), ("checkpoint_mutation", c)] {
        match result {
            Ok(runs) => eprintln!("{target}: {runs} inputs held"),
            Err(e) => panic!("{e}"),
        }
    }
}
