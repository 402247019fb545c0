//! Partial aggregation over few groups, with a filter that passes most rows folded in.
//!
//! TPC-H Q01 groups 59M rows into four groups after a filter that keeps 98.6% of them.
//! DataFusion copies every passing row out of each batch (the filter), then finds each row's
//! group in a general hash table of group values: the two cost about as much CPU as decoding
//! the columns. DuckDB aggregates such inputs into a small perfect-hash table; ClickHouse keeps
//! fixed-size keys in a directly addressed table. [`SmallGroupAggregateExec`] does that for a
//! partial aggregate whose group keys are columns with few distinct values (the segments'
//! distinct-value sketches say at most [`SMALL_GROUPS_MAX`] combinations):
//!
//! * each key column's values become dense codes through a direct-mapped cache of its
//!   fixed-width values (a short string's view, an integer), a hash map behind it; the codes of
//!   a row's keys address a dense table of group ids;
//! * a filter below the aggregate that passes at least [`FOLD_FILTER_MIN_SELECTIVITY`] of its
//!   rows is not run as a copy: its rows' group id becomes 0, a group whose states are dropped
//!   at the end, and the aggregate arguments are computed over the whole batch. If that
//!   computation fails (a row the filter drops may divide by zero), the batch is filtered first
//!   and computed again, so errors are exactly DataFusion's;
//! * `sum`, `avg` and `count` of integers and decimals add into interleaved copies of each
//!   group's slots ([`FewGroupSums`]); other aggregates use DataFusion's own accumulators
//!   (`GroupsAccumulator`). The partial states, and the final aggregate above, are DataFusion's.
//!
//! Its output is the partial aggregate's, partition for partition.

use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{HashMap, Result, internal_err};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use quarry_storage::constant_keys::HideConstantsExec;

use crate::decimal_arith::{Narrow, NarrowDecimalExpr};
use crate::few_group_sums::{FewGroupSums, rows_per_group};
use crate::placement::plan_statistics;

/// Aggregates whose key columns' distinct values multiply to at most this many groups.
pub const SMALL_GROUPS_MAX: f64 = 4096.0;
/// A filter is folded into the aggregate when it is estimated to pass at least this share of
/// its rows; below it, copying the few passing rows costs less than computing on all of them.
pub const FOLD_FILTER_MIN_SELECTIVITY: f64 = 0.5;
/// A batch whose filter passes fewer than this share of its rows is filtered first after all.
const FILTER_FIRST_BELOW: f64 = 0.25;
/// Key columns of one aggregate: their codes are packed into one dense table index.
const KEY_COLUMNS_MAX: usize = 4;

/// Physical rule: a partial aggregate over few groups (and the filter below it, when it passes
/// most rows) becomes a [`SmallGroupAggregateExec`]. Runs after DataFusion's rules and Quarry's
/// decimal rewrite, on the host's plan only (fragments are already fixed).
#[derive(Debug, Default)]
pub struct SmallGroupAggregateRule;

impl PhysicalOptimizerRule for SmallGroupAggregateRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(plan.transform_up(|node| Ok(rewrite(&node)?.map_or_else(|| Transformed::no(node), Transformed::yes)))?.data)
    }

    fn name(&self) -> &str {
        "quarry_small_group_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn rewrite(node: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(aggregate) = node.downcast_ref::<AggregateExec>() else { return Ok(None) };
    let groups = aggregate.group_expr();
    // Partial only: one-step aggregates are the keyed rule's (disjoint keys per partition) and
    // the shared-subplan rule's to recognize.
    if *aggregate.mode() != AggregateMode::Partial || !groups.is_single() || groups.is_empty() || groups.expr().len() > KEY_COLUMNS_MAX {
        return Ok(None);
    }
    // An ordered partial aggregate's parent may rely on its order; this one emits at the end.
    if aggregate.properties().output_ordering().is_some() || aggregate.limit_options().is_some() || !aggregate.dynamic_expressions_produced().is_empty() {
        return Ok(None);
    }
    if aggregate.filter_expr().iter().any(Option::is_some) || aggregate.aggr_expr().iter().any(|a| a.is_distinct() || !a.order_bys().is_empty() || !a.groups_accumulator_supported()) {
        return Ok(None);
    }
    // Below an aggregate ordered only by constant keys, the constants are hidden (the rule that
    // does so runs first): the rows are the input's.
    let input = match aggregate.input().downcast_ref::<HideConstantsExec>() {
        Some(hidden) => hidden.input(),
        None => aggregate.input(),
    };
    let schema = input.schema();
    let Some(statistics) = plan_statistics(input) else { return Ok(None) };
    let mut key_columns = Vec::with_capacity(groups.expr().len());
    let mut combinations = 1.0;
    for (expr, _) in groups.expr() {
        let Some(column) = expr.downcast_ref::<Column>() else { return Ok(None) };
        if !KeyColumn::supports(schema.field(column.index()).data_type()) {
            return Ok(None);
        }
        let Some(distinct) = statistics.column_statistics.get(column.index()).and_then(|c| c.distinct_count.get_value().copied()) else { return Ok(None) };
        combinations *= distinct.max(1) as f64;
        key_columns.push(column.index());
    }
    if combinations > SMALL_GROUPS_MAX {
        return Ok(None);
    }
    let (source, prelude) = match Prelude::fold(input)? {
        Some(folded) => folded,
        None => (Arc::clone(input), Prelude::default()),
    };
    Ok(Some(Arc::new(SmallGroupAggregateExec::new(aggregate, source, prelude, key_columns, combinations as usize))))
}

/// What the aggregate's input computes from the source's batches: a filter folded into the
/// aggregate, the filter's column selection, and the projection above it.
#[derive(Debug, Default, Clone)]
struct Prelude {
    predicate: Option<Arc<dyn PhysicalExpr>>,
    filter_columns: Option<Vec<usize>>,
    /// The projection's expressions and output schema.
    projection: Option<(Vec<ProjectionExpr>, SchemaRef)>,
}

impl Prelude {
    /// The source below a filter (under at most one projection) that passes most of its rows,
    /// and what stood between; `None` if there is no such filter.
    fn fold(input: &Arc<dyn ExecutionPlan>) -> Result<Option<(Arc<dyn ExecutionPlan>, Prelude)>> {
        let (projection, below) = match input.downcast_ref::<ProjectionExec>() {
            Some(p) => (Some((p.expr().to_vec(), p.schema())), p.input()),
            None => (None, input),
        };
        let Some(filter) = below.downcast_ref::<FilterExec>() else { return Ok(None) };
        if ExecutionPlan::fetch(filter).is_some() || projection.iter().flat_map(|(exprs, _)| exprs).any(|p| volatile(&p.expr)) || volatile(filter.predicate()) {
            return Ok(None);
        }
        let rows = |plan: &Arc<dyn ExecutionPlan>| match plan_statistics(plan).map(|s| s.num_rows) {
            Some(Precision::Exact(n) | Precision::Inexact(n)) => Some(n),
            _ => None,
        };
        let (Some(passed), Some(read)) = (rows(below), rows(filter.input())) else { return Ok(None) };
        if read == 0 || (passed as f64) < FOLD_FILTER_MIN_SELECTIVITY * read as f64 {
            return Ok(None);
        }
        let prelude = Prelude { predicate: Some(Arc::clone(filter.predicate())), filter_columns: filter.projection().as_ref().map(|p| p.to_vec()), projection };
        Ok(Some((Arc::clone(filter.input()), prelude)))
    }

    /// The aggregate's input rows computed from every row of `batch`.
    fn compute(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let selected = match &self.filter_columns {
            Some(columns) => batch.project(columns)?,
            None => batch.clone(),
        };
        let Some((exprs, schema)) = &self.projection else { return Ok(selected) };
        let columns = exprs.iter().map(|p| p.expr.evaluate(&selected)?.into_array(selected.num_rows())).collect::<Result<Vec<_>>>()?;
        let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(selected.num_rows()));
        Ok(RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options)?)
    }

    fn expressions(&self) -> impl Iterator<Item = &Arc<dyn PhysicalExpr>> {
        self.predicate.iter().chain(self.projection.iter().flat_map(|(exprs, _)| exprs).map(|p| &p.expr))
    }
}

fn volatile(expr: &Arc<dyn PhysicalExpr>) -> bool {
    datafusion::physical_expr_common::physical_expr::is_volatile(expr)
}

/// A partial aggregate over few groups (see the module docs).
#[derive(Debug)]
pub struct SmallGroupAggregateExec {
    /// The aggregate replaced: its group and aggregate expressions, and its output.
    aggregate: AggregateExec,
    source: Arc<dyn ExecutionPlan>,
    prelude: Prelude,
    /// The key columns' indices in the aggregate's input.
    key_columns: Vec<usize>,
    estimated_groups: usize,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl SmallGroupAggregateExec {
    fn new(aggregate: &AggregateExec, source: Arc<dyn ExecutionPlan>, prelude: Prelude, key_columns: Vec<usize>, estimated_groups: usize) -> Self {
        let properties = Arc::clone(aggregate.properties());
        SmallGroupAggregateExec { aggregate: aggregate.clone(), source, prelude, key_columns, estimated_groups, properties, metrics: ExecutionPlanMetricsSet::new() }
    }
}

impl DisplayAs for SmallGroupAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.aggregate.group_expr().expr().iter().map(|(_, name)| name.clone()).collect();
        let aggregates: Vec<&str> = self.aggregate.aggr_expr().iter().map(|a| a.name()).collect();
        write!(f, "SmallGroupAggregateExec: gby=[{}], aggr=[{}], groups<={}", keys.join(", "), aggregates.join(", "), self.estimated_groups)?;
        if let Some(predicate) = &self.prelude.predicate {
            write!(f, ", folded filter={predicate}")?;
        }
        if let Some((projection, _)) = &self.prelude.projection {
            let exprs: Vec<String> = projection.iter().map(|p| format!("{} as {}", p.expr, p.alias)).collect();
            write!(f, ", projection=[{}]", exprs.join(", "))?;
        }
        Ok(())
    }
}

impl ExecutionPlan for SmallGroupAggregateExec {
    fn name(&self) -> &str {
        "SmallGroupAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.source]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        let groups = self.aggregate.group_expr().expr().iter().map(|(e, _)| Arc::clone(e));
        let arguments = self.aggregate.aggr_expr().iter().flat_map(|a| a.expressions());
        for expr in self.prelude.expressions().cloned().chain(groups).chain(arguments) {
            if f(&expr)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("SmallGroupAggregateExec has one child, got {}", children.len());
        }
        let source = children.remove(0);
        if source.schema() != self.source.schema() {
            return internal_err!("SmallGroupAggregateExec: a new input with another schema");
        }
        Ok(Arc::new(SmallGroupAggregateExec::new(&self.aggregate, source, self.prelude.clone(), self.key_columns.clone(), self.estimated_groups)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.source.execute(partition, Arc::clone(&context))?;
        let reservation = MemoryConsumer::new(format!("SmallGroupAggregateExec[{partition}]")).register(context.memory_pool());
        let mut state = PartitionState {
            prelude: self.prelude.clone(),
            key_columns: self.key_columns.clone(),
            arguments: self.aggregate.aggr_expr().iter().map(|a| a.expressions()).collect(),
            accumulators: self.aggregate.aggr_expr().iter().map(|a| Accumulator::for_aggregate(a, &self.aggregate.input_schema())).collect::<Result<_>>()?,
            groups: Groups::new(self.key_columns.len()),
            group_ids: Vec::new(),
            rows_per_group: Vec::new(),
            reservation,
            schema: self.schema(),
            metrics: BaselineMetrics::new(&self.metrics, partition),
        };
        let schema = self.schema();
        let stream = futures::stream::once(async move {
            let mut input = input;
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let elapsed = state.metrics.elapsed_compute().clone();
                let timer = elapsed.timer();
                state.add(&batch)?;
                timer.done();
            }
            let output = state.finish()?;
            state.metrics.record_output(output.num_rows());
            Ok(output)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// One partition's groups and accumulators.
struct PartitionState {
    prelude: Prelude,
    key_columns: Vec<usize>,
    arguments: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    accumulators: Vec<Accumulator>,
    groups: Groups,
    group_ids: Vec<usize>,
    /// The current batch's rows per group.
    rows_per_group: Vec<u64>,
    reservation: MemoryReservation,
    schema: SchemaRef,
    metrics: BaselineMetrics,
}

impl PartitionState {
    fn add(&mut self, batch: &RecordBatch) -> Result<()> {
        let mut mask = match &self.prelude.predicate {
            Some(predicate) => {
                let passed = predicate.evaluate(batch)?.into_array(batch.num_rows())?;
                let passed = passed.as_boolean();
                // NULL is not a pass: fold the validity into the values.
                let passed = match passed.nulls() {
                    Some(nulls) => BooleanArray::new(passed.values() & nulls.inner(), None),
                    None => passed.clone(),
                };
                match passed.true_count() {
                    0 => return Ok(()),
                    n if n == batch.num_rows() => None,
                    _ => Some(passed),
                }
            }
            None => None,
        };
        let mut input = batch.clone();
        if let Some(passed) = &mask
            && (passed.true_count() as f64) < FILTER_FIRST_BELOW * batch.num_rows() as f64
        {
            input = filter_record_batch(batch, passed)?;
            mask = None;
        }
        // Computed over every row when a mask drops some; a failure there may come from a
        // dropped row, so the batch is filtered and computed again.
        let (rows, arguments) = match (self.compute(&input), &mask) {
            (Ok(computed), _) => computed,
            (Err(_), Some(passed)) => {
                let filtered = filter_record_batch(batch, passed)?;
                mask = None;
                self.compute(&filtered)?
            }
            (Err(e), None) => return Err(e),
        };
        let keys: Vec<&ArrayRef> = self.key_columns.iter().map(|&c| rows.column(c)).collect();
        self.groups.assign(&keys, mask.as_ref(), &mut self.group_ids)?;
        let total = self.groups.len();
        if self.accumulators.iter().any(|a| matches!(a, Accumulator::Sums(_))) {
            rows_per_group(&self.group_ids, total, &mut self.rows_per_group);
        }
        for (accumulator, values) in self.accumulators.iter_mut().zip(&arguments) {
            match (accumulator, values) {
                (Accumulator::Sums(sums), Argument::Arrays(values)) => sums.update(values.first(), &self.group_ids, total, &self.rows_per_group)?,
                (Accumulator::Sums(sums), Argument::Narrow(narrow)) => {
                    let Some((values, nulls, _)) = narrow.array() else { return internal_err!("SmallGroupAggregateExec: a scalar narrow argument") };
                    sums.update_narrow(values, nulls, &self.group_ids, total, &self.rows_per_group)?
                }
                (Accumulator::DataFusion(native), Argument::Arrays(values)) => native.update_batch(values, &self.group_ids, None, total)?,
                (Accumulator::DataFusion(_), Argument::Narrow(_)) => return internal_err!("SmallGroupAggregateExec: a narrow argument to DataFusion's accumulator"),
            }
        }
        let size = self.groups.size() + self.accumulators.iter().map(Accumulator::size).sum::<usize>();
        self.reservation.try_resize(size)
    }

    /// The aggregate's input rows and each aggregate's argument values.
    fn compute(&self, batch: &RecordBatch) -> Result<(RecordBatch, Vec<Argument>)> {
        let rows = self.prelude.compute(batch)?;
        let evaluated = |exprs: &Vec<Arc<dyn PhysicalExpr>>| exprs.iter().map(|e| e.evaluate(&rows)?.into_array(rows.num_rows())).collect::<Result<Vec<_>>>();
        let argument = |exprs: &Vec<Arc<dyn PhysicalExpr>>, accumulator: &Accumulator| -> Result<Argument> {
            let Accumulator::Sums(sums) = accumulator else { return Ok(Argument::Arrays(evaluated(exprs)?)) };
            if sums.ignores_argument() {
                return Ok(Argument::Arrays(Vec::new()));
            }
            // Decimal arithmetic summed as its 64-bit results, where the batch allows them.
            if let ([expr], Some(scale)) = (exprs.as_slice(), sums.decimal_scale())
                && let Some(narrow) = expr.downcast_ref::<NarrowDecimalExpr>()
                && let Some(values) = narrow.evaluate_narrow(&rows)?
                && values.array().is_some_and(|(_, _, s)| s == scale)
            {
                return Ok(Argument::Narrow(values));
            }
            Ok(Argument::Arrays(evaluated(exprs)?))
        };
        let arguments = self.arguments.iter().zip(&self.accumulators).map(|(exprs, accumulator)| argument(exprs, accumulator)).collect::<Result<_>>()?;
        Ok((rows, arguments))
    }

    /// The groups' keys and partial states, without the group of dropped rows.
    fn finish(&mut self) -> Result<RecordBatch> {
        if !self.groups.touched {
            // No batch reached the accumulators: no groups.
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let count = self.groups.len() - 1;
        let mut columns = self.groups.keys()?;
        let total = self.groups.len();
        for accumulator in &mut self.accumulators {
            let state = match accumulator {
                Accumulator::Sums(sums) => sums.state(total)?,
                Accumulator::DataFusion(native) => native.state(EmitTo::All)?,
            };
            columns.extend(state.into_iter().map(|s| s.slice(1, count)));
        }
        self.reservation.free();
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }
}

/// One aggregate's argument values for a batch.
enum Argument {
    /// As its expressions evaluate them.
    Arrays(Vec<ArrayRef>),
    /// A decimal computed by narrow decimal arithmetic, in 64 bits.
    Narrow(Narrow),
}

/// One aggregate's per-group state.
enum Accumulator {
    Sums(FewGroupSums),
    DataFusion(Box<dyn GroupsAccumulator>),
}

impl Accumulator {
    fn for_aggregate(aggregate: &datafusion::physical_expr::aggregate::AggregateFunctionExpr, input: &arrow::datatypes::Schema) -> Result<Self> {
        Ok(match FewGroupSums::for_aggregate(aggregate, input)? {
            Some(sums) => Accumulator::Sums(sums),
            None => Accumulator::DataFusion(aggregate.create_groups_accumulator()?),
        })
    }

    fn size(&self) -> usize {
        match self {
            Accumulator::Sums(sums) => sums.size(),
            Accumulator::DataFusion(native) => native.size(),
        }
    }
}

/// Group ids of rows by their key columns' codes. Group 0 holds the rows a folded filter drops.
struct Groups {
    columns: Vec<KeyColumn>,
    /// Per group from 1, its key columns' codes.
    codes: Vec<u32>,
    /// Group id by packed codes (`u32::MAX`: none yet), while they pack into [`DENSE_BITS`].
    dense: Vec<u32>,
    /// Bits of each column's code in the packed index.
    widths: Vec<u32>,
    /// Group id by packed codes once they no longer fit the dense table.
    hashed: Option<HashMap<u128, u32>>,
    /// Whether any batch has been added.
    touched: bool,
    /// The current batch's codes, per key column (buffers kept between batches).
    row_codes: Vec<Vec<u32>>,
    /// The current batch's packed codes while the dense table holds the groups.
    packed_dense: Vec<u32>,
}

/// Whether `mask` (if any) keeps `row`.
#[inline]
fn passes(mask: Option<&BooleanArray>, row: usize) -> bool {
    mask.is_none_or(|m| m.values().value(row))
}

/// Each row's key codes packed into one integer (`widths` bits per column, the first column
/// lowest), a column at a time; `T` is wide enough for the widths' sum.
fn pack_rows<T>(row_codes: &[Vec<u32>], widths: &[u32], packed: &mut Vec<T>)
where
    T: From<u32> + std::ops::Shl<u32, Output = T> + std::ops::BitOrAssign + Copy,
{
    packed.clear();
    packed.extend(row_codes[0].iter().map(|&c| T::from(c)));
    let mut shift = widths[0];
    for (codes, width) in row_codes.iter().zip(widths).skip(1) {
        packed.iter_mut().zip(codes).for_each(|(p, &c)| *p |= T::from(c) << shift);
        shift += width;
    }
}

/// The dense table of group ids covers this many bits of packed key codes.
const DENSE_BITS: u32 = 16;

impl Groups {
    fn new(columns: usize) -> Self {
        let widths = vec![1; columns];
        Groups {
            columns: (0..columns).map(|_| KeyColumn::default()).collect(),
            codes: Vec::new(),
            dense: vec![u32::MAX; 1 << columns],
            widths,
            hashed: None,
            touched: false,
            row_codes: vec![Vec::new(); columns],
            packed_dense: Vec::new(),
        }
    }

    /// Groups so far, the dropped rows' group included.
    fn len(&self) -> usize {
        1 + self.codes.len() / self.columns.len()
    }

    fn size(&self) -> usize {
        self.columns.iter().map(KeyColumn::size).sum::<usize>() + self.codes.capacity() * 4 + self.dense.capacity() * 4 + self.hashed.as_ref().map_or(0, |h| h.capacity() * 24)
    }

    /// Fills `ids` with each row's group (0 where `mask` drops it), making new groups.
    fn assign(&mut self, keys: &[&ArrayRef], mask: Option<&BooleanArray>, ids: &mut Vec<usize>) -> Result<()> {
        self.touched = true;
        for ((column, array), codes) in self.columns.iter_mut().zip(keys).zip(&mut self.row_codes) {
            column.encode(array, codes)?;
        }
        if self.columns.iter().zip(&self.widths).any(|(c, &w)| c.len() > 1 << w) {
            self.widen();
        }
        let rows = keys.first().map_or(0, |k| k.len());
        ids.clear();
        ids.reserve(rows);
        if self.hashed.is_none() {
            // The dense table: each row's packed codes index it directly. Rows of groups not
            // seen yet get `u32::MAX` here and a group (if they pass) below.
            pack_rows(&self.row_codes, &self.widths, &mut self.packed_dense);
            ids.extend(self.packed_dense.iter().map(|&key| self.dense[key as usize] as usize));
            for row in 0..rows {
                if ids[row] == u32::MAX as usize {
                    // An earlier row of this batch may have made the group.
                    let key = self.packed_dense[row];
                    ids[row] = match self.dense[key as usize] {
                        u32::MAX if passes(mask, row) => self.create(key as u128, row),
                        id => id,
                    } as usize;
                }
            }
        } else {
            let mut packed: Vec<u128> = Vec::new();
            pack_rows(&self.row_codes, &self.widths, &mut packed);
            for (row, &key) in packed.iter().enumerate() {
                let hashed = self.hashed.as_ref().expect("not the dense table");
                let id = match hashed.get(&key) {
                    Some(&id) => id,
                    None if passes(mask, row) => self.create(key, row),
                    None => u32::MAX,
                };
                ids.push(id as usize);
            }
        }
        // Rows the mask drops go to group 0 (and made no group above).
        if let Some(mask) = mask {
            for row in (!mask.values()).set_indices() {
                ids[row] = 0;
            }
        }
        Ok(())
    }

    /// A new group for the packed codes `key` of `row`.
    #[cold]
    fn create(&mut self, key: u128, row: usize) -> u32 {
        let id = (1 + self.codes.len() / self.row_codes.len()) as u32;
        self.codes.extend(self.row_codes.iter().map(|c| c[row]));
        match &mut self.hashed {
            None => self.dense[key as usize] = id,
            Some(hashed) => {
                hashed.insert(key, id);
            }
        }
        id
    }

    /// Gives each column enough bits for its codes and re-packs the groups so far, into the
    /// dense table while it fits, else a hash map.
    fn widen(&mut self) {
        for (column, width) in self.columns.iter().zip(&mut self.widths) {
            while column.len() > 1 << *width {
                *width += 1;
            }
        }
        let bits: u32 = self.widths.iter().sum();
        let n = self.columns.len();
        let pack = |codes: &[u32], widths: &[u32]| {
            let mut packed = 0u128;
            let mut shift = 0;
            for (&code, &w) in codes.iter().zip(widths) {
                packed |= (code as u128) << shift;
                shift += w;
            }
            packed
        };
        if bits <= DENSE_BITS && self.hashed.is_none() {
            self.dense = vec![u32::MAX; 1 << bits];
            for (g, codes) in self.codes.chunks(n).enumerate() {
                self.dense[pack(codes, &self.widths) as usize] = g as u32 + 1;
            }
        } else {
            self.dense = Vec::new();
            self.hashed = Some(self.codes.chunks(n).enumerate().map(|(g, codes)| (pack(codes, &self.widths), g as u32 + 1)).collect());
        }
    }

    /// The key columns of groups 1.. in order.
    fn keys(&self) -> Result<Vec<ArrayRef>> {
        let n = self.columns.len();
        self.columns
            .iter()
            .enumerate()
            .map(|(c, column)| {
                let codes = UInt32Array::from_iter_values(self.codes.chunks(n).map(|g| g[c]));
                column.values(&codes)
            })
            .collect()
    }
}

/// New values kept as one-row slices before they are concatenated.
const PENDING_VALUES_MAX: usize = 256;
/// Slots of a key column's direct-mapped cache.
const CACHE_SLOTS: usize = 1024;

/// A key column's values as dense codes, in the order first seen.
struct KeyColumn {
    /// Direct-mapped cache: fixed-width key and its code (`u32::MAX`: empty).
    cache_keys: Vec<u128>,
    cache_codes: Vec<u32>,
    /// Every fixed-width key's code.
    fixed: HashMap<u128, u32>,
    /// Longer strings' codes.
    long: HashMap<Vec<u8>, u32>,
    null: Option<u32>,
    /// One-row slices of each code's value, and the values concatenated so far.
    pending: Vec<ArrayRef>,
    values: Option<ArrayRef>,
    len: u32,
}

impl Default for KeyColumn {
    fn default() -> Self {
        KeyColumn {
            cache_keys: vec![0; CACHE_SLOTS],
            cache_codes: vec![u32::MAX; CACHE_SLOTS],
            fixed: HashMap::new(),
            long: HashMap::new(),
            null: None,
            pending: Vec::new(),
            values: None,
            len: 0,
        }
    }
}

/// The fixed-width key of an inline string view: its length and bytes, padding cleared.
#[inline]
fn inline_view_key(view: u128) -> u128 {
    let len = view as u32;
    let bits = 32 + 8 * len;
    if bits >= 128 { view } else { view & ((1u128 << bits) - 1) }
}

#[inline]
fn cache_slot(key: u128) -> usize {
    let mixed = ((key as u64) ^ ((key >> 64) as u64).rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 54) as usize & (CACHE_SLOTS - 1)
}

impl KeyColumn {
    fn supports(data_type: &DataType) -> bool {
        use DataType::*;
        matches!(data_type, Utf8View | Utf8 | LargeUtf8 | Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Date32 | Date64 | Decimal128(..))
    }

    fn len(&self) -> usize {
        self.len as usize
    }

    fn size(&self) -> usize {
        self.cache_keys.capacity() * 16 + self.cache_codes.capacity() * 4 + self.fixed.capacity() * 24 + self.long.iter().map(|(k, _)| k.capacity() + 32).sum::<usize>() + self.values.as_ref().map_or(0, |v| v.get_array_memory_size())
    }

    /// Each row's code, new values getting the next codes.
    fn encode(&mut self, array: &ArrayRef, codes: &mut Vec<u32>) -> Result<()> {
        codes.clear();
        codes.reserve(array.len());
        use DataType::*;
        match array.data_type() {
            Utf8View if array.null_count() == 0 => {
                let strings = array.as_string_view();
                for (row, &view) in strings.views().iter().enumerate() {
                    // Equal inline views are equal strings: the cache is probed with the view as
                    // it is, the table behind it with the padding cleared.
                    let code = if view as u32 <= 12 {
                        match self.cached(view) {
                            Some(code) => code,
                            None => {
                                let code = self.fixed_code(inline_view_key(view), array, row);
                                self.cache(view, code);
                                code
                            }
                        }
                    } else {
                        self.long_code(strings.value(row).as_bytes(), array, row)
                    };
                    codes.push(code);
                }
            }
            Utf8View => {
                let strings = array.as_string_view();
                for (row, &view) in strings.views().iter().enumerate() {
                    let code = if strings.is_null(row) {
                        self.null_code(array, row)
                    } else if view as u32 <= 12 {
                        self.fixed_code(inline_view_key(view), array, row)
                    } else {
                        self.long_code(strings.value(row).as_bytes(), array, row)
                    };
                    codes.push(code);
                }
            }
            Utf8 => self.encode_bytes(array, array.as_string::<i32>().iter().map(|s| s.map(str::as_bytes)), codes),
            LargeUtf8 => self.encode_bytes(array, array.as_string::<i64>().iter().map(|s| s.map(str::as_bytes)), codes),
            Boolean => {
                for (row, value) in array.as_boolean().iter().enumerate() {
                    codes.push(match value {
                        Some(v) => self.fixed_code(v as u128, array, row),
                        None => self.null_code(array, row),
                    });
                }
            }
            _ => {
                let fixed = fixed_width_keys(array)?;
                for (row, &key) in fixed.iter().enumerate() {
                    let code = if array.is_null(row) { self.null_code(array, row) } else { self.fixed_code(key, array, row) };
                    codes.push(code);
                }
            }
        }
        Ok(())
    }

    fn encode_bytes<'a>(&mut self, array: &ArrayRef, values: impl Iterator<Item = Option<&'a [u8]>>, codes: &mut Vec<u32>) {
        for (row, value) in values.enumerate() {
            codes.push(match value {
                Some(bytes) => self.long_code(bytes, array, row),
                None => self.null_code(array, row),
            });
        }
    }

    /// The code of `key` if the cache holds it.
    #[inline(always)]
    fn cached(&self, key: u128) -> Option<u32> {
        let slot = cache_slot(key);
        let code = self.cache_codes[slot];
        (self.cache_keys[slot] == key && code != u32::MAX).then_some(code)
    }

    #[inline]
    fn fixed_code(&mut self, key: u128, array: &ArrayRef, row: usize) -> u32 {
        if let Some(code) = self.cached(key) {
            return code;
        }
        let code = match self.fixed.get(&key) {
            Some(&code) => code,
            None => {
                let code = self.new_code(array, row);
                self.fixed.insert(key, code);
                code
            }
        };
        self.cache(key, code);
        code
    }

    fn cache(&mut self, key: u128, code: u32) {
        let slot = cache_slot(key);
        self.cache_keys[slot] = key;
        self.cache_codes[slot] = code;
    }

    fn long_code(&mut self, bytes: &[u8], array: &ArrayRef, row: usize) -> u32 {
        if let Some(&code) = self.long.get(bytes) {
            return code;
        }
        let code = self.new_code(array, row);
        self.long.insert(bytes.to_vec(), code);
        code
    }

    fn null_code(&mut self, array: &ArrayRef, row: usize) -> u32 {
        match self.null {
            Some(code) => code,
            None => {
                let code = self.new_code(array, row);
                self.null = Some(code);
                code
            }
        }
    }

    fn new_code(&mut self, array: &ArrayRef, row: usize) -> u32 {
        self.pending.push(array.slice(row, 1));
        if self.pending.len() >= PENDING_VALUES_MAX {
            // Many one-row slices would each hold their batch's buffers.
            let compacted = self.all_values().expect("slices of one column concatenate");
            self.values = Some(compacted);
            self.pending.clear();
        }
        self.len += 1;
        self.len - 1
    }

    /// The values, concatenated. String views are copied out of the batches they point into
    /// (`gc`): one-row slices of views keep each batch's data buffers, which TPC-H Q21's
    /// 4K supplier names counted as 322 GB of reservation.
    fn all_values(&self) -> Result<ArrayRef> {
        let mut parts: Vec<&dyn Array> = self.values.iter().map(|v| v.as_ref()).collect();
        parts.extend(self.pending.iter().map(|p| p.as_ref()));
        Ok(quarry_storage::view_compaction::gc_views(&arrow::compute::concat(&parts)?))
    }

    /// The values of `codes`.
    fn values(&self, codes: &UInt32Array) -> Result<ArrayRef> {
        Ok(arrow::compute::take(&self.all_values()?, codes, None)?)
    }
}

/// An integer, date or decimal array's values as fixed-width keys (NULL slots hold garbage).
fn fixed_width_keys(array: &ArrayRef) -> Result<Vec<u128>> {
    use arrow::datatypes::*;
    fn keys<T: ArrowPrimitiveType>(array: &ArrayRef, to: impl Fn(T::Native) -> u128) -> Vec<u128> {
        array.as_primitive::<T>().values().iter().map(|&v| to(v)).collect()
    }
    Ok(match array.data_type() {
        DataType::Int8 => keys::<Int8Type>(array, |v| v as i128 as u128),
        DataType::Int16 => keys::<Int16Type>(array, |v| v as i128 as u128),
        DataType::Int32 => keys::<Int32Type>(array, |v| v as i128 as u128),
        DataType::Int64 => keys::<Int64Type>(array, |v| v as i128 as u128),
        DataType::UInt8 => keys::<UInt8Type>(array, |v| v as u128),
        DataType::UInt16 => keys::<UInt16Type>(array, |v| v as u128),
        DataType::UInt32 => keys::<UInt32Type>(array, |v| v as u128),
        DataType::UInt64 => keys::<UInt64Type>(array, |v| v as u128),
        DataType::Date32 => keys::<Date32Type>(array, |v| v as i128 as u128),
        DataType::Date64 => keys::<Date64Type>(array, |v| v as i128 as u128),
        DataType::Decimal128(..) => keys::<Decimal128Type>(array, |v| v as u128),
        other => return internal_err!("SmallGroupAggregateExec: {other} group keys"),
    })
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int32Array, Int64Array, StringViewArray};

    use super::*;

    #[test]
    fn group_ids_stay_consistent_past_the_dense_table_and_dropped_rows_go_to_group_zero() {
        // Key columns of up to 190, 190 and 5 values need 19 bits of codes: the groups move from
        // the dense table to the hash map midway, and keep their ids.
        let mut groups = Groups::new(3);
        let mut ids_by_key: std::collections::HashMap<(i64, String, Option<i32>), usize> = std::collections::HashMap::new();
        let mut ids = Vec::new();
        for batch in 0..4usize {
            let rows = 3000;
            let spread = 10 + 60 * batch; // more values in each batch
            // Each batch repeats the keys of the batches before it (j below `spread`).
            let a: ArrayRef = Arc::new(Int64Array::from_iter_values((0..rows).map(|i| (i % spread) as i64)));
            let b_values: Vec<String> = (0..rows).map(|i| if i % spread % 10 == 0 { format!("a-longer-string-{}", i % spread) } else { format!("v{}", i % spread) }).collect();
            let b: ArrayRef = Arc::new(StringViewArray::from_iter_values(&b_values));
            let c: ArrayRef = Arc::new(Int32Array::from_iter((0..rows).map(|i| (i % spread % 17 != 0).then_some((i / spread % 4) as i32))));
            let mask = BooleanArray::from_iter((0..rows).map(|i| Some(i % 5 != 0)));
            groups.assign(&[&a, &b, &c], Some(&mask), &mut ids).unwrap();
            for row in 0..rows {
                if row % 5 == 0 {
                    assert_eq!(ids[row], 0, "a dropped row's group");
                    continue;
                }
                let key = (a.as_primitive::<arrow::datatypes::Int64Type>().value(row), b_values[row].clone(), c.as_primitive::<arrow::datatypes::Int32Type>().is_valid(row).then(|| c.as_primitive::<arrow::datatypes::Int32Type>().value(row)));
                let id = *ids_by_key.entry(key.clone()).or_insert(ids[row]);
                assert_eq!(ids[row], id, "row {row} of batch {batch}, key {key:?}");
            }
        }
        assert!(groups.hashed.is_some(), "the packed codes outgrew the dense table");
        assert_eq!(groups.len() - 1, ids_by_key.len());
        // The emitted keys of group `id` are the key that made it.
        let keys = groups.keys().unwrap();
        for ((a, b, c), id) in &ids_by_key {
            assert_eq!(keys[0].as_primitive::<arrow::datatypes::Int64Type>().value(id - 1), *a);
            assert_eq!(keys[1].as_string_view().value(id - 1), b);
            let emitted = keys[2].as_primitive::<arrow::datatypes::Int32Type>();
            assert_eq!(emitted.is_valid(id - 1).then(|| emitted.value(id - 1)), *c);
        }
    }

    /// New string values come from many batches, each with large data buffers: the key column
    /// counts the bytes of its values, not of every buffer their views pointed into (TPC-H Q21
    /// with --pushdown off reserved 322 GB for 4K supplier names).
    #[test]
    fn string_key_values_are_counted_at_their_own_bytes() {
        let mut column = KeyColumn::default();
        let mut codes = Vec::new();
        for batch in 0..20 {
            // 10K rows of 40-byte strings (not inlined in the view), 100 of them new.
            let strings: ArrayRef = Arc::new(StringViewArray::from_iter_values((0..10_000).map(|i| format!("supplier-{:031}", batch * 100 + i % 100))));
            column.encode(&strings, &mut codes).unwrap();
        }
        assert_eq!(column.len(), 2000);
        // 2,000 values of 40 bytes and their views: some 112 KB, where the 20 batches' buffers
        // hold 8 MB.
        let values = column.values.as_ref().map_or(0, |v| v.get_array_memory_size());
        assert!(values < 400_000, "{values} bytes for 2,000 values");
    }
}
