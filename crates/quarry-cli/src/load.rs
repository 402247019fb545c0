//! `quarry load`: a CSV or Parquet file into a table, atomically.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use arrow::array::RecordBatch;
use clap::Args;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use quarry_table::csv_import::{CsvBatchReader, CsvOptions, infer_csv_schema};
use quarry_table::ingest::write_batches;
use quarry_table::{PageEncoding, SegmentOptions, TableError, Warehouse, WriteMode};

use crate::progress::rows_bar;
use crate::target::Target;
use crate::{CliResult, with_runtime};

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Table to load into.
    table: String,
    /// Input file.
    path: PathBuf,
    /// Input format (default: from the file extension, else csv).
    #[arg(long, value_parser = ["csv", "parquet"])]
    format: Option<String>,
    /// Column names and SQL types, e.g. 'id INT, name VARCHAR, price DECIMAL(10,2)' (CSV only;
    /// without it, types are inferred).
    #[arg(long)]
    schema: Option<String>,
    /// Add the rows to the table instead of replacing it.
    #[arg(long)]
    append: bool,
    /// CSV field delimiter.
    #[arg(long, default_value = ",")]
    delimiter: char,
    /// CSV escape character inside quoted fields (default: quotes are escaped by doubling).
    #[arg(long)]
    escape: Option<char>,
    /// The CSV file has no header line.
    #[arg(long)]
    no_header: bool,
    /// CSV text meaning NULL, besides an empty field.
    #[arg(long)]
    null: Option<String>,
    /// Columns to give Parquet Bloom filters (comma-separated).
    #[arg(long, value_delimiter = ',')]
    bloom_filter: Vec<String>,
    /// How data pages are encoded: compact (dictionary + Snappy), dictionary (dictionary, no
    /// further compression) or plain (PLAIN, uncompressed).
    /// An append keeps the table's encoding.
    #[arg(long, default_value = "compact")]
    page_encoding: PageEncoding,
}

pub fn run(target: &Target, args: LoadArgs, threads: usize) -> CliResult {
    let append = args.append;
    target.write_tables(threads, append, |warehouse| {
        // Appending to a table on nodes: parse with the table's own types, as locally.
        if append && target.is_remote() {
            target.stage_remote_schema(warehouse, &args.table.to_lowercase(), threads)?;
        }
        load(warehouse, args, threads)
    })
}

fn load(warehouse: &Path, mut args: LoadArgs, threads: usize) -> CliResult {
    let started = Instant::now();
    // Table names fold to lowercase, as unquoted SQL identifiers do.
    args.table = args.table.to_lowercase();
    let warehouse = Warehouse::open(warehouse).map_err(|e| e.to_string())?;
    let format = args.format.clone().unwrap_or_else(|| {
        let parquet = args.path.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
        if parquet { "parquet" } else { "csv" }.to_string()
    });
    let mode = if args.append { WriteMode::Append } else { WriteMode::Replace };
    let options = SegmentOptions { bloom_filter_columns: args.bloom_filter.clone(), page_encoding: args.page_encoding };
    let bar = rows_bar(&args.table, None);
    let progress = |rows: u64| bar.set_position(rows);
    let manifest = match format.as_str() {
        "parquet" => {
            if args.schema.is_some() {
                return Err("--schema applies to CSV files; a Parquet file carries its own schema".into());
            }
            let file = File::open(&args.path).map_err(|e| format!("opening {}: {e}", args.path.display()))?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .and_then(|b| b.with_batch_size(64 * 1024).build())
                .map_err(|e| format!("{}: not a readable Parquet file: {e}", args.path.display()))?;
            let schema = arrow::array::RecordBatchReader::schema(&reader);
            let writer = warehouse.begin_write(&args.table, &schema, mode, options, vec![]).map_err(|e| e.to_string())?;
            let path = args.path.clone();
            let batches = reader.map(|b: Result<RecordBatch, _>| {
                b.map_err(|e| TableError::InvalidInput { file: path.clone(), reason: e.to_string() })
            });
            let segments = write_batches(&writer, batches, &progress).map_err(|e| e.to_string())?;
            writer.commit(segments, vec![]).map_err(|e| e.to_string())?
        }
        _ => {
            let csv = CsvOptions {
                delimiter: single_byte(args.delimiter, "--delimiter")?,
                escape: args.escape.map(|c| single_byte(c, "--escape")).transpose()?,
                has_header: !args.no_header,
                null_text: args.null.clone(),
                ..CsvOptions::default()
            };
            let existing = (args.append && warehouse.table_exists(&args.table)).then(|| warehouse.table(&args.table));
            let schema = match (&args.schema, existing) {
                // Appending without a schema: parse the file as the table's columns.
                (None, Some(table)) => table.map_err(|e| e.to_string())?.schema,
                (Some(text), _) => with_runtime(threads.min(2), async {
                    quarry_engine::parse_schema(text).await.map_err(|e| format!("--schema: {}", quarry_engine::user_message(&e)))
                })?,
                (None, None) => infer_csv_schema(&args.path, &csv).map_err(|e| e.to_string())?,
            };
            let writer = warehouse.begin_write(&args.table, &schema, mode, options, vec![]).map_err(|e| e.to_string())?;
            let reader = CsvBatchReader::try_new(&args.path, writer.schema().clone(), csv).map_err(|e| e.to_string())?;
            let segments = write_batches(&writer, reader, &progress).map_err(|e| e.to_string())?;
            writer.commit(segments, vec![]).map_err(|e| e.to_string())?
        }
    };
    bar.finish_and_clear();
    eprintln!(
        "{}: {} rows in {} segments (version {}), {:.2}s",
        args.table,
        manifest.total_rows(),
        manifest.segments.len(),
        manifest.version,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn single_byte(c: char, flag: &str) -> CliResult<u8> {
    if c.is_ascii() { Ok(c as u8) } else { Err(format!("{flag} must be a single ASCII character")) }
}
