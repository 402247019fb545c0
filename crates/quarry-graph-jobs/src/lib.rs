//! Graph jobs over a warehouse's graphs (GraFBoost, Jun 2018 ch. 9): run an algorithm, commit
//! its result as a table, return a summary. The CLI runs a job in process; a storage node runs
//! the same job next to its data when the host submits it (`quarry --nodes URL graph ...`), and
//! only the summary crosses the link (the result stays a table on the node, for SQL).
//!
//! Graphs live in `<warehouse>/.graphs/<name>/` (a dot directory, so never mistaken for a table);
//! scratch files go to `<warehouse>/.graphs/.tmp/`, and leftovers of killed runs are removed at
//! the start of every job. An algorithm's result is committed as the warehouse table
//! `<graph>_<algorithm>` (vertex, value columns) unless the job names another.
//!
//! Storage knows nothing of graphs: a node runs them as one of its jobs ([`GraphJobs`], the
//! `quarry_storage::NodeJobs` a node is made with), and a host sends one with [`run_on_node`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, Float64Builder, Int64Builder, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use quarry_graph::algorithms::{PageRankOptions, UNREACHED, bfs, betweenness, connected_components, pagerank, sample_sources, sssp};
use quarry_graph::{Cancel, EngineConfig, Graph, GraphBuilder, ImportOptions, ImportStats, KroneckerParams, Progress, RunStats, generate_kronecker, import_edge_files};
use quarry_table::ingest::write_batches;
use quarry_table::{Damage, ScrubReport, SegmentOptions, TableError, Warehouse, WriteMode};
use serde::{Deserialize, Serialize};

mod node;
pub use node::{GraphJobs, run_on_node};

/// The algorithms a job can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GraphAlgorithm {
    /// Breadth-first search: the parent of every reached vertex.
    Bfs,
    /// PageRank, a fixed number of iterations.
    Pagerank,
    /// Betweenness centrality from one or sampled sources.
    Bc,
    /// Single-source shortest paths.
    Sssp,
    /// Weakly connected components.
    Cc,
}

impl GraphAlgorithm {
    /// Its command name, also the suffix of its default result table.
    pub fn name(self) -> &'static str {
        match self {
            GraphAlgorithm::Bfs => "bfs",
            GraphAlgorithm::Pagerank => "pagerank",
            GraphAlgorithm::Bc => "bc",
            GraphAlgorithm::Sssp => "sssp",
            GraphAlgorithm::Cc => "cc",
        }
    }
}

/// What a job does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum GraphJob {
    /// Run an algorithm on a graph and commit its result as a table.
    Run {
        /// The algorithm.
        algorithm: GraphAlgorithm,
        /// Graph name.
        graph: String,
        /// Source vertex (BFS, SSSP, BC).
        root: Option<u64>,
        /// Iterations (PageRank; with a tolerance, the most).
        iterations: u64,
        /// PageRank: recompute only vertices whose rank moved by more than this share of the
        /// average rank (Algorithm 4's Bloom-filter active list).
        #[serde(default)]
        tolerance: Option<f64>,
        /// Sampled sources (BC, instead of `root`).
        sources: Option<u64>,
        /// Result table (default `<graph>_<algorithm>`).
        table: Option<String>,
        /// Memory budget, bytes.
        memory_bytes: u64,
    },
    /// Generate a Graph500 Kronecker graph.
    GenKron {
        /// Graph name.
        name: String,
        /// log2 of the vertex count.
        scale: u32,
        /// Edges generated per vertex.
        edge_factor: u64,
        /// Random seed.
        seed: u64,
        /// Random edge weights in (0, 1].
        weighted: bool,
        /// Memory budget, bytes.
        memory_bytes: u64,
    },
    /// List the graphs.
    List,
}

impl GraphJob {
    /// The memory budget the job asks for (none for a listing).
    pub fn memory_bytes(&self) -> Option<u64> {
        match self {
            GraphJob::Run { memory_bytes, .. } | GraphJob::GenKron { memory_bytes, .. } => Some(*memory_bytes),
            GraphJob::List => None,
        }
    }
}

/// What a job returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum GraphJobOutput {
    /// An algorithm ran.
    Ran(RunSummary),
    /// A graph was made: one line describing it.
    Made(String),
    /// The graphs: name, vertices, edges, weighted.
    Listed(Vec<(String, u64, u64, bool)>),
}

/// One superstep, as the summary reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepSummary {
    /// Superstep number.
    pub superstep: u64,
    /// Active vertices scattered.
    pub active: u64,
    /// Edges traversed.
    pub edges: u64,
    /// Updates the edge program emitted.
    pub updates: u64,
    /// Records left after sort-reduce.
    pub after_reduce: u64,
    /// Bytes sort-reduce spilled.
    pub spilled_bytes: u64,
    /// Seconds.
    pub seconds: f64,
}

/// An algorithm run's summary: the figures of `quarry graph`'s report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The algorithm.
    pub algorithm: String,
    /// The graph.
    pub graph: String,
    /// The result table.
    pub table: String,
    /// One line on the result (vertices reached, components, ...).
    pub result: String,
    /// Per superstep.
    pub steps: Vec<StepSummary>,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// Share of the update stream removed by in-memory reduction before anything is written.
    pub reduction_before_first_write: f64,
    /// Bytes read (graph, values, active lists, sort-reduce runs).
    pub read_bytes: u64,
    /// Bytes written (values, active lists, sort-reduce runs).
    pub written_bytes: u64,
    /// Bytes written by sort-reduce spills.
    pub spilled_bytes: u64,
    /// Peak memory held by sort-reduce.
    pub peak_sort_reduce_bytes: u64,
    /// Peak resident memory of the process that ran the job.
    pub peak_rss_bytes: u64,
}

impl RunSummary {
    fn new(algorithm: GraphAlgorithm, graph: &str, table: &str, result: String, runs: &[RunStats], wall_s: f64) -> Self {
        let steps: Vec<_> = runs.iter().flat_map(|r| r.supersteps.iter()).collect();
        let updates_in: u64 = steps.iter().map(|s| s.sort_reduce.updates_in).sum();
        let after_first: u64 = steps.iter().map(|s| s.sort_reduce.records_after_first_reduce).sum();
        RunSummary {
            algorithm: algorithm.name().into(),
            graph: graph.into(),
            table: table.into(),
            result,
            steps: steps
                .iter()
                .map(|s| StepSummary {
                    superstep: s.superstep,
                    active: s.active_vertices,
                    edges: s.edges_traversed,
                    updates: s.updates_emitted,
                    after_reduce: s.records_after_reduce,
                    spilled_bytes: s.sort_reduce.bytes_written,
                    seconds: s.elapsed.as_secs_f64(),
                })
                .collect(),
            wall_s,
            reduction_before_first_write: if updates_in == 0 { 0.0 } else { 1.0 - after_first as f64 / updates_in as f64 },
            read_bytes: steps.iter().map(|s| s.graph_bytes_read + s.value_bytes_read + s.active_bytes_read + s.sort_reduce.bytes_read).sum(),
            written_bytes: steps.iter().map(|s| s.value_bytes_written + s.active_bytes_written + s.sort_reduce.bytes_written).sum(),
            spilled_bytes: steps.iter().map(|s| s.sort_reduce.bytes_written).sum(),
            peak_sort_reduce_bytes: runs.iter().map(|r| r.peak_sort_reduce_bytes() as u64).max().unwrap_or(0),
            peak_rss_bytes: peak_rss_bytes(),
        }
    }

    /// The report: a headline, a line per superstep, and the totals.
    pub fn report(&self) -> String {
        let mut out = format!("{} on {}: {}; result in table {}\n", self.algorithm, self.graph, self.result, self.table);
        for s in &self.steps {
            out.push_str(&format!(
                "  step {:>3}: active {:>10}  edges {:>12}  updates {:>12} -> {:>10} after reduce  spilled {:>8.1} MB  {:>7.3}s\n",
                s.superstep,
                s.active,
                s.edges,
                s.updates,
                s.after_reduce,
                s.spilled_bytes as f64 / 1e6,
                s.seconds
            ));
        }
        let edges: u64 = self.steps.iter().map(|s| s.edges).sum();
        let updates: u64 = self.steps.iter().map(|s| s.updates).sum();
        out.push_str(&format!(
            "  wall {:.2}s, {:.1} M edges traversed/s, {updates} updates, reduction before the first write {:.1}%, read {:.1} MB, written {:.1} MB (sort-reduce spills {:.1} MB), peak sort-reduce memory {:.1} MB, peak RSS {:.1} MB",
            self.wall_s,
            edges as f64 / self.wall_s.max(1e-9) / 1e6,
            self.reduction_before_first_write * 100.0,
            self.read_bytes as f64 / 1e6,
            self.written_bytes as f64 / 1e6,
            self.spilled_bytes as f64 / 1e6,
            self.peak_sort_reduce_bytes as f64 / 1e6,
            self.peak_rss_bytes as f64 / 1e6
        ));
        out
    }
}

/// Peak resident set size of this process since exec (Linux `VmHWM`); 0 where unavailable.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map_or(0, |kb| kb * 1024)
}

/// A warehouse's graph directory; opening it removes the scratch files of killed runs.
pub struct GraphHome {
    dir: PathBuf,
    temp: PathBuf,
}

impl GraphHome {
    /// The graph directory of `warehouse`, created if missing.
    pub fn open(warehouse: &Warehouse) -> Result<Self, String> {
        let dir = warehouse.root().join(".graphs");
        let temp = dir.join(".tmp");
        std::fs::create_dir_all(&temp).map_err(|e| format!("creating {}: {e}", temp.display()))?;
        quarry_graph::clean_stale_temp_dirs(&temp).map_err(|e| e.to_string())?;
        quarry_graph::clean_stale_temp_dirs(&dir).map_err(|e| e.to_string())?;
        Ok(GraphHome { dir, temp })
    }

    /// Where graph `name` lives; the name must be a valid table name.
    pub fn path(&self, name: &str) -> Result<PathBuf, String> {
        quarry_table::warehouse::validate_table_name(name).map_err(|_| format!("invalid graph name '{name}': use lowercase letters, digits and '_'"))?;
        Ok(self.dir.join(name))
    }

    /// Opens graph `name`.
    pub fn graph(&self, name: &str) -> Result<Graph, String> {
        let path = self.path(name)?;
        if !path.exists() {
            return Err(format!("graph '{name}' does not exist (create it with 'quarry graph import' or 'quarry graph gen kron')"));
        }
        Graph::open(&path).map_err(|e| e.to_string())
    }

    /// Import settings: bounded memory, scratch files here, reverse graph built.
    pub fn import_options(&self, memory: usize, threads: usize) -> ImportOptions {
        ImportOptions::default().with_memory_bytes(memory).with_threads(threads).with_temp_dir(&self.temp).with_reverse(true).with_overwrite(true)
    }

    /// Names of the graphs, sorted.
    fn names(&self) -> Result<Vec<String>, String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .map_err(|e| format!("listing {}: {e}", self.dir.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Reads every file of every graph and checks it against the checksums its header
    /// recorded, adding what it finds to `report`; `pace(bytes)` after each block read.
    pub fn scrub(&self, pace: &mut dyn FnMut(u64), report: &mut ScrubReport) -> Result<(), String> {
        for name in self.names()? {
            let dir = self.dir.join(&name);
            let found = quarry_graph::scrub(&dir, pace).map_err(|e| e.to_string())?;
            let relative = |file: &str| std::path::Path::new(".graphs").join(&name).join(file);
            if found.unverifiable {
                report.unverifiable.push(relative(quarry_graph::csr::META_FILE));
            }
            report.files_verified += found.files_verified;
            report.bytes_verified += found.bytes_verified;
            report.damage.extend(found.damage.into_iter().map(|(file, reason)| Damage { name: name.clone(), file: relative(&file), bytes: None, reason }));
            report.graphs.push(name);
        }
        Ok(())
    }

    /// The graphs, sorted by name.
    pub fn list(&self) -> Result<Vec<(String, u64, u64, bool)>, String> {
        self.names()?
            .into_iter()
            .map(|name| {
                let graph = self.graph(&name)?;
                Ok((name, graph.vertices(), graph.edges_count(), graph.is_weighted()))
            })
            .collect()
    }
}

/// Imports the edge file `from` (Parquet with columns src, dst[, weight]; CSV with that header;
/// or text) as graph `name` within `memory` bytes; `progress` gets the Parquet edges read so
/// far and the file's rows. One line describing the graph made.
pub fn import_graph_file(
    warehouse: &Warehouse,
    name: &str,
    from: &std::path::Path,
    keep_self_loops: bool,
    memory: usize,
    threads: usize,
    progress: &dyn Fn(u64, u64),
) -> Result<String, String> {
    let started = Instant::now();
    let home = GraphHome::open(warehouse)?;
    let dest = home.path(name)?;
    let options = home.import_options(memory, threads).with_self_loops(keep_self_loops);
    let is_parquet = from.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
    let (graph, stats) =
        if is_parquet { import_parquet(from, &dest, options, progress)? } else { import_edge_files(&[from], None, &dest, options).map_err(|e| e.to_string())? };
    Ok(format!(
        "{name}: {} vertices, {} edges ({} read, {} duplicates and {} self-loops removed), {:.2}s",
        graph.vertices(),
        graph.edges_count(),
        stats.edges_read,
        stats.duplicates_removed,
        stats.self_loops_dropped,
        started.elapsed().as_secs_f64()
    ))
}

fn import_parquet(from: &std::path::Path, dest: &std::path::Path, options: ImportOptions, progress: &dyn Fn(u64, u64)) -> Result<(Graph, ImportStats), String> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Float32Type, UInt64Type};
    let file = std::fs::File::open(from).map_err(|e| format!("opening {}: {e}", from.display()))?;
    let unreadable = |e: parquet::errors::ParquetError| format!("{}: not a readable Parquet file: {e}", from.display());
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).map_err(unreadable)?;
    let total = builder.metadata().file_metadata().num_rows().max(0) as u64;
    let reader = builder.with_batch_size(64 * 1024).build().map_err(unreadable)?;
    let schema = arrow::array::RecordBatchReader::schema(&reader);
    for column in ["src", "dst"] {
        if schema.field_with_name(column).is_err() {
            return Err(format!("{}: an edge list needs columns src and dst (and optionally weight)", from.display()));
        }
    }
    let weighted = schema.field_with_name("weight").is_ok();
    let mut builder = GraphBuilder::new(dest, options.with_weighted(weighted)).map_err(|e| e.to_string())?;
    let mut read = 0;
    for batch in reader {
        let batch = batch.map_err(|e| format!("{}: {e}", from.display()))?;
        let column = |name: &str, to: &DataType| -> Result<ArrayRef, String> {
            let array = batch.column_by_name(name).expect("checked above");
            arrow::compute::cast(array, to).map_err(|e| format!("{}: column {name}: {e}", from.display()))
        };
        let src = column("src", &DataType::UInt64)?;
        let dst = column("dst", &DataType::UInt64)?;
        let (src, dst) = (src.as_primitive::<UInt64Type>(), dst.as_primitive::<UInt64Type>());
        let weight = if weighted { Some(column("weight", &DataType::Float32)?) } else { None };
        let weight = weight.as_ref().map(|w| w.as_primitive::<Float32Type>());
        for row in 0..batch.num_rows() {
            if src.is_null(row) || dst.is_null(row) {
                return Err(format!("{}: row {} has a NULL src or dst", from.display(), read + row as u64 + 1));
            }
            builder.add_edge(src.value(row), dst.value(row), weight.map(|w| w.value(row))).map_err(|e| e.to_string())?;
        }
        read += batch.num_rows() as u64;
        progress(read, total);
    }
    builder.finish().map_err(|e| e.to_string())
}

/// Runs `job` over `warehouse`'s graphs with `threads` threads, reporting to `progress` (an
/// algorithm's supersteps, or a generation's edges); an algorithm stops with an
/// error once `cancel` is set (making a graph does not).
pub fn run_graph_job(warehouse: &Warehouse, job: GraphJob, threads: usize, progress: Option<Progress>, cancel: Cancel) -> Result<GraphJobOutput, String> {
    let home = GraphHome::open(warehouse)?;
    let started = Instant::now();
    match job {
        GraphJob::List => Ok(GraphJobOutput::Listed(home.list()?)),
        GraphJob::GenKron { name, scale, edge_factor, seed, weighted, memory_bytes } => {
            let dest = home.path(&name)?;
            let params = KroneckerParams::graph500(scale).with_edge_factor(edge_factor).with_seed(seed).with_weights(weighted);
            let params = match progress {
                Some(progress) => params.with_progress(progress),
                None => params,
            };
            let (graph, stats) = generate_kronecker(&params, &dest, home.import_options(memory_bytes as usize, threads)).map_err(|e| e.to_string())?;
            Ok(GraphJobOutput::Made(format!(
                "{name}: {} vertices, {} edges kept of {} generated ({} duplicates, {} self-loops removed), {:.2}s",
                graph.vertices(),
                graph.edges_count(),
                stats.edges_generated,
                stats.import.duplicates_removed,
                stats.import.self_loops_dropped,
                started.elapsed().as_secs_f64()
            )))
        }
        GraphJob::Run { algorithm, graph: name, root, iterations, tolerance, sources, table, memory_bytes } => {
            let graph = home.graph(&name)?;
            let mut config = EngineConfig::new(memory_bytes as usize).with_threads(threads).with_temp_dir(&home.temp).with_cancel(cancel);
            if let Some(progress) = progress {
                config = config.with_progress(progress);
            }
            let table = table.unwrap_or_else(|| format!("{name}_{}", algorithm.name()));
            let root = || root.ok_or_else(|| format!("{} needs --root VERTEX", algorithm.name()));
            // Each arm streams its values into the result table and returns the engine statistics.
            let (stats, result): (Vec<RunStats>, String) = match algorithm {
                GraphAlgorithm::Bfs => {
                    let result = bfs(&graph, root()?, &config).map_err(|e| e.to_string())?;
                    let values = result.parents.iter().map_err(|e| e.to_string())?.map(|v| v.map(|p| (p != UNREACHED).then_some(p as i64)));
                    write_result(warehouse, &table, ResultColumns::Int("parent"), values.map(|r| r.map(|p| (p.map(|p| p as f64), p))))?;
                    (vec![result.stats], format!("{} vertices reached, depth {}", result.reached, result.depth))
                }
                GraphAlgorithm::Cc => {
                    let result = connected_components(&graph, &config).map_err(|e| e.to_string())?;
                    let values = result.labels.iter().map_err(|e| e.to_string())?.map(|v| v.map(|l| (Some(l as f64), Some(l as i64))));
                    write_result(warehouse, &table, ResultColumns::Int("component"), values)?;
                    (vec![result.stats], format!("{} components", result.components))
                }
                GraphAlgorithm::Pagerank => {
                    let options = PageRankOptions { iterations, tolerance, ..Default::default() };
                    let result = pagerank(&graph, &options, &config).map_err(|e| e.to_string())?;
                    let values = result.ranks.iter().map_err(|e| e.to_string())?.map(|v| v.map(|r| (Some(r), None)));
                    write_result(warehouse, &table, ResultColumns::Float("rank"), values)?;
                    let ran = result.stats.supersteps.len();
                    (vec![result.stats], match tolerance {
                        Some(t) => format!("{ran} iterations (at most {iterations}; Bloom-filter active list, tolerance {t:e})"),
                        None => format!("{ran} iterations"),
                    })
                }
                GraphAlgorithm::Sssp => {
                    let result = sssp(&graph, root()?, &config).map_err(|e| e.to_string())?;
                    let values = result.distances.iter().map_err(|e| e.to_string())?.map(|v| {
                        v.map(|(d, p)| if d.is_finite() { (Some(d), Some(p as i64)) } else { (None, None) })
                    });
                    write_result(warehouse, &table, ResultColumns::FloatInt("distance", "parent"), values)?;
                    (vec![result.stats], "shortest paths".into())
                }
                GraphAlgorithm::Bc => {
                    let sources = match (root().ok(), sources) {
                        (Some(root), None) => vec![root],
                        (None, Some(count)) => sample_sources(graph.vertices(), count, 1),
                        _ => return Err("bc needs either --root VERTEX or --sources COUNT".into()),
                    };
                    let result = betweenness(&graph, &sources, &config).map_err(|e| e.to_string())?;
                    let values = result.scores.iter().map_err(|e| e.to_string())?.map(|v| v.map(|s| (Some(s), None)));
                    write_result(warehouse, &table, ResultColumns::Float("centrality"), values)?;
                    (result.stats, format!("{} sources", sources.len()))
                }
            };
            Ok(GraphJobOutput::Ran(RunSummary::new(algorithm, &name, &table, result, &stats, started.elapsed().as_secs_f64())))
        }
    }
}

/// A result's value columns besides the vertex id.
enum ResultColumns {
    Int(&'static str),
    Float(&'static str),
    FloatInt(&'static str, &'static str),
}

/// Streams `(float value, int value)` pairs (one per vertex, in vertex order) into `table`.
fn write_result(
    warehouse: &Warehouse,
    table: &str,
    columns: ResultColumns,
    values: impl Iterator<Item = quarry_graph::Result<(Option<f64>, Option<i64>)>>,
) -> Result<(), String> {
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
