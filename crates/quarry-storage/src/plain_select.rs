//! Selection over PLAIN-encoded, uncompressed pages of fixed-width columns: the in-storage
//! selection of the Smart SSD paper (Do et al. 2013, sec. 3.2), which reads every page of the
//! table but touches only the predicate's values and the selected tuples' values.
//!
//! Per row group, the predicate's columns are decoded whole and the predicate evaluated; then,
//! for each other column, the selected rows' values are copied out of the raw pages by offset
//! (value `i` of a page starts at byte `i * width`) and nothing else is decoded. arrow-rs's late
//! materialization pays instead per run of selected rows per column (measured here: about 65 ns
//! a run), so that at 1% selectivity over 63 columns it costs more than decoding every value.
//! Tables written with `PageEncoding::Plain` (`quarry gen|load --page-encoding plain`) get this
//! operator for a filter directly over a scan; any other layout, or a page that is not what the
//! table promises, falls back to (or errors like) the Parquet scan.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayData, ArrayRef, AsArray, RecordBatch, make_array};
use arrow::buffer::MutableBuffer;
use arrow::compute::prep_null_mask_filter;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use bytes::Bytes;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Statistics, internal_err};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::utils::{collect_columns, reassign_expr_columns};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics::{BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream, StatisticsArgs, apply_expression_roots};
use futures::{StreamExt, stream};
use object_store::{ObjectStore, ObjectStoreExt};
use object_store::path::Path as ObjectPath;
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::page::Page;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};
use parquet::file::serialized_reader::SerializedPageReader;

use crate::page_reader::{ChunkBytes, read_footer};

/// Column chunks read ahead while the current one is processed: the device's flash channels
/// keep reading while its cores compute.
const READ_AHEAD: usize = 2;

/// One segment file to read.
#[derive(Debug, Clone)]
pub struct PlainSegment {
    /// Its path in the node's object store.
    pub path: ObjectPath,
    /// Its size in bytes.
    pub size: u64,
}

/// `FilterExec(predicate)` over a scan of `schema`'s columns in `segments`, for PLAIN pages.
#[derive(Debug)]
pub struct PlainSelectExec {
    partitions: Vec<Vec<PlainSegment>>,
    schema: SchemaRef,
    predicate: Arc<dyn PhysicalExpr>,
    store: Arc<dyn ObjectStore>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PlainSelectExec {
    /// Whether it can run `predicate` over `schema`: every column can be read by offset (a
    /// required, fixed-width primitive whose Parquet physical type holds it as is), and the
    /// predicate reads at least one of them (it is evaluated on a batch of its columns).
    pub fn supports(schema: &Schema, predicate: &Arc<dyn PhysicalExpr>) -> bool {
        schema.fields().iter().all(|f| !f.is_nullable() && physical_type(f.data_type()).is_some()) && !collect_columns(predicate).is_empty()
    }

    /// Selects the rows of `segments` (spread over `partitions` output partitions) whose
    /// `predicate` (over `schema`) is true, returning `schema`'s columns.
    pub fn try_new(segments: Vec<PlainSegment>, partitions: usize, schema: SchemaRef, predicate: Arc<dyn PhysicalExpr>, store: Arc<dyn ObjectStore>) -> Result<Self> {
        if !Self::supports(&schema, &predicate) {
            return internal_err!("PlainSelectExec reads required fixed-width columns only, not {schema}");
        }
        let partitions = partitions.clamp(1, segments.len().max(1));
        let mut split = vec![Vec::new(); partitions];
        for (i, segment) in segments.into_iter().enumerate() {
            split[i % partitions].push(segment);
        }
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(PlainSelectExec { partitions: split, schema, predicate, store, properties: Arc::new(properties), metrics: ExecutionPlanMetricsSet::new() })
    }
}

impl DisplayAs for PlainSelectExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let columns: Vec<&str> = self.schema.fields().iter().map(|f| f.name().as_str()).collect();
        let segments: usize = self.partitions.iter().map(Vec::len).sum();
        write!(f, "PlainSelectExec: predicate={}, columns=[{}], segments={segments}", self.predicate, columns.join(", "))
    }
}

impl ExecutionPlan for PlainSelectExec {
    fn name(&self) -> &str {
        "PlainSelectExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        apply_expression_roots(std::iter::once(&self.predicate), f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if !children.is_empty() {
            return internal_err!("PlainSelectExec has no children");
        }
        Ok(self)
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let Some(segments) = self.partitions.get(partition) else {
            return internal_err!("PlainSelectExec has {} partitions, asked for {partition}", self.partitions.len());
        };
        let job = Arc::new(SelectJob::try_new(self, partition, context.session_config().batch_size())?);
        let cursor = Cursor { job, files: segments.iter().cloned().collect(), current: None, rows: None };
        let output = stream::try_unfold(cursor, Cursor::next);
        Ok(Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), output)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(&self, _input_stats: &[Arc<Statistics>], _args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        Ok(Arc::new(Statistics::new_unknown(&self.schema)))
    }
}

/// What every row group of one partition needs.
struct SelectJob {
    schema: SchemaRef,
    /// Output columns the predicate reads, in output order.
    predicate_columns: Vec<usize>,
    /// The predicate over a batch of just those columns.
    predicate: Arc<dyn PhysicalExpr>,
    predicate_schema: SchemaRef,
    store: Arc<dyn ObjectStore>,
    batch_size: usize,
    baseline: BaselineMetrics,
    bytes_scanned: Count,
}

impl SelectJob {
    fn try_new(exec: &PlainSelectExec, partition: usize, batch_size: usize) -> Result<Self> {
        let mut predicate_columns = Vec::new();
        exec.predicate.apply(|e| {
            if let Some(column) = e.downcast_ref::<Column>() {
                predicate_columns.push(column.index());
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        predicate_columns.sort_unstable();
        predicate_columns.dedup();
        let predicate_schema = Arc::new(exec.schema.project(&predicate_columns)?);
        let predicate = reassign_expr_columns(Arc::clone(&exec.predicate), &predicate_schema)?;
        Ok(SelectJob {
            schema: Arc::clone(&exec.schema),
            predicate_columns,
            predicate,
            predicate_schema,
            store: Arc::clone(&exec.store),
            batch_size: batch_size.max(1),
            baseline: BaselineMetrics::new(&exec.metrics, partition),
            bytes_scanned: MetricBuilder::new(&exec.metrics).counter("bytes_scanned", partition),
        })
    }

    async fn open(&self, segment: &PlainSegment) -> Result<OpenFile> {
        let metadata = Arc::new(self.read_metadata(segment).await?);
        let columns = self
            .schema
            .fields()
            .iter()
            .map(|field| {
                let columns = metadata.file_metadata().schema_descr().columns();
                let index = columns.iter().position(|c| c.path().string() == *field.name());
                match index {
                    Some(i) if columns[i].max_def_level() == 0 && columns[i].max_rep_level() == 0 && Some(columns[i].physical_type()) == physical_type(field.data_type()) => Ok(i),
                    Some(_) => Err(DataFusionError::Execution(format!("{}: column '{}' is not a required {} column", segment.path, field.name(), field.data_type()))),
                    None => Err(DataFusionError::Execution(format!("{}: no column '{}'", segment.path, field.name()))),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(OpenFile { path: segment.path.clone(), metadata, columns, next_row_group: 0 })
    }

    /// The file's footer.
    async fn read_metadata(&self, segment: &PlainSegment) -> Result<ParquetMetaData> {
        let (metadata, bytes) = read_footer(self.store.as_ref(), &segment.path, segment.size).await?;
        self.bytes_scanned.add(bytes as usize);
        Ok(metadata)
    }

    /// Reads row group `index` of `file` and evaluates the predicate over it; `None` if no
    /// row passes (the other columns are then not read).
    async fn select_row_group(&self, file: &OpenFile, index: usize) -> Result<Option<SelectedRows>> {
        let row_group = file.metadata.row_group(index);
        let rows = usize::try_from(row_group.num_rows()).map_err(|_| DataFusionError::Execution(format!("{}: negative row count", file.path)))?;
        let chunk = |output: usize| row_group.column(file.columns[output]);
        let width = |output: usize| self.schema.field(output).data_type().primitive_width().expect("a fixed-width type");

        let mut columns: Vec<Option<ColumnPages>> = (0..self.schema.fields().len()).map(|_| None).collect();
        let mut predicate_arrays = Vec::with_capacity(self.predicate_columns.len());
        let mut reads = self.read_chunks(file, self.predicate_columns.iter().map(|&c| chunk(c)).collect());
        for &column in &self.predicate_columns {
            let bytes = reads.next().await.expect("one read per column")?;
            let pages = ColumnPages::split(&file.path, bytes, chunk(column), rows, width(column))?;
            predicate_arrays.push(pages.decode_all(self.schema.field(column).data_type())?);
            columns[column] = Some(pages);
        }
        drop(reads);
        let timer = self.baseline.elapsed_compute().timer();
        let predicate_batch = RecordBatch::try_new(Arc::clone(&self.predicate_schema), predicate_arrays)?;
        let mask = self.predicate.evaluate(&predicate_batch)?.into_array(rows)?;
        let mask = mask.as_boolean_opt().ok_or_else(|| DataFusionError::Execution(format!("predicate {} is not boolean", self.predicate)))?;
        let mask = if arrow::array::Array::null_count(mask) > 0 { prep_null_mask_filter(mask) } else { mask.clone() };
        let selected: Vec<u32> = mask.values().set_indices_u32().collect();
        timer.done();
        if selected.is_empty() {
            return Ok(None);
        }
        let others: Vec<usize> = (0..columns.len()).filter(|c| columns[*c].is_none()).collect();
        let mut reads = self.read_chunks(file, others.iter().map(|&c| chunk(c)).collect());
        for &column in &others {
            let bytes = reads.next().await.expect("one read per column")?;
            let _timer = self.baseline.elapsed_compute().timer();
            columns[column] = Some(ColumnPages::split(&file.path, bytes, chunk(column), rows, width(column))?);
        }
        Ok(Some(SelectedRows { columns: columns.into_iter().map(|c| c.expect("every column read")).collect(), selected, next: 0 }))
    }

    /// The next batch of `rows`' values.
    fn next_batch(&self, rows: &mut SelectedRows) -> Result<RecordBatch> {
        let _timer = self.baseline.elapsed_compute().timer();
        let end = (rows.next + self.batch_size).min(rows.selected.len());
        let selected = &rows.selected[rows.next..end];
        rows.next = end;
        let arrays = rows.columns.iter().zip(self.schema.fields()).map(|(pages, field)| pages.gather(field.data_type(), selected)).collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), arrays)?)
    }

    /// Reads the chunks in order, `READ_AHEAD` at a time.
    fn read_chunks<'a>(&'a self, file: &'a OpenFile, chunks: Vec<&'a ColumnChunkMetaData>) -> impl futures::Stream<Item = Result<Bytes>> + Unpin + 'a {
        stream::iter(chunks)
            .map(move |chunk| async move {
                let (start, length) = chunk.byte_range();
                let bytes = self.store.get_range(&file.path, start..start + length).await.map_err(|e| DataFusionError::ObjectStore(Box::new(e)))?;
                self.bytes_scanned.add(bytes.len());
                Ok(bytes)
            })
            .buffered(READ_AHEAD)
            .boxed()
    }
}

struct OpenFile {
    path: ObjectPath,
    metadata: Arc<ParquetMetaData>,
    /// Parquet leaf column of each output column.
    columns: Vec<usize>,
    next_row_group: usize,
}

/// A row group's selected rows and the pages of every output column, emitted a batch at a
/// time so that the device computes, pauses and sends in small steps.
struct SelectedRows {
    columns: Vec<ColumnPages>,
    selected: Vec<u32>,
    next: usize,
}

/// A partition's progress: files to open, the open one, the row group being emitted.
struct Cursor {
    job: Arc<SelectJob>,
    files: VecDeque<PlainSegment>,
    current: Option<OpenFile>,
    rows: Option<SelectedRows>,
}

impl Cursor {
    async fn next(mut self) -> Result<Option<(RecordBatch, Self)>> {
        loop {
            if let Some(rows) = self.rows.as_mut().filter(|r| r.next < r.selected.len()) {
                let batch = self.job.next_batch(rows)?;
                self.job.baseline.record_output(batch.num_rows());
                return Ok(Some((batch, self)));
            }
            self.rows = None;
            match &mut self.current {
                Some(file) if file.next_row_group < file.metadata.num_row_groups() => {
                    let index = file.next_row_group;
                    file.next_row_group += 1;
                    self.rows = self.job.select_row_group(file, index).await?;
                }
                _ => match self.files.pop_front() {
                    Some(segment) => self.current = Some(self.job.open(&segment).await?),
                    None => {
                        self.job.baseline.done();
                        return Ok(None);
                    }
                },
            }
        }
    }
}

/// A column chunk's data pages: the first row of each and its PLAIN little-endian values
/// (Arrow's layout too), sliced from the chunk's bytes without copying.
struct ColumnPages {
    first_rows: Vec<usize>,
    pages: Vec<Bytes>,
    width: usize,
}

impl ColumnPages {
    /// Splits a chunk into its pages; errors on any page that is not PLAIN fixed-width values.
    fn split(path: &ObjectPath, bytes: Bytes, chunk: &ColumnChunkMetaData, rows: usize, width: usize) -> Result<Self> {
        let column = chunk.column_path().string();
        let bad = |reason: String| DataFusionError::Execution(format!("{path}: column '{column}': {reason}"));
        let (start, _) = chunk.byte_range();
        let reader = SerializedPageReader::new(Arc::new(ChunkBytes { start, data: bytes }), chunk, rows, None).map_err(|e| parquet_error(path, e))?;
        let (mut first_rows, mut pages, mut first_row) = (Vec::new(), Vec::new(), 0);
        for page in reader {
            let (buf, values, encoding, levels) = match page.map_err(|e| parquet_error(path, e))? {
                Page::DataPage { buf, num_values, encoding, .. } => (buf, num_values as usize, encoding, 0),
                Page::DataPageV2 { buf, num_values, encoding, def_levels_byte_len, rep_levels_byte_len, .. } => (buf, num_values as usize, encoding, def_levels_byte_len + rep_levels_byte_len),
                Page::DictionaryPage { .. } => return Err(bad("a dictionary page in a PLAIN table".into())),
            };
            if encoding != Encoding::PLAIN || levels != 0 || buf.len() != values * width {
                return Err(bad(format!("a page of {values} values in {} bytes, encoding {encoding}: not PLAIN fixed-width", buf.len())));
            }
            first_rows.push(first_row);
            pages.push(buf);
            first_row += values;
        }
        if first_row != rows {
            return Err(bad(format!("pages hold {first_row} values, the row group {rows}")));
        }
        Ok(ColumnPages { first_rows, pages, width })
    }

    /// Every value of the chunk.
    fn decode_all(&self, data_type: &DataType) -> Result<ArrayRef> {
        let rows = self.pages.iter().map(|p| p.len()).sum::<usize>() / self.width;
        let mut values = MutableBuffer::with_capacity(rows * self.width);
        for page in &self.pages {
            values.extend_from_slice(page);
        }
        let data = ArrayData::builder(data_type.clone()).len(rows).add_buffer(values.into()).build()?;
        Ok(make_array(data))
    }

    /// The values of rows `selected` (ascending), copied from their pages by offset: a
    /// contiguous selection is one copy per page, a sparse one a fixed-size copy per value.
    fn gather(&self, data_type: &DataType, selected: &[u32]) -> Result<ArrayRef> {
        let width = self.width;
        let mut values = MutableBuffer::with_capacity(selected.len() * width);
        if let (Some(&first), Some(&last)) = (selected.first(), selected.last()) {
            let mut page = self.first_rows.partition_point(|&f| f <= first as usize) - 1;
            if (last - first) as usize + 1 == selected.len() {
                let (mut row, end) = (first as usize, last as usize + 1);
                while row < end {
                    let page_first = self.first_rows[page];
                    let upto = end.min(page_first + self.pages[page].len() / width);
                    values.extend_from_slice(&self.pages[page][(row - page_first) * width..(upto - page_first) * width]);
                    row = upto;
                    page += 1;
                }
            } else {
                let mut next = 0;
                while next < selected.len() {
                    let (page_first, bytes) = (self.first_rows[page], &self.pages[page]);
                    let page_end = page_first + bytes.len() / width;
                    while let Some(&row) = selected.get(next).filter(|&&row| (row as usize) < page_end) {
                        let offset = (row as usize - page_first) * width;
                        match width {
                            4 => values.push(u32::from_ne_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))),
                            8 => values.push(u64::from_ne_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))),
                            _ => values.extend_from_slice(&bytes[offset..offset + width]),
                        }
                        next += 1;
                    }
                    page += 1;
                }
            }
        }
        let data = ArrayData::builder(data_type.clone()).len(selected.len()).add_buffer(values.into()).build()?;
        Ok(make_array(data))
    }
}

/// The Parquet physical type a fixed-width Arrow type is stored as without conversion.
fn physical_type(data_type: &DataType) -> Option<PhysicalType> {
    match data_type {
        DataType::Int32 | DataType::Date32 => Some(PhysicalType::INT32),
        DataType::Int64 => Some(PhysicalType::INT64),
        DataType::Float32 => Some(PhysicalType::FLOAT),
        DataType::Float64 => Some(PhysicalType::DOUBLE),
        _ => None,
    }
}

fn parquet_error(path: &ObjectPath, e: ParquetError) -> DataFusionError {
    DataFusionError::Execution(format!("reading {path}: {e}"))
}

