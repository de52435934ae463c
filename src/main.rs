//! `zeroplan`: compile BERT-family models into memory-planned training programs.

mod chart;
mod cli;
mod commands;
mod diagnostic;
mod gpus;
mod logging;
mod output;
mod trace;

use clap::Parser;
use std::process::ExitCode;

/// mimalloc rather than the system allocator: the planner builds and drops
/// many small graphs, and glibc's malloc and free took a quarter of a
/// search's time (bert-large on 64 H100s, `perf`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's number for its purge delay (`mi_option_purge_delay` in
/// `mimalloc.h`, the same in its v2 and v3; libmimalloc-sys builds v3):
/// libmimalloc-sys names only some of the options.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps the pages mimalloc frees in the process rather than handing them
/// back to the kernel a second later (v3's default delay). A compile drops
/// each pass's input graph as the next is built: purged, those pages fault
/// in again, zeroed, for the next graph (1.8 GiB purged and 0.65M page
/// faults when planning transformer-100t for 4,096 A100s; 0.45M without
/// purging). The price is the resident peak, 1.6 → 1.8 GiB there: a page
/// one thread frees is not at once reused by another.
fn keep_freed_pages() {
    // SAFETY: `mi_option_set` is not thread-safe; it runs first in `main`,
    // before any other thread is started.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}

fn main() -> ExitCode {
    keep_freed_pages();
    let cli = cli::Cli::parse();
    logging::init(cli.verbose, cli.command.json());
    let result = match &cli.command {
        cli::Command::Compile(args) => commands::compile::run(args),
        cli::Command::Inspect(args) => commands::inspect::run(args),
        cli::Command::Graph(args) => commands::graph::run(args),
        cli::Command::Train(args) => commands::train::run(args),
        cli::Command::Embed(args) => commands::embed::run(args),
        cli::Command::Devices(args) => commands::devices::run(args),
        cli::Command::Export(args) => commands::export::run(args),
        cli::Command::Finetune(args) => commands::finetune::run(args),
        cli::Command::Eval(args) => commands::eval::run(args),
        cli::Command::Predict(args) => commands::predict::run(args),
        cli::Command::ExportDeepspeed(args) => commands::export_deepspeed::run(args),
        cli::Command::Capacity(args) => commands::capacity::run(args),
        cli::Command::Launch(args) => commands::launch::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if cli.command.json() => {
            eprintln!("{}", diagnostic::to_json(&e));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{}", diagnostic::render(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MI_OPTION_PURGE_DELAY;

    /// The option number names the purge delay: its default is 1,000 ms.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reads an option; the test sets none.
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }, 1000);
    }
}
