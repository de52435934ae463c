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

fn main() -> ExitCode {
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
