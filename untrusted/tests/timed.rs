//! Every fuzz target for a bounded time on the stable toolchain, as CI runs
//! them (it has no nightly for libFuzzer): each target replays its
//! committed corpus (`fuzz/corpus/TARGET/`, what `scripts/fuzz.sh` found
//! and minimised), then runs inputs until its budget is spent — a minute,
//! or `ZEROPLAN_FUZZ_SECONDS` — alternating a corpus input with a few
//! random edits and a fresh random byte string. The targets run at once,
//! one thread each. Without libFuzzer there is no coverage guidance and no
//! sanitizer, but a debug build's overflow checks: the properties are the
//! targets' own (`zeroplan_untrusted::targets`: refused, or run with every
//! arena's guard pages intact; never left waiting), and a failing input is
//! printed in hex with the stream seed that made it, to replay through
//! the fuzz target. The stream is fixed unless `ZEROPLAN_FUZZ_SEED` (hex)
//! sets it, so CI runs the inputs that passed here.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use zeroplan_untrusted::targets;

/// Each target's budget: `ZEROPLAN_FUZZ_SECONDS`, else a minute.
fn budget() -> Duration {
    let seconds = std::env::var("ZEROPLAN_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    Duration::from_secs(seconds)
}

/// `target`'s committed corpus, in name order; empty where it has none.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.map(|entry| entry.unwrap().path()).collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

/// An xorshift stream started at `seed`.
struct Stream(u64);

impl Stream {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// 1 to 256 random bytes.
    fn bytes(&mut self) -> Vec<u8> {
        let len = 1 + self.below(256);
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// `input` after 1 to 4 random edits: a byte overwritten, inserted or
    /// removed, or a run of bytes copied over another place.
    fn edit(&mut self, input: &[u8]) -> Vec<u8> {
        let mut out = input.to_vec();
        for _ in 0..1 + self.below(4) {
            let at = self.below(out.len());
            match self.below(4) {
                0 if !out.is_empty() => out[at] = self.next() as u8,
                1 => out.insert(at, self.next() as u8),
                2 if !out.is_empty() => {
                    out.remove(at);
                }
                _ if !out.is_empty() => {
                    let (from, len) = (self.below(out.len()), 1 + self.below(16));
                    let run: Vec<u8> = out[from..(from + len).min(out.len())].to_vec();
                    let to = self.below(out.len());
                    let end = (to + run.len()).min(out.len());
                    out[to..end].copy_from_slice(&run[..end - to]);
                }
                _ => out.push(self.next() as u8),
            }
        }
        out
    }
}

thread_local! {
    /// The target and input this thread runs, for [`print_input_on_panic`].
    static RUNNING: std::cell::RefCell<(&'static str, Vec<u8>)> = const { std::cell::RefCell::new(("", Vec::new())) };
}

fn hex(input: &[u8]) -> String {
    input.iter().map(|b| format!("{b:02x}")).collect()
}

/// Prints the input in flight with any panic's message: a panic that
/// cannot unwind (an unsafe precondition a debug build checks) aborts the
/// process before [`fuzz`] could print it.
fn print_input_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        RUNNING.with(|r| {
            let (target, input) = &*r.borrow();
            if !target.is_empty() {
                eprintln!("{target}: the input in flight: {}", hex(input));
            }
        });
    }));
}

/// Runs `one` over `target`'s corpus, then over edited corpus inputs and
/// random ones in turn until the budget is spent; the inputs run, or the
/// failing input in hex.
fn fuzz(target: &'static str, seed: u64, one: fn(&[u8])) -> Result<usize, String> {
    let started = Instant::now();
    let mut stream = Stream(seed | 1);
    let corpus = corpus(target);
    let mut runs = 0;
    loop {
        let input = if runs < corpus.len() {
            corpus[runs].clone()
        } else if started.elapsed() >= budget() {
            return Ok(runs);
        } else if runs % 2 == 0 && !corpus.is_empty() {
            let of = stream.below(corpus.len());
            stream.edit(&corpus[of])
        } else {
            stream.bytes()
        };
        RUNNING.with(|r| *r.borrow_mut() = (target, input.clone()));
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| one(&input))) {
            let why =
                panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
            return Err(format!(
                "{target}: input {runs} (stream seed {seed:#x}) failed: {}\ninput: {}",
                why.unwrap_or_default(),
                hex(&input)
            ));
        }
        runs += 1;
    }
}

/// `cargo test -p zeroplan-untrusted --test timed` (a minute; in CI).
/// A failure prints the input: replay it with `cargo +nightly fuzz run
/// TARGET FILE` after writing the hex to FILE, or through the function in
/// `zeroplan_untrusted::targets`.
#[test]
fn the_fuzz_targets_hold_for_their_budget() {
    // A fixed stream unless told otherwise, so that CI replays what passed here.
    let seed =
        std::env::var("ZEROPLAN_FUZZ_SEED").ok().and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok());
    let seed = seed.unwrap_or(0x2e7f_1a35_c0de_5eed);
    eprintln!("stream seed {seed:#x}, {} s a target", budget().as_secs());
    print_input_on_panic();
    let results: Vec<(&str, Result<usize, String>)> = std::thread::scope(|s| {
        let runs: Vec<_> = targets::ALL
            .iter()
            .enumerate()
            .map(|(i, &(name, one))| (name, s.spawn(move || fuzz(name, seed.rotate_left(8 * i as u32), one))))
            .collect();
        runs.into_iter().map(|(name, run)| (name, run.join().unwrap())).collect()
    });
    targets::remove_scratch();
    let mut failed = Vec::new();
    for (target, result) in results {
        match result {
            Ok(runs) => eprintln!("{target}: {runs} inputs held"),
            Err(e) => failed.push(e),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
