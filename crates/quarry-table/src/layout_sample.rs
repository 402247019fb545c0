//! Measures, on a sample of a table's rows, what each Parquet column layout (an encoding and a
//! codec) would cost: stored bytes and decode time per row, on this machine. The layout
//! planner (`quarry layout plan`) scales them to the table and feeds them to its model.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use bytes::Bytes;
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, Encoding, Type as PhysicalType, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::segment::{DATA_PAGE_ROWS, ROW_GROUP_ROWS};
use crate::{Result, TableError, TableSnapshot};

/// The encodings tried: `None` is dictionary encoding (RLE_DICTIONARY, falling back to PLAIN
/// when the dictionary outgrows its page, as the writer does). Each is tried on the columns
/// whose Parquet type it can encode ([`encodes`]).
pub const ENCODINGS: &[Option<Encoding>] = &[
    Some(Encoding::PLAIN),
    None,
    Some(Encoding::DELTA_BINARY_PACKED),
    Some(Encoding::DELTA_LENGTH_BYTE_ARRAY),
    Some(Encoding::DELTA_BYTE_ARRAY),
    Some(Encoding::BYTE_STREAM_SPLIT),
    Some(Encoding::RLE),
];

/// Whether `encoding` (`None`: dictionary) can encode values of `physical` type (the Parquet
/// format's table; the writer panics rather than refuse the others).
pub fn encodes(encoding: Option<Encoding>, physical: PhysicalType) -> bool {
    use PhysicalType::*;
    match encoding {
        None => physical != BOOLEAN,
        Some(Encoding::PLAIN) => true,
        Some(Encoding::RLE) => physical == BOOLEAN,
        Some(Encoding::DELTA_BINARY_PACKED) => matches!(physical, INT32 | INT64),
        Some(Encoding::DELTA_LENGTH_BYTE_ARRAY) => physical == BYTE_ARRAY,
        Some(Encoding::DELTA_BYTE_ARRAY) => matches!(physical, BYTE_ARRAY | FIXED_LEN_BYTE_ARRAY),
        Some(Encoding::BYTE_STREAM_SPLIT) => matches!(physical, FLOAT | DOUBLE | INT32 | INT64 | FIXED_LEN_BYTE_ARRAY),
        Some(_) => false,
    }
}

/// The page codecs tried (the workspace's Parquet has Snappy and ZSTD; LZ4 is not built in).
pub fn codecs() -> Vec<Compression> {
    let zstd = |level| Compression::ZSTD(ZstdLevel::try_new(level).expect("valid ZSTD level"));
    vec![Compression::UNCOMPRESSED, Compression::SNAPPY, zstd(1), zstd(3), zstd(9)]
}

/// One layout of one column, measured on the sample.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredLayout {
    /// `PLAIN`, `RLE_DICTIONARY`, ...
    pub encoding: String,
    /// `UNCOMPRESSED`, `SNAPPY`, `ZSTD(3)`, ...
    pub codec: String,
    /// Stored bytes per row (the column chunk's pages and dictionary, footer aside).
    pub bytes_per_row: f64,
    /// Nanoseconds per row to decompress and decode to Arrow, on this machine (best of runs).
    pub decode_ns_per_row: f64,
}

/// Up to `rows` rows of `table`, taken from the starts of segments spread over the table.
pub fn sample_rows(table: &TableSnapshot, rows: usize) -> Result<Vec<RecordBatch>> {
    let segments = &table.manifest.segments;
    if segments.is_empty() || rows == 0 {
        return Ok(Vec::new());
    }
    // Up to 64 segments evenly spaced, an equal share from each: a table already sorted by a
    // column is then sampled over that column's whole range, not at a few points of it.
    let picks = segments.len().min(64);
    let share = rows.div_ceil(picks);
    let mut batches = Vec::new();
    for pick in 0..picks {
        let segment = &segments[pick * segments.len() / picks];
        let path = table.segment_path(segment);
        let file = std::fs::File::open(&path).map_err(TableError::io("opening", &path))?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.with_limit(share).with_batch_size(8192).build())
            .map_err(|e| TableError::CorruptSegment { path: path.clone(), reason: e.to_string() })?;
        for batch in reader {
            batches.push(batch.map_err(|e| TableError::CorruptSegment { path: path.clone(), reason: e.to_string() })?);
        }
    }
    Ok(batches)
}

/// Every layout the writer accepts for column `column` of `batches`, measured.
pub fn measure_column(batches: &[RecordBatch], column: usize) -> Vec<MeasuredLayout> {
    let Some(first) = batches.first() else { return Vec::new() };
    let field = first.schema().field(column).clone();
    let schema = Arc::new(Schema::new(vec![field.clone()]));
    let columns: Vec<RecordBatch> = batches
        .iter()
        .map(|b| RecordBatch::try_new(Arc::clone(&schema), vec![Arc::clone(b.column(column))]).expect("one column of the batch's own"))
        .collect();
    let rows: usize = columns.iter().map(RecordBatch::num_rows).sum();
    if rows == 0 {
        return Vec::new();
    }
    let path = ColumnPath::from(field.name().as_str());
    let Ok(parquet_schema) = ArrowSchemaConverter::new().convert(&schema) else { return Vec::new() };
    // A flat column has one leaf; a nested one is measured in its default layout only.
    let physical = (parquet_schema.num_columns() == 1).then(|| parquet_schema.column(0).physical_type());
    let mut measured = Vec::new();
    for encoding in ENCODINGS.iter().filter(|e| physical.is_some_and(|p| encodes(**e, p))) {
        for codec in codecs() {
            let mut props = WriterProperties::builder()
                .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
                .set_data_page_row_count_limit(DATA_PAGE_ROWS)
                .set_compression(codec);
            props = match encoding {
                None => props.set_column_dictionary_enabled(path.clone(), true),
                Some(encoding) => props.set_column_dictionary_enabled(path.clone(), false).set_column_encoding(path.clone(), *encoding),
            };
            let Some(file) = write(&schema, &columns, props.build()) else { continue };
            let Some(chunk_bytes) = column_chunk_bytes(&file) else { continue };
            let Some(decode_ns) = decode_ns(&file) else { continue };
            measured.push(MeasuredLayout {
                encoding: encoding.map_or("RLE_DICTIONARY".to_string(), |e| e.to_string()),
                codec: codec_name(codec),
                bytes_per_row: chunk_bytes as f64 / rows as f64,
                decode_ns_per_row: decode_ns as f64 / rows as f64,
            });
        }
    }
    measured
}

/// A codec's name as the planner prints it: `SNAPPY`, `ZSTD(3)`.
pub fn codec_name(codec: Compression) -> String {
    match codec {
        Compression::ZSTD(level) => format!("ZSTD({})", level.compression_level()),
        other => other.to_string(),
    }
}

/// Per column of `table` (schema order), the bytes its column chunks take in the stored
/// segments, from their footers.
pub fn stored_column_bytes(table: &TableSnapshot) -> Result<Vec<u64>> {
    let mut bytes = vec![0u64; table.schema.fields().len()];
    for segment in &table.manifest.segments {
        let path = table.segment_path(segment);
        let file = std::fs::File::open(&path).map_err(TableError::io("opening", &path))?;
        let metadata = parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&file)
            .map_err(|e| TableError::CorruptSegment { path: path.clone(), reason: e.to_string() })?;
        for group in metadata.row_groups() {
            for (total, column) in bytes.iter_mut().zip(group.columns()) {
                *total += column.compressed_size() as u64;
            }
        }
    }
    Ok(bytes)
}

/// The Parquet file of `columns` under `props`, or `None` if the writer refuses the layout.
fn write(schema: &Arc<Schema>, columns: &[RecordBatch], props: WriterProperties) -> Option<Bytes> {
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, Arc::clone(schema), Some(props)).ok()?;
    for batch in columns {
        writer.write(batch).ok()?;
    }
    writer.close().ok()?;
    Some(Bytes::from(out))
}

/// The compressed bytes of the file's column chunks.
fn column_chunk_bytes(file: &Bytes) -> Option<i64> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(file.clone()).ok()?;
    Some(builder.metadata().row_groups().iter().flat_map(|g| g.columns()).map(|c| c.compressed_size()).sum())
}

/// Nanoseconds to read the whole file into Arrow batches: the best of three runs.
fn decode_ns(file: &Bytes) -> Option<u128> {
    let mut best = u128::MAX;
    for _ in 0..3 {
        let started = Instant::now();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file.clone()).ok()?.with_batch_size(8192).build().ok()?;
        for batch in reader {
            std::hint::black_box(batch.ok()?);
        }
        best = best.min(started.elapsed().as_nanos());
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int64Array, StringArray};

    fn batch() -> RecordBatch {
        // A sorted integer column (DELTA packs it to almost nothing) and a low-cardinality string.
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..50_000));
        let names: ArrayRef = Arc::new(StringArray::from_iter_values((0..50_000).map(|i| ["red", "green", "blue"][i % 3])));
        RecordBatch::try_from_iter([("id", ids), ("colour", names)]).unwrap()
    }

    #[test]
    fn layouts_are_measured_and_refused_ones_skipped() {
        let batches = vec![batch()];
        let ids = measure_column(&batches, 0);
        let find = |m: &[MeasuredLayout], e: &str, c: &str| m.iter().find(|l| l.encoding == e && l.codec == c).cloned();
        let plain = find(&ids, "PLAIN", "UNCOMPRESSED").expect("plain integers");
        let delta = find(&ids, "DELTA_BINARY_PACKED", "UNCOMPRESSED").expect("delta integers");
        // PLAIN stores 8 bytes a value; DELTA of consecutive integers well under one.
        assert!((7.9..8.5).contains(&plain.bytes_per_row), "{plain:?}");
        assert!(delta.bytes_per_row < 0.5, "{delta:?}");
        assert!(ids.iter().all(|l| l.decode_ns_per_row > 0.0));
        // No DELTA_BYTE_ARRAY for integers, no DELTA_BINARY_PACKED for strings.
        assert!(find(&ids, "DELTA_BYTE_ARRAY", "UNCOMPRESSED").is_none());
        let colours = measure_column(&batches, 1);
        assert!(find(&colours, "DELTA_BINARY_PACKED", "UNCOMPRESSED").is_none());
        let dictionary = find(&colours, "RLE_DICTIONARY", "UNCOMPRESSED").expect("dictionary strings");
        let plain = find(&colours, "PLAIN", "UNCOMPRESSED").expect("plain strings");
        assert!(dictionary.bytes_per_row < plain.bytes_per_row / 4.0, "{dictionary:?} vs {plain:?}");
        // Every codec was tried for the dictionary.
        assert_eq!(colours.iter().filter(|l| l.encoding == "RLE_DICTIONARY").count(), codecs().len());
    }
}
