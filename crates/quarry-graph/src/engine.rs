//! The vertex-program engine: GraFBoost's push-style supersteps with sort-reduce (ch. 9,
//! Algorithms 1 and 3).
//!
//! # The model
//!
//! A [`VertexProgram`] gives every vertex a value. A superstep takes the *active list* (vertices
//! with their values, sorted by id) and, for every out-edge (or in-edge, see
//! [`VertexProgram::directions`]) of every active vertex, runs
//! [`edge_program`](VertexProgram::edge_program), which may emit an update for the edge's other
//! end. Updates to the same vertex are combined with
//! [`vertex_update`](VertexProgram::vertex_update) (associative and commutative); each vertex's
//! combined update is then applied with [`finalize`](VertexProgram::finalize), and
//! [`is_active`](VertexProgram::is_active) decides whether the vertex is active in the next
//! superstep. Iteration stops when the active list is empty or after a superstep limit.
//!
//! # One superstep on disk (Algorithm 3)
//!
//! 1. **Scatter.** Stream the sorted active list together with the CSR index and edge files.
//!    Because the list is sorted, the index and edge files are read forward only (sequentially
//!    for dense lists, a few blocks per gap for sparse ones). Every update `(dst, u)` goes into
//!    a [`SortReducer`] instead of being applied: the random read-modify-writes of Algorithm 1
//!    become an append.
//! 2. **Sort-reduce.** The sort-reducer sorts the updates by destination, combining equal
//!    destinations at every sorting level, and streams out `newV`: one combined update per
//!    updated vertex, in id order.
//! 3. **Apply.** Merge `newV` with the vertex-value file (a dense array of values, one per
//!    vertex) in id order: read the old value, `finalize`, write the new value back, and append
//!    `(vertex, new value)` to the next active list (a file) when `is_active`. In
//!    [`Mode::Dense`] every vertex is finalized (with `None` when it received nothing) and every
//!    vertex is active next; the value file then doubles as the active list (the paper's "vertex
//!    list generator" for all-active algorithms).
//!
//! The value file is accessed through a one-block cache in ascending order, so it too is read
//! and written block-sequentially; no per-vertex state is ever held in memory.
//!
//! # Memory
//!
//! [`EngineConfig::memory_bytes`] is split once: eight file buffers of `memory / 32` (4 KiB to
//! 1 MiB each: the active-list reader or writer, the value block, and index/edge/weight readers
//! for up to two directions) and the rest for the sort-reducer, whose peak is reported per
//! superstep ([`SuperstepStats::sort_reduce`]) and never exceeds its budget
//! ([`RunStats::sort_reduce_budget_bytes`]).
//!
//! # Files
//!
//! Everything lives in `<temp_dir>/quarry-graph-<pid>-<n>/`: `values` (the dense value array)
//! and `active-<n>` (active lists: records of a little-endian u64 vertex id followed by the
//! value's encoding). Each active list is deleted when its [`ActiveList`] is dropped, the
//! directory when the engine, its lists and its [`VertexValues`] are all gone.
//!
//! # Errata of the paper, and how they are resolved here
//!
//! - Algorithms 1 and 3 store `V[k] = v` (the combined *update*) and only for active vertices;
//!   the intent, and what this engine does, is to store the *finalized* value `x` whenever it
//!   differs from the old one, active or not (PageRank needs every new rank stored).
//! - `vertex_update` must be associative **and** commutative: the sort-reducer combines updates
//!   in an order that depends on chunking and threads. Integer `min`/`max`/sums are exact;
//!   floating-point sums may differ in the last bits between memory budgets or thread counts.
//! - Algorithm 4 writes `V[ksrc] = <x, i>` where `V[k]` is meant; see
//!   [`PageRank`](crate::algorithms::PageRank) for how this crate handles PageRank's active list.
//!
//! # Writing an algorithm
//!
//! Hop distance from a root: a vertex's value is its distance, an edge offers "my distance + 1",
//! offers combine with `min`, and a vertex is active again when its distance dropped.
//!
//! ```
//! use quarry_graph::engine::{Edge, EngineConfig, StepContext, Start, VertexProgram, run_program};
//! use quarry_graph::{GraphBuilder, ImportOptions};
//!
//! struct Hops { root: u64 }
//!
//! impl VertexProgram for Hops {
//!     type Value = u32;
//!     type Update = u32;
//!     fn initial_value(&self, v: u64) -> u32 { if v == self.root { 0 } else { u32::MAX } }
//!     fn start(&self) -> Start { Start::Vertices(vec![self.root]) }
//!     fn edge_program(&self, hops: &u32, _edge: &Edge) -> Option<u32> { Some(hops + 1) }
//!     fn vertex_update(&self, a: u32, b: u32) -> u32 { a.min(b) }
//!     fn finalize(&self, _: &StepContext, _: u64, old: u32, update: Option<u32>) -> u32 {
//!         old.min(update.unwrap_or(u32::MAX))
//!     }
//!     fn is_active(&self, old: &u32, new: &u32) -> bool { new < old }
//! }
//!
//! # fn main() -> quarry_graph::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let mut builder = GraphBuilder::new(dir.path().join("g"), ImportOptions::default())?;
//! for (s, d) in [(0, 1), (1, 2), (0, 3), (3, 2)] {
//!     builder.add_edge(s, d, None)?;
//! }
//! let (graph, _) = builder.finish()?;
//! let config = EngineConfig::new(4 << 20).with_temp_dir(dir.path());
//! let out = run_program(&graph, &Hops { root: 0 }, &config, u64::MAX)?;
//! assert_eq!(out.values.to_vec()?, vec![0, 1, 2, 1]);
//! assert_eq!(out.stats.supersteps.len(), 3); // the last one finds nothing new
//! # Ok(())
//! # }
//! ```

use std::fs::{self, File};
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quarry_sortreduce::{Key, SortReduceConfig, SortReduceStats, SortReducer, Value};

use crate::csr::{AdjCursor, Direction, Graph, IdWidth};
use crate::error::{Error, Result};
use crate::io::{
    ForwardReader, MemoryPlan, RecordWriter, TempDir, ValueStore, plan_memory, sync_dir,
};

/// Default engine memory budget: 256 MiB.
pub const DEFAULT_ENGINE_MEMORY_BYTES: usize = 256 << 20;

/// File buffers the engine carves from its budget (see the [module docs](self)).
pub const ENGINE_BUFFERS: usize = 8;

/// A push-style vertex program; see the [module docs](self) for the model and an example.
///
/// The program is shared (`&self`, `Sync`) with the sort-reducer's threads, which call
/// [`Self::vertex_update`].
pub trait VertexProgram: Sync {
    /// Per-vertex state, stored in the dense value file.
    type Value: Value + PartialEq;
    /// What an edge sends to a vertex; combined by [`Self::vertex_update`].
    type Update: Value;

    /// The value of `vertex` before the first superstep.
    fn initial_value(&self, vertex: u64) -> Self::Value;

    /// The first active list (its values come from [`Self::initial_value`]).
    fn start(&self) -> Start;

    /// Which edges an active vertex sends along: out-edges by default; `[In]` runs on the
    /// reverse graph, `[Out, In]` on the undirected graph. At most one of each.
    fn directions(&self) -> &[Direction] {
        &[Direction::Out]
    }

    /// Which vertices are finalized after each superstep ([`Mode::Sparse`] by default).
    fn mode(&self) -> Mode {
        Mode::Sparse
    }

    /// Runs on every edge of every active vertex, `value` being the active vertex's value;
    /// `None` sends nothing.
    fn edge_program(&self, value: &Self::Value, edge: &Edge) -> Option<Self::Update>;

    /// Combines two updates to the same vertex. Must be associative and commutative.
    fn vertex_update(&self, a: Self::Update, b: Self::Update) -> Self::Update;

    /// The new value of `vertex` from its old value and its combined update (always `Some` in
    /// [`Mode::Sparse`]; `None` in [`Mode::Dense`] when it received nothing).
    fn finalize(
        &self,
        step: &StepContext,
        vertex: u64,
        old: Self::Value,
        update: Option<Self::Update>,
    ) -> Self::Value;

    /// Whether a vertex whose value went from `old` to `new` is active in the next superstep
    /// (only asked in [`Mode::Sparse`], only for vertices that received an update).
    fn is_active(&self, old: &Self::Value, new: &Self::Value) -> bool;

    /// A number summed over the active vertices of a superstep (in id order, so the sum is
    /// repeatable) and handed to that superstep's [`Self::finalize`] as
    /// [`StepContext::aggregate`]. `degree` counts the vertex's edges in all
    /// [`Self::directions`]. PageRank uses it for the rank of dangling vertices.
    fn aggregate(&self, vertex: u64, value: &Self::Value, degree: u64) -> f64 {
        let _ = (vertex, value, degree);
        0.0
    }
}

/// The first active list of a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Every vertex.
    All,
    /// These vertices (any order; duplicates ignored).
    Vertices(Vec<u64>),
}

/// Which vertices a superstep finalizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Only those that received an update; the next active list is chosen by `is_active`.
    Sparse,
    /// Every vertex, and every vertex is active in the next superstep (PageRank).
    Dense,
}

/// One edge, as seen by [`VertexProgram::edge_program`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Edge {
    /// The active vertex.
    pub src: u64,
    /// The vertex the update is for (the other end of the edge).
    pub dst: u64,
    /// The edge weight (1.0 on unweighted graphs).
    pub weight: f32,
    /// The active vertex's number of edges in this direction (its out-degree for
    /// [`Direction::Out`]).
    pub degree: u64,
    /// Which of the program's directions this edge comes from ([`Direction::In`]: the stored
    /// edge is `dst -> src`).
    pub direction: Direction,
}

/// What [`VertexProgram::finalize`] knows about the superstep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepContext {
    /// 1-based superstep number within the engine.
    pub superstep: u64,
    /// Vertices in the graph.
    pub vertices: u64,
    /// Active vertices this superstep.
    pub active: u64,
    /// Sum of [`VertexProgram::aggregate`] over the active vertices.
    pub aggregate: f64,
}

/// Engine settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Total memory for the sort-reducer and the file buffers.
    pub memory_bytes: usize,
    /// Threads the sort-reducer sorts with.
    pub threads: usize,
    /// Parent of the engine's scratch directory (value file, active lists, sort-reduce spills).
    pub temp_dir: PathBuf,
    /// Told how each superstep advances (a CLI draws a progress bar from it).
    pub progress: Progress,
    /// Stops the run between steps of a scatter when set (a storage node sets it when the host
    /// that submitted the job goes away).
    pub cancel: Cancel,
}

/// How far a superstep has come.
#[derive(Debug, Clone, Copy)]
pub enum ProgressEvent<'a> {
    /// Scattering the active vertices' edges.
    Scatter {
        /// 1-based superstep number.
        superstep: u64,
        /// Active vertices visited so far.
        visited: u64,
        /// Active vertices in the step, when known before it ends.
        active_total: Option<u64>,
        /// Edges traversed so far.
        edges: u64,
    },
    /// The superstep ended.
    Finished(&'a SuperstepStats),
    /// Making a Kronecker graph: edges generated so far, of `total`.
    Generated {
        /// Edges generated and added so far.
        edges: u64,
        /// Edges the graph generates in all.
        total: u64,
    },
}

/// A progress listener; none by default. Configurations compare equal whatever it is.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<dyn Fn(ProgressEvent<'_>) + Send + Sync>>);

impl Progress {
    /// Calls `listener` with each event.
    pub fn new(listener: impl Fn(ProgressEvent<'_>) + Send + Sync + 'static) -> Self {
        Progress(Some(Arc::new(listener)))
    }

    pub(crate) fn report(&self, event: ProgressEvent<'_>) {
        if let Some(listener) = &self.0 {
            listener(event);
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Progress(listener)" } else { "Progress(none)" })
    }
}

impl PartialEq for Progress {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

impl Eq for Progress {}

/// A flag that stops a run when set; none by default. Configurations compare equal whatever it
/// is.
#[derive(Clone, Default)]
pub struct Cancel(Option<Arc<AtomicBool>>);

impl Cancel {
    /// Cancels the run once `flag` is set.
    pub fn new(flag: Arc<AtomicBool>) -> Self {
        Cancel(Some(flag))
    }

    /// [`Error::Cancelled`] once the flag is set.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.0 {
            Some(flag) if flag.load(Ordering::Relaxed) => Err(Error::Cancelled),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Cancel(flag)" } else { "Cancel(none)" })
    }
}

impl PartialEq for Cancel {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

impl Eq for Cancel {}

/// Active vertices between two scatter progress events (and cancellation checks).
const PROGRESS_EVERY: u64 = 1 << 16;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            memory_bytes: DEFAULT_ENGINE_MEMORY_BYTES,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            temp_dir: std::env::temp_dir(),
            progress: Progress::default(),
            cancel: Cancel::default(),
        }
    }
}

impl EngineConfig {
    /// The defaults with a memory budget.
    pub fn new(memory_bytes: usize) -> Self {
        EngineConfig {
            memory_bytes,
            ..Self::default()
        }
    }

    /// Sets [`Self::threads`].
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Sets [`Self::temp_dir`].
    pub fn with_temp_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.temp_dir = dir.into();
        self
    }

    /// Sets [`Self::progress`].
    pub fn with_progress(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Sets [`Self::cancel`].
    pub fn with_cancel(mut self, cancel: Cancel) -> Self {
        self.cancel = cancel;
        self
    }
}

/// Counters of one superstep.
#[derive(Debug, Clone, PartialEq)]
pub struct SuperstepStats {
    /// 1-based superstep number.
    pub superstep: u64,
    /// Vertices in the active list.
    pub active_vertices: u64,
    /// Edges the edge program ran on.
    pub edges_traversed: u64,
    /// Updates emitted (edge programs that returned `Some`).
    pub updates_emitted: u64,
    /// Vertices in `newV` (unique destinations after the reduce).
    pub records_after_reduce: u64,
    /// Vertices whose stored value changed.
    pub vertices_changed: u64,
    /// Vertices active in the next superstep.
    pub next_active: u64,
    /// [`StepContext::aggregate`].
    pub aggregate: f64,
    /// Bytes read from the CSR files.
    pub graph_bytes_read: u64,
    /// Bytes read from the value file.
    pub value_bytes_read: u64,
    /// Bytes written to the value file.
    pub value_bytes_written: u64,
    /// Bytes read from the active list.
    pub active_bytes_read: u64,
    /// Bytes written to the next active list.
    pub active_bytes_written: u64,
    /// The sort-reduce of the updates (its `peak_reserved` never exceeds its budget).
    pub sort_reduce: SortReduceStats,
    /// Wall time.
    pub elapsed: Duration,
}

impl SuperstepStats {
    /// All bytes read: graph, values, active list and sort-reduce runs.
    pub fn bytes_read(&self) -> u64 {
        self.graph_bytes_read
            + self.value_bytes_read
            + self.active_bytes_read
            + self.sort_reduce.bytes_read
    }

    /// All bytes written: values, next active list and sort-reduce runs.
    pub fn bytes_written(&self) -> u64 {
        self.value_bytes_written + self.active_bytes_written + self.sort_reduce.bytes_written
    }
}

/// Counters of an engine's life.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStats {
    /// [`EngineConfig::memory_bytes`].
    pub memory_bytes: usize,
    /// The sort-reducer's share of the budget.
    pub sort_reduce_budget_bytes: usize,
    /// The file buffers' share.
    pub buffer_bytes: usize,
    /// Time to write the initial value file.
    pub init_elapsed: Duration,
    /// Bytes of the initial value file.
    pub init_bytes_written: u64,
    /// One entry per superstep.
    pub supersteps: Vec<SuperstepStats>,
}

impl RunStats {
    /// Initialization plus all supersteps.
    pub fn elapsed(&self) -> Duration {
        self.init_elapsed + self.supersteps.iter().map(|s| s.elapsed).sum::<Duration>()
    }

    /// The largest sort-reducer reservation of any superstep.
    pub fn peak_sort_reduce_bytes(&self) -> usize {
        self.supersteps
            .iter()
            .map(|s| s.sort_reduce.peak_reserved)
            .max()
            .unwrap_or(0)
    }

    /// Updates emitted over all supersteps.
    pub fn updates_emitted(&self) -> u64 {
        self.supersteps.iter().map(|s| s.updates_emitted).sum()
    }

    /// Edges traversed over all supersteps.
    pub fn edges_traversed(&self) -> u64 {
        self.supersteps.iter().map(|s| s.edges_traversed).sum()
    }

    /// Bytes read over all supersteps.
    pub fn bytes_read(&self) -> u64 {
        self.supersteps.iter().map(SuperstepStats::bytes_read).sum()
    }

    /// Bytes written, the initial value file included.
    pub fn bytes_written(&self) -> u64 {
        self.init_bytes_written
            + self
                .supersteps
                .iter()
                .map(SuperstepStats::bytes_written)
                .sum::<u64>()
    }
}

/// A sorted list of active vertices with their values, in a file of the engine's scratch
/// directory (deleted when dropped).
#[derive(Debug)]
pub struct ActiveList<V> {
    path: PathBuf,
    len: u64,
    _dir: Arc<TempDir>,
    _values: PhantomData<fn() -> V>,
}

impl<V: Value> ActiveList<V> {
    /// Number of vertices.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads `(vertex, value)` pairs in ascending vertex order.
    pub fn read(&self) -> Result<ActiveListIter<V>> {
        self.reader(64 << 10)
    }

    fn reader(&self, buffer: usize) -> Result<ActiveListIter<V>> {
        let record = 8 + V::WIDTH;
        let reader = ForwardReader::open(&self.path, buffer.max(record))?;
        if reader.file_len() != self.len * record as u64 {
            return Err(Error::corrupt(
                &self.path,
                "active list has the wrong length",
            ));
        }
        Ok(ActiveListIter {
            reader,
            next: 0,
            len: self.len,
            _values: PhantomData,
        })
    }
}

impl<V> Drop for ActiveList<V> {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Iterator over an [`ActiveList`].
#[derive(Debug)]
pub struct ActiveListIter<V> {
    reader: ForwardReader,
    next: u64,
    len: u64,
    _values: PhantomData<fn() -> V>,
}

impl<V: Value> ActiveListIter<V> {
    fn next_record(&mut self) -> Result<Option<(u64, V)>> {
        if self.next == self.len {
            return Ok(None);
        }
        let record = 8 + V::WIDTH;
        let raw = self.reader.slice(self.next * record as u64, record)?;
        let vertex = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
        let value = V::decode(&raw[8..]);
        self.next += 1;
        Ok(Some((vertex, value)))
    }
}

impl<V: Value> Iterator for ActiveListIter<V> {
    type Item = Result<(u64, V)>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.next_record();
        if item.is_err() {
            self.next = self.len;
        }
        item.transpose()
    }
}

/// Writes an active list; vertices must ascend.
struct ActiveWriter<V> {
    writer: RecordWriter,
    path: PathBuf,
    dir: Arc<TempDir>,
    len: u64,
    last: Option<u64>,
    buf: Vec<u8>,
    _values: PhantomData<fn() -> V>,
}

impl<V: Value> ActiveWriter<V> {
    fn create(dir: &Arc<TempDir>, n: u64, buffer: usize) -> Result<Self> {
        let path = dir.path().join(format!("active-{n:06}"));
        Ok(ActiveWriter {
            writer: RecordWriter::create(&path, buffer)?,
            path,
            dir: Arc::clone(dir),
            len: 0,
            last: None,
            buf: vec![0; 8 + V::WIDTH],
            _values: PhantomData,
        })
    }

    #[inline]
    fn push(&mut self, vertex: u64, value: V) -> Result<()> {
        if self.last.is_some_and(|last| last >= vertex) {
            return Err(Error::invalid(format!(
                "active vertices must ascend without repeats: {vertex} after {}",
                self.last.expect("checked")
            )));
        }
        self.last = Some(vertex);
        self.buf[..8].copy_from_slice(&vertex.to_le_bytes());
        value.encode(&mut self.buf[8..]);
        self.writer.write(&self.buf)?;
        self.len += 1;
        Ok(())
    }

    fn finish(self) -> Result<(ActiveList<V>, u64)> {
        let bytes = self.writer.finish(false)?;
        Ok((
            ActiveList {
                path: self.path,
                len: self.len,
                _dir: self.dir,
                _values: PhantomData,
            },
            bytes,
        ))
    }
}

/// The active vertices of a superstep.
#[derive(Debug)]
pub enum Frontier<V> {
    /// Every vertex, with its stored value.
    All,
    /// The vertices of the list with the list's values (what a superstep produces).
    List(ActiveList<V>),
    /// The vertices of the list with their *current stored* values (the list's values are
    /// ignored). Betweenness centrality replays its BFS levels this way.
    Vertices(ActiveList<V>),
}

impl<V: Value> Frontier<V> {
    /// Whether no vertex is active ([`Frontier::All`] never is).
    pub fn is_empty(&self) -> bool {
        match self {
            Frontier::All => false,
            Frontier::List(l) | Frontier::Vertices(l) => l.is_empty(),
        }
    }
}

/// Vertex ids as sort keys: u32 for graphs with 4-byte ids (half the sort traffic), else u64.
trait VertexKey: Key {
    fn from_u64(v: u64) -> Self;
    fn to_u64(self) -> u64;
}

impl VertexKey for u32 {
    #[inline(always)]
    fn from_u64(v: u64) -> Self {
        v as u32
    }
    #[inline(always)]
    fn to_u64(self) -> u64 {
        self as u64
    }
}

impl VertexKey for u64 {
    #[inline(always)]
    fn from_u64(v: u64) -> Self {
        v
    }
    #[inline(always)]
    fn to_u64(self) -> u64 {
        self
    }
}

/// Runs vertex programs over one graph, keeping one dense value file; see the
/// [module docs](self).
///
/// Several programs with the same value type may run on one engine in turn (betweenness
/// centrality runs a forward and a backward program over the same values).
pub struct Engine<'g, V: Value> {
    graph: &'g Graph,
    config: EngineConfig,
    plan: MemoryPlan,
    dir: Arc<TempDir>,
    values: ValueStore<V>,
    superstep: u64,
    next_list: u64,
    stats: RunStats,
}

impl<'g, V: Value + PartialEq> Engine<'g, V> {
    /// Creates the scratch directory and the value file with `init(v)` for every vertex.
    pub fn new(graph: &'g Graph, config: EngineConfig, init: impl FnMut(u64) -> V) -> Result<Self> {
        if V::WIDTH == 0 {
            return Err(Error::invalid("vertex values must have a non-zero width"));
        }
        let plan = plan_memory(config.memory_bytes, ENGINE_BUFFERS, 0)?;
        let started = Instant::now();
        let dir = TempDir::create(&config.temp_dir)?;
        let values = ValueStore::create(
            &dir.path().join("values"),
            graph.vertices(),
            plan.io_buffer,
            init,
        )?;
        let stats = RunStats {
            memory_bytes: config.memory_bytes,
            sort_reduce_budget_bytes: plan.sort_reduce_bytes,
            buffer_bytes: plan.buffer_bytes,
            init_elapsed: started.elapsed(),
            init_bytes_written: values.bytes_written(),
            supersteps: Vec::new(),
        };
        Ok(Engine {
            graph,
            config,
            plan,
            dir,
            values,
            superstep: 0,
            next_list: 0,
            stats,
        })
    }

    /// The graph.
    pub fn graph(&self) -> &'g Graph {
        self.graph
    }

    /// Counters so far.
    pub fn stats(&self) -> &RunStats {
        &self.stats
    }

    /// The stored value of `vertex` (through the block cache; cheap in ascending order).
    pub fn value(&mut self, vertex: u64) -> Result<V> {
        self.check_vertex(vertex)?;
        self.values.get(vertex)
    }

    fn check_vertex(&self, vertex: u64) -> Result<()> {
        if vertex >= self.graph.vertices() {
            return Err(Error::invalid(format!(
                "vertex {vertex} is not in the graph ({} vertices)",
                self.graph.vertices()
            )));
        }
        Ok(())
    }

    /// An active list of `vertices` (strictly ascending) with their current values.
    pub fn frontier(&mut self, vertices: impl IntoIterator<Item = u64>) -> Result<Frontier<V>> {
        let mut writer = self.list_writer()?;
        for v in vertices {
            self.check_vertex(v)?;
            let value = self.values.get(v)?;
            writer.push(v, value)?;
        }
        Ok(Frontier::List(writer.finish()?.0))
    }

    fn list_writer(&mut self) -> Result<ActiveWriter<V>> {
        self.next_list += 1;
        ActiveWriter::create(&self.dir, self.next_list, self.plan.io_buffer)
    }

    /// Runs one superstep of `program` from `frontier` and returns the next frontier.
    pub fn superstep<P: VertexProgram<Value = V>>(
        &mut self,
        program: &P,
        frontier: &Frontier<V>,
    ) -> Result<Frontier<V>> {
        self.config.cancel.check()?;
        let directions = program.directions();
        if directions.is_empty()
            || directions.len() > 2
            || (directions.len() == 2 && directions[0] == directions[1])
        {
            return Err(Error::invalid(format!(
                "a program needs one or two distinct directions, not {directions:?}"
            )));
        }
        for &d in directions {
            self.graph.require(d)?;
        }
        match self.graph.meta().id_width {
            IdWidth::U32 => self.superstep_with::<P, u32>(program, frontier),
            IdWidth::U64 => self.superstep_with::<P, u64>(program, frontier),
        }
    }

    /// Runs supersteps until the frontier is empty or `max_supersteps` have run; returns the
    /// last frontier (empty when the program converged).
    pub fn run<P: VertexProgram<Value = V>>(
        &mut self,
        program: &P,
        mut frontier: Frontier<V>,
        max_supersteps: u64,
    ) -> Result<Frontier<V>> {
        let mut done = 0;
        while done < max_supersteps && !frontier.is_empty() {
            frontier = self.superstep(program, &frontier)?;
            done += 1;
        }
        Ok(frontier)
    }

    /// Ends the engine, keeping the value file.
    pub fn into_values(mut self) -> Result<VertexValues<V>> {
        self.values.flush()?;
        VertexValues::open_in(self.values.path(), self.values.count(), Some(self.dir))
    }

    fn superstep_with<P, K>(&mut self, program: &P, frontier: &Frontier<V>) -> Result<Frontier<V>>
    where
        P: VertexProgram<Value = V>,
        K: VertexKey,
    {
        let started = Instant::now();
        let graph = self.graph;
        let vertices = graph.vertices();
        self.superstep += 1;
        let superstep = self.superstep;
        let io = self.plan.io_buffer;
        let (value_read0, value_written0) = (self.values.bytes_read(), self.values.bytes_written());

        // Scatter: active list x CSR -> updates into the sort-reducer.
        let config = SortReduceConfig::new(self.plan.sort_reduce_bytes)
            .with_threads(self.config.threads.max(1))
            .with_temp_dir(self.dir.path());
        let reducer = SortReducer::new(config, |a, b| program.vertex_update(a, b))?;
        let cursors = program
            .directions()
            .iter()
            .map(|&d| Ok((d, AdjCursor::open(graph, d, io)?)))
            .collect::<Result<Vec<_>>>()?;
        let mut scatter = Scatter::<P, K, _> {
            program,
            cursors,
            reducer,
            vertices,
            active: 0,
            edges: 0,
            updates: 0,
            aggregate: 0.0,
        };
        let mut active_bytes_read = 0;
        let progress = self.config.progress.clone();
        let active_total = matches!(frontier, Frontier::All).then_some(vertices);
        let cancel = self.config.cancel.clone();
        let report = |scatter: &Scatter<P, K, _>| {
            if scatter.active % PROGRESS_EVERY == 0 {
                progress.report(ProgressEvent::Scatter { superstep, visited: scatter.active, active_total, edges: scatter.edges });
                return cancel.check();
            }
            Ok(())
        };
        match frontier {
            Frontier::All => {
                for v in 0..vertices {
                    let value = self.values.get(v)?;
                    scatter.visit(v, &value)?;
                    report(&scatter)?;
                }
            }
            Frontier::List(list) => {
                let mut reader = list.reader(io)?;
                while let Some((v, value)) = reader.next_record()? {
                    scatter.visit(v, &value)?;
                    report(&scatter)?;
                }
                active_bytes_read = reader.reader.bytes_read();
            }
            Frontier::Vertices(list) => {
                let mut reader = list.reader(io)?;
                while let Some((v, _)) = reader.next_record()? {
                    self.check_vertex(v)?;
                    let value = self.values.get(v)?;
                    scatter.visit(v, &value)?;
                    report(&scatter)?;
                }
                active_bytes_read = reader.reader.bytes_read();
            }
        }
        let graph_bytes_read = scatter.cursors.iter().map(|(_, c)| c.bytes_read()).sum();
        let Scatter {
            reducer,
            cursors,
            active,
            edges,
            updates,
            aggregate,
            ..
        } = scatter;
        // Free the CSR buffers before the apply phase allocates its own.
        drop(cursors);
        let step = StepContext {
            superstep,
            vertices,
            active,
            aggregate,
        };

        // Sort-reduce, then apply newV to the value file in id order.
        let mut new_v = reducer.finish()?;
        let mut changed = 0;
        let (next, next_active, active_bytes_written) = match program.mode() {
            Mode::Sparse => {
                let mut writer = self.list_writer()?;
                while let Some((key, update)) = new_v.next_record()? {
                    let v = key.to_u64();
                    self.check_vertex(v)?;
                    let (old, new) = self.finalize_vertex(program, &step, v, Some(update), &mut changed)?;
                    if program.is_active(&old, &new) {
                        writer.push(v, new)?;
                    }
                }
                let (list, bytes) = writer.finish()?;
                let n = list.len();
                (Frontier::List(list), n, bytes)
            }
            Mode::Dense => {
                let mut pending = new_v.next_record()?;
                for v in 0..vertices {
                    let update = match pending {
                        Some((key, update)) if key.to_u64() == v => {
                            pending = new_v.next_record()?;
                            Some(update)
                        }
                        _ => None,
                    };
                    self.finalize_vertex(program, &step, v, update, &mut changed)?;
                }
                if let Some((key, _)) = pending {
                    self.check_vertex(key.to_u64())?;
                }
                (Frontier::All, vertices, 0)
            }
        };
        self.values.flush()?;
        let sort_reduce = new_v.stats();
        drop(new_v);
        self.record_step(SuperstepStats {
            superstep,
            active_vertices: active,
            edges_traversed: edges,
            updates_emitted: updates,
            records_after_reduce: sort_reduce.records_out,
            vertices_changed: changed,
            next_active,
            aggregate,
            graph_bytes_read,
            value_bytes_read: self.values.bytes_read() - value_read0,
            value_bytes_written: self.values.bytes_written() - value_written0,
            active_bytes_read,
            active_bytes_written,
            sort_reduce,
            elapsed: started.elapsed(),
        });
        Ok(next)
    }
}

impl<V: Value + PartialEq> Engine<'_, V> {
    /// Finalizes `v` with its combined update, storing the new value (and counting it in
    /// `changed`) when it differs; returns the old and the new value.
    fn finalize_vertex<P: VertexProgram<Value = V>>(&mut self, program: &P, step: &StepContext, v: u64, update: Option<P::Update>, changed: &mut u64) -> Result<(V, V)> {
        let old = self.values.get(v)?;
        let new = program.finalize(step, v, old, update);
        if new != old {
            self.values.set(v, new)?;
            *changed += 1;
        }
        Ok((old, new))
    }

    /// Keeps a finished superstep's counters and tells the progress listener.
    fn record_step(&mut self, step: SuperstepStats) {
        self.stats.supersteps.push(step);
        if let Some(last) = self.stats.supersteps.last() {
            self.config.progress.report(ProgressEvent::Finished(last));
        }
    }

    /// One superstep of Algorithm 4 (sort-reduce with custom active list generation, the
    /// paper's PageRank): only the vertices of `recompute` get new values.
    ///
    /// 1. **Mark.** Every vertex of `recompute` (ascending) adds the sources of its in-edges to
    ///    a Bloom filter of at most `bloom_bytes`, taken from the sort-reducer's share of the
    ///    budget: those are the vertices whose updates it needs.
    /// 2. **Scatter.** The whole keyspace is read in order; a vertex in the filter runs the edge
    ///    program on its out-edges. [`VertexProgram::aggregate`] is summed over *every* vertex
    ///    (PageRank's dangling rank must count all of them).
    /// 3. **Apply.** The sort-reduced updates are finalized for `recompute`'s vertices only: a
    ///    vertex outside it may have heard from just some of its in-neighbours (the paper
    ///    stores a superstep stamp in `V` for this; the sorted `recompute` list does the same).
    ///    The next list holds the vertices that [`VertexProgram::is_active`] keeps.
    ///
    /// The program must send along out-edges only; the graph needs its reverse (in-edges).
    pub fn superstep_bloom<P: VertexProgram<Value = V>>(&mut self, program: &P, recompute: &Frontier<V>, bloom_bytes: usize) -> Result<Frontier<V>> {
        self.config.cancel.check()?;
        if program.directions() != [Direction::Out] {
            return Err(Error::invalid("Algorithm 4 scatters along out-edges only"));
        }
        self.graph.require(Direction::In)?;
        match self.graph.meta().id_width {
            IdWidth::U32 => self.superstep_bloom_with::<P, u32>(program, recompute, bloom_bytes),
            IdWidth::U64 => self.superstep_bloom_with::<P, u64>(program, recompute, bloom_bytes),
        }
    }

    fn superstep_bloom_with<P, K>(&mut self, program: &P, recompute: &Frontier<V>, bloom_bytes: usize) -> Result<Frontier<V>>
    where
        P: VertexProgram<Value = V>,
        K: VertexKey,
    {
        let started = Instant::now();
        let graph = self.graph;
        let vertices = graph.vertices();
        self.superstep += 1;
        let superstep = self.superstep;
        let io = self.plan.io_buffer;
        let (value_read0, value_written0) = (self.values.bytes_read(), self.values.bytes_written());
        let bloom_bytes = bloom_bytes.min(self.plan.sort_reduce_bytes / 2);
        let recompute_len = match recompute {
            Frontier::All => vertices,
            Frontier::List(l) | Frontier::Vertices(l) => l.len(),
        };

        // Mark: in-neighbours of the vertices to recompute (all vertices: no filter needed).
        let mut active_bytes_read = 0;
        let mut graph_bytes_read = 0;
        let bloom = match recompute {
            Frontier::All => None,
            Frontier::List(list) | Frontier::Vertices(list) => {
                let mut bloom = crate::bloom::BloomFilter::new(graph.edges_count().min(vertices), bloom_bytes);
                let mut in_edges = AdjCursor::open(graph, Direction::In, io)?;
                let mut reader = list.reader(io)?;
                while let Some((k, _)) = reader.next_record()? {
                    self.check_vertex(k)?;
                    let (start, end) = in_edges.range(k)?;
                    in_edges.scan(start, end, |src, _| {
                        bloom.insert(src);
                        Ok(())
                    })?;
                }
                active_bytes_read = reader.reader.bytes_read();
                graph_bytes_read += in_edges.bytes_read();
                Some(bloom)
            }
        };
        let bloom_held = bloom.as_ref().map_or(0, |b| b.bytes());

        // Scatter: the keyspace in order; vertices in the filter send along their out-edges.
        let config = SortReduceConfig::new(self.plan.sort_reduce_bytes - bloom_held)
            .with_threads(self.config.threads.max(1))
            .with_temp_dir(self.dir.path());
        let reducer = SortReducer::new(config, |a, b| program.vertex_update(a, b))?;
        let out_edges = AdjCursor::open(graph, Direction::Out, io)?;
        let (mut aggregate, mut sources) = (0.0, 0);
        let mut scatter = Scatter::<P, K, _> { program, cursors: vec![(Direction::Out, out_edges)], reducer, vertices, active: 0, edges: 0, updates: 0, aggregate: 0.0 };
        for v in 0..vertices {
            let value = self.values.get(v)?;
            let (start, end) = scatter.cursors[0].1.range(v)?;
            aggregate += program.aggregate(v, &value, end - start);
            if bloom.as_ref().is_none_or(|b| b.contains(v)) {
                sources += 1;
                scatter.visit(v, &value)?;
            }
            if v % PROGRESS_EVERY == 0 {
                self.config.progress.report(ProgressEvent::Scatter { superstep, visited: v, active_total: Some(vertices), edges: scatter.edges });
                self.config.cancel.check()?;
            }
        }
        drop(bloom);
        let Scatter { reducer, cursors, edges, updates, .. } = scatter;
        graph_bytes_read += cursors.iter().map(|(_, c)| c.bytes_read()).sum::<u64>();
        drop(cursors);
        let step = StepContext { superstep, vertices, active: recompute_len, aggregate };

        // Apply: finalize the vertices to recompute; ignore partial sums of the others.
        let mut new_v = reducer.finish()?;
        let mut pending = new_v.next_record()?;
        let mut changed = 0;
        let mut writer = self.list_writer()?;
        let keys: Box<dyn Iterator<Item = Result<u64>>> = match recompute {
            Frontier::All => Box::new((0..vertices).map(Ok)),
            Frontier::List(list) | Frontier::Vertices(list) => {
                active_bytes_read += list.len() * (8 + V::WIDTH) as u64;
                Box::new(list.reader(io)?.map(|record| record.map(|(k, _)| k)))
            }
        };
        for k in keys {
            let k = k?;
            while let Some((key, _)) = pending
                && key.to_u64() < k
            {
                pending = new_v.next_record()?;
            }
            let update = match pending {
                Some((key, update)) if key.to_u64() == k => {
                    pending = new_v.next_record()?;
                    Some(update)
                }
                _ => None,
            };
            let (old, new) = self.finalize_vertex(program, &step, k, update, &mut changed)?;
            if program.is_active(&old, &new) {
                writer.push(k, new)?;
            }
        }
        let (list, active_bytes_written) = writer.finish()?;
        let next_active = list.len();
        self.values.flush()?;
        let sort_reduce = new_v.stats();
        drop(new_v);
        self.record_step(SuperstepStats {
            superstep,
            active_vertices: sources,
            edges_traversed: edges,
            updates_emitted: updates,
            records_after_reduce: sort_reduce.records_out,
            vertices_changed: changed,
            next_active,
            aggregate,
            graph_bytes_read,
            value_bytes_read: self.values.bytes_read() - value_read0,
            value_bytes_written: self.values.bytes_written() - value_written0,
            active_bytes_read,
            active_bytes_written,
            sort_reduce,
            elapsed: started.elapsed(),
        });
        Ok(Frontier::List(list))
    }
}

/// The scatter phase's state: the program, the CSR cursors and the sort-reducer.
struct Scatter<'p, P: VertexProgram, K: Key, F> {
    program: &'p P,
    cursors: Vec<(Direction, AdjCursor)>,
    reducer: SortReducer<K, P::Update, F>,
    vertices: u64,
    active: u64,
    edges: u64,
    updates: u64,
    aggregate: f64,
}

impl<P, K, F> Scatter<'_, P, K, F>
where
    P: VertexProgram,
    K: VertexKey,
    F: Fn(P::Update, P::Update) -> P::Update + Send + Sync,
{
    /// Runs the edge program on every edge of `src`.
    #[inline]
    fn visit(&mut self, src: u64, value: &P::Value) -> Result<()> {
        if src >= self.vertices {
            return Err(Error::invalid(format!(
                "active vertex {src} is not in the graph ({} vertices)",
                self.vertices
            )));
        }
        let mut ranges = [(0u64, 0u64); 2];
        let mut degree_total = 0;
        for (range, (_, cursor)) in ranges.iter_mut().zip(self.cursors.iter_mut()) {
            *range = cursor.range(src)?;
            degree_total += range.1 - range.0;
        }
        self.active += 1;
        self.aggregate += self.program.aggregate(src, value, degree_total);
        let Scatter {
            program,
            cursors,
            reducer,
            edges,
            updates,
            ..
        } = self;
        for (&(start, end), (direction, cursor)) in ranges.iter().zip(cursors.iter_mut()) {
            let degree = end - start;
            let direction = *direction;
            cursor.scan(start, end, |dst, weight| {
                *edges += 1;
                let edge = Edge {
                    src,
                    dst,
                    weight,
                    degree,
                    direction,
                };
                if let Some(update) = program.edge_program(value, &edge) {
                    *updates += 1;
                    reducer.push(K::from_u64(dst), update)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// What [`run_program`] returns.
pub struct ProgramOutput<V> {
    /// The final value of every vertex.
    pub values: VertexValues<V>,
    /// Per-superstep counters.
    pub stats: RunStats,
    /// Whether the active list ran empty (rather than hitting the superstep limit).
    pub converged: bool,
}

/// Runs `program` on `graph` from [`VertexProgram::start`] until no vertex is active or
/// `max_supersteps` supersteps have run.
pub fn run_program<P: VertexProgram>(
    graph: &Graph,
    program: &P,
    config: &EngineConfig,
    max_supersteps: u64,
) -> Result<ProgramOutput<P::Value>> {
    let mut engine = Engine::new(graph, config.clone(), |v| program.initial_value(v))?;
    let frontier = match program.start() {
        Start::All => Frontier::All,
        Start::Vertices(mut vertices) => {
            vertices.sort_unstable();
            vertices.dedup();
            engine.frontier(vertices)?
        }
    };
    let last = engine.run(program, frontier, max_supersteps)?;
    let converged = last.is_empty();
    drop(last);
    let stats = engine.stats().clone();
    Ok(ProgramOutput {
        values: engine.into_values()?,
        stats,
        converged,
    })
}

/// A dense file of one value per vertex: an algorithm's result.
///
/// Results of a run live in the engine's scratch directory and are deleted when this is dropped,
/// unless [`Self::persist`]ed.
#[derive(Debug)]
pub struct VertexValues<V> {
    file: File,
    path: PathBuf,
    len: u64,
    _dir: Option<Arc<TempDir>>,
    _values: PhantomData<fn() -> V>,
}

impl<V: Value> VertexValues<V> {
    /// Opens a persisted file of `len` values (its size must match).
    pub fn open(path: impl AsRef<Path>, len: u64) -> Result<Self> {
        Self::open_in(path.as_ref(), len, None)
    }

    pub(crate) fn open_in(path: &Path, len: u64, dir: Option<Arc<TempDir>>) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io("opening", path, e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::io("reading metadata of", path, e))?
            .len();
        if size != len * V::WIDTH as u64 {
            return Err(Error::corrupt(
                path,
                format!("{size} bytes, expected {len} values of {} bytes", V::WIDTH),
            ));
        }
        Ok(VertexValues {
            file,
            path: path.to_path_buf(),
            len,
            _dir: dir,
            _values: PhantomData,
        })
    }

    /// Number of values (the graph's vertex count).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the values are (little-endian, `V::WIDTH` bytes each, vertex order).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The value of `vertex` (one positional read).
    pub fn get(&self, vertex: u64) -> Result<V> {
        if vertex >= self.len {
            return Err(Error::invalid(format!(
                "vertex {vertex} is not in the graph ({} vertices)",
                self.len
            )));
        }
        let mut raw = vec![0u8; V::WIDTH];
        self.file
            .read_exact_at(&mut raw, vertex * V::WIDTH as u64)
            .map_err(|e| Error::io("reading", &self.path, e))?;
        Ok(V::decode(&raw))
    }

    /// All values in vertex order, streamed through a 64 KiB buffer.
    pub fn iter(&self) -> Result<ValuesIter<V>> {
        Ok(ValuesIter {
            reader: ForwardReader::open(&self.path, (64 << 10).max(V::WIDTH))?,
            next: 0,
            len: self.len,
            _values: PhantomData,
        })
    }

    /// All values in memory (for tests and small graphs).
    pub fn to_vec(&self) -> Result<Vec<V>> {
        self.iter()?.collect()
    }

    /// Moves the file to `dest` (copying across file systems) and fsyncs it; `dest` must not
    /// exist.
    pub fn persist(self, dest: impl AsRef<Path>) -> Result<VertexValues<V>> {
        let dest = dest.as_ref();
        if fs::symlink_metadata(dest).is_ok() {
            return Err(Error::invalid(format!("{} already exists", dest.display())));
        }
        if fs::rename(&self.path, dest).is_err() {
            let tmp = dest.with_extension("tmp");
            fs::copy(&self.path, &tmp).map_err(|e| Error::io("copying to", &tmp, e))?;
            fs::rename(&tmp, dest).map_err(|e| Error::io("renaming", &tmp, e))?;
        }
        File::open(dest)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io("syncing", dest, e))?;
        if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        VertexValues::open(dest, self.len)
    }
}

/// Iterator over [`VertexValues`].
#[derive(Debug)]
pub struct ValuesIter<V> {
    reader: ForwardReader,
    next: u64,
    len: u64,
    _values: PhantomData<fn() -> V>,
}

impl<V: Value> Iterator for ValuesIter<V> {
    type Item = Result<V>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next == self.len {
            return None;
        }
        let at = self.next * V::WIDTH as u64;
        match self.reader.slice(at, V::WIDTH) {
            Ok(raw) => {
                self.next += 1;
                Some(Ok(V::decode(raw)))
            }
            Err(e) => {
                self.next = self.len;
                Some(Err(e))
            }
        }
    }
}
