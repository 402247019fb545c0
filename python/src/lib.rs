//! `quarry._quarry`: Quarry embedded in Python. The Python package (`python/quarry`) wraps it;
//! this module owns a session and its runtime, runs queries and jobs with the GIL released,
//! and hands results to pyarrow through the Arrow C stream interface (no copy).

use std::path::PathBuf;

use arrow::array::{RecordBatch, RecordBatchIterator, RecordBatchReader};
use arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use quarry_cli::target::{Target, default_memory_budget};
use quarry_engine::{Objective, QuarrySession, user_message};
use quarry_graph::Cancel;
use quarry_graph_jobs::{GraphAlgorithm, GraphJob, GraphJobOutput, import_graph_file, run_graph_job};
use quarry_table::ingest::{LoadOptions, LoadSource, load_table};
use quarry_table::manifest::storage_schema;
use quarry_table::segment::conform_batch;
use quarry_table::{TableError, Warehouse};

create_exception!(_quarry, Error, PyException, "An error from Quarry, with the message the `quarry` command prints.");
create_exception!(_quarry, QueryError, Error, "A query failed: bad SQL, an unknown table or column, or a failure while it ran.");
create_exception!(_quarry, LoadError, Error, "Loading a table failed; the table is as it was.");
create_exception!(_quarry, GraphError, Error, "A graph job failed.");

/// Memory a graph job sort-reduces within unless told otherwise (the CLI's default).
const GRAPH_MEMORY: u64 = 1 << 30;

/// A connection: a session over the embedded warehouse or over storage nodes.
#[pyclass(module = "quarry._quarry")]
struct Connection {
    runtime: tokio::runtime::Runtime,
    session: QuarrySession,
    /// The warehouse, when embedded (loads and graph jobs run on it).
    warehouse: Option<PathBuf>,
    threads: usize,
}

#[pymethods]
impl Connection {
    #[new]
    #[pyo3(signature = (warehouse=None, nodes=None, profile=None, threads=None, pushdown="auto", token_file=None))]
    fn new(
        py: Python<'_>,
        warehouse: Option<PathBuf>,
        nodes: Option<Vec<String>>,
        profile: Option<String>,
        threads: Option<usize>,
        pushdown: &str,
        token_file: Option<PathBuf>,
    ) -> PyResult<Self> {
        let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
        let target = Target {
            warehouse: warehouse.unwrap_or_else(|| PathBuf::from("quarry-data")),
            nodes: nodes.unwrap_or_default(),
            token_file,
            tls_ca: None,
            pushdown: pushdown.parse().map_err(|e: String| Error::new_err(e))?,
            objective: Objective::Time,
            host_power: None,
            star_join: true,
            profile,
            threads,
            memory: default_memory_budget(),
        };
        if !target.is_remote() {
            std::fs::create_dir_all(&target.warehouse).map_err(|e| Error::new_err(format!("creating the warehouse {}: {e}", target.warehouse.display())))?;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .map_err(|e| Error::new_err(format!("starting the runtime: {e}")))?;
        let session = py.detach(|| runtime.block_on(target.session())).map_err(Error::new_err)?;
        let warehouse = (!target.is_remote()).then(|| target.warehouse.clone());
        Ok(Connection { runtime, session, warehouse, threads })
    }

    /// Runs one SQL statement: a pyarrow RecordBatchReader over its rows, and its accounting
    /// (`--stats`' JSON).
    fn execute<'py>(&self, py: Python<'py>, sql: &str) -> PyResult<(Bound<'py, PyAny>, String)> {
        let result = py.detach(|| self.runtime.block_on(self.session.query(sql))).map_err(|e| QueryError::new_err(user_message(&e)))?;
        // Plain strings, not views: what every pyarrow, pandas and polars version reads.
        let schema = storage_schema(&result.schema);
        let batches: Vec<RecordBatch> = result
            .batches
            .iter()
            .map(|batch| conform_batch(batch, &schema))
            .collect::<Result<_, String>>()
            .map_err(QueryError::new_err)?;
        let stats = serde_json::to_string(&result.stats).expect("stats serialize");
        Ok((to_pyarrow(py, Box::new(RecordBatchIterator::new(batches.into_iter().map(Ok), schema)))?, stats))
    }

    /// Loads the batches of `reader` (a pyarrow RecordBatchReader) into table `name`, replacing
    /// it unless `append`; the rows loaded.
    fn load_arrow(&self, py: Python<'_>, name: &str, reader: &Bound<'_, PyAny>, append: bool) -> PyResult<u64> {
        let mut stream = FFI_ArrowArrayStream::empty();
        reader.call_method1("_export_to_c", (&raw mut stream as usize,))?;
        let reader = ArrowArrayStreamReader::try_new(stream).map_err(|e| LoadError::new_err(e.to_string()))?;
        self.load(py, name, LoadSource::Batches(Box::new(reader)), append)
    }

    /// Loads a CSV or Parquet file into table `name` (CSV types inferred as `quarry load` does).
    fn load_file(&self, py: Python<'_>, name: &str, path: PathBuf, append: bool) -> PyResult<u64> {
        self.load(py, name, LoadSource::File(path), append)
    }

    /// The tables, by name.
    fn tables(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        py.detach(|| self.runtime.block_on(self.session.refresh_tables())).map_err(|e| Error::new_err(user_message(&e)))?;
        let mut names = self.session.context().catalog("quarry").and_then(|c| c.schema("main")).map(|s| s.table_names()).unwrap_or_default();
        names.sort();
        Ok(names)
    }

    /// Imports an edge file (Parquet with src, dst[, weight]; CSV with that header; or text)
    /// as graph `name`; one line describing it.
    #[pyo3(signature = (name, path, keep_self_loops=false, memory=None))]
    fn import_graph(&self, py: Python<'_>, name: &str, path: PathBuf, keep_self_loops: bool, memory: Option<u64>) -> PyResult<String> {
        let warehouse = self.embedded("importing a graph")?;
        let memory = memory.unwrap_or(GRAPH_MEMORY) as usize;
        py.detach(|| import_graph_file(&warehouse, name, &path, keep_self_loops, memory, self.threads, &|_, _| {})).map_err(GraphError::new_err)
    }

    /// Runs `algorithm` on graph `graph`; the table holding the result.
    #[pyo3(signature = (graph, algorithm, root=None, iterations=10, tolerance=None, sources=None, memory=None))]
    #[allow(clippy::too_many_arguments)]
    fn run_graph(
        &self,
        py: Python<'_>,
        graph: &str,
        algorithm: &str,
        root: Option<u64>,
        iterations: u64,
        tolerance: Option<f64>,
        sources: Option<u64>,
        memory: Option<u64>,
    ) -> PyResult<String> {
        let warehouse = self.embedded("a graph job")?;
        let algorithm = match algorithm {
            "bfs" => GraphAlgorithm::Bfs,
            "pagerank" => GraphAlgorithm::Pagerank,
            "cc" => GraphAlgorithm::Cc,
            "sssp" => GraphAlgorithm::Sssp,
            "bc" => GraphAlgorithm::Bc,
            other => return Err(GraphError::new_err(format!("unknown graph algorithm '{other}' (bfs, pagerank, cc, sssp, bc)"))),
        };
        let job = GraphJob::Run {
            algorithm,
            graph: graph.to_string(),
            root,
            iterations,
            tolerance,
            sources,
            table: None,
            memory_bytes: memory.unwrap_or(GRAPH_MEMORY),
        };
        let output = py.detach(|| run_graph_job(&warehouse, job, self.threads, None, Cancel::default())).map_err(GraphError::new_err)?;
        match output {
            GraphJobOutput::Ran(summary) => {
                py.detach(|| self.runtime.block_on(self.session.refresh_tables())).map_err(|e| GraphError::new_err(user_message(&e)))?;
                Ok(summary.table)
            }
            other => Err(GraphError::new_err(format!("the graph job returned {other:?}, not a result"))),
        }
    }
}

impl Connection {
    /// The embedded warehouse, or an error naming `what` needs one.
    fn embedded(&self, what: &str) -> PyResult<Warehouse> {
        let Some(path) = &self.warehouse else {
            return Err(Error::new_err(format!("{what} needs an embedded warehouse; with storage nodes use the quarry command with --nodes")));
        };
        Warehouse::open(path).map_err(|e| Error::new_err(e.to_string()))
    }

    fn load(&self, py: Python<'_>, name: &str, source: LoadSource, append: bool) -> PyResult<u64> {
        let warehouse = self.embedded("loading a table").map_err(|e| LoadError::new_err(e.to_string()))?;
        let options = LoadOptions { append, ..LoadOptions::default() };
        let manifest = py.detach(|| load_table(&warehouse, name, source, &options, &|_| {})).map_err(|e: TableError| LoadError::new_err(e.to_string()))?;
        py.detach(|| self.runtime.block_on(self.session.refresh_tables())).map_err(|e| LoadError::new_err(user_message(&e)))?;
        Ok(manifest.total_rows())
    }
}

/// `reader` as a pyarrow RecordBatchReader, moved through the Arrow C stream interface.
fn to_pyarrow<'py>(py: Python<'py>, reader: Box<dyn RecordBatchReader + Send>) -> PyResult<Bound<'py, PyAny>> {
    let mut stream = FFI_ArrowArrayStream::new(reader);
    // pyarrow takes the stream over (it marks ours released), so dropping ours frees nothing.
    py.import("pyarrow")?.getattr("RecordBatchReader")?.call_method1("_import_from_c", (&raw mut stream as usize,))
}

#[pymodule]
fn _quarry(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Connection>()?;
    m.add("Error", m.py().get_type::<Error>())?;
    m.add("QueryError", m.py().get_type::<QueryError>())?;
    m.add("LoadError", m.py().get_type::<LoadError>())?;
    m.add("GraphError", m.py().get_type::<GraphError>())?;
    Ok(())
}
