//! `quarry`: the command-line front end. Embedded mode: the host and an in-process storage node
//! over the warehouse directory run in this one process.

mod allocator;

use std::process::ExitCode;

use clap::Parser;
use quarry_cli::{Cli, Command};

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("quarry: internal error: {info}\nThis is a bug in Quarry; please report it with the command you ran.");
    }));
    allocator::disable_transparent_huge_pages();
    let cli = Cli::parse();
    if matches!(cli.command, Command::Graph(_)) {
        allocator::return_freed_memory_at_once();
    }
    quarry_cli::run(cli)
}
