//! `quarry graph`: external-memory graph analytics over the warehouse's storage (GraFBoost).
//!
//! Graphs live in `<warehouse>/.graphs/<name>/` (a dot directory, so never mistaken for a table);
//! scratch files go to `<warehouse>/.graphs/.tmp/`, and leftovers of killed runs are removed at
//! the start of every graph command. An algorithm's result is committed as the warehouse table
//! `<graph>_<algorithm>` (vertex, value columns), so SQL can query it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, Float64Builder, Int64Builder, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use clap::{Args, Subcommand};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use quarry_graph::algorithms::{PageRankOptions, UNREACHED, bfs, betweenness, connected_components, pagerank, sample_sources, sssp};
use quarry_graph::{
    EngineConfig, Graph, GraphBuilder, ImportOptions, KroneckerParams, Progress, ProgressEvent, RunStats, generate_kronecker, import_edge_files,
};
use quarry_table::ingest::write_batches;
use quarry_table::{SegmentOptions, TableError, Warehouse, WriteMode};

use crate::CliResult;

#[derive(Debug, Args)]
pub struct GraphArgs {
    #[command(subcommand)]
    command: GraphCommand,
}

#[derive(Debug, Args)]
struct MemoryArg {
    /// Memory budget, e.g. 512MB or 1GB.
    #[arg(long, default_value = "1GB", value_parser = parse_size)]
    memory: usize,
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
        #[command(flatten)]
        memory: MemoryArg,
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
        #[command(flatten)]
        memory: MemoryArg,
    },
}

#[derive(Debug, Args)]
struct AlgoArgs {
    /// Graph name.
    name: String,
    /// Source vertex (BFS, SSSP, BC).
    #[arg(long)]
    root: Option<u64>,
    /// Iterations (PageRank).
    #[arg(long, default_value_t = 20)]
    iterations: u64,
    /// Number of sampled sources (BC, instead of --root).
    #[arg(long)]
    sources: Option<u64>,
    /// Table to write the result to (default <graph>_<algorithm>).
    #[arg(long)]
    table: Option<String>,
    #[command(flatten)]
    memory: MemoryArg,
}

/// `512MB`, `1GB`, `64KiB`, or bytes.
fn parse_size(text: &str) -> Result<usize, String> {
    let lower = text.trim().to_ascii_lowercase();
    let split = lower.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(lower.len());
    let (number, unit) = lower.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("'{text}' is not a size like 512MB"))?;
    let scale = match unit.trim() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown size unit '{other}' (use KB, MB or GB)")),
    };
    Ok((number * scale) as usize)
}

struct GraphHome {
    dir: PathBuf,
    temp: PathBuf,
}

impl GraphHome {
    fn open(warehouse: &Warehouse) -> CliResult<Self> {
        let dir = warehouse.root().join(".graphs");
        let temp = dir.join(".tmp");
        std::fs::create_dir_all(&temp).map_err(|e| format!("creating {}: {e}", temp.display()))?;
        quarry_graph::clean_stale_temp_dirs(&temp).map_err(|e| e.to_string())?;
        quarry_graph::clean_stale_temp_dirs(&dir).map_err(|e| e.to_string())?;
        Ok(GraphHome { dir, temp })
    }

    fn path(&self, name: &str) -> CliResult<PathBuf> {
        quarry_table::warehouse::validate_table_name(name).map_err(|_| format!("invalid graph name '{name}': use lowercase letters, digits and '_'"))?;
        Ok(self.dir.join(name))
    }

    fn graph(&self, name: &str) -> CliResult<Graph> {
        let path = self.path(name)?;
        if !path.exists() {
            return Err(format!("graph '{name}' does not exist (create it with 'quarry graph import' or 'quarry graph gen kron')"));
        }
        Graph::open(&path).map_err(|e| e.to_string())
    }

    fn import_options(&self, memory: usize, threads: usize) -> ImportOptions {
        ImportOptions::default().with_memory_bytes(memory).with_threads(threads).with_temp_dir(&self.temp).with_reverse(true).with_overwrite(true)
    }
}

pub fn run(warehouse_dir: &Path, args: GraphArgs, threads: usize) -> CliResult {
    let warehouse = Warehouse::open(warehouse_dir).map_err(|e| e.to_string())?;
    let home = GraphHome::open(&warehouse)?;
    let started = Instant::now();
    match args.command {
        GraphCommand::List => {
            let mut names: Vec<String> = std::fs::read_dir(&home.dir)
                .map_err(|e| e.to_string())?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect();
            names.sort();
            for name in names {
                let graph = home.graph(&name)?;
                println!("{name}\t{} vertices\t{} edges\t{}", graph.vertices(), graph.edges_count(), if graph.is_weighted() { "weighted" } else { "unweighted" });
            }
            Ok(())
        }
        GraphCommand::Import { name, from, keep_self_loops, memory } => {
            let dest = home.path(&name)?;
            let options = home.import_options(memory.memory, threads).with_self_loops(keep_self_loops);
            let is_parquet = from.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
            let (graph, stats) = if is_parquet {
                import_parquet(&from, &dest, options)?
            } else {
                import_edge_files(&[&from], None, &dest, options).map_err(|e| e.to_string())?
            };
            eprintln!(
                "{name}: {} vertices, {} edges ({} read, {} duplicates and {} self-loops removed), {:.2}s",
                graph.vertices(),
                graph.edges_count(),
                stats.edges_read,
                stats.duplicates_removed,
                stats.self_loops_dropped,
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        GraphCommand::Gen { kind: GenKind::Kron { name, scale, edge_factor, seed, weighted, memory } } => {
            let dest = home.path(&name)?;
            let params = KroneckerParams::graph500(scale).with_edge_factor(edge_factor).with_seed(seed).with_weights(weighted);
            let (graph, stats) = generate_kronecker(&params, &dest, home.import_options(memory.memory, threads)).map_err(|e| e.to_string())?;
            eprintln!(
                "{name}: {} vertices, {} edges kept of {} generated ({} duplicates, {} self-loops removed), {:.2}s",
                graph.vertices(),
                graph.edges_count(),
                stats.edges_generated,
                stats.import.duplicates_removed,
                stats.import.self_loops_dropped,
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        GraphCommand::Bfs(args) => run_algorithm(&warehouse, &home, "bfs", args, threads),
        GraphCommand::Pagerank(args) => run_algorithm(&warehouse, &home, "pagerank", args, threads),
        GraphCommand::Bc(args) => run_algorithm(&warehouse, &home, "bc", args, threads),
        GraphCommand::Sssp(args) => run_algorithm(&warehouse, &home, "sssp", args, threads),
        GraphCommand::Cc(args) => run_algorithm(&warehouse, &home, "cc", args, threads),
    }
}

fn import_parquet(from: &Path, dest: &Path, options: ImportOptions) -> CliResult<(Graph, quarry_graph::ImportStats)> {
    let file = std::fs::File::open(from).map_err(|e| format!("opening {}: {e}", from.display()))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.with_batch_size(64 * 1024).build())
        .map_err(|e| format!("{}: not a readable Parquet file: {e}", from.display()))?;
    let schema = arrow::array::RecordBatchReader::schema(&reader);
    for column in ["src", "dst"] {
        if schema.field_with_name(column).is_err() {
            return Err(format!("{}: an edge list needs columns src and dst (and optionally weight)", from.display()));
        }
    }
    let weighted = schema.field_with_name("weight").is_ok();
    let mut builder = GraphBuilder::new(dest, options.with_weighted(weighted)).map_err(|e| e.to_string())?;
    for batch in reader {
        let batch = batch.map_err(|e| format!("{}: {e}", from.display()))?;
        let column = |name: &str, to: &DataType| -> CliResult<ArrayRef> {
            let array = batch.column_by_name(name).expect("checked above");
            arrow::compute::cast(array, to).map_err(|e| format!("{}: column {name}: {e}", from.display()))
        };
        let src = column("src", &DataType::UInt64)?;
        let dst = column("dst", &DataType::UInt64)?;
        let src = arrow::array::AsArray::as_primitive::<arrow::datatypes::UInt64Type>(src.as_ref());
        let dst = arrow::array::AsArray::as_primitive::<arrow::datatypes::UInt64Type>(dst.as_ref());
        let weight = if weighted { Some(column("weight", &DataType::Float32)?) } else { None };
        let weight = weight.as_ref().map(|w| arrow::array::AsArray::as_primitive::<arrow::datatypes::Float32Type>(w.as_ref()));
        for row in 0..batch.num_rows() {
            if src.is_null(row) || dst.is_null(row) {
                return Err(format!("{}: row {} has a NULL src or dst", from.display(), row + 1));
            }
            builder.add_edge(src.value(row), dst.value(row), weight.map(|w| w.value(row))).map_err(|e| e.to_string())?;
        }
    }
    builder.finish().map_err(|e| e.to_string())
}

/// A result column: vertex id plus one or two values, streamed into a warehouse table.
enum ResultColumns {
    Int(&'static str),
    Float(&'static str),
    FloatInt(&'static str, &'static str),
}

/// A live bar per superstep (on a terminal): active vertices visited and edges traversed; when
/// the step ends, a line with its counts stays in its place.
fn step_bars(algorithm: &str) -> Progress {
    let algorithm = algorithm.to_string();
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

fn console_is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

fn run_algorithm(warehouse: &Warehouse, home: &GraphHome, algorithm: &str, args: AlgoArgs, threads: usize) -> CliResult {
    let graph = home.graph(&args.name)?;
    let config = EngineConfig::new(args.memory.memory).with_threads(threads).with_temp_dir(&home.temp).with_progress(step_bars(algorithm));
    let table = args.table.clone().unwrap_or_else(|| format!("{}_{algorithm}", args.name));
    let root = || args.root.ok_or_else(|| format!("{algorithm} needs --root VERTEX"));
    let started = Instant::now();
    // Each arm streams its values into the result table and returns the engine statistics.
    let (stats, summary): (Vec<RunStats>, String) = match algorithm {
        "bfs" => {
            let result = bfs(&graph, root()?, &config).map_err(|e| e.to_string())?;
            let values = result.parents.iter().map_err(|e| e.to_string())?.map(|v| v.map(|p| (p != UNREACHED).then_some(p as i64)));
            write_result(warehouse, &table, ResultColumns::Int("parent"), values.map(|r| r.map(|p| (p.map(|p| p as f64), p))))?;
            (vec![result.stats], format!("{} vertices reached, depth {}", result.reached, result.depth))
        }
        "cc" => {
            let result = connected_components(&graph, &config).map_err(|e| e.to_string())?;
            let values = result.labels.iter().map_err(|e| e.to_string())?.map(|v| v.map(|l| (Some(l as f64), Some(l as i64))));
            write_result(warehouse, &table, ResultColumns::Int("component"), values)?;
            (vec![result.stats], format!("{} components", result.components))
        }
        "pagerank" => {
            let options = PageRankOptions { iterations: args.iterations, ..Default::default() };
            let result = pagerank(&graph, &options, &config).map_err(|e| e.to_string())?;
            let values = result.ranks.iter().map_err(|e| e.to_string())?.map(|v| v.map(|r| (Some(r), None)));
            write_result(warehouse, &table, ResultColumns::Float("rank"), values)?;
            (vec![result.stats], format!("{} iterations", args.iterations))
        }
        "sssp" => {
            let result = sssp(&graph, root()?, &config).map_err(|e| e.to_string())?;
            let values = result.distances.iter().map_err(|e| e.to_string())?.map(|v| {
                v.map(|(d, p)| if d.is_finite() { (Some(d), Some(p as i64)) } else { (None, None) })
            });
            write_result(warehouse, &table, ResultColumns::FloatInt("distance", "parent"), values)?;
            (vec![result.stats], String::new())
        }
        "bc" => {
            let sources = match (args.root, args.sources) {
                (Some(root), None) => vec![root],
                (None, Some(count)) => sample_sources(graph.vertices(), count, 1),
                _ => return Err("bc needs either --root VERTEX or --sources COUNT".into()),
            };
            let result = betweenness(&graph, &sources, &config).map_err(|e| e.to_string())?;
            let values = result.scores.iter().map_err(|e| e.to_string())?.map(|v| v.map(|s| (Some(s), None)));
            write_result(warehouse, &table, ResultColumns::Float("centrality"), values)?;
            (result.stats, format!("{} sources", sources.len()))
        }
        _ => unreachable!("clap lists the algorithms"),
    };
    print_summary(algorithm, &args.name, &table, &stats, &summary, started.elapsed().as_secs_f64());
    Ok(())
}

/// Streams `(float value, int value)` pairs (one per vertex, in vertex order) into `table`.
fn write_result(
    warehouse: &Warehouse,
    table: &str,
    columns: ResultColumns,
    values: impl Iterator<Item = quarry_graph::Result<(Option<f64>, Option<i64>)>>,
) -> CliResult {
    let mut fields = vec![Field::new("vertex", DataType::Int64, false)];
    match columns {
        ResultColumns::Int(name) => fields.push(Field::new(name, DataType::Int64, true)),
        ResultColumns::Float(name) => fields.push(Field::new(name, DataType::Float64, true)),
        ResultColumns::FloatInt(f, i) => {
            fields.push(Field::new(f, DataType::Float64, true));
            fields.push(Field::new(i, DataType::Int64, true));
        }
    }
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let writer = warehouse
        .begin_write(table, &schema, WriteMode::Replace, SegmentOptions::default(), vec!["vertex".into()])
        .map_err(|e| e.to_string())?;
    let mut values = values.enumerate().peekable();
    let batches = std::iter::from_fn(|| {
        values.peek()?;
        let (mut vertex, mut float, mut int) = (Int64Builder::new(), Float64Builder::new(), Int64Builder::new());
        for (v, value) in values.by_ref().take(64 * 1024) {
            let (f, i) = match value {
                Ok(pair) => pair,
                Err(e) => return Some(Err(TableError::InvalidInput { file: "graph values".into(), reason: e.to_string() })),
            };
            vertex.append_value(v as i64);
            float.append_option(f);
            int.append_option(i);
        }
        let mut arrays: Vec<ArrayRef> = vec![Arc::new(vertex.finish())];
        match columns {
            ResultColumns::Int(_) => arrays.push(Arc::new(int.finish())),
            ResultColumns::Float(_) => arrays.push(Arc::new(float.finish())),
            ResultColumns::FloatInt(..) => {
                arrays.push(Arc::new(float.finish()));
                arrays.push(Arc::new(int.finish()));
            }
        }
        Some(RecordBatch::try_new(schema.clone(), arrays).map_err(|e| TableError::InvalidInput { file: "graph values".into(), reason: e.to_string() }))
    });
    let segments = write_batches(&writer, batches, &|_| {}).map_err(|e| e.to_string())?;
    writer.commit(segments, vec![("generator".into(), "graph".into())]).map_err(|e| e.to_string())?;
    Ok(())
}

fn print_summary(algorithm: &str, graph: &str, table: &str, runs: &[RunStats], summary: &str, wall_s: f64) {
    let steps: Vec<_> = runs.iter().flat_map(|r| r.supersteps.iter()).collect();
    let edges: u64 = steps.iter().map(|s| s.edges_traversed).sum();
    let updates: u64 = steps.iter().map(|s| s.updates_emitted).sum();
    // The paper's measure: the share of the update stream removed by in-memory reduction before
    // anything is written, over all supersteps.
    let updates_in: u64 = steps.iter().map(|s| s.sort_reduce.updates_in).sum();
    let after_first: u64 = steps.iter().map(|s| s.sort_reduce.records_after_first_reduce).sum();
    let first = if updates_in == 0 { 0.0 } else { 1.0 - after_first as f64 / updates_in as f64 };
    let read: u64 = steps.iter().map(|s| s.graph_bytes_read + s.value_bytes_read + s.active_bytes_read + s.sort_reduce.bytes_read).sum();
    let written: u64 = steps.iter().map(|s| s.value_bytes_written + s.active_bytes_written + s.sort_reduce.bytes_written).sum();
    let spilled: u64 = steps.iter().map(|s| s.sort_reduce.bytes_written).sum();
    let peak_sort = runs.iter().map(|r| r.peak_sort_reduce_bytes()).max().unwrap_or(0);
    println!("{algorithm} on {graph}: {summary}; result in table {table}");
    for s in &steps {
        println!(
            "  step {:>3}: active {:>10}  edges {:>12}  updates {:>12} -> {:>10} after reduce  spilled {:>8.1} MB  {:>7.3}s",
            s.superstep,
            s.active_vertices,
            s.edges_traversed,
            s.updates_emitted,
            s.records_after_reduce,
            s.sort_reduce.bytes_written as f64 / 1e6,
            s.elapsed.as_secs_f64()
        );
    }
    println!(
        "  wall {wall_s:.2}s, {:.1} M edges traversed/s, {updates} updates, reduction before the first write {:.1}%, read {:.1} MB, written {:.1} MB (sort-reduce spills {:.1} MB), peak sort-reduce memory {:.1} MB, peak RSS {:.1} MB",
        edges as f64 / wall_s / 1e6,
        first * 100.0,
        read as f64 / 1e6,
        written as f64 / 1e6,
        spilled as f64 / 1e6,
        peak_sort as f64 / 1e6,
        crate::peak_rss_bytes() as f64 / 1e6
    );
}
