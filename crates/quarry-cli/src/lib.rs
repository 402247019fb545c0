//! The `quarry` command as a library: its commands, and what they share (`target`: the storage
//! a command works on). The binary (`main.rs`) parses the command line and calls [`run`]; the
//! Python package uses the same commands' pieces.

pub mod bench;
pub mod calibrate;
pub mod chart;
pub mod generate;
pub mod graph;
pub mod layout;
pub mod load;
pub mod model;
pub mod progress;
pub mod queries;
pub mod scrub;
pub mod serve;
pub mod server;
pub mod shell;
pub mod sql;
pub mod tables;
pub mod target;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Errors reach the user as one line of text; each command turns its errors into that line.
pub type CliResult<T = ()> = Result<T, String>;

/// Quarry: near-data analytics. Tables live in a warehouse directory; SQL runs over them.
#[derive(Debug, Parser)]
#[command(name = "quarry", version, about, long_about = None)]
pub struct Cli {
    /// Warehouse directory holding the tables.
    #[arg(long, global = true, env = "QUARRY_WAREHOUSE", default_value = "./quarry-data")]
    warehouse: PathBuf,
    /// Threads to use (default: all cores).
    #[arg(long, global = true)]
    threads: Option<usize>,
    /// Storage nodes to use instead of the warehouse directory (grpc://HOST:PORT, or
    /// grpc+tls://HOST:PORT for nodes serving TLS; comma-separated).
    #[arg(long, global = true, env = "QUARRY_NODES", value_delimiter = ',')]
    nodes: Vec<String>,
    /// File holding the token the storage nodes require.
    #[arg(long, global = true, env = "QUARRY_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the grpc+tls:// nodes' certificates (default: the
    /// system's roots).
    #[arg(long, global = true, env = "QUARRY_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// Which operators run on the storage nodes: by the cost model, always, or never
    /// (passthrough).
    #[arg(long, global = true, default_value = "auto")]
    pushdown: quarry_engine::PushdownMode,
    /// What `--pushdown auto` minimizes: the query's time, or its energy (from the device
    /// profiles' power figures).
    #[arg(long, global = true, default_value = "time")]
    optimize: quarry_engine::Objective,
    /// The host's power figures for energy accounting: a JSON file with `sources`, `idle_w`,
    /// `cpu_w` and `dram_nj_per_byte` (default: the server of Do et al. 2013).
    #[arg(long, global = true)]
    host_power: Option<PathBuf>,
    /// Device profile of the embedded storage node (built-in name or JSON file).
    #[arg(long, global = true)]
    profile: Option<String>,
    /// Aggregates over a fact table joined to small dimension tables run as one star join
    /// (`on`), or as a tree of hash joins (`off`).
    #[arg(long, global = true, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    star_join: bool,
    /// Memory the host may use for query state (hash tables, aggregates, sorts), e.g. 4GB;
    /// sorts and aggregates spill to disk beyond it, other operators fail with an error
    /// (default: 80% of physical memory). Graph jobs sort-reduce within it (default 1GB).
    #[arg(long, global = true)]
    memory: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load a CSV or Parquet file into a table (replacing it unless --append).
    Load(load::LoadArgs),
    /// Generate benchmark data into the warehouse.
    Gen(generate::GenArgs),
    /// Run SQL and print or write the result.
    Sql(sql::SqlArgs),
    /// Interactive SQL shell.
    Shell,
    /// Run a benchmark suite's queries and print per-query times.
    Bench(bench::BenchArgs),
    /// List the warehouse's tables with their row counts (`--json`: with schemas too).
    Tables(tables::TablesArgs),
    /// Graph analytics with sort-reduce in a fixed memory budget.
    Graph(graph::GraphArgs),
    /// Run a storage node serving the warehouse over Arrow Flight.
    Serve(serve::ServeArgs),
    /// Serve SQL over Arrow Flight SQL (for ADBC, JDBC and other Flight SQL clients).
    Server(server::ServerArgs),
    /// Measure this machine's operator costs for the placement cost model.
    Calibrate(calibrate::CalibrateArgs),
    /// Verify every segment of the tables against the checksums written with it.
    Scrub(scrub::ScrubArgs),
    /// Models that explain runs (EMOS: the energy of a storage I/O trace; Kim 2015's model).
    Model(model::ModelArgs),
    /// Plan a table's column layout (encoding and codec per column) for a workload on a device.
    Layout(layout::LayoutArgs),
}

fn parse_on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("expected on or off, not '{other}'")),
    }
}

/// Runs the command `cli` describes; its exit code.
pub fn run(cli: Cli) -> ExitCode {
    let threads = cli.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let memory = match cli.memory.as_deref().map(quarry_storage::parse_size).transpose() {
        Ok(memory) => memory.map(|bytes| bytes as usize),
        Err(e) => {
            eprintln!("quarry: --memory: {e}");
            return ExitCode::from(2);
        }
    };
    let target = target::Target {
        warehouse: cli.warehouse.clone(),
        nodes: cli.nodes.clone(),
        token_file: cli.token_file.clone(),
        tls_ca: cli.tls_ca.clone(),
        pushdown: cli.pushdown,
        objective: cli.optimize,
        host_power: cli.host_power.clone(),
        star_join: cli.star_join,
        profile: cli.profile.clone(),
        threads,
        memory: memory.or_else(target::default_memory_budget),
    };
    let outcome = match cli.command {
        Command::Load(args) => load::run(&target, args, threads),
        Command::Gen(args) => generate::run(&target, args, threads),
        Command::Sql(args) => with_runtime(threads, sql::run(&target, args)),
        Command::Shell => with_runtime(threads, shell::run(&target)),
        Command::Bench(args) => bench::run(&target, args, threads),
        Command::Tables(args) => with_runtime(threads, tables::run(&target, args)),
        Command::Graph(args) => graph::run(&target, args, threads, memory),
        Command::Serve(args) => serve::run(&target, args, threads),
        Command::Server(args) => with_runtime(2, server::run(&target, args)),
        Command::Calibrate(args) => calibrate::run(&cli.warehouse, args, threads),
        Command::Scrub(args) => with_runtime(threads, scrub::run(&target, args)),
        Command::Model(args) => model::run(args),
        Command::Layout(args) => layout::run(&target, args),
    };
    if std::env::var_os("QUARRY_REPORT_PEAK_RSS").is_some() {
        // For memory tests: a parent process cannot measure this (a forked child's peak RSS
        // includes the parent's pages until exec), so the process reports its own.
        eprintln!("quarry: peak RSS {} bytes", peak_rss_bytes());
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `future` on a multi-threaded runtime of `threads` workers.
pub fn with_runtime<T>(threads: usize, future: impl std::future::Future<Output = CliResult<T>>) -> CliResult<T> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    runtime.block_on(future)
}

pub use quarry_graph_jobs::peak_rss_bytes;
