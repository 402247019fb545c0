//! A hash join that stays within a memory budget by spilling: the Grace hash join ("in-storage
//! hash join", Kim et al. 2015, sec. 3.2).
//!
//! Its memory comes from the node's one pool (the task's `MemoryPool`), reserved before use: the
//! build rows, DataFusion's concatenated copy of them and its hash table. When the whole build
//! side fits, the join runs in memory with the probe side streamed straight through it and
//! nothing touches a disk. Only when a reservation fails (or the build side outgrows the join's
//! own budget) are both inputs split as follows; spill files are written and read on blocking
//! threads, never on the device's worker threads.
//!
//! Both inputs are split by a hash of their join keys into partitions written to Arrow IPC files;
//! equal keys land in the same partition on both sides, so the join is the union of the joins
//! of the partition pairs. Each pair is then joined by DataFusion's own [`HashJoinExec`] with
//! only that partition's build rows in memory; a build partition over the budget is split again
//! with another hash seed. Because partitions are disjoint by key, every join type works per
//! partition: a row that finds no partner in its partition has none anywhere, and rows whose
//! key is NULL all hash alike, so they land in one partition and are emitted exactly once.

use std::fmt;
use std::fs::{self, File};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take_record_batch};
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::common::{DataFusionError, JoinType, Statistics, exec_datafusion_err, internal_err, not_impl_err, plan_err, resources_err};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation, UnboundedMemoryPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ChildStats, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use datafusion::physical_plan::{SendableRecordBatchStream, StatisticsArgs, StatisticsContext, apply_expression_roots};
use futures::stream::BoxStream;

use crate::blocking::blocking;
use crate::view_compaction::compact_views;
use futures::{Stream, StreamExt, TryStreamExt, stream};

/// How many times a build partition that is still over the budget is split again; past that
/// its rows share too few keys to split (skew) and the join fails rather than exceed the budget.
const MAX_DEPTH: u32 = 3;
/// How long a partition the memory pool refuses waits for memory before the join fails.
const MEMORY_PATIENCE: Duration = Duration::from_secs(30);
/// Partition counts per pass: at least two (else nothing is split), at most 256 open files; 16
/// when the build side's size is unknown.
const MIN_FANOUT: usize = 2;
const MAX_FANOUT: usize = 256;
const DEFAULT_FANOUT: usize = 16;

/// A Grace hash join: the results of a [`HashJoinExec`] (left input = build side) within at
/// most `memory_budget` bytes and what the task's memory pool grants, spilling hash partitions
/// of both inputs to Arrow IPC files under `spill_dir` only when the build side does not fit.
///
/// The memory it reserves for a join in memory is [`in_memory_cost`]: the build rows (Arrow
/// buffer bytes, the `max_build_partition_bytes` metric), DataFusion's concatenated copy and
/// its hash table; rows buffered while partitioning are reserved too, at most half the budget.
/// It reads every input partition of both children and produces one output partition, in no
/// particular order.
#[derive(Debug)]
pub struct GraceHashJoinExec {
    /// The join to reproduce, never executed itself: each partition pair runs a fresh copy.
    join: Arc<HashJoinExec>,
    memory_budget: usize,
    spill_dir: PathBuf,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl GraceHashJoinExec {
    /// Replaces DataFusion's in-memory HashJoinExec (left input = build side) by a Grace hash join
    /// that keeps at most `memory_budget` bytes of build-side rows in memory, spilling hash
    /// partitions of both inputs to Arrow IPC files under `spill_dir`.
    ///
    /// Keeps the join's keys, filter, join type, output projection, null equality and fetch;
    /// ignores its partition mode. Fails for a zero budget, for unbounded inputs and for
    /// null-aware anti joins (`NOT IN`), whose output for one partition depends on all others.
    pub fn try_from_hash_join(join: &HashJoinExec, memory_budget: usize, spill_dir: PathBuf) -> Result<Self> {
        if memory_budget == 0 {
            return plan_err!("GraceHashJoinExec needs a memory budget above zero bytes");
        }
        if join.null_aware {
            return not_impl_err!(
                "GraceHashJoinExec does not support null-aware anti joins (NOT IN): one NULL probe key empties every partition's output"
            );
        }
        if join.left().boundedness().is_unbounded() || join.right().boundedness().is_unbounded() {
            return not_impl_err!("GraceHashJoinExec needs bounded inputs: it reads both before joining");
        }
        // Every join type is per-partition (see the module docs); this match is exhaustive so
        // that a join type DataFusion adds later is reviewed here before it is accepted.
        match join.join_type() {
            JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full | JoinType::LeftMark | JoinType::RightMark => {}
            JoinType::LeftSemi | JoinType::RightSemi | JoinType::LeftAnti | JoinType::RightAnti => {}
        }
        // A fresh copy: the builder would otherwise share the original's build-side state.
        let join = Arc::new(join.builder().reset_state().build()?);
        let eq_properties = EquivalenceProperties::new(join.schema());
        let properties = PlanProperties::new(eq_properties, Partitioning::UnknownPartitioning(1), EmissionType::Final, Boundedness::Bounded);
        Ok(Self { join, memory_budget, spill_dir, properties: Arc::new(properties), metrics: ExecutionPlanMetricsSet::new() })
    }

    /// Rows produced (summed over executions, like all the accessors below).
    pub fn output_rows(&self) -> usize {
        self.metrics.clone_inner().output_rows().unwrap_or(0)
    }

    /// Bytes written to spill files, re-partitioning passes included.
    pub fn spilled_bytes(&self) -> usize {
        self.metrics.clone_inner().spilled_bytes().unwrap_or(0)
    }

    /// Partitions created, re-partitioned ones included.
    pub fn spill_partitions(&self) -> usize {
        self.metrics.clone_inner().sum_by_name("spill_partitions").map_or(0, |value| value.as_usize())
    }

    /// The largest build partition held in memory, in bytes; at most the budget.
    pub fn max_build_partition_bytes(&self) -> usize {
        self.metrics.clone_inner().sum_by_name("max_build_partition_bytes").map_or(0, |value| value.as_usize())
    }
}

impl DisplayAs for GraceHashJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let on: Vec<String> = self.join.on().iter().map(|(l, r)| format!("({l}, {r})")).collect();
        write!(f, "GraceHashJoinExec: join_type={}, on=[{}]", self.join.join_type(), on.join(", "))?;
        if let Some(filter) = self.join.filter() {
            write!(f, ", filter={}", filter.expression())?;
        }
        if let Some(projection) = &self.join.projection {
            write!(f, ", projection={:?}", &projection[..])?;
        }
        write!(f, ", memory_budget={}", self.memory_budget)
    }
}

impl ExecutionPlan for GraceHashJoinExec {
    fn name(&self) -> &str {
        "GraceHashJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.join.left(), self.join.right()]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        let keys = self.join.on().iter().flat_map(|(l, r)| [l, r]);
        apply_expression_roots(keys.chain(self.join.filter().map(|filter| filter.expression())), f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 2 {
            return internal_err!("GraceHashJoinExec takes two children, got {}", children.len());
        }
        let join = self.join.builder().with_new_children(children)?.build()?;
        Ok(Arc::new(Self::try_from_hash_join(&join, self.memory_budget, self.spill_dir.clone())?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("GraceHashJoinExec has one output partition, asked for partition {partition}");
        }
        // Sized so that the average build partition fills half the budget.
        let stats = StatisticsContext::new().compute(self.join.left().as_ref(), &StatisticsArgs::new());
        let cost = stats.ok().and_then(|stats| Some(in_memory_cost(*stats.total_byte_size.get_value()?, stats.num_rows.get_value().copied().unwrap_or(0))));
        let fanout = fanout_for(cost, self.memory_budget);
        let metric = || MetricBuilder::new(&self.metrics);
        let metrics = GraceMetrics {
            output_rows: metric().output_rows(partition),
            spilled_bytes: metric().spilled_bytes(partition),
            spill_partitions: metric().counter("spill_partitions", partition),
            max_build_partition_bytes: metric().gauge("max_build_partition_bytes", partition),
        };
        let (join, budget, spill_dir) = (Arc::clone(&self.join), self.memory_budget, self.spill_dir.clone());
        let reservation = MemoryConsumer::new(format!("GraceHashJoinExec[{partition}]")).with_can_spill(true).register(context.memory_pool());
        let join_ctx = unaccounted(&context)?;
        let run = async move {
            let (pending, current, remaining) = (Vec::new(), None, join.fetch());
            let run = JoinRun { join, ctx: context, join_ctx, reservation, budget, spill_dir, dir: None, metrics, pending, current, passes: 0, remaining };
            run.build_side(fanout).await
        };
        let output = stream::once(run).map_ok(|run| stream::unfold(run, JoinRun::next)).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), output)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn child_stats_requests(&self, _partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(None), ChildStats::At(None)]
    }

    fn statistics_from_inputs(&self, input_stats: &[Arc<Statistics>], _args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        // The same rows as the hash join's, over all of its output partitions.
        self.join.statistics_from_inputs(input_stats, &StatisticsArgs::new())
    }

    fn fetch(&self) -> Option<usize> {
        self.join.fetch()
    }
}

/// Bytes of DataFusion's hash table per build row: a (hash, row) bucket at its load factor and
/// the row's link in the chain of equal hashes.
const HASH_TABLE_BYTES_PER_ROW: usize = 32;

/// Memory a hash join over `bytes` of build rows in `rows` rows takes: the rows, the copy
/// DataFusion concatenates them into, and its hash table.
pub fn in_memory_cost(bytes: usize, rows: usize) -> usize {
    2 * bytes + rows * HASH_TABLE_BYTES_PER_ROW
}

/// `ctx` over a pool that counts nothing: the joins of loaded partitions run in it, their memory
/// reserved beforehand through the Grace join's own reservation ([`in_memory_cost`]).
fn unaccounted(ctx: &TaskContext) -> Result<Arc<TaskContext>> {
    let runtime = RuntimeEnvBuilder::from_runtime_env(&ctx.runtime_env()).with_memory_pool(Arc::new(UnboundedMemoryPool::default())).build_arc()?;
    Ok(Arc::new(
        TaskContext::new(
            ctx.task_id(),
            ctx.session_id(),
            ctx.session_config().clone(),
            ctx.scalar_functions().clone(),
            ctx.higher_order_functions().clone(),
            ctx.aggregate_functions().clone(),
            ctx.window_functions().clone(),
            runtime,
        ),
    ))
}

/// The partition count for build rows whose join in memory would cost `cost` bytes
/// ([`in_memory_cost`]): partitions of about half the budget.
fn fanout_for(cost: Option<usize>, budget: usize) -> usize {
    match cost {
        Some(cost) if cost > 0 => cost.saturating_mul(2).div_ceil(budget).clamp(MIN_FANOUT, MAX_FANOUT),
        _ => DEFAULT_FANOUT,
    }
}

/// The hash that routes rows at re-partitioning depth `depth`: a new seed per depth, so that rows
/// sharing one partition at a depth spread over the next; and none equal to the hash join's or
/// `RepartitionExec`'s, whose hash tables would otherwise see correlated hashes.
fn router_hash(depth: u32) -> RandomState {
    RandomState::with_seed(0x6a09_e667_f3bc_c908 ^ u64::from(depth))
}

struct GraceMetrics {
    output_rows: Count,
    spilled_bytes: Count,
    spill_partitions: Count,
    max_build_partition_bytes: Gauge,
}

/// One spilled partition of one side.
#[derive(Debug, Clone)]
struct SpillFile {
    path: PathBuf,
    bytes: usize,
    rows: usize,
}

/// A build and a probe partition holding the same keys (`None`: no rows).
struct PartitionPair {
    build: Option<SpillFile>,
    probe: Option<SpillFile>,
    depth: u32,
}

impl PartitionPair {
    /// Best effort: the spill directory's guard removes whatever is left.
    fn remove_files(&self) {
        self.build.iter().chain(&self.probe).for_each(|file| drop(fs::remove_file(&file.path)));
    }
}

/// A directory of one execution's own under the caller's spill directory, removed with its files
/// when dropped: when the output stream ends, fails, or is dropped early.
struct SpillDir(PathBuf);

impl SpillDir {
    /// Named by process and execution, so no live execution shares it (one left by a dead process
    /// with the same id is reused, and removed with ours).
    fn create(parent: &Path) -> Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = parent.join(format!("grace-join-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        fs::create_dir_all(&path).map_err(|e| exec_datafusion_err!("GraceHashJoinExec: cannot create spill directory {}: {e}", path.display()))?;
        Ok(SpillDir(path))
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn spill_error(action: &str, path: &Path, e: impl fmt::Display) -> DataFusionError {
    exec_datafusion_err!("GraceHashJoinExec: cannot {action} spill file {}: {e}", path.display())
}

/// One execution's state: the partition pairs still to join and the join running now.
struct JoinRun {
    join: Arc<HashJoinExec>,
    ctx: Arc<TaskContext>,
    /// For the joins of loaded partitions, whose memory `reservation` holds.
    join_ctx: Arc<TaskContext>,
    /// The build rows in memory (and the join over them) from the task's pool.
    reservation: MemoryReservation,
    budget: usize,
    spill_dir: PathBuf,
    /// Made when the first partition is spilled.
    dir: Option<SpillDir>,
    metrics: GraceMetrics,
    /// A stack: partition 0 on top, then the sub-partitions of a split pair before the rest.
    pending: Vec<PartitionPair>,
    current: Option<(SendableRecordBatchStream, PartitionPair)>,
    /// Partitioning passes so far, which name their files.
    passes: usize,
    /// Rows still to produce under the join's fetch.
    remaining: Option<usize>,
}

impl JoinRun {
    /// Reads the build side into memory while the pool grants it and it stays within the
    /// budget; then joins in memory, streaming the probe side. Else partitions both sides.
    async fn build_side(mut self, fanout: usize) -> Result<Self> {
        let mut input = merge_partitions(self.join.left(), &self.ctx)?;
        let (mut held, mut bytes, mut rows) = (Vec::new(), 0, 0);
        while let Some(batch) = input.next().await {
            let batch = batch?;
            let (more_bytes, more_rows) = (bytes + get_record_batch_memory_size(&batch), rows + batch.num_rows());
            let cost = in_memory_cost(more_bytes, more_rows);
            if cost <= self.budget && self.reservation.try_resize(cost).is_ok() {
                (bytes, rows) = (more_bytes, more_rows);
                held.push(batch);
                continue;
            }
            // It does not fit: partition both sides, into parts of about half what was granted.
            self.reservation.free();
            let granted = in_memory_cost(bytes, rows).max(self.budget / MAX_FANOUT);
            let fanout = fanout.max(fanout_for(Some(in_memory_cost(2 * more_bytes, 2 * more_rows)), granted));
            let held = stream::iter(held.into_iter().chain([batch]).map(Ok));
            let build = self.partition_side(true, held.chain(input), 0, fanout).await?;
            let probe = self.partition_side(false, merge_partitions(self.join.right(), &self.ctx)?, 0, fanout).await?;
            self.push_pairs(build, probe, 0);
            return Ok(self);
        }
        self.metrics.max_build_partition_bytes.set_max(bytes);
        let probe = OnceSource::new(self.join.right().schema(), merge_partitions(self.join.right(), &self.ctx)?);
        let pair = PartitionPair { build: None, probe: None, depth: 0 };
        self.current = Some((self.join_in_memory(held, probe)?, pair));
        Ok(self)
    }

    /// The join of `build` (held in memory, reserved) with the rows of `probe`.
    fn join_in_memory(&self, build: Vec<RecordBatch>, probe: Arc<dyn PartitionStream>) -> Result<SendableRecordBatchStream> {
        let build = MemorySourceConfig::try_new_exec(&[build], self.join.left().schema(), None)?;
        let probe = StreamingTableExec::try_new(self.join.right().schema(), vec![probe], None, Vec::new(), false, None)?;
        let builder = self.join.builder().with_new_children(vec![build, Arc::new(probe)])?;
        let join = builder.with_partition_mode(PartitionMode::CollectLeft).reset_state().build()?;
        join.execute(0, Arc::clone(&self.join_ctx))
    }

    /// Routes `input` (one side's rows) to `fanout` spill files by the hash of its join keys.
    async fn partition_side(
        &mut self,
        build_side: bool,
        mut input: impl Stream<Item = Result<RecordBatch>> + Unpin,
        depth: u32,
        fanout: usize,
    ) -> Result<Vec<Option<SpillFile>>> {
        let (child, side) = if build_side { (self.join.left(), "build") } else { (self.join.right(), "probe") };
        let keys = self.join.on().iter().map(|(l, r)| Arc::clone(if build_side { l } else { r })).collect();
        self.passes += 1;
        let dir = match &self.dir {
            Some(dir) => dir.0.clone(),
            None => self.dir.insert(SpillDir::create(&self.spill_dir)?).0.clone(),
        };
        let paths = (0..fanout).map(|p| dir.join(format!("{}-{side}-{p}.arrow", self.passes))).collect();
        let (buffers, writers) = (vec![Vec::new(); fanout], (0..fanout).map(|_| None).collect());
        let (schema, hash, buffer_limit) = (child.schema(), router_hash(depth), self.budget / 2);
        let reservation = self.reservation.new_empty();
        let mut router = Router { schema, keys, hash, paths, buffers, writers, rows: vec![0; fanout], reservation, buffer_limit };
        while let Some(batch) = input.next().await {
            if router.push(&batch?)? {
                router = blocking("GraceHashJoinExec spill I/O", move || router.flush().map(|()| router)).await?;
            }
        }
        let files = blocking("GraceHashJoinExec spill I/O", move || router.finish()).await?;
        self.metrics.spilled_bytes.add(files.iter().flatten().map(|file| file.bytes).sum());
        Ok(files)
    }

    fn push_pairs(&mut self, build: Vec<Option<SpillFile>>, probe: Vec<Option<SpillFile>>, depth: u32) {
        self.metrics.spill_partitions.add(build.len());
        let pairs = build.into_iter().zip(probe).map(|(build, probe)| PartitionPair { build, probe, depth });
        self.pending.extend(pairs.rev());
    }

    /// The output stream's step: the next batch of the running join, else starts the next pair.
    async fn next(mut self) -> Option<(Result<RecordBatch>, Self)> {
        loop {
            if self.remaining == Some(0) {
                return None;
            }
            if let Some((join, _)) = &mut self.current {
                match join.next().await {
                    Some(Ok(batch)) => {
                        let rows = self.remaining.map_or(batch.num_rows(), |remaining| remaining.min(batch.num_rows()));
                        self.remaining = self.remaining.map(|remaining| remaining - rows);
                        self.metrics.output_rows.add(rows);
                        return Some((Ok(batch.slice(0, rows)), self));
                    }
                    Some(Err(e)) => return Some((Err(e), self.stop())),
                    None => {
                        self.current.take().into_iter().for_each(|(_, pair)| pair.remove_files());
                        self.reservation.free();
                    }
                }
            }
            // No pair left: the stream ends, and dropping `self` removes the spill directory.
            let pair = self.pending.pop()?;
            if let Err(e) = self.start(pair).await {
                return Some((Err(e), self.stop()));
            }
        }
    }

    /// After an error: nothing more is produced.
    fn stop(mut self) -> Self {
        (self.pending, self.current, self.remaining) = (Vec::new(), None, Some(0));
        self
    }

    /// Starts joining `pair`, or splits it further if its build rows exceed the budget.
    async fn start(&mut self, pair: PartitionPair) -> Result<()> {
        use JoinType::*;
        // Partitions are disjoint by key: a side without rows here has no partner anywhere, so
        // the pair produces only the rows the join keeps unmatched, if it keeps any.
        let keeps_probe = matches!(self.join.join_type(), Right | Full | RightAnti | RightMark);
        let keeps_build = matches!(self.join.join_type(), Left | Full | LeftAnti | LeftMark);
        let (no_build, no_probe) = (pair.build.is_none(), pair.probe.is_none());
        if (no_build && (no_probe || !keeps_probe)) || (no_probe && !keeps_build) {
            pair.remove_files();
            return Ok(());
        }
        // A partition the pool refuses (concurrent work holds its memory) is split while that
        // is allowed, then waits for the memory, holding none: what others hold they return
        // when they finish. Not forever: they may be waiting for this join's output (a host
        // operator that reads it first), so past `MEMORY_PATIENCE` the join fails.
        let (mut pause, deadline) = (Duration::from_millis(2), tokio::time::Instant::now() + MEMORY_PATIENCE);
        let (batches, bytes) = loop {
            match load_build(&self.reservation, self.budget, &pair).await? {
                Load::Loaded(batches, bytes) => break (batches, bytes),
                Load::Refused if pair.depth >= MAX_DEPTH => {
                    if tokio::time::Instant::now() >= deadline {
                        let bytes = pair.build.as_ref().map_or(0, |file| file.bytes);
                        return resources_err!(
                            "GraceHashJoinExec: the node's memory pool did not grant a build partition of {bytes} bytes within {} s (concurrent work holds it)",
                            MEMORY_PATIENCE.as_secs()
                        );
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Load::OverBudget | Load::Refused => return self.split(pair).await,
            }
        };
        self.metrics.max_build_partition_bytes.set_max(bytes);
        let probe = Arc::new(SpillSource { schema: self.join.right().schema(), file: pair.probe.clone() });
        self.current = Some((self.join_in_memory(batches, probe)?, pair));
        Ok(())
    }

    /// Splits an oversized pair with the next depth's hash and queues the parts in its place.
    async fn split(&mut self, pair: PartitionPair) -> Result<()> {
        let bytes = pair.build.as_ref().map_or(0, |file| file.bytes);
        if pair.depth >= MAX_DEPTH {
            return resources_err!(
                "GraceHashJoinExec: a build partition of {bytes} bytes still exceeds the memory budget of {} bytes after {MAX_DEPTH} re-partitionings (too many build rows share a join key?)",
                self.budget
            );
        }
        let rows = pair.build.as_ref().map_or(0, |file| file.rows);
        let (depth, fanout) = (pair.depth + 1, fanout_for(Some(in_memory_cost(bytes, rows)), self.budget));
        let build = self.partition_side(true, spill_stream(pair.build.clone()), depth, fanout).await?;
        let probe = self.partition_side(false, spill_stream(pair.probe.clone()), depth, fanout).await?;
        pair.remove_files();
        self.push_pairs(build, probe, depth);
        Ok(())
    }
}

/// What loading a build partition came to.
enum Load {
    /// Its rows and their bytes in memory, reserved with their join.
    Loaded(Vec<RecordBatch>, usize),
    /// Its join in memory would exceed the budget.
    OverBudget,
    /// The pool refused the memory (within the budget).
    Refused,
}

/// Loads the pair's build rows, reserving before reading (IPC files hold about what the rows
/// take in memory), then keeping what the rows really take.
async fn load_build(reservation: &MemoryReservation, budget: usize, pair: &PartitionPair) -> Result<Load> {
    let (file_bytes, rows) = pair.build.as_ref().map_or((0, 0), |file| (file.bytes, file.rows));
    let estimate = in_memory_cost(file_bytes, rows);
    if estimate > budget {
        return Ok(Load::OverBudget);
    }
    if reservation.try_resize(estimate).is_err() {
        return Ok(Load::Refused);
    }
    let file = pair.build.clone();
    let batches: Vec<RecordBatch> = blocking("GraceHashJoinExec spill I/O", move || read_spill(file.as_ref())?.collect()).await?;
    let bytes = batches.iter().map(get_record_batch_memory_size).sum();
    let cost = in_memory_cost(bytes, rows);
    if cost > budget {
        reservation.free();
        return Ok(Load::OverBudget);
    }
    if reservation.try_resize(cost).is_err() {
        reservation.free();
        return Ok(Load::Refused);
    }
    Ok(Load::Loaded(batches, bytes))
}

/// All output partitions of `plan`, polled together: draining them one by one would make an
/// upstream `RepartitionExec` buffer everything meant for the others.
fn merge_partitions(
    plan: &Arc<dyn ExecutionPlan>,
    ctx: &Arc<TaskContext>,
) -> Result<impl Stream<Item = Result<RecordBatch>> + Unpin + use<>> {
    let count = plan.output_partitioning().partition_count();
    let streams = (0..count).map(|p| plan.execute(p, Arc::clone(ctx))).collect::<Result<Vec<_>>>()?;
    Ok(stream::select_all(streams))
}

/// One partitioning pass of one side: routes rows to `paths` (one per partition) by key hash,
/// buffering up to `buffer_limit` bytes (as far as the pool grants them) so that each file gets
/// few, large IPC messages.
struct Router {
    schema: SchemaRef,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    hash: RandomState,
    paths: Vec<PathBuf>,
    buffers: Vec<Vec<RecordBatch>>,
    /// Opened on a partition's first rows: an empty partition has no file.
    writers: Vec<Option<StreamWriter<BufWriter<File>>>>,
    /// Rows written to each partition.
    rows: Vec<usize>,
    /// The buffered rows' bytes.
    reservation: MemoryReservation,
    buffer_limit: usize,
}

impl Router {
    /// Routes a batch's rows to their partitions' buffers; true when the buffers should be
    /// written out (over the limit, or the pool refused them).
    fn push(&mut self, batch: &RecordBatch) -> Result<bool> {
        let rows = batch.num_rows();
        let keys = self.keys.iter().map(|key| key.evaluate(batch)?.into_array(rows)).collect::<Result<Vec<_>>>()?;
        let mut hashes = vec![0; rows];
        // NULL keys leave their hash unchanged, so they all go to the same partition.
        create_hashes(&keys, &self.hash, &mut hashes)?;
        let mut indices = vec![Vec::new(); self.paths.len()];
        for (row, hash) in hashes.iter().enumerate() {
            indices[(hash % self.paths.len() as u64) as usize].push(row as u32);
        }
        let mut refused = false;
        for (partition, rows) in indices.into_iter().enumerate().filter(|(_, rows)| !rows.is_empty()) {
            // A taken part would otherwise keep (and spill) all of the batch's string bytes.
            let part = compact_views(take_record_batch(batch, &UInt32Array::from(rows))?)?;
            // Rows the pool refuses are written out at once, with what is buffered.
            refused |= self.reservation.try_grow(get_record_batch_memory_size(&part)).is_err();
            self.buffers[partition].push(part);
        }
        Ok(refused || self.reservation.size() > self.buffer_limit)
    }

    fn flush(&mut self) -> Result<()> {
        for (partition, buffer) in self.buffers.iter_mut().enumerate().filter(|(_, buffer)| !buffer.is_empty()) {
            let batch = concat_batches(&self.schema, buffer.iter())?;
            buffer.clear();
            let path = &self.paths[partition];
            let writer = match &mut self.writers[partition] {
                Some(writer) => writer,
                slot => {
                    let file = File::create(path).map_err(|e| spill_error("create", path, e))?;
                    slot.insert(StreamWriter::try_new_buffered(file, &self.schema).map_err(|e| spill_error("write", path, e))?)
                }
            };
            writer.write(&batch).map_err(|e| spill_error("write", path, e))?;
            self.rows[partition] += batch.num_rows();
        }
        self.reservation.free();
        Ok(())
    }

    /// Writes what is buffered and closes the files: one per partition, `None` where it has no rows.
    fn finish(mut self) -> Result<Vec<Option<SpillFile>>> {
        self.flush()?;
        let close = |writer: StreamWriter<BufWriter<File>>, path: PathBuf, rows: usize| {
            let file = writer.into_inner().map_err(|e| spill_error("write", &path, e))?;
            let file = file.into_inner().map_err(|e| spill_error("write", &path, e.error()))?;
            let bytes = file.metadata().map_err(|e| spill_error("inspect", &path, e))?.len() as usize;
            Ok(SpillFile { path, bytes, rows })
        };
        let files = self.writers.into_iter().zip(self.paths).zip(self.rows);
        files.map(|((writer, path), rows)| writer.map(|writer| close(writer, path, rows)).transpose()).collect()
    }
}

type SpillBatches = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// The batches of a spill file (none for an empty partition). Reads block, batch by batch.
fn read_spill(file: Option<&SpillFile>) -> Result<SpillBatches> {
    let Some(file) = file else { return Ok(Box::new(std::iter::empty())) };
    let path = file.path.clone();
    let handle = File::open(&path).map_err(|e| spill_error("open", &path, e))?;
    let reader = StreamReader::try_new_buffered(handle, None).map_err(|e| spill_error("read", &path, e))?;
    Ok(Box::new(reader.map(move |batch| batch.map_err(|e| spill_error("read", &path, e)))))
}

/// The batches of a spill file, read on a blocking thread a couple of batches ahead.
fn spill_stream(file: Option<SpillFile>) -> impl Stream<Item = Result<RecordBatch>> + Send + Unpin + 'static {
    let (sender, receiver) = tokio::sync::mpsc::channel(2);
    if file.is_some() {
        tokio::task::spawn_blocking(move || {
            let batches: SpillBatches = read_spill(file.as_ref()).unwrap_or_else(|e| Box::new(std::iter::once(Err(e))));
            for batch in batches {
                // The join stopped reading (it ended early or was dropped): stop too.
                if sender.blocking_send(batch).is_err() {
                    break;
                }
            }
        });
    }
    Box::pin(stream::unfold(receiver, |mut receiver| async move { receiver.recv().await.map(|batch| (batch, receiver)) }))
}

/// A probe partition streamed from its spill file into the partition's hash join.
#[derive(Debug)]
struct SpillSource {
    schema: SchemaRef,
    file: Option<SpillFile>,
}

impl PartitionStream for SpillSource {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), spill_stream(self.file.clone())))
    }
}

/// The probe side's live input, handed to the in-memory join once.
struct OnceSource {
    schema: SchemaRef,
    input: std::sync::Mutex<Option<BoxStream<'static, Result<RecordBatch>>>>,
}

impl OnceSource {
    fn new(schema: SchemaRef, input: impl Stream<Item = Result<RecordBatch>> + Send + 'static) -> Arc<Self> {
        Arc::new(OnceSource { schema, input: std::sync::Mutex::new(Some(input.boxed())) })
    }
}

impl fmt::Debug for OnceSource {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("OnceSource").field("schema", &self.schema).finish()
    }
}

impl PartitionStream for OnceSource {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let input = self.input.lock().expect("once source lock").take();
        let input = input.unwrap_or_else(|| stream::once(async { internal_err!("GraceHashJoinExec: the probe side was read twice") }).boxed());
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), input))
    }
}
