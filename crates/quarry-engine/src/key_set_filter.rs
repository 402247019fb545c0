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
use arrow::datatypes::{DataType, Date32Type, Int32Type, Int64Type, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{JoinType, NullEquality, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::{DisplayAs, ExecutionPlanProperties, DisplayFormatType, ExecutionPlan, PlanProperties, RecordBatchStream, SendableRecordBatchStream};
use futures::{Stream, StreamExt};
use quarry_storage::key_set::{self, KeySet};

use crate::scan::FragmentExec;

/// Where a join's key set is published for the fragment on its probe side: unset until the
/// build side ends; `None` if the keys did not make a set (too many, too wide, or no memory).
#[derive(Debug, Default)]
pub struct KeySetSlot {
    set: OnceLock<Option<Arc<KeySet>>>,
}

impl KeySetSlot {
    /// The published set, if there is one yet.
    pub fn get(&self) -> Option<Arc<KeySet>> {
        self.set.get().cloned().flatten()
    }

    fn publish(&self, set: Option<KeySet>) {
        // A second execution of the build side publishes the same keys.
        let _ = self.set.set(set.map(Arc::new));
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
    let passes_rows = plan.is::<RepartitionExec>() || plan.is::<CoalescePartitionsExec>();
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
            reservation,
            baseline: BaselineMetrics::new(&self.metrics, partition),
            published_keys: MetricBuilder::new(&self.metrics).counter("key_set_keys", partition),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

struct CollectStream {
    input: SendableRecordBatchStream,
    key: Arc<dyn PhysicalExpr>,
    slot: Arc<KeySetSlot>,
    /// The keys so far; `None` once given up.
    keys: Option<Vec<i64>>,
    reservation: MemoryReservation,
    baseline: BaselineMetrics,
    published_keys: Count,
}

impl CollectStream {
    fn gather_keys(&mut self, batch: &RecordBatch) -> Result<()> {
        let Some(keys) = self.keys.as_mut() else { return Ok(()) };
        let values = self.key.evaluate(batch)?.into_array(batch.num_rows())?;
        let present = values.len() - values.null_count();
        if keys.len() + present > key_set::MAX_KEYS || self.reservation.try_grow(present * size_of::<i64>()).is_err() {
            self.keys = None;
            self.reservation.free();
            return Ok(());
        }
        let valid = |i: usize| values.is_valid(i);
        match values.data_type() {
            DataType::Int32 => keys.extend(values.as_primitive::<Int32Type>().values().iter().enumerate().filter(|(i, _)| valid(*i)).map(|(_, &v)| v as i64)),
            DataType::Date32 => keys.extend(values.as_primitive::<Date32Type>().values().iter().enumerate().filter(|(i, _)| valid(*i)).map(|(_, &v)| v as i64)),
            DataType::Int64 => keys.extend(values.as_primitive::<Int64Type>().values().iter().enumerate().filter(|(i, _)| valid(*i)).map(|(_, &v)| v)),
            _ => self.keys = None,
        }
        Ok(())
    }

    fn publish(&mut self) {
        let set = self.keys.take().and_then(KeySet::new);
        self.published_keys.add(set.as_ref().map_or(0, |s| s.keys().len()));
        self.slot.publish(set);
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
