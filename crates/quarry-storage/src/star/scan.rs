//! The star join's fact side over Parquet segments read page by page (see the module docs of
//! `star` and `page_reader`): each row group's steps (dimension lookups and the fact predicate's
//! simple comparisons) run one column at a time, each over the rows still alive, in the order of
//! their measured pass rates; the other columns are decoded only for the rows that pass all.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::compute::prep_null_mask_filter;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use bytes::Bytes;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, ScalarValue, Statistics, internal_err};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::utils::{collect_columns, reassign_expr_columns, split_conjunction};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr, conjunction_opt};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::expressions::{BinaryExpr, Column, InListExpr, Literal};
use datafusion::physical_plan::metrics::{BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream, StatisticsArgs};
use futures::{StreamExt, stream};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::file::metadata::ParquetMetaData;

use super::{GroupedStates, StarSpec, StarTables, evaluate_args, narrow, partial_schema};
use crate::page_reader::{ColumnChunk, NO_CODE, ValueKind, read_footer};

/// Column chunks read ahead of the one being decoded.
const READ_AHEAD: usize = 4;

/// A segment the scan reads, with its footer (read when the scan was planned).
#[derive(Debug, Clone)]
pub struct StarSegment {
    pub path: ObjectPath,
    pub size: u64,
    pub metadata: Arc<ParquetMetaData>,
}

impl StarSegment {
    /// The segment at `path`, if this scan reads every one of `columns` (by name, with their
    /// Arrow types) in all its row groups; `Err` says why not.
    pub async fn open(store: &dyn ObjectStore, path: ObjectPath, size: u64, columns: &Schema) -> Result<std::result::Result<(Self, u64), String>> {
        let (metadata, bytes) = read_footer(store, &path, size).await?;
        for field in columns.fields() {
            let Some(index) = leaf_index(&metadata, field.name()) else { return Ok(Err(format!("no column '{}'", field.name()))) };
            for group in metadata.row_groups() {
                let kind = match ColumnChunk::supports(group.column(index)) {
                    Ok(kind) => kind,
                    Err(why) => return Ok(Err(why.0)),
                };
                if !kind_holds(kind, field.data_type()) {
                    return Ok(Err(format!("column '{}' is stored as {kind:?}, not {}", field.name(), field.data_type())));
                }
            }
        }
        Ok(Ok((StarSegment { path, size, metadata: Arc::new(metadata) }, bytes)))
    }
}

fn leaf_index(metadata: &ParquetMetaData, name: &str) -> Option<usize> {
    metadata.file_metadata().schema_descr().columns().iter().position(|c| c.path().parts() == [name.to_string()])
}

/// Whether values stored as `kind` read back as `data_type`.
fn kind_holds(kind: ValueKind, data_type: &DataType) -> bool {
    match kind {
        ValueKind::Int32 => matches!(data_type, DataType::Int32 | DataType::Date32 | DataType::Decimal128(..)),
        ValueKind::Int64 => matches!(data_type, DataType::Int64 | DataType::Decimal128(..)),
        ValueKind::Bytes => matches!(data_type, DataType::Utf8 | DataType::Utf8View),
    }
}

/// [`super::StarProbeExec`] over a filter over a scan of Parquet segments, run page by page.
#[derive(Debug)]
pub struct StarScanExec {
    partitions: Vec<Vec<StarSegment>>,
    /// The scanned columns (the probe's input).
    columns: SchemaRef,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    spec: Arc<StarSpec>,
    tables: Arc<StarTables>,
    store: Arc<dyn ObjectStore>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StarScanExec {
    /// The probe `spec` (with `tables`) of the rows of `segments` (spread over `partitions`)
    /// whose `predicate` holds, over `columns`.
    pub fn try_new(
        segments: Vec<StarSegment>,
        partitions: usize,
        columns: SchemaRef,
        predicate: Option<Arc<dyn PhysicalExpr>>,
        spec: Arc<StarSpec>,
        tables: Arc<StarTables>,
        store: Arc<dyn ObjectStore>,
    ) -> Result<Self> {
        let partitions = partitions.clamp(1, segments.len().max(1));
        let mut split = vec![Vec::new(); partitions];
        for (i, segment) in segments.into_iter().enumerate() {
            split[i % partitions].push(segment);
        }
        let schema = partial_schema(&spec.aggregates.iter().map(|a| (a.func, a.domain)).collect::<Vec<_>>());
        let properties = PlanProperties::new(EquivalenceProperties::new(Arc::clone(&schema)), Partitioning::UnknownPartitioning(partitions), EmissionType::Final, Boundedness::Bounded);
        Ok(StarScanExec { partitions: split, columns, predicate, spec, tables, store, schema, properties: Arc::new(properties), metrics: ExecutionPlanMetricsSet::new() })
    }
}

impl DisplayAs for StarScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let segments: usize = self.partitions.iter().map(Vec::len).sum();
        let keys: Vec<&str> = self.spec.keys.iter().map(|&k| self.columns.field(k).name().as_str()).collect();
        write!(f, "StarScanExec: keys=[{}], segments={segments}", keys.join(", "))?;
        if let Some(predicate) = &self.predicate {
            write!(f, ", predicate={predicate}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for StarScanExec {
    fn name(&self) -> &str {
        "StarScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        let mut roots: Vec<&Arc<dyn PhysicalExpr>> = self.predicate.iter().collect();
        roots.extend(self.spec.aggregates.iter().filter_map(|a| a.arg.as_ref()));
        datafusion::physical_plan::apply_expression_roots(roots, f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if !children.is_empty() {
            return internal_err!("StarScanExec has no children");
        }
        Ok(self)
    }

    fn execute(&self, partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let Some(segments) = self.partitions.get(partition) else {
            return internal_err!("StarScanExec has {} partitions, asked for {partition}", self.partitions.len());
        };
        let mut job = Job::try_new(self, partition)?;
        let segments: VecDeque<StarSegment> = segments.iter().cloned().collect();
        let schema = Arc::clone(&self.schema);
        let output = stream::once(async move {
            for segment in segments {
                for group in 0..segment.metadata.num_row_groups() {
                    job.row_group(&segment, group).await?;
                }
            }
            let _timer = job.baseline.elapsed_compute().timer();
            let partial = job.states.partial(&schema)?;
            job.baseline.record_output(partial.num_rows());
            Ok(partial)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), output)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(&self, _input_stats: &[Arc<Statistics>], _args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        Ok(Arc::new(Statistics::new_unknown(&self.schema)))
    }
}

/// One step of a row group's probe: a lookup or a comparison, over one column.
#[derive(Debug)]
struct Step {
    column: usize,
    test: Test,
    /// Rows seen and kept so far (for the order of the next row group).
    seen: u64,
    kept: u64,
}

#[derive(Debug)]
enum Test {
    /// Dimension `d`'s lookup: the code goes into the group id.
    Dimension(usize),
    /// `column op value` on integers (decimals at the column's scale, dates in days).
    Int(Operator, i64),
    /// `column IN (values)` on integers.
    IntIn(Vec<i64>),
    /// `column = value` or `<>` on strings.
    Bytes(Operator, Vec<u8>),
}

impl Step {
    fn pass_rate(&self) -> f64 {
        if self.seen == 0 { 0.5 } else { self.kept as f64 / self.seen as f64 }
    }
}

/// Buffers a partition reuses from one row group to the next.
#[derive(Default)]
struct Scratch {
    alive: Vec<u32>,
    gids: Vec<u64>,
    kept: Vec<u32>,
    codes: Vec<u32>,
    gids_next: Vec<u64>,
}

/// What a partition needs, and its states.
struct Job {
    scratch: Scratch,
    columns: SchemaRef,
    steps: Vec<Step>,
    /// The rest of the predicate, evaluated over the survivors' values (its columns, in order).
    residual: Option<(Arc<dyn PhysicalExpr>, Vec<usize>, SchemaRef)>,
    /// The columns the aggregates read, their schema, and the aggregates' arguments over a
    /// batch of just those.
    arg_columns: Vec<usize>,
    arg_schema: SchemaRef,
    args: StarSpec,
    tables: Arc<StarTables>,
    strides: Vec<u64>,
    states: GroupedStates,
    store: Arc<dyn ObjectStore>,
    baseline: BaselineMetrics,
    bytes_scanned: Count,
    rows_probed: Count,
    rows_matched: Count,
}

impl Job {
    fn try_new(exec: &StarScanExec, partition: usize) -> Result<Self> {
        let mut steps: Vec<Step> = exec.tables.order.iter().map(|&d| Step { column: exec.spec.keys[d], test: Test::Dimension(d), seen: 0, kept: 0 }).collect();
        let mut residual = Vec::new();
        if let Some(predicate) = &exec.predicate {
            for conjunct in split_conjunction(predicate) {
                match compile(conjunct, &exec.columns) {
                    Some(step) => steps.push(step),
                    None => residual.push(Arc::clone(conjunct)),
                }
            }
        }
        let residual = match conjunction_opt(residual) {
            Some(expr) => {
                let (columns, schema) = used_columns(std::slice::from_ref(&expr), &exec.columns)?;
                Some((reassign_expr_columns(expr, &schema)?, columns, schema))
            }
            None => None,
        };
        let arg_exprs: Vec<Arc<dyn PhysicalExpr>> = exec.spec.aggregates.iter().filter_map(|a| a.arg.clone()).collect();
        let (arg_columns, arg_schema) = used_columns(&arg_exprs, &exec.columns)?;
        let aggregates = exec
            .spec
            .aggregates
            .iter()
            .map(|a| Ok(super::StarAggregate { arg: a.arg.clone().map(|e| reassign_expr_columns(e, &arg_schema)).transpose()?, ..a.clone() }))
            .collect::<Result<Vec<_>>>()?;
        let funcs = aggregates.iter().map(|a| (a.func, a.domain)).collect();
        Ok(Job {
            scratch: Scratch::default(),
            columns: Arc::clone(&exec.columns),
            steps,
            residual,
            arg_columns,
            arg_schema,
            args: StarSpec { keys: Vec::new(), aggregates },
            strides: exec.tables.strides(),
            states: GroupedStates::new(funcs, exec.tables.domain()),
            tables: Arc::clone(&exec.tables),
            store: Arc::clone(&exec.store),
            baseline: BaselineMetrics::new(&exec.metrics, partition),
            bytes_scanned: MetricBuilder::new(&exec.metrics).counter("bytes_scanned", partition),
            rows_probed: MetricBuilder::new(&exec.metrics).counter("rows_probed", partition),
            rows_matched: MetricBuilder::new(&exec.metrics).counter("rows_matched", partition),
        })
    }

    /// Probes and aggregates row group `group` of `segment`.
    async fn row_group(&mut self, segment: &StarSegment, group: usize) -> Result<()> {
        let metadata = segment.metadata.row_group(group);
        let rows = usize::try_from(metadata.num_rows()).map_err(|_| DataFusionError::Execution(format!("{}: a negative row count", segment.path)))?;
        if rows == 0 {
            return Ok(());
        }
        self.rows_probed.add(rows);
        // The order of this row group: the most selective step first.
        self.steps.sort_by(|a, b| a.pass_rate().total_cmp(&b.pass_rate()));
        let mut needed: Vec<usize> = self.steps.iter().map(|s| s.column).collect();
        needed.extend(self.residual.iter().flat_map(|(_, c, _)| c.iter().copied()));
        needed.extend(self.arg_columns.iter().copied());
        let mut order = Vec::new();
        for c in needed {
            if !order.contains(&c) {
                order.push(c);
            }
        }
        let mut chunks: Vec<Option<ColumnChunk>> = (0..self.columns.fields().len()).map(|_| None).collect();
        let mut fetches: Vec<futures::future::BoxFuture<'_, Result<(usize, Bytes)>>> = Vec::with_capacity(order.len());
        for &c in &order {
            let name = self.columns.field(c).name().clone();
            let store = Arc::clone(&self.store);
            let path = segment.path.clone();
            let range = leaf_index(&segment.metadata, &name).map(|index| metadata.column(index).byte_range());
            fetches.push(Box::pin(async move {
                let (start, length) = range.ok_or_else(|| DataFusionError::Execution(format!("{path}: no column '{name}'")))?;
                let bytes = store.get_range(&path, start..start + length).await.map_err(|e| DataFusionError::Execution(format!("reading {path}: {e}")))?;
                Ok((c, bytes))
            }));
        }
        let mut reads = stream::iter(fetches).buffered(READ_AHEAD);

        // The rows still alive (all of them until the first step ran) and their group ids.
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut narrowed = false;
        let mut step = 0usize;
        while let Some(read) = reads.next().await {
            let (c, bytes) = read?;
            self.bytes_scanned.add(bytes.len());
            let _timer = self.baseline.elapsed_compute().timer();
            let index = leaf_index(&segment.metadata, self.columns.field(c).name()).expect("found when read");
            // Pages without a row still alive are skipped, not decompressed.
            let wanted = narrowed.then_some(scratch.alive.as_slice());
            let chunk = ColumnChunk::read(metadata.column(index), rows, bytes, wanted).map_err(|e| DataFusionError::Execution(format!("{}: {e}", segment.path)))?;
            chunks[c] = Some(chunk);
            // Run every step whose column is now read, in order.
            while step < self.steps.len() && chunks[self.steps[step].column].is_some() {
                let chunk = chunks[self.steps[step].column].as_ref().expect("read");
                let alive = narrowed.then_some(scratch.alive.as_slice());
                self.run_step(step, chunk, alive, &mut scratch.kept, &mut scratch.codes);
                let s = &mut self.steps[step];
                s.seen += alive.map_or(rows, <[u32]>::len) as u64;
                s.kept += scratch.kept.len() as u64;
                let stride = match s.test {
                    Test::Dimension(d) => self.strides[d],
                    _ => 0,
                };
                scratch.gids_next.clear();
                if narrowed {
                    narrow(&scratch.alive, &scratch.gids, &scratch.kept, &scratch.codes, stride, &mut scratch.gids_next);
                } else {
                    scratch.gids_next.extend(scratch.codes.iter().map(|&code| code as u64 * stride));
                }
                std::mem::swap(&mut scratch.alive, &mut scratch.kept);
                std::mem::swap(&mut scratch.gids, &mut scratch.gids_next);
                narrowed = true;
                step += 1;
                if scratch.alive.is_empty() {
                    self.scratch = scratch;
                    return Ok(());
                }
            }
        }
        drop(reads);
        let _timer = self.baseline.elapsed_compute().timer();
        let (mut alive, mut gids) = if narrowed { (scratch.alive.clone(), scratch.gids.clone()) } else { ((0..rows as u32).collect(), vec![0; rows]) };
        self.scratch = scratch;
        if let Some((predicate, columns, schema)) = &self.residual {
            let batch = gather(&chunks, columns, schema, &alive)?;
            let mask = predicate.evaluate(&batch)?.into_array(batch.num_rows())?;
            let mask = mask.as_boolean_opt().ok_or_else(|| DataFusionError::Execution(format!("predicate {predicate} is not boolean")))?;
            let mask = prep_null_mask_filter(mask);
            let keep: Vec<usize> = mask.values().set_indices().collect();
            alive = keep.iter().map(|&i| alive[i]).collect();
            gids = keep.iter().map(|&i| gids[i]).collect();
        }
        if alive.is_empty() {
            return Ok(());
        }
        self.rows_matched.add(alive.len());
        let batch = gather(&chunks, &self.arg_columns, &self.arg_schema, &alive)?;
        let args = evaluate_args(&self.args, &batch)?;
        self.states.update(&gids, &args)
    }

    /// Runs step `step` over `chunk`: the rows (of `alive`, or all) it keeps go to `kept`, and
    /// their codes to `codes`.
    fn run_step(&self, step: usize, chunk: &ColumnChunk, alive: Option<&[u32]>, kept: &mut Vec<u32>, codes: &mut Vec<u32>) {
        kept.clear();
        codes.clear();
        let pass = |ok: bool| if ok { 0 } else { NO_CODE };
        match &self.steps[step].test {
            Test::Dimension(d) => {
                let lookup = &self.tables.dims[*d].lookup;
                if chunk.kind() == ValueKind::Bytes {
                    chunk.keep_bytes(alive, |v| lookup.code_bytes(v), kept, codes);
                } else {
                    chunk.keep_int(alive, |v| lookup.code_int(v), kept, codes);
                }
            }
            Test::Int(op, value) => {
                let value = *value;
                let test: fn(i64, i64) -> bool = match op {
                    Operator::Eq => |a, b| a == b,
                    Operator::NotEq => |a, b| a != b,
                    Operator::Lt => |a, b| a < b,
                    Operator::LtEq => |a, b| a <= b,
                    Operator::Gt => |a, b| a > b,
                    _ => |a, b| a >= b,
                };
                chunk.keep_int(alive, |v| pass(test(v, value)), kept, codes);
            }
            Test::IntIn(values) => chunk.keep_int(alive, |v| pass(values.contains(&v)), kept, codes),
            Test::Bytes(op, value) => {
                let equal = *op == Operator::Eq;
                chunk.keep_bytes(alive, |v| pass((v == value.as_slice()) == equal), kept, codes);
            }
        }
    }
}

/// A batch of `columns`' values (with `schema`) at the `rows` given.
fn gather(chunks: &[Option<ColumnChunk>], columns: &[usize], schema: &SchemaRef, rows: &[u32]) -> Result<RecordBatch> {
    let arrays = columns
        .iter()
        .zip(schema.fields())
        .map(|(&c, field)| {
            let chunk = chunks[c].as_ref().ok_or_else(|| DataFusionError::Internal(format!("column {c} was not read")))?;
            chunk.gather(rows, field.data_type()).map_err(|e| DataFusionError::Execution(e.to_string()))
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    Ok(RecordBatch::try_new_with_options(Arc::clone(schema), arrays, &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows.len())))?)
}

/// The columns `exprs` read (sorted) and the schema of just those.
fn used_columns(exprs: &[Arc<dyn PhysicalExpr>], input: &SchemaRef) -> Result<(Vec<usize>, SchemaRef)> {
    let mut columns: Vec<usize> = exprs.iter().flat_map(|e| collect_columns(e).into_iter().map(|c| c.index())).collect();
    columns.sort_unstable();
    columns.dedup();
    Ok((columns.clone(), Arc::new(input.project(&columns)?)))
}

/// A step for `column op literal` (or `IN`) on one column, if the scan runs it natively.
fn compile(expr: &Arc<dyn PhysicalExpr>, columns: &SchemaRef) -> Option<Step> {
    let step = |column: usize, test: Test| Some(Step { column, test, seen: 0, kept: 0 });
    if let Some(binary) = expr.downcast_ref::<BinaryExpr>() {
        let (column, op, literal) = match (binary.left().downcast_ref::<Column>(), binary.right().downcast_ref::<Literal>()) {
            (Some(c), Some(l)) => (c, *binary.op(), l),
            _ => match (binary.left().downcast_ref::<Literal>(), binary.right().downcast_ref::<Column>()) {
                (Some(l), Some(c)) => (c, binary.op().swap()?, l),
                _ => return None,
            },
        };
        if !matches!(op, Operator::Eq | Operator::NotEq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq) {
            return None;
        }
        let data_type = columns.field(column.index()).data_type();
        if matches!(data_type, DataType::Utf8 | DataType::Utf8View) {
            let text = match literal.value() {
                ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => s.as_bytes().to_vec(),
                _ => return None,
            };
            return if matches!(op, Operator::Eq | Operator::NotEq) { step(column.index(), Test::Bytes(op, text)) } else { None };
        }
        return step(column.index(), Test::Int(op, int_literal(literal.value(), data_type)?));
    }
    if let Some(list) = expr.downcast_ref::<InListExpr>() {
        let column = list.expr().downcast_ref::<Column>()?;
        if list.negated() {
            return None;
        }
        let data_type = columns.field(column.index()).data_type();
        let values = list.list().iter().map(|e| e.downcast_ref::<Literal>().and_then(|l| int_literal(l.value(), data_type))).collect::<Option<Vec<i64>>>()?;
        return step(column.index(), Test::IntIn(values));
    }
    None
}

/// A literal as the integer a column of `data_type` stores, if it is one exactly.
fn int_literal(value: &ScalarValue, data_type: &DataType) -> Option<i64> {
    match (value, data_type) {
        (ScalarValue::Int8(Some(v)), DataType::Int32 | DataType::Int64) => Some(*v as i64),
        (ScalarValue::Int16(Some(v)), DataType::Int32 | DataType::Int64) => Some(*v as i64),
        (ScalarValue::Int32(Some(v)), DataType::Int32 | DataType::Int64) => Some(*v as i64),
        (ScalarValue::Int64(Some(v)), DataType::Int32 | DataType::Int64) => Some(*v),
        (ScalarValue::Date32(Some(v)), DataType::Date32) => Some(*v as i64),
        (ScalarValue::Decimal128(Some(v), _, s), DataType::Decimal128(_, scale)) if s == scale => i64::try_from(*v).ok(),
        _ => None,
    }
}
