//! `quarry graph`: external-memory graph analytics over the warehouse's storage (GraFBoost).
//!
//! The jobs themselves are `quarry_graph_jobs`: embedded, they run in this process over
//! the warehouse; with `--nodes`, on the storage node that holds the graph, which returns only
//! the summary (the result table stays on the node, for `quarry sql --nodes`). Importing an edge
//! file reads a local file and so runs only on a local warehouse.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use quarry_flight::RemoteStorageNode;
use quarry_storage::StorageNode;
use quarry_graph::{Cancel, Progress, ProgressEvent};
use quarry_graph_jobs::{GraphAlgorithm, GraphJob, GraphJobOutput, import_graph_file, run_graph_job, run_on_node};
use quarry_table::Warehouse;

use crate::target::Target;
use crate::{CliResult, with_runtime};

#[derive(Debug, Args)]
pub struct GraphArgs {
    #[command(subcommand)]
    command: GraphCommand,
}

#[derive(Debug, Subcommand)]
enum GraphCommand {
    /// Import an edge list (Parquet with columns src, dst[, weight]; CSV with a header src,dst[,weight]; or text).
    Import {
        /// Graph name.
        name: String,
        /// Edge list file.
        #[arg(long)]
        from: PathBuf,
        /// Keep self-loops (dropped by default).
        #[arg(long)]
        keep_self_loops: bool,
    },
    /// Generate a graph.
    Gen {
        #[command(subcommand)]
        kind: GenKind,
    },
    /// Breadth-first search: parent of every reached vertex.
    Bfs(AlgoArgs),
    /// PageRank (damping 0.85; dangling vertices' rank spread uniformly).
    Pagerank(AlgoArgs),
    /// Betweenness centrality from --root, or from --sources K sampled vertices.
    Bc(AlgoArgs),
    /// Single-source shortest paths over edge weights (1.0 when unweighted).
    Sssp(AlgoArgs),
    /// Weakly connected components: each vertex's smallest vertex id in its component.
    Cc(AlgoArgs),
    /// List the graphs.
    List,
}

#[derive(Debug, Subcommand)]
enum GenKind {
    /// Graph500 Kronecker graph (A=0.57, B=0.19, C=0.19), permuted ids, no self-loops or duplicates.
    Kron {
        /// Graph name.
        name: String,
        /// log2 of the vertex count.
        #[arg(long)]
        scale: u32,
        /// Edges generated per vertex.
        #[arg(long, default_value_t = 16)]
        edge_factor: u64,
        /// Random seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Give edges random weights in (0, 1].
        #[arg(long)]
        weighted: bool,
    },
}

#[derive(Debug, Args)]
struct AlgoArgs {
    /// Graph name.
    name: String,
    /// Source vertex (BFS, SSSP, BC).
    #[arg(long)]
    root: Option<u64>,
    /// Iterations (PageRank; with --tolerance, the most).
    #[arg(long, default_value_t = 20)]
    iterations: u64,
    /// PageRank: after the first iteration, recompute only vertices whose rank moved by more
    /// than this share of the average rank 1/V (Algorithm 4's Bloom-filter active list); stop
    /// when none does. E.g. 1e-6.
    #[arg(long)]
    tolerance: Option<f64>,
    /// Number of sampled sources (BC, instead of --root).
    #[arg(long)]
    sources: Option<u64>,
    /// Table to write the result to (default <graph>_<algorithm>).
    #[arg(long)]
    table: Option<String>,
}

impl AlgoArgs {
    fn job(self, algorithm: GraphAlgorithm, memory: usize) -> (GraphJob, Option<GraphAlgorithm>) {
        let job = GraphJob::Run {
            algorithm,
            graph: self.name,
            root: self.root,
            iterations: self.iterations,
            tolerance: self.tolerance,
            sources: self.sources,
            table: self.table,
            memory_bytes: memory as u64,
        };
        (job, Some(algorithm))
    }
}

/// A graph job's budget when `--memory` is not given: sort-reduce sizes its buffers to the
/// budget, so the default is a fixed size rather than the query default (a share of RAM).
const DEFAULT_GRAPH_MEMORY: usize = 1_000_000_000;

/// `memory` is the process's `--memory` when the user gave one.
pub fn run(target: &Target, args: GraphArgs, threads: usize, memory: Option<usize>) -> CliResult {
    let memory = memory.unwrap_or(DEFAULT_GRAPH_MEMORY);
    let (job, algorithm) = match args.command {
        GraphCommand::Import { name, from, keep_self_loops } => {
            if target.is_remote() {
                return Err("graph import reads a local file: import on the node's own warehouse (quarry --warehouse DIR graph import), not through --nodes".into());
            }
            return import(&target.warehouse, &name, &from, keep_self_loops, memory, threads);
        }
        GraphCommand::List => (GraphJob::List, None),
        GraphCommand::Gen { kind: GenKind::Kron { name, scale, edge_factor, seed, weighted } } => {
            (GraphJob::GenKron { name, scale, edge_factor, seed, weighted, memory_bytes: memory as u64 }, None)
        }
        GraphCommand::Bfs(args) => args.job(GraphAlgorithm::Bfs, memory),
        GraphCommand::Pagerank(args) => args.job(GraphAlgorithm::Pagerank, memory),
        GraphCommand::Bc(args) => args.job(GraphAlgorithm::Bc, memory),
        GraphCommand::Sssp(args) => args.job(GraphAlgorithm::Sssp, memory),
        GraphCommand::Cc(args) => args.job(GraphAlgorithm::Cc, memory),
    };
    let outputs: Vec<(Option<String>, GraphJobOutput)> = if target.is_remote() {
        with_runtime(threads, run_on_nodes(target, job))?
    } else {
        let warehouse = Warehouse::open(&target.warehouse).map_err(|e| e.to_string())?;
        let progress = match (&job, algorithm) {
            (_, Some(algorithm)) => Some(step_bars(algorithm)),
            (GraphJob::GenKron { .. }, None) => Some(generation_bar()),
            _ => None,
        };
        vec![(None, run_graph_job(&warehouse, job, threads, progress, Cancel::default())?)]
    };
    for (node, output) in outputs {
        match output {
            GraphJobOutput::Listed(graphs) => {
                for (name, vertices, edges, weighted) in graphs {
                    let place = node.as_deref().map(|n| format!("\t{n}")).unwrap_or_default();
                    println!("{name}\t{vertices} vertices\t{edges} edges\t{}{place}", if weighted { "weighted" } else { "unweighted" });
                }
            }
            GraphJobOutput::Made(line) => eprintln!("{line}"),
            GraphJobOutput::Ran(summary) => {
                let place = node.map(|n| format!(" (ran on node {n})")).unwrap_or_default();
                println!("{}{place}", summary.report());
            }
        }
    }
    Ok(())
}

/// Sends `job` to the node it belongs on: a run to the node holding its graph, a new graph to
/// the one node named, a listing to every node.
async fn run_on_nodes(target: &Target, job: GraphJob) -> CliResult<Vec<(Option<String>, GraphJobOutput)>> {
    let nodes = target.remote_nodes().await?;
    match &job {
        GraphJob::List => {
            let mut out = Vec::new();
            for node in &nodes {
                out.push(call_node(node, GraphJob::List).await?);
            }
            Ok(out)
        }
        GraphJob::GenKron { .. } => match &nodes[..] {
            [node] => Ok(vec![call_node(node, job).await?]),
            _ => Err("graph gen makes a graph on one node: name exactly one with --nodes".into()),
        },
        GraphJob::Run { graph, .. } => {
            for node in &nodes {
                if let (_, GraphJobOutput::Listed(graphs)) = call_node(node, GraphJob::List).await?
                    && graphs.iter().any(|(name, ..)| name == graph)
                {
                    return Ok(vec![call_node(node, job).await?]);
                }
            }
            Err(format!("no node holds graph '{graph}' (nodes: {})", target.nodes.join(", ")))
        }
    }
}

async fn call_node(node: &RemoteStorageNode, job: GraphJob) -> CliResult<(Option<String>, GraphJobOutput)> {
    let output = run_on_node(node, &job).await.map_err(|e| format!("node {}: {}", node.name(), quarry_engine::user_message(&e)))?;
    Ok((Some(node.name().to_string()), output))
}

fn import(warehouse: &Path, name: &str, from: &Path, keep_self_loops: bool, memory: usize, threads: usize) -> CliResult {
    let warehouse = Warehouse::open(warehouse).map_err(|e| e.to_string())?;
    // Made at the first report, which brings the file's rows.
    let bar = std::sync::OnceLock::new();
    let made = import_graph_file(&warehouse, name, from, keep_self_loops, memory, threads, &|edges, total| {
        bar.get_or_init(|| crate::progress::rows_bar("edges", Some(total))).set_position(edges)
    })?;
    if let Some(bar) = bar.get() {
        bar.finish_and_clear();
    }
    eprintln!("{made}");
    Ok(())
}

/// A live bar per superstep (on a terminal): active vertices visited and edges traversed; when
/// the step ends, a line with its counts stays in its place.
fn step_bars(algorithm: GraphAlgorithm) -> Progress {
    let algorithm = algorithm.name().to_string();
    let current: std::sync::Mutex<Option<(u64, indicatif::ProgressBar)>> = std::sync::Mutex::new(None);
    Progress::new(move |event| {
        let mut current = current.lock().expect("progress lock");
        match event {
            ProgressEvent::Scatter { superstep, visited, active_total, edges } => {
                if current.as_ref().is_none_or(|(step, _)| *step != superstep) {
                    let bar = crate::progress::rows_bar(&format!("{algorithm} step {superstep}"), active_total);
                    *current = Some((superstep, bar));
                }
                let (_, bar) = current.as_ref().expect("just set");
                bar.set_position(visited);
                bar.set_message(format!("{algorithm} step {superstep}, {edges} edges"));
            }
            ProgressEvent::Generated { .. } => {}
            ProgressEvent::Finished(step) => {
                if let Some((_, bar)) = current.take() {
                    bar.finish_and_clear();
                }
                if console_is_terminal() {
                    eprintln!(
                        "{algorithm} step {}: {} active, {} edges, {} updates -> {} after reduce, {:.2}s",
                        step.superstep,
                        step.active_vertices,
                        step.edges_traversed,
                        step.updates_emitted,
                        step.records_after_reduce,
                        step.elapsed.as_secs_f64()
                    );
                }
            }
        }
    })
}

/// A live bar of the edges a Kronecker graph's generation has made (on a terminal).
fn generation_bar() -> Progress {
    let bar = std::sync::OnceLock::new();
    Progress::new(move |event| {
        if let ProgressEvent::Generated { edges, total } = event {
            let bar = bar.get_or_init(|| crate::progress::steps_bar("generating", total, "edges"));
            bar.set_position(edges);
            if edges >= total {
                bar.finish_and_clear();
            }
        }
    })
}

fn console_is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

