//! Running aggregates and ranks of a window as one pass over each batch.
//!
//! `sum(x) OVER (PARTITION BY k ORDER BY d ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)`
//! (a running total, and its `min`, `max` and `count`) is, over input sorted by `k` and `d`, a
//! scan that restarts at each new `k`; with SQL's default frame for an ordered window (`RANGE`,
//! the same but up to the row's last peer, equal in `d`) each row of a peer group takes the
//! group's last value, the rows of a group that may go on in the next batch waiting for it; `row_number()`, `rank()` and `dense_rank()` count rows
//! and groups of rows equal in `d` (peers) the same way. DataFusion's `BoundedWindowAggExec`
//! evaluates them partition by partition and row by row: for an aggregate a one-row slice of
//! the argument into the accumulator, a `ScalarValue` out, gathered into an array again, about
//! 250 ns a row and window (TPC-DS q51: 0.5 s of its 0.8 s of CPU on 1.2M rows); for a rank,
//! bookkeeping per partition and batch (q47: 30 ms for each of three ranks of 65K rows in 5K
//! partitions). [`RunningAggregateExec`] computes the same values with one loop over each
//! batch. [`RunningWindowRule`] puts it in place of a window operator whose input is sorted on
//! its partition keys and whose every expression is one of these; any other window (other
//! functions, other frames, `DISTINCT`) stays DataFusion's.
//!
//! The values are DataFusion's: a sum in the type DataFusion sums in (the argument cast to the
//! result type, adding with wraparound as its accumulator does, in row order), `NULL` until a
//! partition's first non-null argument; `count` counts non-null arguments; ranks are `UInt64`.
//! A `RANGE` frame needs order keys here (without them it is the whole partition).

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::{Array, ArrayRef, ArrowPrimitiveType, AsArray, Int64Array, PrimitiveArray, PrimitiveBuilder, RecordBatch, UInt32Array, UInt64Array};
use arrow::compute::{cast, concat_batches, take};
use arrow::datatypes::{ArrowNativeTypeOp, DataType, Decimal128Type, Float64Type, Int64Type, SchemaRef, UInt64Type};
use arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, internal_err};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::logical_expr::{WindowFrameBound, WindowFrameUnits};
use datafusion::physical_expr::window::StandardWindowFunctionExpr;
use datafusion::physical_expr::{OrderingRequirements, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, PlainAggregateWindowExpr, StandardWindowExpr, WindowExpr, WindowUDFExpr};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, InputOrderMode, PlanProperties, RecordBatchStream, SendableRecordBatchStream,
};
use futures::{Stream, StreamExt};

/// Physical rule: each qualifying `BoundedWindowAggExec` as a [`RunningAggregateExec`].
#[derive(Debug)]
pub struct RunningWindowRule;

impl PhysicalOptimizerRule for RunningWindowRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(plan
            .transform_up(|node| {
                let Some(window) = node.downcast_ref::<BoundedWindowAggExec>() else { return Ok(Transformed::no(node)) };
                match window_functions(window) {
                    Some(functions) => Ok(Transformed::yes(Arc::new(RunningAggregateExec::new(Arc::clone(&node), functions)) as Arc<dyn ExecutionPlan>)),
                    None => Ok(Transformed::no(node)),
                }
            })?
            .data)
    }

    fn name(&self) -> &str {
        "quarry_running_window"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The aggregate a running window expression computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Running {
    Sum,
    Min,
    Max,
    Count,
}

/// One window expression.
#[derive(Debug, Clone)]
enum WindowFunction {
    /// A running aggregate of `argument`, of type `result`; with `peers` (a `RANGE` frame) a
    /// row's value takes in its peers after it too.
    Aggregate { running: Running, argument: Arc<dyn PhysicalExpr>, result: DataType, peers: bool },
    /// The row's position in its partition, from 1.
    RowNumber,
    /// The position of the row's first peer (equal in the order keys).
    Rank,
    /// The number of peer groups up to the row's.
    DenseRank,
}

/// `window`'s expressions as [`WindowFunction`]s, if its input arrives sorted on the partition
/// keys and every expression is `row_number`, `rank` or `dense_rank`, or `sum`, `min`, `max` or
/// `count` (not distinct, one argument) of a number over `ROWS BETWEEN UNBOUNDED PRECEDING AND
/// CURRENT ROW` (or `RANGE`, with order keys), all with the same partition and order keys.
fn window_functions(window: &BoundedWindowAggExec) -> Option<Vec<WindowFunction>> {
    if window.input_order_mode != InputOrderMode::Sorted {
        return None;
    }
    let first = window.window_expr().first()?;
    let input_schema = window.input().schema();
    window
        .window_expr()
        .iter()
        .map(|expr| {
            if expr.partition_by() != first.partition_by() || expr.order_by() != first.order_by() {
                return None;
            }
            if let Some(standard) = expr.as_any().downcast_ref::<StandardWindowExpr>() {
                let function = standard.get_standard_func_expr().as_any().downcast_ref::<WindowUDFExpr>()?;
                if !function.expressions().is_empty() || function.field().ok()?.data_type() != &DataType::UInt64 {
                    return None;
                }
                return match function.fun().name() {
                    "row_number" => Some(WindowFunction::RowNumber),
                    "rank" => Some(WindowFunction::Rank),
                    "dense_rank" => Some(WindowFunction::DenseRank),
                    _ => None,
                };
            }
            let plain = expr.as_any().downcast_ref::<PlainAggregateWindowExpr>()?;
            let frame = plain.get_window_frame();
            let from_start = matches!(&frame.start_bound, WindowFrameBound::Preceding(bound) if bound.is_null());
            // A RANGE frame without order keys spans the whole partition: not a running one.
            let peers = match frame.units {
                WindowFrameUnits::Rows => false,
                WindowFrameUnits::Range if !expr.order_by().is_empty() => true,
                _ => return None,
            };
            if !from_start || frame.end_bound != WindowFrameBound::CurrentRow {
                return None;
            }
            let aggregate = plain.get_aggregate_expr();
            let running = match aggregate.fun().name() {
                "sum" => Running::Sum,
                "min" => Running::Min,
                "max" => Running::Max,
                "count" => Running::Count,
                _ => return None,
            };
            let [argument] = &aggregate.expressions()[..] else { return None };
            let result = aggregate.field().data_type().clone();
            let argument_type = argument.data_type(&input_schema).ok()?;
            let supported = match running {
                Running::Count => result == DataType::Int64,
                Running::Min | Running::Max => argument_type == result && compute_type(&result).is_some(),
                Running::Sum => compute_type(&result).is_some() && compute_type(&argument_type).is_some(),
            };
            (supported && !aggregate.is_distinct() && !aggregate.ignore_nulls()).then(|| WindowFunction::Aggregate { running, argument: Arc::clone(argument), result, peers })
        })
        .collect()
}

/// A `BoundedWindowAggExec` of [`WindowFunction`]s (see the module docs), evaluated in one pass
/// over each batch. It keeps the window operator it stands for, whose schema, properties and
/// input requirements are its own.
#[derive(Debug)]
pub struct RunningAggregateExec {
    window: Arc<dyn ExecutionPlan>,
    functions: Vec<WindowFunction>,
    metrics: ExecutionPlanMetricsSet,
}

impl RunningAggregateExec {
    fn new(window: Arc<dyn ExecutionPlan>, functions: Vec<WindowFunction>) -> Self {
        RunningAggregateExec { window, functions, metrics: ExecutionPlanMetricsSet::new() }
    }

    fn bounded(&self) -> &BoundedWindowAggExec {
        self.window.downcast_ref::<BoundedWindowAggExec>().expect("a running aggregate stands for a bounded window")
    }
}

impl DisplayAs for RunningAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<String> = self.bounded().window_expr().iter().map(|e| e.name().to_string()).collect();
        write!(f, "RunningAggregateExec: [{}]", names.join(", "))
    }
}

impl ExecutionPlan for RunningAggregateExec {
    fn name(&self) -> &str {
        "RunningAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.window.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.bounded().input()]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        self.window.apply_expressions(f)
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.window.input_distribution_requirements()
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        self.window.required_input_ordering()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let window = replace_children_if_necessary(Arc::clone(&self.window), children)?;
        Ok(Arc::new(RunningAggregateExec::new(window, self.functions.clone())))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let window = self.bounded();
        let first = window.window_expr().first();
        let input_schema = window.input().schema();
        let partition_by = first.map(|e| e.partition_by().to_vec()).unwrap_or_default();
        let order_by = first.map(|e| e.order_by().to_vec()).unwrap_or_default();
        let partition_fields = partition_by.iter().map(|e| Ok(SortField::new(e.data_type(&input_schema)?))).collect::<Result<Vec<_>>>()?;
        let order_fields = order_by.iter().map(|e| Ok(SortField::new_with_options(e.expr.data_type(&input_schema)?, e.options))).collect::<Result<Vec<_>>>()?;
        Ok(Box::pin(RunningAggregateStream {
            input: window.input().execute(partition, Arc::clone(&context))?,
            schema: self.window.schema(),
            partitions: KeyChanges::new(partition_by, partition_fields)?,
            peers: KeyChanges::new(order_by.into_iter().map(|e| e.expr).collect(), order_fields)?,
            ranks: Ranks::default(),
            states: self.functions.iter().map(|_| RunningState::default()).collect(),
            peer_columns: (self.functions.iter().enumerate())
                .filter(|(_, f)| matches!(f, WindowFunction::Aggregate { peers: true, .. }))
                .map(|(i, _)| input_schema.fields().len() + i)
                .collect(),
            waiting: Vec::new(),
            reservation: MemoryConsumer::new(format!("RunningAggregateExec[{partition}]")).register(context.memory_pool()),
            functions: self.functions.clone(),
            metrics: BaselineMetrics::new(&self.metrics, partition),
        }))
    }
}

/// An aggregate's value so far in the current partition (`None` before its first non-null
/// argument; a count is never `None` once the partition starts).
#[derive(Debug, Default, Clone)]
enum RunningState {
    #[default]
    Empty,
    Int(i64),
    Wide(i128),
    UInt(u64),
    Float(f64),
}

/// Where the values of some expressions change from one row to the next, across batches.
struct KeyChanges {
    exprs: Vec<Arc<dyn PhysicalExpr>>,
    converter: RowConverter,
    /// A row has been seen.
    started: bool,
    /// The values of the previous batch's last row.
    last: Option<OwnedRow>,
}

impl KeyChanges {
    fn new(exprs: Vec<Arc<dyn PhysicalExpr>>, fields: Vec<SortField>) -> Result<Self> {
        Ok(KeyChanges { exprs, converter: RowConverter::new(fields)?, started: false, last: None })
    }

    /// For each row of `batch`: its values differ from the previous row's (the stream's first
    /// row always does; with no expressions no other row does).
    fn of(&mut self, batch: &RecordBatch) -> Result<Vec<bool>> {
        let rows = batch.num_rows();
        let mut changes = vec![false; rows];
        if rows == 0 {
            return Ok(changes);
        }
        if self.exprs.is_empty() {
            changes[0] = !self.started;
        } else {
            let values = self.exprs.iter().map(|e| e.evaluate(batch)?.into_array(rows)).collect::<Result<Vec<_>>>()?;
            let keys = self.converter.convert_columns(&values)?;
            changes[0] = self.last.as_ref().is_none_or(|last| last.row() != keys.row(0));
            for (i, change) in changes.iter_mut().enumerate().skip(1) {
                *change = keys.row(i) != keys.row(i - 1);
            }
            self.last = Some(keys.row(rows - 1).owned());
        }
        self.started = true;
        Ok(changes)
    }
}

/// Row number, rank and dense rank of the last row so far.
#[derive(Debug, Default, Clone, Copy)]
struct Ranks {
    row: u64,
    rank: u64,
    dense: u64,
}

struct RunningAggregateStream {
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    partitions: KeyChanges,
    /// Changes of the order keys: peers are rows of a partition with equal order keys.
    peers: KeyChanges,
    ranks: Ranks,
    functions: Vec<WindowFunction>,
    states: Vec<RunningState>,
    /// Output columns of the aggregates that take in peers.
    peer_columns: Vec<usize>,
    /// Output rows of the last peer group so far, which may go on in the next batch.
    waiting: Vec<RecordBatch>,
    /// The query's memory held by `waiting`.
    reservation: MemoryReservation,
    metrics: BaselineMetrics,
}

impl RunningAggregateStream {
    /// The output rows of `batch` that are final: all of them, unless an aggregate takes in
    /// peers, whose rows wait until their peer group ends (`None` while the whole batch is
    /// one open group).
    fn evaluate(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        let rows = batch.num_rows();
        let starts = self.partitions.of(batch)?;
        let ordered = self.functions.iter().any(|f| !matches!(f, WindowFunction::Aggregate { peers: false, .. }));
        let peer_starts = if ordered { self.peer_starts(batch, &starts)? } else { Vec::new() };
        let ranks = self.ranks(&starts, &peer_starts);
        let mut columns = batch.columns().to_vec();
        for (function, state) in self.functions.iter().zip(self.states.iter_mut()) {
            let column: ArrayRef = match function {
                WindowFunction::Aggregate { running, argument, result, .. } => {
                    let argument = argument.evaluate(batch)?.into_array(rows)?;
                    running_column(*running, result, &argument, &starts, state)?
                }
                WindowFunction::RowNumber => Arc::new(ranks.iter().map(|r| r.row).collect::<UInt64Array>()),
                WindowFunction::Rank => Arc::new(ranks.iter().map(|r| r.rank).collect::<UInt64Array>()),
                WindowFunction::DenseRank => Arc::new(ranks.iter().map(|r| r.dense).collect::<UInt64Array>()),
            };
            columns.push(column);
        }
        let output = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        if self.peer_columns.is_empty() {
            return Ok(Some(output));
        }
        // The last peer group may go on in the next batch: it waits, with the rows of the
        // group that has waited so far if this batch only continues it.
        let Some(last_start) = peer_starts.iter().rposition(|&start| start) else {
            self.reservation.try_grow(output.get_array_memory_size())?;
            self.waiting.push(output);
            return Ok(None);
        };
        let open = output.slice(last_start, rows - last_start);
        self.reservation.try_resize(open.get_array_memory_size())?;
        let waiting = std::mem::replace(&mut self.waiting, vec![open]);
        let mut group_starts = one_group(&waiting);
        group_starts.extend(&peer_starts[..last_start]);
        let done: Vec<RecordBatch> = waiting.into_iter().chain(std::iter::once(output.slice(0, last_start))).collect();
        self.with_peers(&done, &group_starts).map(Some)
    }

    /// The rows that wait at the end of the input: their group ends there.
    fn finish(&mut self) -> Result<Option<RecordBatch>> {
        if self.waiting.is_empty() {
            return Ok(None);
        }
        let waiting = std::mem::take(&mut self.waiting);
        self.reservation.free();
        let group_starts = one_group(&waiting);
        self.with_peers(&waiting, &group_starts).map(Some)
    }

    /// `batches` (whole peer groups, starting where `group_starts` says) as one batch, each
    /// peer-taking aggregate's value that of its group's last row.
    fn with_peers(&self, batches: &[RecordBatch], group_starts: &[bool]) -> Result<RecordBatch> {
        let batch = concat_batches(&self.schema, batches)?;
        let rows = batch.num_rows();
        let mut last = vec![0u32; rows];
        let mut end = rows;
        for i in (0..rows).rev() {
            last[i] = (end - 1) as u32;
            if group_starts[i] {
                end = i;
            }
        }
        let last = UInt32Array::from(last);
        let mut columns = batch.columns().to_vec();
        for &c in &self.peer_columns {
            columns[c] = take(&columns[c], &last, None)?;
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// For each row of `batch`: a peer group starts there (a partition starts, or the order
    /// keys change).
    fn peer_starts(&mut self, batch: &RecordBatch, starts: &[bool]) -> Result<Vec<bool>> {
        let order_changes = self.peers.of(batch)?;
        Ok(starts.iter().zip(order_changes).map(|(&start, change)| start || change).collect())
    }

    /// Each row's [`Ranks`], partitions starting at `starts`, peer groups at `peer_starts`
    /// (none if no function ranks).
    fn ranks(&mut self, starts: &[bool], peer_starts: &[bool]) -> Vec<Ranks> {
        if !self.functions.iter().any(|f| !matches!(f, WindowFunction::Aggregate { .. })) {
            return Vec::new();
        }
        let mut ranks = self.ranks;
        let out = starts
            .iter()
            .zip(peer_starts)
            .map(|(&start, &peer_start)| {
                if start {
                    ranks = Ranks::default();
                }
                ranks.row += 1;
                if peer_start {
                    ranks.rank = ranks.row;
                    ranks.dense += 1;
                }
                ranks
            })
            .collect();
        self.ranks = ranks;
        out
    }
}

/// Group starts of `batches` holding one peer group.
fn one_group(batches: &[RecordBatch]) -> Vec<bool> {
    let mut starts = vec![false; batches.iter().map(RecordBatch::num_rows).sum()];
    if let Some(first) = starts.first_mut() {
        *first = true;
    }
    starts
}

impl Stream for RunningAggregateStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let next = std::task::ready!(self.input.poll_next_unpin(cx));
            let elapsed = self.metrics.elapsed_compute().clone();
            let timer = elapsed.timer();
            let output = match next {
                Some(Ok(batch)) => self.evaluate(&batch),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => match self.finish() {
                    Ok(None) => return Poll::Ready(None),
                    other => other,
                },
            };
            timer.done();
            match output {
                Ok(Some(output)) => {
                    self.metrics.record_output(output.num_rows());
                    return Poll::Ready(Some(Ok(output)));
                }
                Ok(None) => continue,
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
        }
    }
}

impl RecordBatchStream for RunningAggregateStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// The aggregate's values for the rows of `argument`, partitions starting at `starts`, carrying
/// `state` over from the previous batch and on to the next. Integers are computed as 64-bit,
/// floats as `f64` (a minimum or maximum cast back to its own type exactly).
fn running_column(running: Running, result: &DataType, argument: &ArrayRef, starts: &[bool], state: &mut RunningState) -> Result<ArrayRef> {
    if running == Running::Count {
        let mut count = match state {
            RunningState::Int(count) => *count,
            _ => 0,
        };
        let counts: Int64Array = starts
            .iter()
            .enumerate()
            .map(|(i, &start)| {
                if start {
                    count = 0;
                }
                count += i64::from(argument.is_valid(i));
                count
            })
            .collect();
        *state = RunningState::Int(count);
        return Ok(Arc::new(counts));
    }
    let computed: ArrayRef = match compute_type(result) {
        Some(DataType::Int64) => Arc::new(running_values::<Int64Type>(cast(argument, &DataType::Int64)?.as_primitive(), starts, running, state)),
        Some(DataType::UInt64) => Arc::new(running_values::<UInt64Type>(cast(argument, &DataType::UInt64)?.as_primitive(), starts, running, state)),
        Some(DataType::Float64) => Arc::new(running_values::<Float64Type>(cast(argument, &DataType::Float64)?.as_primitive(), starts, running, state)),
        Some(DataType::Decimal128(..)) => Arc::new(running_values::<Decimal128Type>(cast(argument, result)?.as_primitive(), starts, running, state)),
        _ => return internal_err!("a running aggregate of {result}"),
    };
    Ok(cast(&computed, result)?)
}

/// The type a running aggregate of `result` computes in.
fn compute_type(result: &DataType) -> Option<DataType> {
    Some(match result {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => DataType::Int64,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => DataType::UInt64,
        DataType::Float32 | DataType::Float64 => DataType::Float64,
        DataType::Decimal128(..) => result.clone(),
        _ => return None,
    })
}

/// A native value carried between batches in a [`RunningState`].
trait Carried: Copy {
    fn load(state: &RunningState) -> Option<Self>;
    fn store(value: Option<Self>) -> RunningState;
}

macro_rules! carried {
    ($($native:ty => $variant:ident),+) => {$(
        impl Carried for $native {
            fn load(state: &RunningState) -> Option<Self> {
                match state {
                    RunningState::$variant(v) => Some(*v),
                    _ => None,
                }
            }
            fn store(value: Option<Self>) -> RunningState {
                value.map_or(RunningState::Empty, RunningState::$variant)
            }
        }
    )+};
}
carried!(i64 => Int, u64 => UInt, f64 => Float, i128 => Wide);

fn running_values<T: ArrowPrimitiveType>(argument: &PrimitiveArray<T>, starts: &[bool], running: Running, state: &mut RunningState) -> PrimitiveArray<T>
where
    T::Native: Carried,
{
    let combine: fn(T::Native, T::Native) -> T::Native = match running {
        Running::Sum => |a, b| a.add_wrapping(b),
        Running::Min => |a, b| if b.is_lt(a) { b } else { a },
        Running::Max => |a, b| if b.is_gt(a) { b } else { a },
        Running::Count => unreachable!("counts are computed apart"),
    };
    let mut value = T::Native::load(state);
    let mut out = PrimitiveBuilder::<T>::with_capacity(argument.len()).with_data_type(argument.data_type().clone());
    for (i, &start) in starts.iter().enumerate() {
        if start {
            value = None;
        }
        if argument.is_valid(i) {
            let v = argument.value(i);
            value = Some(value.map_or(v, |so_far| combine(so_far, v)));
        }
        out.append_option(value);
    }
    *state = T::Native::store(value);
    out.finish()
}

#[cfg(test)]
mod tests {
    use arrow::array::{Decimal128Array, Float64Array, Int32Array};
    use arrow::datatypes::{Field, Schema};
    use arrow::util::pretty::pretty_format_batches;
    use datafusion::datasource::MemTable;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    /// Partitions (NULL among the keys) that span batches of 7 rows, and arguments with NULLs,
    /// some partitions NULL throughout.
    fn context() -> SessionContext {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, true),
            Field::new("d", DataType::Int32, false),
            Field::new("x", DataType::Int32, true),
            Field::new("y", DataType::Decimal128(7, 2), true),
            Field::new("z", DataType::Float64, true),
        ]));
        let rows = 200;
        let key = |i: i32| if i % 11 == 0 { None } else { Some(i % 9) };
        let batches: Vec<RecordBatch> = (0..rows)
            .step_by(7)
            .map(|from| {
                let range = from..(from + 7).min(rows);
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::new(range.clone().map(key).collect::<Int32Array>()),
                        Arc::new(range.clone().collect::<Int32Array>()),
                        Arc::new(range.clone().map(|i| (i % 5 != 0 && i % 9 != 4).then_some((i * 37) % 101 - 50)).collect::<Int32Array>()),
                        Arc::new(range.clone().map(|i| (i % 3 != 0).then_some(i128::from(i) * 1234 % 99_999)).collect::<Decimal128Array>().with_precision_and_scale(7, 2).unwrap()),
                        Arc::new(range.map(|i| (i % 4 != 1).then_some(f64::from(i) * 0.1)).collect::<Float64Array>()),
                    ],
                )
                .unwrap()
            })
            .collect();
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2).with_batch_size(5));
        ctx.register_table("t", Arc::new(MemTable::try_new(schema, vec![batches]).unwrap())).unwrap();
        ctx
    }

    /// Runs `sql` with and without the rule, asserts the results equal, and returns how many
    /// `RunningAggregateExec`s the rule placed.
    async fn running_equals_datafusion(ctx: &SessionContext, sql: &str) -> usize {
        let (expected, _) = run(ctx, sql, false).await;
        let (actual, running) = run(ctx, sql, true).await;
        assert_eq!(actual, expected, "{sql}");
        running
    }

    async fn run(ctx: &SessionContext, sql: &str, rule: bool) -> (String, usize) {
        let mut plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        if rule {
            plan = RunningWindowRule.optimize(plan, &ConfigOptions::default()).unwrap();
        }
        let mut running = 0;
        plan.apply(|node| {
            running += usize::from(node.is::<RunningAggregateExec>());
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx()).await.unwrap();
        (pretty_format_batches(&batches).unwrap().to_string(), running)
    }

    /// Running sums, minimums, maximums and counts of integers, decimals and floats equal
    /// DataFusion's own window operator's, row for row.
    #[tokio::test]
    async fn running_aggregates_equal_datafusions_window() {
        let ctx = context();
        let sql = "select k, d, sum(x) over w as sx, min(x) over w as mnx, max(x) over w as mxx, sum(y) over w as sy, \
                   max(y) over w as my, count(x) over w as cx, count(*) over w as c, sum(z) over w as sz, min(z) over w as mz \
                   from t window w as (partition by k order by d rows between unbounded preceding and current row) order by d";
        assert_eq!(running_equals_datafusion(&ctx, sql).await, 1);
        // A window over the whole input (no partition keys) too.
        let sql = "select d, sum(x) over (order by d rows between unbounded preceding and current row) as s from t order by d";
        assert_eq!(running_equals_datafusion(&ctx, sql).await, 1);
    }

    /// Row numbers, ranks and dense ranks, with ties and NULLs in the order keys and peer
    /// groups across batches, alone and beside a running sum, equal DataFusion's.
    #[tokio::test]
    async fn ranks_equal_datafusions_window() {
        let ctx = context();
        for sql in [
            "select k, d, row_number() over (partition by k order by x / 20 desc nulls last, d) as n, rank() over w as r, \
             dense_rank() over w as dr from t window w as (partition by k order by x / 20 desc nulls last) order by d",
            "select k, d, rank() over (partition by k order by z / 3 nulls first, d) as r, \
             sum(y) over (partition by k order by z / 3 nulls first, d rows between unbounded preceding and current row) as s from t order by d",
            "select d, dense_rank() over (order by x / 25) as dr from t order by d",
        ] {
            assert!(running_equals_datafusion(&ctx, sql).await >= 1, "{sql}");
        }
    }

    /// The default frame with order keys (`RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW`):
    /// a row's value takes in its peers, in groups that span batches (one order key value for
    /// a whole partition, or for the whole input), beside ranks, equal DataFusion's.
    #[tokio::test]
    async fn aggregates_over_peers_equal_datafusions_window() {
        let ctx = context();
        for sql in [
            "select k, d, sum(x) over w as s, max(y) over w as m, count(z) over w as c, rank() over w as r from t \
             window w as (partition by k order by x / 30 nulls first) order by d",
            "select k, d, sum(y) over (partition by k order by k) as s, min(x) over (partition by k order by d / 50) as m from t order by d",
            "select d, sum(x) over (order by d / 64) as s, count(*) over (order by d / 64) as c from t order by d",
        ] {
            assert!(running_equals_datafusion(&ctx, sql).await >= 1, "{sql}");
        }
    }

    /// The rows of an open peer group wait within the query's memory budget: one group of
    /// the whole input, over a budget smaller than it, fails the query naming the operator.
    #[tokio::test]
    async fn waiting_peers_are_reserved_from_the_pool() {
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        use datafusion::logical_expr::{SortExpr, col};
        let schema = Arc::new(Schema::new(vec![Field::new("c", DataType::Int32, false), Field::new("x", DataType::Int32, false)]));
        let batches: Vec<RecordBatch> = (0..40)
            .map(|b| RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int32Array::from(vec![7; 1000])), Arc::new(Int32Array::from_iter_values(b * 1000..(b + 1) * 1000))]).unwrap())
            .collect();
        let table = MemTable::try_new(Arc::clone(&schema), vec![batches]).unwrap().with_sort_order(vec![vec![SortExpr::new(col("c"), true, false)]]);
        let runtime = RuntimeEnvBuilder::new().with_memory_limit(64 * 1024, 1.0).build_arc().unwrap();
        let ctx = SessionContext::new_with_config_rt(SessionConfig::new().with_target_partitions(1), runtime);
        ctx.register_table("t", Arc::new(table)).unwrap();
        let plan = ctx.sql("select x, sum(x) over (order by c) as s from t").await.unwrap().create_physical_plan().await.unwrap();
        let plan = RunningWindowRule.optimize(plan, &ConfigOptions::default()).unwrap();
        let error = datafusion::physical_plan::collect(plan, ctx.task_ctx()).await.unwrap_err().to_string();
        assert!(error.contains("RunningAggregateExec"), "{error}");
    }

    /// Other functions and frames stay DataFusion's.
    #[tokio::test]
    async fn other_windows_stay() {
        let ctx = context();
        for window in [
            "avg(x) over (partition by k order by d rows between unbounded preceding and current row)",
            "sum(x) over (partition by k order by d rows between 2 preceding and current row)",
            "sum(x) over (partition by k)",
            "sum(distinct x) over (partition by k order by d rows between unbounded preceding and current row)",
            "percent_rank() over (partition by k order by d)",
            "lag(x) over (partition by k order by d)",
        ] {
            let (_, running) = run(&ctx, &format!("select {window} as v from t"), true).await;
            assert_eq!(running, 0, "{window}");
        }
    }
}
