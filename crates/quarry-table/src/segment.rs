//! Writing one Parquet segment and reading back the statistics the manifest records.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::compute::kernels::cmp::lt;
use arrow::compute::{SortOptions, cast, concat, sort_to_indices};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use serde::{Deserialize, Serialize};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::checksum::ChecksumWriter;
use crate::error::{Result, TableError};
use crate::manifest::{ColumnStats, SegmentMeta, Zones, segment_relative_path};
use crate::sketch::DistinctSketch;

/// Rows per Parquet row group: large enough for efficient scans, small enough that row-group
/// statistics prune well.
pub const ROW_GROUP_ROWS: usize = 1 << 20;
/// Rows per data page: the page index prunes at this granularity.
pub const DATA_PAGE_ROWS: usize = 20_000;
/// False-positive probability of Bloom filters.
pub const BLOOM_FILTER_FPP: f64 = 0.01;

/// How segments are written.
#[derive(Debug, Clone, Default)]
pub struct SegmentOptions {
    /// Columns that get a Bloom filter.
    pub bloom_filter_columns: Vec<String>,
    /// How data pages are encoded.
    pub page_encoding: PageEncoding,
    /// Columns stored otherwise than `page_encoding` says, each in its own layout (the
    /// layout planner's, `quarry layout apply`).
    pub column_layouts: Vec<ColumnLayoutSpec>,
    /// Rows are sorted by this column: row groups of [`ZONE_ROWS`] rows, each one's bounds in
    /// the column recorded in the manifest ([`crate::manifest::Zones`]), so that a reader skips
    /// row groups by them without opening the file (a sorted copy, `quarry layout apply`).
    pub zone_column: Option<String>,
}

/// Rows per row group of a segment with zones: a sorted copy is skipped at this granularity
/// (in a copy of SSB SF 10's lineorder sorted by `lo_suppkey`, about 5 suppliers).
pub const ZONE_ROWS: usize = 1 << 14;

/// One column's stored layout: a Parquet encoding (`RLE_DICTIONARY` for dictionary encoding)
/// and a page codec (`UNCOMPRESSED`, `SNAPPY`, `ZSTD(level)`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnLayoutSpec {
    /// The column.
    pub column: String,
    /// Its encoding.
    pub encoding: String,
    /// Its pages' codec.
    pub codec: String,
}

impl ColumnLayoutSpec {
    /// The encoding (`None`: dictionary) and codec, checked against the column's Parquet type.
    pub fn parse(&self, physical: parquet::basic::Type) -> std::result::Result<(Option<Encoding>, Compression), String> {
        let encoding = match self.encoding.as_str() {
            "RLE_DICTIONARY" | "PLAIN_DICTIONARY" => None,
            other => Some(other.parse::<Encoding>().map_err(|e| format!("column '{}': encoding '{other}': {e}", self.column))?),
        };
        if !crate::layout_sample::encodes(encoding, physical) {
            return Err(format!("column '{}' ({physical}) cannot be stored with the {} encoding", self.column, self.encoding));
        }
        let codec = match self.codec.as_str() {
            "UNCOMPRESSED" => Compression::UNCOMPRESSED,
            "SNAPPY" => Compression::SNAPPY,
            other => match other.strip_prefix("ZSTD(").and_then(|l| l.strip_suffix(')')).and_then(|l| l.parse::<i32>().ok()) {
                Some(level) => Compression::ZSTD(ZstdLevel::try_new(level).map_err(|e| format!("column '{}': {e}", self.column))?),
                None => return Err(format!("column '{}': unknown codec '{other}' (expected UNCOMPRESSED, SNAPPY or ZSTD(level))", self.column)),
            },
        };
        Ok((encoding, codec))
    }
}

/// Checks `layouts` against `schema` (stored types): each names a column once, with an
/// encoding its type takes and a known codec.
pub fn check_column_layouts(schema: &SchemaRef, layouts: &[ColumnLayoutSpec]) -> std::result::Result<(), String> {
    let parquet = parquet::arrow::ArrowSchemaConverter::new().convert(schema).map_err(|e| e.to_string())?;
    for (i, layout) in layouts.iter().enumerate() {
        if layouts[..i].iter().any(|l| l.column == layout.column) {
            return Err(format!("column '{}' has two layouts", layout.column));
        }
        let leaf = (0..parquet.num_columns())
            .find(|&c| parquet.column(c).path().string() == layout.column)
            .ok_or_else(|| format!("the layout names column '{}', which the table does not have as a flat column", layout.column))?;
        layout.parse(parquet.column(leaf).physical_type())?;
    }
    Ok(())
}

/// How a table's data pages are encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PageEncoding {
    /// Dictionary encoding where it pays; pages of text Snappy-compressed, the others not (see
    /// [`compresses_well`]).
    #[default]
    Compact,
    /// PLAIN-encoded, uncompressed pages. A fixed-width value sits at a computable offset, so a
    /// scan that selects few rows skips the others' values without decoding them; this is the
    /// layout of the Smart SSD paper's uncompressed PAX pages, which its selectivity sweep ran on.
    Plain,
    /// Dictionary encoding where it pays, pages not compressed further: a dictionary index is
    /// read by position without decompressing its page first (lightweight compression only, as
    /// in-memory column stores keep their data).
    Dictionary,
}

impl PageEncoding {
    /// The name used on the command line and in manifests.
    pub fn name(self) -> &'static str {
        match self {
            PageEncoding::Compact => "compact",
            PageEncoding::Plain => "plain",
            PageEncoding::Dictionary => "dictionary",
        }
    }
}

impl std::str::FromStr for PageEncoding {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "compact" => Ok(PageEncoding::Compact),
            "plain" => Ok(PageEncoding::Plain),
            "dictionary" => Ok(PageEncoding::Dictionary),
            other => Err(format!("unknown page encoding '{other}' (expected compact, dictionary or plain)")),
        }
    }
}

/// Whether a column of `data_type` is Snappy-compressed in a compact table: text, bytes and
/// nested values. Numbers, dates and booleans are stored uncompressed: Snappy saved them little
/// (their bit-packed dictionary indices nothing) and decompressing them took a quarter to a
/// third of every scan (SSB and TPC-H SF 10: 0.93x DuckDB's time became 0.73x on SSB, 1.13x
/// became 1.07x on TPC-H, for 42% and 24% more bytes).
pub fn compresses_well(data_type: &DataType) -> bool {
    !data_type.is_primitive() && !matches!(data_type, DataType::Boolean | DataType::Null)
}

impl PageEncoding {
    /// The Parquet encoding and codec a column of `data_type` gets in a table of this page
    /// encoding (dictionary encoding falls back to PLAIN where a column's dictionary grows too
    /// large, as the writer decides).
    pub fn layout_of(self, data_type: &DataType) -> (&'static str, &'static str) {
        match self {
            PageEncoding::Compact if compresses_well(data_type) => ("RLE_DICTIONARY", "SNAPPY"),
            PageEncoding::Compact | PageEncoding::Dictionary => ("RLE_DICTIONARY", "UNCOMPRESSED"),
            PageEncoding::Plain => ("PLAIN", "UNCOMPRESSED"),
        }
    }
}

/// Writes one segment file. Dropping it without [`SegmentWriter::finish`] deletes the file.
pub struct SegmentWriter {
    id: String,
    path: PathBuf,
    schema: SchemaRef,
    writer: Option<ArrowWriter<BufWriter<ChecksumWriter<File>>>>,
    rows: u64,
    /// Per column, its distinct values so far (`None` for types without a sketch).
    sketches: Vec<Option<DistinctSketch>>,
    /// Per column, whether its values have arrived in order so far.
    order: Vec<OrderCheck>,
    /// The column whose row-group bounds the manifest records.
    zone_column: Option<String>,
}

impl SegmentWriter {
    /// Creates `table_dir/data/<id>.parquet` for batches of `schema` (the stored schema).
    pub(crate) fn create(table_dir: &Path, id: String, schema: SchemaRef, options: &SegmentOptions) -> Result<Self> {
        let path = table_dir.join(segment_relative_path(&id));
        let file = File::create_new(&path).map_err(TableError::io("creating", &path))?;
        let row_group_rows = if options.zone_column.is_some() { ZONE_ROWS } else { ROW_GROUP_ROWS };
        if let Some(column) = &options.zone_column
            && schema.field_with_name(column).is_err()
        {
            return Err(TableError::WriteSegment { path, reason: format!("zone column '{column}' is not in the data") });
        }
        let mut props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(row_group_rows))
            .set_data_page_row_count_limit(DATA_PAGE_ROWS)
            .set_statistics_enabled(EnabledStatistics::Page);
        props = match options.page_encoding {
            PageEncoding::Compact => {
                let mut props = props.set_compression(Compression::SNAPPY);
                for field in schema.fields().iter().filter(|f| !compresses_well(f.data_type())) {
                    props = props.set_column_compression(ColumnPath::from(field.name().as_str()), Compression::UNCOMPRESSED);
                }
                props
            }
            PageEncoding::Plain => props.set_compression(Compression::UNCOMPRESSED).set_dictionary_enabled(false).set_encoding(Encoding::PLAIN),
            PageEncoding::Dictionary => props.set_compression(Compression::UNCOMPRESSED),
        };
        if !options.column_layouts.is_empty() {
            let parquet = parquet::arrow::ArrowSchemaConverter::new()
                .convert(&schema)
                .map_err(|e| TableError::WriteSegment { path: path.clone(), reason: e.to_string() })?;
            for layout in &options.column_layouts {
                let leaf = (0..parquet.num_columns()).find(|&c| parquet.column(c).path().string() == layout.column);
                let parsed = leaf.ok_or_else(|| format!("no flat column '{}'", layout.column)).and_then(|c| layout.parse(parquet.column(c).physical_type()));
                let (encoding, codec) = parsed.map_err(|reason| TableError::WriteSegment { path: path.clone(), reason })?;
                let column = ColumnPath::from(layout.column.as_str());
                props = props.set_column_compression(column.clone(), codec);
                props = match encoding {
                    None => props.set_column_dictionary_enabled(column, true),
                    Some(encoding) => props.set_column_dictionary_enabled(column.clone(), false).set_column_encoding(column, encoding),
                };
            }
        }
        for column in &options.bloom_filter_columns {
            props = props
                .set_column_bloom_filter_enabled(ColumnPath::from(column.as_str()), true)
                .set_column_bloom_filter_fpp(ColumnPath::from(column.as_str()), BLOOM_FILTER_FPP);
        }
        let writer = ArrowWriter::try_new(BufWriter::with_capacity(1 << 20, ChecksumWriter::new(file)), schema.clone(), Some(props.build()))
            .map_err(|e| TableError::WriteSegment { path: path.clone(), reason: e.to_string() })?;
        let sketches = schema.fields().iter().map(|f| DistinctSketch::supports(f.data_type()).then(DistinctSketch::default)).collect();
        let order = schema.fields().iter().map(|f| OrderCheck::new(f.data_type())).collect();
        Ok(SegmentWriter { id, path, schema, writer: Some(writer), rows: 0, sketches, order, zone_column: options.zone_column.clone() })
    }

    /// The segment's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Appends a batch. Columns are cast to the stored types when they differ only in
    /// representation (e.g. `Utf8View` to `Utf8`); names and count must match.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let batch = conform_batch(batch, &self.schema).map_err(|reason| TableError::WriteSegment {
            path: self.path.clone(),
            reason,
        })?;
        let writer = self.writer.as_mut().expect("write after finish");
        writer
            .write(&batch)
            .map_err(|e| TableError::WriteSegment { path: self.path.clone(), reason: e.to_string() })?;
        self.rows += batch.num_rows() as u64;
        for (sketch, column) in self.sketches.iter_mut().zip(batch.columns()) {
            if let Some(sketch) = sketch {
                sketch.add_array(column);
            }
        }
        for (order, column) in self.order.iter_mut().zip(batch.columns()) {
            order.add(column);
        }
        Ok(())
    }

    /// Closes the file, fsyncs it and returns its manifest entry.
    pub fn finish(mut self) -> Result<SegmentMeta> {
        let writer = self.writer.take().expect("finish twice");
        let write_err = |e: parquet::errors::ParquetError| TableError::WriteSegment {
            path: self.path.clone(),
            reason: e.to_string(),
        };
        let mut writer = writer;
        let metadata = writer.finish().map_err(write_err)?;
        // `finish` wrote the footer; flush our buffer and make the file durable before any
        // manifest can name it.
        let buffered = writer.inner_mut();
        std::io::Write::flush(buffered).map_err(TableError::io("flushing", &self.path))?;
        let checksums = buffered.get_ref().checksums();
        let file = buffered.get_ref().get_ref();
        file.sync_all().map_err(TableError::io("syncing", &self.path))?;
        let bytes = file.metadata().map_err(TableError::io("reading metadata of", &self.path))?.len();
        assert!(checksums.covers(bytes), "the checksums cover every byte written");
        let mut columns = column_stats(&metadata, &self.schema).map_err(|reason| TableError::WriteSegment {
            path: self.path.clone(),
            reason,
        })?;
        for ((column, sketch), order) in columns.iter_mut().zip(&self.sketches).zip(&self.order) {
            column.distinct = sketch.as_ref().map(DistinctSketch::encode);
            column.ascending = order.ascending && self.rows > 0;
        }
        assert_eq!(metadata.file_metadata().num_rows() as u64, self.rows, "parquet row count differs from rows written");
        let zones = match &self.zone_column {
            Some(column) => Some(zones(&metadata, &self.schema, column).map_err(|reason| TableError::WriteSegment { path: self.path.clone(), reason })?),
            None => None,
        };
        let meta = SegmentMeta {
            zones,
            id: self.id.clone(),
            path: segment_relative_path(&self.id),
            rows: self.rows,
            bytes,
            row_groups: metadata.num_row_groups() as u32,
            columns,
            checksums: Some(checksums),
            // Its commit numbers it.
            range: 0,
        };
        self.path = PathBuf::new(); // finished: keep the file
        Ok(meta)
    }
}

/// Whether a column's values arrive in non-decreasing order with no NULLs. Checked for integer,
/// decimal and temporal columns only (the keys a table is sorted by); others are never ascending.
struct OrderCheck {
    ascending: bool,
    /// The last value seen, copied out of its batch (a slice would keep the batch alive).
    last: Option<ArrayRef>,
}

impl OrderCheck {
    fn new(data_type: &DataType) -> Self {
        let checked = data_type.is_integer() || data_type.is_temporal() || matches!(data_type, DataType::Decimal128(..) | DataType::Decimal256(..));
        OrderCheck { ascending: checked, last: None }
    }

    fn add(&mut self, column: &ArrayRef) {
        if !self.ascending || column.is_empty() {
            return;
        }
        let n = column.len();
        let descends = |later: &dyn Array, earlier: &dyn Array| lt(&later, &earlier).map(|d| d.true_count() > 0).unwrap_or(true);
        self.ascending = column.null_count() == 0
            && !descends(column.slice(1, n - 1).as_ref(), column.slice(0, n - 1).as_ref())
            && self.last.as_ref().is_none_or(|last| !descends(column.slice(0, 1).as_ref(), last.as_ref()));
        self.last = if self.ascending { concat(&[column.slice(n - 1, 1).as_ref()]).ok() } else { None };
    }
}

impl Drop for SegmentWriter {
    fn drop(&mut self) {
        if self.writer.is_some() && !self.path.as_os_str().is_empty() {
            // Aborted: the file belongs to no manifest, so removing it is always safe.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Casts `batch` to `schema` when only the physical representation differs.
pub fn conform_batch(batch: &RecordBatch, schema: &SchemaRef) -> std::result::Result<RecordBatch, String> {
    if batch.schema().fields() == schema.fields() {
        return Ok(batch.clone());
    }
    if batch.num_columns() != schema.fields().len() {
        return Err(format!("batch has {} columns, table has {}", batch.num_columns(), schema.fields().len()));
    }
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (array, field) in batch.columns().iter().zip(schema.fields()) {
        if !field.is_nullable() && array.null_count() > 0 {
            return Err(format!("column '{}' is NOT NULL but the data has NULLs", field.name()));
        }
        let column = if array.data_type() == field.data_type() {
            array.clone()
        } else {
            cast(array, field.data_type()).map_err(|e| format!("column '{}': {e}", field.name()))?
        };
        columns.push(column);
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

/// Per-column statistics of a whole segment, from its row-group statistics.
fn column_stats(metadata: &ParquetMetaData, schema: &SchemaRef) -> std::result::Result<Vec<ColumnStats>, String> {
    let parquet_schema = metadata.file_metadata().schema_descr();
    let row_groups = metadata.row_groups();
    let mut out = Vec::with_capacity(schema.fields().len());
    for (index, field) in schema.fields().iter().enumerate() {
        let converter = StatisticsConverter::try_new(field.name(), schema, parquet_schema).map_err(|e| e.to_string())?;
        let null_counts = converter.row_group_null_counts(row_groups.iter()).map_err(|e| e.to_string())?;
        let mins = converter.row_group_mins(row_groups.iter()).map_err(|e| e.to_string())?;
        let maxes = converter.row_group_maxes(row_groups.iter()).map_err(|e| e.to_string())?;
        // A row group that is all NULL has no bounds and constrains nothing; any other row group
        // without bounds makes the segment's bounds unknown.
        let mut complete = true;
        for (i, rg) in row_groups.iter().enumerate() {
            let all_null = !null_counts.is_null(i) && null_counts.value(i) as i64 == rg.num_rows();
            if !all_null && (mins.is_null(i) || maxes.is_null(i)) {
                complete = false;
            }
        }
        let (min, max) = if complete { (extreme(&mins, false)?, extreme(&maxes, true)?) } else { (None, None) };
        let null_count = (null_counts.null_count() == 0).then(|| null_counts.values().iter().sum());
        let mut encodings = Vec::new();
        let (mut compressed_bytes, mut uncompressed_bytes) = (0u64, 0u64);
        let mut compression = String::new();
        for rg in row_groups {
            let chunk = rg.column(index);
            for encoding in chunk.encodings() {
                let name = encoding.to_string();
                if !encodings.contains(&name) {
                    encodings.push(name);
                }
            }
            compression = chunk.compression().to_string();
            compressed_bytes += chunk.compressed_size() as u64;
            uncompressed_bytes += chunk.uncompressed_size() as u64;
        }
        out.push(ColumnStats {
            name: field.name().clone(),
            min,
            max,
            null_count,
            encodings,
            compression,
            compressed_bytes,
            uncompressed_bytes,
            distinct: None,
            ascending: false,
        });
    }
    Ok(out)
}

/// Each row group's rows and bounds in `column`.
fn zones(metadata: &ParquetMetaData, schema: &SchemaRef, column: &str) -> std::result::Result<Zones, String> {
    let converter = StatisticsConverter::try_new(column, schema, metadata.file_metadata().schema_descr()).map_err(|e| e.to_string())?;
    let row_groups = metadata.row_groups();
    let mins = converter.row_group_mins(row_groups.iter()).map_err(|e| e.to_string())?;
    let maxes = converter.row_group_maxes(row_groups.iter()).map_err(|e| e.to_string())?;
    let text = |array: &ArrayRef, i: usize| extreme(&array.slice(i, 1), false);
    let mut zones = Zones { column: column.to_string(), rows: Vec::new(), min: Vec::new(), max: Vec::new() };
    for (i, rg) in row_groups.iter().enumerate() {
        zones.rows.push(rg.num_rows() as u64);
        zones.min.push(text(&mins, i)?);
        zones.max.push(text(&maxes, i)?);
    }
    Ok(zones)
}

/// The smallest (or largest) non-NULL value of `array` as canonical text.
fn extreme(array: &ArrayRef, largest: bool) -> std::result::Result<Option<String>, String> {
    if array.null_count() == array.len() {
        return Ok(None);
    }
    let options = SortOptions { descending: largest, nulls_first: false };
    let index = sort_to_indices(array, Some(options), Some(1)).map_err(|e| e.to_string())?;
    let formatter = ArrayFormatter::try_new(array.as_ref(), &FormatOptions::default()).map_err(|e| e.to_string())?;
    Ok(Some(formatter.value(index.value(0) as usize).to_string()))
}
