//! A filter over a scan of Parquet segments, run page by page on the stored values (see
//! `page_reader`): each row group's simple comparisons run one column at a time, each over the
//! rows still alive, in the order of their measured pass rates (on a dictionary-encoded column,
//! once per dictionary entry); the rest of the predicate runs over the survivors' values; the
//! other columns are decoded only for the rows that pass, and their pages holding none are not
//! decompressed. This is the late materialization arrow-rs's row filter does, without decoding
//! a predicate column into Arrow first.
//!
//! The pieces the star join's fact side shares (segments, comparisons, column reads, gathering)
//! live here too.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions};
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
use futures::stream::BoxStream;
use futures::{StreamExt, stream};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::file::metadata::ParquetMetaData;

use datafusion::datasource::physical_plan::parquet::CachedParquetMetaData;
use datafusion::execution::cache::cache_manager::{CachedFileMetadataEntry, FileMetadataCache};

use crate::key_set::{self, Bitmap, KeySet, KeySetExpr};
use crate::page_reader::{ColumnChunk, NO_CODE, ValueKind, read_footer};
use crate::verified_store::VerifiedStore;

/// Column chunks read ahead of the one being decoded.
const READ_AHEAD: usize = 4;

/// A segment read page by page, with its footer (read when the scan was planned).
#[derive(Debug, Clone)]
pub struct PagedSegment {
    pub path: ObjectPath,
    pub size: u64,
    pub metadata: Arc<ParquetMetaData>,
    /// The row groups to read, in order (all, unless zone maps skip some).
    pub row_groups: Vec<usize>,
}

impl PagedSegment {
    /// The segment at `path` and the bytes its footer took, if every one of `columns` (by
    /// name, with their Arrow types) can be read page by page in all its row groups; `Err`
    /// says why not.
    ///
    /// The footer comes from `footers` if a scan of this process read it before (DataFusion's
    /// metadata cache, which its own Parquet scans share), else it is read and kept there.
    pub async fn open(store: &dyn ObjectStore, path: ObjectPath, size: u64, columns: &Schema, footers: &FileMetadataCache) -> Result<std::result::Result<(Self, u64), String>> {
        let (metadata, bytes) = cached_footer(store, &path, size, footers).await?;
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
        let row_groups = (0..metadata.num_row_groups()).collect();
        Ok(Ok((PagedSegment { path, size, metadata, row_groups }, bytes)))
    }

    /// The same segment, reading only the row groups `kept` marks (one flag per row group of
    /// the file; a mask of another length keeps them all).
    pub fn keeping(mut self, kept: &[bool]) -> Self {
        if kept.len() == self.metadata.num_row_groups() {
            self.row_groups.retain(|&g| kept[g]);
        }
        self
    }

    /// Reads the chunks of `columns` (indices into `schema`, by name in the file) of row group
    /// `group`, in that order, a few ahead of the one the caller decodes.
    pub fn read_chunks<'a>(&'a self, store: &'a Arc<VerifiedStore>, group: usize, schema: &'a Schema, columns: &'a [usize]) -> BoxStream<'a, Result<(usize, Bytes)>> {
        let metadata = self.metadata.row_group(group);
        let reads = columns.iter().map(move |&c| {
            let name = schema.field(c).name();
            let range = leaf_index(&self.metadata, name).map(|index| metadata.column(index).byte_range());
            async move {
                let (start, length) = range.ok_or_else(|| DataFusionError::Execution(format!("{}: no column '{name}'", self.path)))?;
                let bytes = store.get_range(&self.path, start..start + length).await.map_err(|e| DataFusionError::ObjectStore(Box::new(e)))?;
                Ok((c, bytes))
            }
        });
        stream::iter(reads).buffered(READ_AHEAD).boxed()
    }

    /// Tells `store` that the chunks of `schema`'s columns in row group `group` are read next,
    /// so that the device reads them while the scan decodes the row group before.
    pub fn read_ahead(&self, store: &VerifiedStore, group: usize, schema: &Schema) {
        let metadata = self.metadata.row_group(group);
        let ranges: Vec<_> = schema
            .fields()
            .iter()
            .filter_map(|field| leaf_index(&self.metadata, field.name()))
            .map(|index| {
                let (start, length) = metadata.column(index).byte_range();
                start..start + length
            })
            .collect();
        store.read_ahead(&self.path, &ranges);
    }

    /// The chunk of column `name` of row group `group` from its bytes; with `wanted`, pages
    /// holding none of those rows are skipped.
    pub fn chunk(&self, group: usize, name: &str, bytes: Bytes, wanted: Option<&[u32]>) -> Result<ColumnChunk> {
        let metadata = self.metadata.row_group(group);
        let index = leaf_index(&self.metadata, name).ok_or_else(|| DataFusionError::Execution(format!("{}: no column '{name}'", self.path)))?;
        ColumnChunk::read(metadata.column(index), group_rows(self, group)?, bytes, wanted).map_err(|e| DataFusionError::Execution(format!("{}: {e}", self.path)))
    }
}

/// The footer of the segment file at `path` (`size` bytes) and the bytes read for it: none if
/// `footers` holds it for this file (its size and modification time), else read and put there.
async fn cached_footer(store: &dyn ObjectStore, path: &ObjectPath, size: u64, footers: &FileMetadataCache) -> Result<(Arc<ParquetMetaData>, u64)> {
    let file = store.head(path).await.map_err(|e| DataFusionError::ObjectStore(Box::new(e)))?;
    if let Some(entry) = footers.get(path)
        && entry.is_valid_for(&file)
        && let Some(cached) = entry.file_metadata.as_any().downcast_ref::<CachedParquetMetaData>()
    {
        return Ok((Arc::clone(cached.parquet_metadata()), 0));
    }
    let (metadata, bytes) = read_footer(store, path, size).await?;
    let metadata = Arc::new(metadata);
    footers.put(path, CachedFileMetadataEntry::new(file, Arc::new(CachedParquetMetaData::new(Arc::clone(&metadata)))));
    Ok((metadata, bytes))
}

/// The rows of row group `group` of `segment`.
pub fn group_rows(segment: &PagedSegment, group: usize) -> Result<usize> {
    usize::try_from(segment.metadata.row_group(group).num_rows()).map_err(|_| DataFusionError::Execution(format!("{}: a negative row count", segment.path)))
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

/// `column op value` (or `IN`) that the page reader evaluates on stored values.
#[derive(Debug, Clone, PartialEq)]
pub enum Comparison {
    /// `column op value` on integers (decimals at the column's scale, dates in days).
    Int(Operator, i64),
    /// `lo <= column AND column <= hi` on integers: the comparisons of one column bounding it
    /// from both sides (a `BETWEEN`), tested in one pass.
    IntRange(i64, i64),
    /// `column IN (values)` on integers.
    IntIn(IntSet),
    /// `column = value` or `<>` on strings.
    Bytes(Operator, Vec<u8>),
    /// `column IN (values)` on strings.
    BytesIn(Vec<Vec<u8>>),
}

/// The values of an integer `IN` list, looked up by how many there are: a few in turn, more in
/// a bitmap over their range where it is small enough (a join's key set: 4K supplier keys of
/// 100K take 12.5 KB, 2K part keys of 2M 250 KB), else by binary search (which took 29% of a
/// scan that a bitmap makes negligible).
#[derive(Debug, Clone, PartialEq)]
pub struct IntSet {
    /// Sorted, without repeats.
    values: Vec<i64>,
    /// The values as bits over their range; `None` when the range is too sparse.
    bitmap: Option<Bitmap>,
}

/// Values compared one by one at most.
const LINEAR_SET: usize = 16;
/// A bitmap may take this many words per value, or [`BITMAP_ANY_WORDS`] (1 MB) whatever their number.
const BITMAP_WORDS_PER_VALUE: u64 = 64;
const BITMAP_ANY_WORDS: u64 = 1 << 17;

impl IntSet {
    pub fn new(mut values: Vec<i64>) -> Self {
        values.sort_unstable();
        values.dedup();
        let span = values.last().map_or(0, |max| max.abs_diff(values[0]));
        let words = (span >> 6) + 1;
        let dense = values.len() > LINEAR_SET && span < key_set::MAX_RANGE && words <= (BITMAP_WORDS_PER_VALUE * values.len() as u64).max(BITMAP_ANY_WORDS);
        let bitmap = dense.then(|| Bitmap::of(&values));
        IntSet { values, bitmap }
    }

    /// A join's key set, always as a bitmap (its range is bounded).
    pub fn of_key_set(set: &KeySet) -> Self {
        IntSet { values: set.keys().to_vec(), bitmap: Some(set.bitmap().clone()) }
    }

    #[inline]
    pub fn contains(&self, value: i64) -> bool {
        if let Some(bitmap) = &self.bitmap {
            return bitmap.contains(value);
        }
        if self.values.len() <= LINEAR_SET { self.values.contains(&value) } else { self.values.binary_search(&value).is_ok() }
    }
}

impl Comparison {
    /// `expr` as a comparison of one of `columns` (its index), if the page reader runs it.
    pub fn compile(expr: &Arc<dyn PhysicalExpr>, columns: &Schema) -> Option<(usize, Comparison)> {
        if let Some(binary) = expr.downcast_ref::<BinaryExpr>()
            && *binary.op() == Operator::Or
        {
            return Self::compile_any_of(binary, columns);
        }
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
            let data_type = columns.fields().get(column.index())?.data_type();
            if matches!(data_type, DataType::Utf8 | DataType::Utf8View) {
                let text = bytes_literal(literal.value())?;
                return matches!(op, Operator::Eq | Operator::NotEq).then_some((column.index(), Comparison::Bytes(op, text)));
            }
            return Some((column.index(), Comparison::Int(op, int_literal(literal.value(), data_type)?)));
        }
        if let Some(key_set) = expr.downcast_ref::<KeySetExpr>() {
            let column = key_set.column()?;
            key_set::supports(columns.fields().get(column.index())?.data_type()).then_some(())?;
            return Some((column.index(), Comparison::IntIn(IntSet::of_key_set(key_set.set()))));
        }
        if let Some(list) = expr.downcast_ref::<InListExpr>() {
            let column = list.expr().downcast_ref::<Column>()?;
            if list.negated() {
                return None;
            }
            let data_type = columns.fields().get(column.index())?.data_type();
            // A NULL in the list never makes the test true (it makes it NULL, which a filter
            // drops): a join's build keys reach the probe's scan with their NULLs.
            let literals = list.list().iter().map(|e| e.downcast_ref::<Literal>().map(|l| l.value())).filter(|l| !l.is_some_and(ScalarValue::is_null));
            if matches!(data_type, DataType::Utf8 | DataType::Utf8View) {
                let values = literals.map(|l| bytes_literal(l?)).collect::<Option<Vec<_>>>()?;
                return Some((column.index(), Comparison::BytesIn(values)));
            }
            let values = literals.map(|l| int_literal(l?, data_type)).collect::<Option<Vec<i64>>>()?;
            return Some((column.index(), Comparison::IntIn(IntSet::new(values))));
        }
        None
    }

    /// `column = a OR column = b OR ...` (how the planner writes a short `IN` list) as `IN`.
    fn compile_any_of(or: &BinaryExpr, columns: &Schema) -> Option<(usize, Comparison)> {
        let (left, right) = (Self::compile(or.left(), columns)?, Self::compile(or.right(), columns)?);
        if left.0 != right.0 {
            return None;
        }
        let ints = |c: Comparison| match c {
            Comparison::Int(Operator::Eq, v) => Some(vec![v]),
            Comparison::IntIn(set) => Some(set.values),
            _ => None,
        };
        let bytes = |c: Comparison| match c {
            Comparison::Bytes(Operator::Eq, v) => Some(vec![v]),
            Comparison::BytesIn(values) => Some(values),
            _ => None,
        };
        let merged = match (&left.1, &right.1) {
            (Comparison::Int(..) | Comparison::IntIn(_), _) => Comparison::IntIn(IntSet::new([ints(left.1)?, ints(right.1)?].concat())),
            _ => Comparison::BytesIn([bytes(left.1)?, bytes(right.1)?].concat()),
        };
        Some((left.0, merged))
    }

    /// Keeps the rows of `chunk` (of `alive`, or all) that pass: their indices go to `kept`
    /// (and a code per kept row to `codes`, which a filter ignores).
    pub fn keep(&self, chunk: &ColumnChunk, alive: Option<&[u32]>, kept: &mut Vec<u32>, codes: &mut Vec<u32>) {
        let pass = |ok: bool| if ok { 0 } else { NO_CODE };
        match self {
            Comparison::Int(op, value) => {
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
            Comparison::IntRange(lo, hi) => {
                let (lo, hi) = (*lo, *hi);
                chunk.keep_int(alive, |v| pass(lo <= v && v <= hi), kept, codes);
            }
            Comparison::IntIn(set) => chunk.keep_int(alive, |v| pass(set.contains(v)), kept, codes),
            Comparison::Bytes(op, value) => {
                let equal = *op == Operator::Eq;
                chunk.keep_bytes(alive, |v| pass((v == value.as_slice()) == equal), kept, codes);
            }
            Comparison::BytesIn(values) => chunk.keep_bytes(alive, |v| pass(values.iter().any(|x| x.as_slice() == v)), kept, codes),
        }
    }
}

/// A string literal's bytes (`None` for NULL or another type).
fn bytes_literal(value: &ScalarValue) -> Option<Vec<u8>> {
    match value {
        ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => Some(s.as_bytes().to_vec()),
        _ => None,
    }
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

/// A batch of `columns`' values (with `schema`) at the `rows` given.
pub fn gather(chunks: &[Option<ColumnChunk>], columns: &[usize], schema: &SchemaRef, rows: &[u32]) -> Result<RecordBatch> {
    let arrays = columns
        .iter()
        .zip(schema.fields())
        .map(|(&c, field)| {
            let chunk = chunks[c].as_ref().ok_or_else(|| DataFusionError::Internal(format!("column {c} was not read")))?;
            chunk.gather(rows, field.data_type()).map_err(|e| DataFusionError::Execution(e.to_string()))
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    Ok(RecordBatch::try_new_with_options(Arc::clone(schema), arrays, &RecordBatchOptions::new().with_row_count(Some(rows.len())))?)
}

/// The columns `exprs` read (sorted) and the schema of just those.
pub fn used_columns(exprs: &[Arc<dyn PhysicalExpr>], input: &SchemaRef) -> Result<(Vec<usize>, SchemaRef)> {
    let mut columns: Vec<usize> = exprs.iter().flat_map(|e| collect_columns(e).into_iter().map(|c| c.index())).collect();
    columns.sort_unstable();
    columns.dedup();
    Ok((columns.clone(), Arc::new(input.project(&columns)?)))
}

/// A predicate split into the comparisons the page reader runs (with their columns) and the
/// rest, rewritten over a batch of just the columns it reads.
pub struct SplitPredicate {
    pub comparisons: Vec<(usize, Comparison)>,
    pub residual: Option<Residual>,
}

/// The part of a predicate evaluated over gathered values.
pub struct Residual {
    pub predicate: Arc<dyn PhysicalExpr>,
    /// The columns it reads (indices into the scanned columns) and their schema.
    pub columns: Vec<usize>,
    pub schema: SchemaRef,
}

impl SplitPredicate {
    pub fn new(predicate: Option<&Arc<dyn PhysicalExpr>>, columns: &SchemaRef) -> Result<Self> {
        let mut comparisons = Vec::new();
        let mut rest = Vec::new();
        for conjunct in predicate.map(split_conjunction).unwrap_or_default() {
            match Comparison::compile(conjunct, columns) {
                Some(comparison) => comparisons.push(comparison),
                None => rest.push(Arc::clone(conjunct)),
            }
        }
        let comparisons = merge_ranges(comparisons);
        let residual = match conjunction_opt(rest) {
            Some(expr) => {
                let (used, schema) = used_columns(std::slice::from_ref(&expr), columns)?;
                Some(Residual { predicate: reassign_expr_columns(expr, &schema)?, columns: used, schema })
            }
            None => None,
        };
        Ok(SplitPredicate { comparisons, residual })
    }
}

/// The integer comparisons of each column that bound it from below and above, as one
/// [`Comparison::IntRange`] in the place of the first (they pass the same rows, in one pass
/// instead of two over the page's values).
fn merge_ranges(comparisons: Vec<(usize, Comparison)>) -> Vec<(usize, Comparison)> {
    let bounds = |c: &Comparison| match *c {
        Comparison::Int(Operator::Eq, v) => Some((v, v)),
        Comparison::Int(Operator::Gt, v) => Some((v.checked_add(1)?, i64::MAX)),
        Comparison::Int(Operator::GtEq, v) => Some((v, i64::MAX)),
        Comparison::Int(Operator::Lt, v) => Some((i64::MIN, v.checked_sub(1)?)),
        Comparison::Int(Operator::LtEq, v) => Some((i64::MIN, v)),
        _ => None,
    };
    let mut merged: Vec<(usize, Comparison)> = Vec::with_capacity(comparisons.len());
    for (column, comparison) in comparisons {
        let Some((lo, hi)) = bounds(&comparison) else {
            merged.push((column, comparison));
            continue;
        };
        let earlier = merged.iter_mut().find(|(c, m)| *c == column && (matches!(m, Comparison::IntRange(..)) || bounds(m).is_some()));
        match earlier {
            Some((_, m)) => {
                let (lo0, hi0) = match *m {
                    Comparison::IntRange(lo, hi) => (lo, hi),
                    _ => bounds(m).expect("found by its bounds"),
                };
                *m = Comparison::IntRange(lo0.max(lo), hi0.min(hi));
            }
            None => merged.push((column, comparison)),
        }
    }
    merged
}

impl Residual {
    /// The positions (into `rows`) of the rows whose values pass.
    pub fn passing(&self, chunks: &[Option<ColumnChunk>], rows: &[u32]) -> Result<Vec<usize>> {
        let batch = gather(chunks, &self.columns, &self.schema, rows)?;
        let mask = self.predicate.evaluate(&batch)?.into_array(batch.num_rows())?;
        let mask = mask.as_boolean_opt().ok_or_else(|| DataFusionError::Execution(format!("predicate {} is not boolean", self.predicate)))?;
        // NULL fails a filter.
        Ok(match mask.nulls() {
            Some(_) => prep_null_mask_filter(mask).values().set_indices().collect(),
            None => mask.values().set_indices().collect(),
        })
    }
}

/// Orders a row group's `steps` most selective first (by their pass rates so far) and returns
/// the columns to read, in the order they are needed: the steps', the residual's, then `rest`.
pub fn read_order<T>(steps: &mut [Step<T>], residual: Option<&Residual>, rest: &[usize]) -> Vec<usize> {
    steps.sort_by(|a, b| a.pass_rate().total_cmp(&b.pass_rate()));
    let needed = steps.iter().map(|s| s.column).chain(residual.iter().flat_map(|r| r.columns.iter().copied())).chain(rest.iter().copied());
    let mut order = Vec::new();
    for c in needed {
        if !order.contains(&c) {
            order.push(c);
        }
    }
    order
}

/// `segments` dealt round-robin into at most `partitions` (at least one) lists.
pub fn split_segments(segments: Vec<PagedSegment>, partitions: usize) -> Vec<Vec<PagedSegment>> {
    let partitions = partitions.clamp(1, segments.len().max(1));
    let mut split = vec![Vec::new(); partitions];
    for (i, segment) in segments.into_iter().enumerate() {
        split[i % partitions].push(segment);
    }
    split
}

/// A filter over a scan of Parquet segments, run page by page: the rows of the segments whose
/// predicate holds, with the columns the filter projects.
#[derive(Debug)]
pub struct PageSelectExec {
    partitions: Vec<Vec<PagedSegment>>,
    /// The scanned columns (the filter's input).
    columns: SchemaRef,
    predicate: Arc<dyn PhysicalExpr>,
    /// The columns produced (indices into `columns`).
    projection: Vec<usize>,
    store: Arc<VerifiedStore>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PageSelectExec {
    /// Whether the page reader runs some conjunct of `predicate` over `columns` itself (else a
    /// Parquet scan and a filter over its batches do as well).
    pub fn supports(columns: &Schema, predicate: &Arc<dyn PhysicalExpr>) -> bool {
        split_conjunction(predicate).into_iter().any(|c| Comparison::compile(c, columns).is_some())
    }

    /// The rows of `segments` (spread over `partitions`) whose `predicate` holds, with the
    /// `projection` of `columns` (all of them with `None`).
    pub fn try_new(segments: Vec<PagedSegment>, partitions: usize, columns: SchemaRef, predicate: Arc<dyn PhysicalExpr>, projection: Option<Vec<usize>>, store: Arc<VerifiedStore>) -> Result<Self> {
        let split = split_segments(segments, partitions);
        let partitions = split.len();
        let projection = projection.unwrap_or_else(|| (0..columns.fields().len()).collect());
        let schema = Arc::new(columns.project(&projection)?);
        let properties = PlanProperties::new(EquivalenceProperties::new(Arc::clone(&schema)), Partitioning::UnknownPartitioning(partitions), EmissionType::Incremental, Boundedness::Bounded);
        Ok(PageSelectExec { partitions: split, columns, predicate, projection, store, schema, properties: Arc::new(properties), metrics: ExecutionPlanMetricsSet::new() })
    }
}

impl DisplayAs for PageSelectExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let segments: usize = self.partitions.iter().map(Vec::len).sum();
        let names: Vec<&str> = self.schema.fields().iter().map(|f| f.name().as_str()).collect();
        write!(f, "PageSelectExec: predicate={}, projection=[{}], segments={segments}", self.predicate, names.join(", "))
    }
}

impl ExecutionPlan for PageSelectExec {
    fn name(&self) -> &str {
        "PageSelectExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        datafusion::physical_plan::apply_expression_roots([&self.predicate], f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if !children.is_empty() {
            return internal_err!("PageSelectExec has no children");
        }
        Ok(self)
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let Some(segments) = self.partitions.get(partition) else {
            return internal_err!("PageSelectExec has {} partitions, asked for {partition}", self.partitions.len());
        };
        let batch_size = context.session_config().batch_size().max(1);
        let job = SelectJob::try_new(self, partition)?;
        let groups: VecDeque<(PagedSegment, usize)> = segments.iter().flat_map(|s| s.row_groups.iter().map(move |&g| (s.clone(), g))).collect();
        // A row group's selected rows go out a few pages at a time, each batch gathered when
        // asked for, so that it is still in the cache when the operator above reads it.
        let batches = stream::try_unfold((job, groups, None::<Selected>), move |(mut job, mut groups, mut current)| async move {
            loop {
                if let Some(selected) = &mut current
                    && let Some(batch) = selected.next_batch(&job, batch_size)?
                {
                    return Ok(Some((batch, (job, groups, current))));
                }
                let Some((segment, group)) = groups.pop_front() else { return Ok::<_, DataFusionError>(None) };
                if let Some((next, next_group)) = groups.front() {
                    next.read_ahead(&job.store, *next_group, &job.columns);
                }
                current = job.row_group(&segment, group).await?;
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), batches)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(&self, _input_stats: &[Arc<Statistics>], _args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        Ok(Arc::new(Statistics::new_unknown(&self.schema)))
    }
}

/// One step of a row group's selection: a test of one column, with the rows it has seen and
/// kept so far (for the order of the next row group: the most selective step first).
#[derive(Debug)]
pub struct Step<T> {
    pub column: usize,
    pub test: T,
    pub seen: u64,
    pub kept: u64,
}

impl<T> Step<T> {
    pub fn new(column: usize, test: T) -> Self {
        Step { column, test, seen: 0, kept: 0 }
    }

    pub fn pass_rate(&self) -> f64 {
        if self.seen == 0 { 0.5 } else { self.kept as f64 / self.seen as f64 }
    }
}

/// A partition of a [`PageSelectExec`] at work.
struct SelectJob {
    columns: SchemaRef,
    steps: Vec<Step<Comparison>>,
    residual: Option<Residual>,
    projection: Vec<usize>,
    schema: SchemaRef,
    store: Arc<VerifiedStore>,
    alive: Vec<u32>,
    kept: Vec<u32>,
    codes: Vec<u32>,
    baseline: BaselineMetrics,
    bytes_scanned: Count,
    rows_selected: Count,
}

impl SelectJob {
    fn try_new(exec: &PageSelectExec, partition: usize) -> Result<Self> {
        let split = SplitPredicate::new(Some(&exec.predicate), &exec.columns)?;
        Ok(SelectJob {
            columns: Arc::clone(&exec.columns),
            steps: split.comparisons.into_iter().map(|(column, comparison)| Step::new(column, comparison)).collect(),
            residual: split.residual,
            projection: exec.projection.clone(),
            schema: Arc::clone(&exec.schema),
            store: Arc::clone(&exec.store),
            alive: Vec::new(),
            kept: Vec::new(),
            codes: Vec::new(),
            baseline: BaselineMetrics::new(&exec.metrics, partition),
            bytes_scanned: MetricBuilder::new(&exec.metrics).counter("bytes_scanned", partition),
            rows_selected: MetricBuilder::new(&exec.metrics).counter("rows_selected", partition),
        })
    }

    /// The selected rows of row group `group` of `segment` (their values read, not gathered),
    /// or `None` if none pass.
    async fn row_group(&mut self, segment: &PagedSegment, group: usize) -> Result<Option<Selected>> {
        let rows = group_rows(segment, group)?;
        if rows == 0 {
            return Ok(None);
        }
        let order = read_order(&mut self.steps, self.residual.as_ref(), &self.projection);
        let mut chunks: Vec<Option<ColumnChunk>> = (0..self.columns.fields().len()).map(|_| None).collect();
        let mut reads = segment.read_chunks(&self.store, group, &self.columns, &order);
        let mut narrowed = false;
        let mut step = 0usize;
        while let Some(read) = reads.next().await {
            let (c, bytes) = read?;
            self.bytes_scanned.add(bytes.len());
            let _timer = self.baseline.elapsed_compute().timer();
            let wanted = narrowed.then_some(self.alive.as_slice());
            chunks[c] = Some(segment.chunk(group, self.columns.field(c).name(), bytes, wanted)?);
            while step < self.steps.len() && chunks[self.steps[step].column].is_some() {
                let s = &mut self.steps[step];
                let alive = narrowed.then_some(self.alive.as_slice());
                self.kept.clear();
                self.codes.clear();
                // At most every row tested passes: room for all at once, not grown by copying.
                let tested = alive.map_or(rows, <[u32]>::len);
                self.kept.reserve(tested);
                self.codes.reserve(tested);
                s.test.keep(chunks[s.column].as_ref().expect("read"), alive, &mut self.kept, &mut self.codes);
                s.seen += alive.map_or(rows, <[u32]>::len) as u64;
                s.kept += self.kept.len() as u64;
                std::mem::swap(&mut self.alive, &mut self.kept);
                narrowed = true;
                step += 1;
                if self.alive.is_empty() {
                    return Ok(None);
                }
            }
        }
        drop(reads);
        let _timer = self.baseline.elapsed_compute().timer();
        if !narrowed {
            self.alive.clear();
            self.alive.extend(0..rows as u32);
        }
        if let Some(residual) = &self.residual {
            let passing = residual.passing(&chunks, &self.alive)?;
            self.kept.clear();
            self.kept.extend(passing.iter().map(|&i| self.alive[i]));
            std::mem::swap(&mut self.alive, &mut self.kept);
        }
        if self.alive.is_empty() {
            return Ok(None);
        }
        self.rows_selected.add(self.alive.len());
        Ok(Some(Selected { chunks, alive: std::mem::take(&mut self.alive), next: 0 }))
    }
}

/// A row group's selected rows, not yet all sent.
struct Selected {
    chunks: Vec<Option<ColumnChunk>>,
    alive: Vec<u32>,
    /// The first row of `alive` not sent.
    next: usize,
}

impl Selected {
    /// The next batch: at least `batch_size` rows (unless fewer are left), up to the end of the
    /// page holding the last of them, so that no page is decoded for two batches.
    fn next_batch(&mut self, job: &SelectJob, batch_size: usize) -> Result<Option<RecordBatch>> {
        let start = self.next;
        if start >= self.alive.len() {
            return Ok(None);
        }
        let _timer = job.baseline.elapsed_compute().timer();
        let mut end = (start + batch_size).min(self.alive.len());
        let paged = job.projection.first().and_then(|&c| self.chunks[c].as_ref());
        if let Some(page_end) = paged.and_then(|chunk| chunk.page_end(self.alive[end - 1] as usize)) {
            end += self.alive[end..].partition_point(|&r| (r as usize) < page_end);
        }
        self.next = end;
        let batch = gather(&self.chunks, &job.projection, &job.schema, &self.alive[start..end])?;
        job.baseline.record_output(batch.num_rows());
        Ok(Some(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A footer is read once: the second open of the same file finds it in the cache, read
    /// nothing, and has the same metadata; a file of another size is read afresh.
    #[tokio::test]
    async fn footers_are_read_once() {
        use arrow::array::Int32Array;
        use datafusion::execution::cache::default_cache::DefaultCache;
        let batch = RecordBatch::try_from_iter([("a", Arc::new(Int32Array::from_iter_values(0..1000)) as ArrayRef)]).unwrap();
        let mut file = Vec::new();
        let mut writer = parquet::arrow::ArrowWriter::try_new(&mut file, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let store = object_store::memory::InMemory::new();
        let path = ObjectPath::from("t/s.parquet");
        store.put(&path, file.clone().into()).await.unwrap();
        let footers = DefaultCache::new(1 << 20);
        let (first, read) = cached_footer(&store, &path, file.len() as u64, &footers).await.unwrap();
        assert!(read > 8, "the first open reads the footer");
        let (second, read) = cached_footer(&store, &path, file.len() as u64, &footers).await.unwrap();
        assert_eq!(read, 0, "the second finds it");
        assert!(Arc::ptr_eq(&first, &second));
        let mut longer = file.clone();
        longer.splice(0..0, *b"PAR1");
        store.put(&path, longer.into()).await.unwrap();
        assert!(cached_footer(&store, &path, file.len() as u64 + 4, &footers).await.is_ok_and(|(_, read)| read > 0), "a changed file is read again");
    }

    #[test]
    fn comparisons_bounding_a_column_become_one_range() {
        let merged = merge_ranges(vec![
            (0, Comparison::Int(Operator::GtEq, 1)),
            (1, Comparison::Int(Operator::Eq, 7)),
            (0, Comparison::Int(Operator::Lt, 21)),
            (2, Comparison::Int(Operator::NotEq, 3)),
            (0, Comparison::Int(Operator::Gt, 4)),
            (2, Comparison::Int(Operator::LtEq, 9)),
        ]);
        assert_eq!(
            merged,
            vec![
                (0, Comparison::IntRange(5, 20)),
                (1, Comparison::Int(Operator::Eq, 7)),
                (2, Comparison::Int(Operator::NotEq, 3)),
                (2, Comparison::Int(Operator::LtEq, 9)),
            ]
        );
        // A bound that cannot be made inclusive stays as it is.
        assert_eq!(merge_ranges(vec![(0, Comparison::Int(Operator::Lt, i64::MIN))]), vec![(0, Comparison::Int(Operator::Lt, i64::MIN))]);
    }

    #[test]
    fn an_in_list_with_nulls_compiles_to_its_values() {
        use arrow::datatypes::{Field, Schema};
        use datafusion::physical_expr::expressions::{in_list, lit};
        let schema = Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new("s", DataType::Utf8, true)]);
        let list = |column: &str, values: Vec<ScalarValue>| in_list(Arc::new(Column::new_with_schema(column, &schema).unwrap()), values.into_iter().map(lit).collect(), &false, &schema).unwrap();
        // A join's build keys with a NULL and repeats: the page reader tests the keys.
        let keys = list("k", vec![ScalarValue::Int64(Some(3)), ScalarValue::Int64(None), ScalarValue::Int64(Some(1)), ScalarValue::Int64(Some(3))]);
        assert_eq!(Comparison::compile(&keys, &schema), Some((0, Comparison::IntIn(IntSet::new(vec![1, 3])))));
        let names = list("s", vec![ScalarValue::Utf8(None), ScalarValue::Utf8(Some("a".into()))]);
        assert_eq!(Comparison::compile(&names, &schema), Some((1, Comparison::BytesIn(vec![b"a".to_vec()]))));
        let set = IntSet::new(vec![1, 3]);
        assert!(set.contains(3) && !set.contains(2));
    }
}
