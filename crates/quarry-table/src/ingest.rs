//! Turning streams of batches into segments: sequentially (file loads) or chunk-parallel
//! (generators).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::array::RecordBatch;

use crate::error::Result;
use crate::manifest::SegmentMeta;
use crate::segment::{ROW_GROUP_ROWS, SegmentWriter};
use crate::warehouse::TableWriter;

/// Writes `batches` into segments of at most [`ROW_GROUP_ROWS`] rows each (one row group per
/// segment). `progress` is called with the rows written so far. Stops at the first error; the
/// caller then drops the [`TableWriter`], which removes the segments.
pub fn write_batches(
    writer: &TableWriter,
    batches: impl Iterator<Item = Result<RecordBatch>>,
    progress: &dyn Fn(u64),
) -> Result<Vec<SegmentMeta>> {
    write_segments_of(writer, batches, ROW_GROUP_ROWS, None, progress)
}

/// [`write_batches`] into segments of at most `segment_rows` rows each; with `sorted_by`, the
/// segments of a copy sorted by that column ([`TableWriter::new_sorted_segment`]).
pub fn write_segments_of(
    writer: &TableWriter,
    batches: impl Iterator<Item = Result<RecordBatch>>,
    segment_rows: usize,
    sorted_by: Option<&str>,
    progress: &dyn Fn(u64),
) -> Result<Vec<SegmentMeta>> {
    let segment_rows = segment_rows.max(1);
    let mut segments = Vec::new();
    let mut current: Option<SegmentWriter> = None;
    let mut rows_total = 0u64;
    for batch in batches {
        let mut batch = batch?;
        while batch.num_rows() > 0 {
            let segment = match &mut current {
                Some(segment) => segment,
                None => current.insert(match sorted_by {
                    Some(key) => writer.new_sorted_segment(key)?,
                    None => writer.new_segment()?,
                }),
            };
            let room = segment_rows - segment.rows() as usize;
            let take = room.min(batch.num_rows());
            segment.write(&batch.slice(0, take))?;
            batch = batch.slice(take, batch.num_rows() - take);
            rows_total += take as u64;
            if segment.rows() as usize >= segment_rows {
                segments.push(current.take().expect("segment open").finish()?);
            }
        }
        progress(rows_total);
    }
    if let Some(segment) = current {
        segments.push(segment.finish()?);
    }
    Ok(segments)
}

/// Writes chunks `0..chunk_count` on `threads` threads, each chunk into its own segment, and
/// returns the segments in chunk order. `make_chunk(i)` yields chunk `i`'s batches; memory is
/// bounded by one chunk in flight per thread. `progress` receives rows written so far.
pub fn write_chunks_parallel<'a, F, I>(
    writer: &TableWriter,
    chunk_count: usize,
    threads: usize,
    make_chunk: F,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<SegmentMeta>>
where
    F: Fn(usize) -> I + Sync,
    I: Iterator<Item = RecordBatch> + 'a,
{
    let next = AtomicUsize::new(0);
    let rows = std::sync::atomic::AtomicU64::new(0);
    let results: Mutex<Vec<(usize, SegmentMeta)>> = Mutex::new(Vec::with_capacity(chunk_count));
    let failed: Mutex<Option<crate::error::TableError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, chunk_count.max(1)) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= chunk_count || failed.lock().expect("lock").is_some() {
                        break;
                    }
                    let outcome = (|| -> Result<Option<SegmentMeta>> {
                        let mut segment: Option<SegmentWriter> = None;
                        for batch in make_chunk(index) {
                            if batch.num_rows() == 0 {
                                continue;
                            }
                            let open = match &mut segment {
                                Some(s) => s,
                                None => segment.insert(writer.new_segment()?),
                            };
                            open.write(&batch)?;
                            let total = rows.fetch_add(batch.num_rows() as u64, Ordering::Relaxed) + batch.num_rows() as u64;
                            progress(total);
                        }
                        segment.map(SegmentWriter::finish).transpose()
                    })();
                    match outcome {
                        Ok(Some(meta)) => results.lock().expect("lock").push((index, meta)),
                        Ok(None) => {}
                        Err(e) => {
                            failed.lock().expect("lock").get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().expect("lock") {
        return Err(e);
    }
    let mut results = results.into_inner().expect("lock");
    results.sort_by_key(|(index, _)| *index);
    Ok(results.into_iter().map(|(_, meta)| meta).collect())
}

/// Where a load's rows come from.
pub enum LoadSource {
    /// A CSV or Parquet file (Parquet by its `.parquet` extension unless a format is given).
    File(std::path::PathBuf),
    /// Batches in memory (their schema becomes the table's), e.g. from Python.
    Batches(Box<dyn arrow::array::RecordBatchReader + Send>),
}

/// How a load writes.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Add the rows to the table instead of replacing it.
    pub append: bool,
    /// `"csv"` or `"parquet"` for a file; `None` goes by its extension.
    pub format: Option<String>,
    /// A CSV file's columns; `None` infers them (or takes the table's when appending).
    pub schema: Option<arrow::datatypes::SchemaRef>,
    /// How a CSV file is parsed.
    pub csv: crate::csv_import::CsvOptions,
    /// How segments are written.
    pub segments: crate::SegmentOptions,
}

/// Loads `source` into `table` (its name folded to lowercase, as unquoted SQL identifiers are)
/// as one atomic commit: on an error the table is as it was. `progress` gets the rows written
/// so far. The new version's manifest.
pub fn load_table(
    warehouse: &crate::Warehouse,
    table: &str,
    source: LoadSource,
    options: &LoadOptions,
    progress: &dyn Fn(u64),
) -> Result<crate::manifest::Manifest> {
    use crate::TableError;
    use crate::csv_import::{CsvBatchReader, infer_csv_schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let table = table.to_lowercase();
    let mode = if options.append { crate::WriteMode::Append } else { crate::WriteMode::Replace };
    let write = |schema: &arrow::datatypes::SchemaRef, batches: &mut dyn Iterator<Item = Result<RecordBatch>>| {
        let writer = warehouse.begin_write(&table, schema, mode, options.segments.clone(), vec![])?;
        let segments = write_batches(&writer, batches, progress)?;
        writer.commit(segments, vec![])
    };
    let path = match source {
        LoadSource::Batches(reader) => {
            let schema = reader.schema();
            let invalid = |e: arrow::error::ArrowError| TableError::InvalidInput { file: "<arrow data>".into(), reason: e.to_string() };
            return write(&schema, &mut reader.map(|b| b.map_err(invalid)));
        }
        LoadSource::File(path) => path,
    };
    let parquet = match options.format.as_deref() {
        Some("parquet") => true,
        Some("csv") => false,
        Some(other) => return Err(TableError::InvalidInput { file: path, reason: format!("unknown format '{other}' (csv or parquet)") }),
        None => path.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet")),
    };
    if parquet {
        if options.schema.is_some() {
            return Err(TableError::InvalidInput { file: path, reason: "a schema applies to CSV files; a Parquet file carries its own".into() });
        }
        let invalid = |e: &dyn std::fmt::Display| TableError::InvalidInput { file: path.clone(), reason: format!("not a readable Parquet file: {e}") };
        let file = std::fs::File::open(&path).map_err(|e| TableError::InvalidInput { file: path.clone(), reason: format!("opening: {e}") })?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).and_then(|b| b.with_batch_size(64 * 1024).build()).map_err(|e| invalid(&e))?;
        let schema = arrow::array::RecordBatchReader::schema(&reader);
        return write(&schema, &mut reader.map(|b| b.map_err(|e| invalid(&e))));
    }
    let existing = (options.append && warehouse.table_exists(&table)).then(|| warehouse.table(&table));
    let schema = match (&options.schema, existing) {
        (Some(schema), _) => schema.clone(),
        // Appending without a schema: parse the file as the table's columns.
        (None, Some(existing)) => existing?.schema,
        (None, None) => infer_csv_schema(&path, &options.csv)?,
    };
    let writer = warehouse.begin_write(&table, &schema, mode, options.segments.clone(), vec![])?;
    let reader = CsvBatchReader::try_new(&path, writer.schema().clone(), options.csv.clone())?;
    let segments = write_batches(&writer, reader, progress)?;
    writer.commit(segments, vec![])
}
