//! Runtime join filters for large build sides: a hash join's build-side keys collected as they
//! stream into the join ([`KeySetCollectExec`]) and applied by the storage node to the probe
//! side's scan ([`FragmentExec`] adds a [`KeySetExpr`] to its fragment), so rows without a join
//! partner are neither decoded past their key nor sent (the semi-join reduction of Kim 2015 and
//! of DuckDB's and Exadata's scans).
//!
//! DataFusion's own dynamic filter reaches the fragment too, but beyond 16K keys it is a lookup
//! into the join's hash table, which cannot travel: TPC-H Q03 probed 32M `lineitem` rows for
//! 1.46M orders. [`KeySetRule`] pairs each eligible join with the fragment its probe key comes
//! from. The build side is complete before the join polls its probe side, so the set is
//! published before the fragment starts; a fragment that starts without one runs unfiltered.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::{DataType, Date32Type, Int32Type, Int64Type, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{JoinType, NullEquality, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::{ChildStats, DisplayAs, ExecutionPlanProperties, DisplayFormatType, ExecutionPlan, PlanProperties, RecordBatchStream, SendableRecordBatchStream, Statistics, StatisticsArgs};
use futures::{Stream, StreamExt};
use quarry_storage::key_set::{self, KeySet};

use crate::scan::FragmentExec;

/// Where a join's key set is published for the fragment on its probe side: unset until the
/// build side ends; `None` if the keys did not make a set (too many, too wide, or no memory).
/// The keys are kept as collected, one buffer per batch; the sorted set (which travels to a
/// node) and the bitmap (which the host tests) are each made once, when first asked for:
/// sorting TPC-H Q09's 15M order keys took longer than the bitmap the host needs.
#[derive(Debug, Default)]
pub struct KeySetSlot {
    keys: OnceLock<Option<Vec<ScalarBuffer<i64>>>>,
    set: OnceLock<Option<Arc<KeySet>>>,
    bitmap: OnceLock<Option<Arc<key_set::Bitmap>>>,
}

impl KeySetSlot {
    /// The published set, sorted, if there is one yet.
    pub fn get(&self) -> Option<Arc<KeySet>> {
        let keys = self.keys.get()?.as_ref()?;
        self.set.get_or_init(|| KeySet::new(keys.iter().flat_map(|k| k.iter().copied()).collect()).map(Arc::new)).clone()
    }

    /// The published keys as a bitmap, if there are keys yet and they span at most
    /// [`key_set::MAX_RANGE`] values.
    pub fn bitmap(&self) -> Option<Arc<key_set::Bitmap>> {
        let keys = self.keys.get()?.as_ref()?;
        self.bitmap.get_or_init(|| key_set::Bitmap::of_unsorted(keys).map(Arc::new)).clone()
    }

    /// The number of published keys, if there are keys yet.
    pub fn len(&self) -> Option<usize> {
        Some(self.keys.get()?.as_ref()?.iter().map(|k| k.len()).sum())
    }

    fn publish(&self, keys: Option<Vec<ScalarBuffer<i64>>>) {
        // A second execution of the build side publishes the same keys.
        let _ = self.keys.set(keys);
    }
}

/// A join's key set as the fragment on its probe side holds it.
#[derive(Debug, Clone)]
pub struct ProbeKeySet {
    pub slot: Arc<KeySetSlot>,
    /// The fragment's output column the set filters.
    pub column: String,
    /// The distinct values of that column the fragment's statistics estimate.
    pub distinct: Option<usize>,
}

impl ProbeKeySet {
    /// Whether the published set is expected to drop most of the probe side's rows: it holds
    /// at most [`HostKeyFilter::KEEP_SHARE_MAX`] of the column's distinct values. `false`
    /// while unpublished or when the column's distinct values are unknown.
    pub fn selective(&self) -> bool {
        match (self.slot.len(), self.distinct) {
            (Some(keys), Some(distinct)) => keys as f64 <= HostKeyFilter::KEEP_SHARE_MAX * distinct as f64,
            _ => false,
        }
    }
}

/// Join types whose output needs no probe row without a key match: the probe (right) side's
/// unmatched rows are dropped, or only the build side's rows are emitted.
fn drops_unmatched_probe_rows(join_type: JoinType) -> bool {
    matches!(join_type, JoinType::Inner | JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark | JoinType::RightSemi)
}

/// Physical rule: gives each hash join that builds one partition on a single integer key, and
/// whose probe key is a column of a fragment reached through operators that keep rows as they
/// are (projections, filters, repartitioning), a [`KeySetCollectExec`] on its build side and
/// the fragment the slot to read. Runs after DataFusion has chosen the join modes.
#[derive(Debug, Default)]
pub struct KeySetRule;

impl PhysicalOptimizerRule for KeySetRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(plan
            .transform_up(|node| {
                let Some(join) = node.downcast_ref::<HashJoinExec>() else { return Ok(Transformed::no(node)) };
                let eligible = *join.partition_mode() == PartitionMode::CollectLeft
                    && join.null_equality() == NullEquality::NullEqualsNothing
                    && drops_unmatched_probe_rows(*join.join_type())
                    && join.left().output_partitioning().partition_count() == 1;
                let [(build_key, probe_key)] = join.on() else { return Ok(Transformed::no(node)) };
                let key_type = build_key.data_type(&join.left().schema())?;
                let Some(probe_column) = probe_key.downcast_ref::<Column>() else { return Ok(Transformed::no(node)) };
                if !eligible || !key_set::supports(&key_type) || probe_key.data_type(&join.right().schema())? != key_type {
                    return Ok(Transformed::no(node));
                }
                let slot = Arc::new(KeySetSlot::default());
                let Some(probe) = attach(join.right(), probe_column.index(), &slot)? else { return Ok(Transformed::no(node)) };
                let build = Arc::new(KeySetCollectExec::new(Arc::clone(join.left()), Arc::clone(build_key), slot));
                Ok(Transformed::yes(replace_children_if_necessary(Arc::clone(&node), vec![build, probe])?))
            })?
            .data)
    }

    fn name(&self) -> &str {
        "quarry_key_set_filter"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with the fragment that produces its output column `column` reading `slot`, if
/// there is one below operators that pass rows through unchanged.
fn attach(plan: &Arc<dyn ExecutionPlan>, column: usize, slot: &Arc<KeySetSlot>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let below = |input: &Arc<dyn ExecutionPlan>, column: usize| -> Result<Option<Arc<dyn ExecutionPlan>>> {
        Ok(match attach(input, column, slot)? {
            Some(input) => Some(replace_children_if_necessary(Arc::clone(plan), vec![input])?),
            None => None,
        })
    };
    if let Some(fragment) = plan.downcast_ref::<FragmentExec>() {
        let name = plan.schema().field(column).name().clone();
        return Ok(fragment.with_key_set(Arc::clone(slot), name)?.map(|f| Arc::new(f) as Arc<dyn ExecutionPlan>));
    }
    if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        let Some(source) = projection.expr().get(column).and_then(|e| e.expr.downcast_ref::<Column>()) else { return Ok(None) };
        return below(projection.input(), source.index());
    }
    if let Some(filter) = plan.downcast_ref::<FilterExec>() {
        let column = match filter.projection() {
            Some(projection) => projection[column],
            None => column,
        };
        return below(filter.input(), column);
    }
    // Through the probe side of an inner join below: each of its output rows comes from one
    // probe row with the same key, so a probe row the set drops only loses rows the join
    // above would drop (TPC-H Q05: orders' keys reach lineitem under the supplier join).
    if let Some(join) = plan.downcast_ref::<HashJoinExec>()
        && matches!(join.join_type(), JoinType::Inner | JoinType::RightSemi)
    {
        let joined = join.projection.as_ref().map_or(column, |p| p[column]);
        let left_columns = if *join.join_type() == JoinType::Inner { join.left().schema().fields().len() } else { 0 };
        let Some(right_column) = joined.checked_sub(left_columns) else { return Ok(None) };
        return Ok(match attach(join.right(), right_column, slot)? {
            Some(right) => Some(replace_children_if_necessary(Arc::clone(plan), vec![Arc::clone(join.left()), right])?),
            None => None,
        });
    }
    // A star join's dimensions arrive planned whole, their scans already under the
    // `CooperativeExec`s DataFusion adds last (TPC-H Q10's orders' keys never reached customer).
    let passes_rows = plan.is::<RepartitionExec>() || plan.is::<CoalescePartitionsExec>() || plan.is::<CooperativeExec>();
    match plan.children().as_slice() {
        [input] if passes_rows => below(input, column),
        _ => Ok(None),
    }
}

/// Passes a hash join's build side through, collecting its keys; publishes them as a
/// [`KeySet`] when the input ends. The keys are reserved from the memory pool as they arrive;
/// when the pool refuses, or they exceed [`key_set::MAX_KEYS`], no set is published.
#[derive(Debug)]
pub struct KeySetCollectExec {
    input: Arc<dyn ExecutionPlan>,
    key: Arc<dyn PhysicalExpr>,
    slot: Arc<KeySetSlot>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl KeySetCollectExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, key: Arc<dyn PhysicalExpr>, slot: Arc<KeySetSlot>) -> Self {
        let properties = Arc::clone(input.properties());
        KeySetCollectExec { input, key, slot, properties, metrics: ExecutionPlanMetricsSet::new() }
    }
}

impl DisplayAs for KeySetCollectExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "KeySetCollectExec: key={}", self.key)
    }
}

impl ExecutionPlan for KeySetCollectExec {
    fn name(&self) -> &str {
        "KeySetCollectExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        datafusion::physical_plan::apply_expression_roots([&self.key], f)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        match <[_; 1]>::try_from(children) {
            Ok([input]) => Ok(Arc::new(KeySetCollectExec::new(input, Arc::clone(&self.key), Arc::clone(&self.slot)))),
            Err(_) => datafusion::common::internal_err!("KeySetCollectExec has one input"),
        }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let reservation = MemoryConsumer::new(format!("KeySetCollectExec[{partition}]")).register(context.memory_pool());
        Ok(Box::pin(CollectStream {
            input,
            key: Arc::clone(&self.key),
            slot: Arc::clone(&self.slot),
            keys: Some(Vec::new()),
            key_count: 0,
            reservation,
            baseline: BaselineMetrics::new(&self.metrics, partition),
            published_keys: MetricBuilder::new(&self.metrics).counter("key_set_keys", partition),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    /// Its input's rows pass through.
    fn statistics_from_inputs(&self, input_stats: &[Arc<Statistics>], _args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        match input_stats {
            [input] => Ok(Arc::clone(input)),
            _ => datafusion::common::internal_err!("KeySetCollectExec has one input"),
        }
    }
}

struct CollectStream {
    input: SendableRecordBatchStream,
    key: Arc<dyn PhysicalExpr>,
    slot: Arc<KeySetSlot>,
    /// The keys so far, per batch; `None` once given up.
    keys: Option<Vec<ScalarBuffer<i64>>>,
    /// How many keys `keys` holds.
    key_count: usize,
    reservation: MemoryReservation,
    baseline: BaselineMetrics,
    published_keys: Count,
}

impl CollectStream {
    fn gather_keys(&mut self, batch: &RecordBatch) -> Result<()> {
        let Some(keys) = self.keys.as_mut() else { return Ok(()) };
        let values = self.key.evaluate(batch)?.into_array(batch.num_rows())?;
        let present = values.len() - values.null_count();
        if self.key_count + present > key_set::MAX_KEYS || self.reservation.try_grow(present * size_of::<i64>()).is_err() {
            self.keys = None;
            self.reservation.free();
            return Ok(());
        }
        // An Int64 column without NULLs is kept as it came (a buffer shared with the batch):
        // copying TPC-H Q09's 15M order keys into one growing vector took 200 ms of its build.
        let widened = |values: &mut dyn Iterator<Item = i64>| ScalarBuffer::from(values.collect::<Vec<i64>>());
        let batch_keys = match values.data_type() {
            DataType::Int64 if values.null_count() == 0 => values.as_primitive::<Int64Type>().values().clone(),
            DataType::Int64 => widened(&mut values.as_primitive::<Int64Type>().iter().flatten()),
            DataType::Int32 => widened(&mut values.as_primitive::<Int32Type>().iter().flatten().map(i64::from)),
            DataType::Date32 => widened(&mut values.as_primitive::<Date32Type>().iter().flatten().map(i64::from)),
            _ => {
                self.keys = None;
                self.reservation.free();
                return Ok(());
            }
        };
        self.key_count += present;
        keys.push(batch_keys);
        Ok(())
    }

    fn publish(&mut self) {
        let keys = self.keys.take();
        self.published_keys.add(if keys.is_some() { self.key_count } else { 0 });
        self.slot.publish(keys);
        self.reservation.free();
    }
}

impl Stream for CollectStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.input.poll_next_unpin(cx);
        let elapsed = self.baseline.elapsed_compute().clone();
        let _timer = elapsed.timer();
        match polled {
            Poll::Ready(Some(Ok(batch))) => {
                if let Err(e) = self.gather_keys(&batch) {
                    return Poll::Ready(Some(Err(e)));
                }
                self.baseline.record_output(batch.num_rows());
                Poll::Ready(Some(Ok(batch)))
            }
            Poll::Ready(None) => {
                self.publish();
                Poll::Ready(None)
            }
            other => other,
        }
    }
}

impl RecordBatchStream for CollectStream {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
}

/// Key sets tested on the host, on the batches of a fragment whose node runs in this process
/// (see [`FragmentExec::with_key_set`]): each drops the rows whose key is not in its join's
/// build side before the probe, where a bitmap test costs less than a hash table lookup.
/// A set that keeps most rows only costs its tests, so after [`HostKeyFilter::SAMPLE_ROWS`]
/// rows the filter stops if it kept more than [`HostKeyFilter::KEEP_SHARE_MAX`] of them.
pub struct HostKeyFilter {
    /// Output column index and the bitmap of its key set.
    tests: Vec<(usize, Arc<key_set::Bitmap>)>,
    seen: usize,
    kept: usize,
    dropped: Count,
    /// The bitmaps' bytes, reserved from the query's pool while the filter lives.
    _reservation: MemoryReservation,
}

impl HostKeyFilter {
    /// Rows seen before the filter judges its worth.
    pub const SAMPLE_ROWS: usize = 1 << 20;
    /// Share of rows kept above which the filter stops testing.
    pub const KEEP_SHARE_MAX: f64 = 0.5;

    /// The filter of the published sets among `key_sets` over batches of `schema`, counting
    /// the rows it drops in `dropped`; `None` if no set is published, or if `pool` refuses
    /// the bitmaps' memory (each partition reserves what it reads, though they share them).
    pub fn new(key_sets: &[ProbeKeySet], schema: &SchemaRef, dropped: Count, pool: &Arc<dyn MemoryPool>) -> Result<Option<Self>> {
        let mut tests = Vec::new();
        for set in key_sets {
            if let Some(bitmap) = set.slot.bitmap() {
                tests.push((schema.index_of(&set.column)?, bitmap));
            }
        }
        let reservation = MemoryConsumer::new("HostKeyFilter").register(pool);
        if tests.is_empty() || reservation.try_grow(tests.iter().map(|(_, b)| b.bytes()).sum()).is_err() {
            return Ok(None);
        }
        Ok(Some(HostKeyFilter { tests, seen: 0, kept: 0, dropped, _reservation: reservation }))
    }

    fn filter(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        let testing = self.seen < Self::SAMPLE_ROWS || (self.kept as f64) <= Self::KEEP_SHARE_MAX * self.seen as f64;
        if !testing || batch.num_rows() == 0 {
            return Ok(batch);
        }
        let mut keep: Option<arrow::array::BooleanArray> = None;
        for (column, bitmap) in &self.tests {
            let passed = bitmap.contains_array(batch.column(*column))?;
            keep = Some(match keep {
                Some(keep) => arrow::compute::and(&keep, &passed)?,
                None => passed,
            });
        }
        let keep = keep.expect("at least one key set");
        let kept = keep.true_count();
        self.seen += batch.num_rows();
        self.kept += kept;
        self.dropped.add(batch.num_rows() - kept);
        Ok(if kept == batch.num_rows() { batch } else { arrow::compute::filter_record_batch(&batch, &keep)? })
    }

    /// `stream` with its batches filtered.
    pub fn apply(mut self, stream: quarry_storage::ScanStream) -> quarry_storage::ScanStream {
        stream
            .map(move |message| match message {
                Ok(quarry_storage::ScanMessage::Batch(batch)) => self.filter(batch).map(quarry_storage::ScanMessage::Batch),
                other => other,
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{Field, Schema};
    use datafusion::execution::memory_pool::GreedyMemoryPool;

    fn pool() -> Arc<dyn MemoryPool> {
        Arc::new(datafusion::execution::memory_pool::UnboundedMemoryPool::default())
    }

    fn published(keys: Vec<i64>) -> Arc<KeySetSlot> {
        let slot = Arc::new(KeySetSlot::default());
        slot.publish(Some(vec![ScalarBuffer::from(keys)]));
        slot
    }

    /// `slot` filtering column `k`, whose distinct values are unknown.
    fn probe(slot: Arc<KeySetSlot>) -> ProbeKeySet {
        ProbeKeySet { slot, column: "k".into(), distinct: None }
    }

    /// A set is selective when it holds at most half the probe column's distinct values.
    #[test]
    fn a_set_is_selective_when_it_holds_few_of_the_probe_columns_values() {
        let unpublished = ProbeKeySet { distinct: Some(100), ..probe(Arc::new(KeySetSlot::default())) };
        assert!(!unpublished.selective());
        let fifty = published((0..50).collect());
        assert_eq!(fifty.len(), Some(50));
        assert!(ProbeKeySet { distinct: Some(100), ..probe(Arc::clone(&fifty)) }.selective());
        assert!(!ProbeKeySet { distinct: Some(99), ..probe(Arc::clone(&fifty)) }.selective());
        assert!(!probe(fifty).selective(), "unknown distinct values");
    }

    /// A batch of `rows` rows with keys `start`, `start + 1`, ...
    fn batch(schema: &SchemaRef, start: i64, rows: i64) -> RecordBatch {
        RecordBatch::try_new(Arc::clone(schema), vec![Arc::new(Int64Array::from_iter_values(start..start + rows))]).unwrap()
    }

    /// A selective set filters every batch; one that keeps most rows stops after the sample.
    #[test]
    fn host_filter_drops_rows_without_a_key_and_stops_when_it_keeps_most() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let rows = 1 << 16;
        let batches = (2 * HostKeyFilter::SAMPLE_ROWS as i64) / rows;
        for every in [10, 2, 1] {
            // Keys 0, every, 2 * every, ... : one row in `every` has a key.
            let slot = published((0..2 * HostKeyFilter::SAMPLE_ROWS as i64).step_by(every).collect());
            let dropped = Count::new();
            let mut filter = HostKeyFilter::new(&[probe(Arc::clone(&slot))], &schema, dropped.clone(), &pool()).unwrap().unwrap();
            let mut last_kept = 0;
            for i in 0..batches {
                let out = filter.filter(batch(&schema, i * rows, rows)).unwrap();
                let keys = out.column(0).as_primitive::<Int64Type>();
                assert!(keys.values().iter().all(|k| k % every as i64 == 0), "a row without a key passed");
                last_kept = out.num_rows();
            }
            assert!(last_kept.abs_diff(rows as usize / every) <= 1, "every={every}: kept {last_kept} of the last batch");
            assert_eq!(dropped.value() > 0, every > 1);
        }
        // Keeping 60%: tested over the sample, then passed through untested.
        let keys: Vec<i64> = (0..2 * HostKeyFilter::SAMPLE_ROWS as i64).filter(|k| k % 5 < 3).collect();
        let dropped = Count::new();
        let mut filter = HostKeyFilter::new(&[probe(published(keys))], &schema, dropped.clone(), &pool()).unwrap().unwrap();
        let kept: Vec<usize> = (0..batches).map(|i| filter.filter(batch(&schema, i * rows, rows)).unwrap().num_rows()).collect();
        assert!(kept[0] < rows as usize && kept[batches as usize - 1] == rows as usize, "{kept:?}");
        assert!(dropped.value() <= HostKeyFilter::SAMPLE_ROWS, "{}", dropped.value());
    }

    #[test]
    fn no_filter_until_a_set_is_published_or_when_none_is() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let unpublished = Arc::new(KeySetSlot::default());
        assert!(HostKeyFilter::new(&[probe(Arc::clone(&unpublished))], &schema, Count::new(), &pool()).unwrap().is_none());
        assert!(unpublished.get().is_none() && unpublished.bitmap().is_none());
        unpublished.publish(None);
        assert!(HostKeyFilter::new(&[probe(unpublished)], &schema, Count::new(), &pool()).unwrap().is_none());
        // Keys spanning more than a bitmap covers make no bitmap (and no host filter).
        let wide = published(vec![0, key_set::MAX_RANGE as i64 + 1]);
        assert!(wide.bitmap().is_none());
    }

    /// Keys collected from several batches (NULLs skipped, narrower types widened) make the
    /// same set and bitmap as the keys listed at once; too many for the pool make none.
    #[test]
    fn collected_batches_publish_their_keys() {
        use arrow::array::{Date32Array, Int32Array};
        use datafusion::datasource::memory::MemorySourceConfig;
        use datafusion::prelude::SessionContext;
        let run = |batches: Vec<RecordBatch>, pool: Arc<dyn MemoryPool>| {
            let schema = batches[0].schema();
            let input = MemorySourceConfig::try_new_exec(&[batches], Arc::clone(&schema), None).unwrap();
            let slot = Arc::new(KeySetSlot::default());
            let key: Arc<dyn PhysicalExpr> = Arc::new(Column::new("k", 0));
            let collect: Arc<dyn ExecutionPlan> = Arc::new(KeySetCollectExec::new(input, key, Arc::clone(&slot)));
            let context = SessionContext::new_with_config_rt(Default::default(), Arc::new(datafusion::execution::runtime_env::RuntimeEnvBuilder::new().with_memory_pool(pool).build().unwrap())).task_ctx();
            let out = futures::executor::block_on(datafusion::physical_plan::collect(collect, context)).unwrap();
            assert_eq!(out.iter().map(RecordBatch::num_rows).sum::<usize>(), 6, "the batches pass through");
            slot
        };
        let int64: SchemaRef = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let batches = vec![
            RecordBatch::try_new(Arc::clone(&int64), vec![Arc::new(Int64Array::from(vec![7, 3, 7]))]).unwrap(),
            RecordBatch::try_new(Arc::clone(&int64), vec![Arc::new(Int64Array::from(vec![None, Some(-2), Some(40)]))]).unwrap(),
        ];
        let slot = run(batches.clone(), pool());
        assert_eq!(slot.get().unwrap().keys(), &[-2, 3, 7, 40]);
        let bitmap = slot.bitmap().unwrap();
        assert!([-2, 3, 7, 40].iter().all(|&k| bitmap.contains(k)) && ![-3, 0, 8, 39, 41].iter().any(|&k| bitmap.contains(k)));
        for narrow in [DataType::Int32, DataType::Date32] {
            let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("k", narrow.clone(), true)]));
            let column = |values: Vec<Option<i32>>| -> arrow::array::ArrayRef {
                if narrow == DataType::Int32 { Arc::new(Int32Array::from(values)) } else { Arc::new(Date32Array::from(values)) }
            };
            let batches = vec![
                RecordBatch::try_new(Arc::clone(&schema), vec![column(vec![Some(7), Some(3), Some(7)])]).unwrap(),
                RecordBatch::try_new(Arc::clone(&schema), vec![column(vec![None, Some(-2), Some(40)])]).unwrap(),
            ];
            assert_eq!(run(batches, pool()).get().unwrap().keys(), &[-2, 3, 7, 40], "{narrow}");
        }
        // Room for the first batch's keys but not the second's: no set.
        let small: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(4 * size_of::<i64>()));
        let slot = run(batches, small);
        assert!(slot.get().is_none() && slot.bitmap().is_none());
    }

    /// The bitmaps' memory comes from the query's pool: a pool too small for them gets no
    /// filter (the join still drops the rows), and the reservation ends with the filter.
    #[test]
    fn host_filter_reserves_its_bitmaps() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let slot = published((0..1 << 20).step_by(3).collect());
        let bytes = slot.bitmap().unwrap().bytes();
        let small: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(bytes - 1));
        assert!(HostKeyFilter::new(&[probe(Arc::clone(&slot))], &schema, Count::new(), &small).unwrap().is_none());
        let enough: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(bytes));
        let filter = HostKeyFilter::new(&[probe(slot)], &schema, Count::new(), &enough).unwrap();
        assert!(filter.is_some());
        assert_eq!(enough.reserved(), bytes);
        drop(filter);
        assert_eq!(enough.reserved(), 0);
    }
}
