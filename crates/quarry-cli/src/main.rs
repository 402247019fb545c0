//! `quarry`: the command-line front end. Embedded mode: the host and an in-process storage node
//! over the warehouse directory run in this one process.

mod allocator;
mod prefault;

use std::process::ExitCode;

use clap::Parser;
use quarry_cli::{Cli, Command};

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("quarry: internal error: {info}\nThis is a bug in Quarry; please report it with the command you ran.");
    }));
    allocator::disable_transparent_huge_pages();
    let cli = Cli::parse();
    // A query run as its own process plans on one core while the other would idle; the
    // long-running commands (a node, a server, a graph job bound to a memory budget) leave it.
    if matches!(cli.command, Command::Sql(_)) && std::env::var_os("QUARRY_NO_PREFAULT").is_none() {
        prefault::code_in_background();
    }
    if matches!(cli.command, Command::Graph(_)) {
        allocator::return_freed_memory_at_once();
    }
    quarry_cli::run(cli)
}
