//! A hash join that stays within a memory budget by spilling: the Grace hash join ("in-storage
//! hash join", Kim et al. 2015, sec. 3.2).
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

use arrow::array::{ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take_record_batch};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::utils::memory::{RecordBatchMemoryCounter, get_record_batch_memory_size};
use datafusion::common::{DataFusionError, JoinType, Statistics, exec_datafusion_err, internal_err, not_impl_err, plan_err, resources_err};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ChildStats, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use datafusion::physical_plan::{SendableRecordBatchStream, StatisticsArgs, StatisticsContext, apply_expression_roots};
use futures::{Stream, StreamExt, TryStreamExt, stream};

/// How many times a build partition that is still over the budget is split again; past that
/// its rows share too few keys to split (skew) and the join fails rather than exceed the budget.
const MAX_DEPTH: u32 = 3;
/// Partition counts per pass: at least two (else nothing is split), at most 256 open files; 16
/// when the build side's size is unknown.
const MIN_FANOUT: usize = 2;
const MAX_FANOUT: usize = 256;
const DEFAULT_FANOUT: usize = 16;

/// A Grace hash join: the results of a [`HashJoinExec`] (left input = build side) with at most
/// `memory_budget` bytes of build-side rows in memory, spilling hash partitions of both inputs
/// to Arrow IPC files under `spill_dir`.
///
/// The budget bounds the build rows held for one partition's join (Arrow buffer bytes, the
/// `max_build_partition_bytes` metric) and, at half the budget, the rows buffered while
/// partitioning; DataFusion's hash table over a loaded partition and its concatenated copy of
/// the rows come on top. It reads every input partition of both children and produces one
/// output partition, in no particular order.
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
        let fanout = fanout_for(stats.ok().and_then(|stats| stats.total_byte_size.get_value().copied()), self.memory_budget);
        let metric = || MetricBuilder::new(&self.metrics);
        let metrics = GraceMetrics {
            output_rows: metric().output_rows(partition),
            spilled_bytes: metric().spilled_bytes(partition),
            spill_partitions: metric().counter("spill_partitions", partition),
            max_build_partition_bytes: metric().gauge("max_build_partition_bytes", partition),
        };
        let (join, budget, spill_dir) = (Arc::clone(&self.join), self.memory_budget, self.spill_dir.clone());
        let run = async move {
            let dir = SpillDir::create(&spill_dir)?;
            let (pending, current, remaining) = (Vec::new(), None, join.fetch());
            let run = JoinRun { join, ctx: context, budget, dir, metrics, pending, current, passes: 0, remaining };
            run.partition_inputs(fanout).await
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

/// The partition count for `bytes` of build rows.
fn fanout_for(bytes: Option<usize>, budget: usize) -> usize {
    match bytes {
        Some(bytes) if bytes > 0 => bytes.saturating_mul(2).div_ceil(budget).clamp(MIN_FANOUT, MAX_FANOUT),
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
    budget: usize,
    dir: SpillDir,
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
    /// The partition phase: splits all input partitions of the build side, then of the probe side.
    async fn partition_inputs(mut self, fanout: usize) -> Result<Self> {
        let build = self.partition_side(true, merge_partitions(self.join.left(), &self.ctx)?, 0, fanout).await?;
        let probe = self.partition_side(false, merge_partitions(self.join.right(), &self.ctx)?, 0, fanout).await?;
        self.push_pairs(build, probe, 0);
        Ok(self)
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
        let paths = (0..fanout).map(|p| self.dir.0.join(format!("{}-{side}-{p}.arrow", self.passes))).collect();
        let (buffers, writers) = (vec![Vec::new(); fanout], (0..fanout).map(|_| None).collect());
        let (schema, hash, buffer_limit) = (child.schema(), router_hash(depth), self.budget / 2);
        let mut router = Router { schema, keys, hash, paths, buffers, writers, buffered: 0, buffer_limit };
        while let Some(batch) = input.next().await {
            router.push(&batch?)?;
        }
        let files = router.finish()?;
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
                    None => self.current.take().into_iter().for_each(|(_, pair)| pair.remove_files()),
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
        let Some((batches, bytes)) = self.load_build(&pair)? else { return self.split(pair).await };
        self.metrics.max_build_partition_bytes.set_max(bytes);
        let build = MemorySourceConfig::try_new_exec(&[batches], self.join.left().schema(), None)?;
        let probe_source = Arc::new(SpillSource { schema: self.join.right().schema(), file: pair.probe.clone() });
        let probe = StreamingTableExec::try_new(self.join.right().schema(), vec![probe_source], None, Vec::new(), false, None)?;
        let builder = self.join.builder().with_new_children(vec![build, Arc::new(probe)])?;
        let join = builder.with_partition_mode(PartitionMode::CollectLeft).reset_state().build()?;
        self.current = Some((join.execute(0, Arc::clone(&self.ctx))?, pair));
        Ok(())
    }

    /// The pair's build rows and their bytes in memory, or `None` if they exceed the budget.
    fn load_build(&self, pair: &PartitionPair) -> Result<Option<(Vec<RecordBatch>, usize)>> {
        // IPC files hold about what the rows take in memory: no use reading one far too large.
        if pair.build.as_ref().is_some_and(|file| file.bytes > self.budget) {
            return Ok(None);
        }
        let (mut counter, mut batches) = (RecordBatchMemoryCounter::new(), Vec::new());
        for batch in read_spill(pair.build.as_ref())? {
            let batch = batch?;
            counter.count_batch(&batch);
            if counter.memory_usage() > self.budget {
                return Ok(None);
            }
            batches.push(batch);
        }
        Ok(Some((batches, counter.memory_usage())))
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
        let (depth, fanout) = (pair.depth + 1, fanout_for(Some(bytes), self.budget));
        let build = self.partition_side(true, stream::iter(read_spill(pair.build.as_ref())?), depth, fanout).await?;
        let probe = self.partition_side(false, stream::iter(read_spill(pair.probe.as_ref())?), depth, fanout).await?;
        pair.remove_files();
        self.push_pairs(build, probe, depth);
        Ok(())
    }
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
/// buffering up to `buffer_limit` bytes so that each file gets few, large IPC messages.
struct Router {
    schema: SchemaRef,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    hash: RandomState,
    paths: Vec<PathBuf>,
    buffers: Vec<Vec<RecordBatch>>,
    /// Opened on a partition's first rows: an empty partition has no file.
    writers: Vec<Option<StreamWriter<BufWriter<File>>>>,
    buffered: usize,
    buffer_limit: usize,
}

impl Router {
    fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        let keys = self.keys.iter().map(|key| key.evaluate(batch)?.into_array(rows)).collect::<Result<Vec<_>>>()?;
        let mut hashes = vec![0; rows];
        // NULL keys leave their hash unchanged, so they all go to the same partition.
        create_hashes(&keys, &self.hash, &mut hashes)?;
        let mut indices = vec![Vec::new(); self.paths.len()];
        for (row, hash) in hashes.iter().enumerate() {
            indices[(hash % self.paths.len() as u64) as usize].push(row as u32);
        }
        for (partition, rows) in indices.into_iter().enumerate().filter(|(_, rows)| !rows.is_empty()) {
            let part = compact_views(take_record_batch(batch, &UInt32Array::from(rows))?)?;
            self.buffered += get_record_batch_memory_size(&part);
            self.buffers[partition].push(part);
        }
        if self.buffered > self.buffer_limit {
            self.flush()?;
        }
        Ok(())
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
        }
        self.buffered = 0;
        Ok(())
    }

    /// Writes what is buffered and closes the files: one per partition, `None` where it has no rows.
    fn finish(mut self) -> Result<Vec<Option<SpillFile>>> {
        self.flush()?;
        let close = |writer: StreamWriter<BufWriter<File>>, path: PathBuf| {
            let file = writer.into_inner().map_err(|e| spill_error("write", &path, e))?;
            let file = file.into_inner().map_err(|e| spill_error("write", &path, e.error()))?;
            let bytes = file.metadata().map_err(|e| spill_error("inspect", &path, e))?.len() as usize;
            Ok(SpillFile { path, bytes })
        };
        let files = self.writers.into_iter().zip(self.paths);
        files.map(|(writer, path)| writer.map(|writer| close(writer, path)).transpose()).collect()
    }
}

/// Copies the strings a view column still uses into buffers of their own: after a `take`, each
/// partition's rows would keep (and spill) all of the input batch's string data.
fn compact_views(batch: RecordBatch) -> Result<RecordBatch> {
    if !batch.columns().iter().any(|column| matches!(column.data_type(), DataType::Utf8View | DataType::BinaryView)) {
        return Ok(batch);
    }
    let columns = batch.columns().iter().map(|column| match column.data_type() {
        DataType::Utf8View => Arc::new(column.as_string_view().gc()) as ArrayRef,
        DataType::BinaryView => Arc::new(column.as_binary_view().gc()) as ArrayRef,
        _ => Arc::clone(column),
    });
    Ok(RecordBatch::try_new(batch.schema(), columns.collect())?)
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
        let batches: SpillBatches = read_spill(self.file.as_ref()).unwrap_or_else(|e| Box::new(std::iter::once(Err(e))));
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream::iter(batches)))
    }
}
