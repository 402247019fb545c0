//! `quarry load`: a CSV or Parquet file into a table, atomically.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use quarry_table::csv_import::CsvOptions;
use quarry_table::ingest::{LoadOptions, LoadSource, load_table};
use quarry_table::{PageEncoding, SegmentOptions, Warehouse};

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
    /// How data pages are encoded: compact (dictionary; Snappy on text columns), dictionary (dictionary, no
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

fn load(warehouse: &Path, args: LoadArgs, threads: usize) -> CliResult {
    let started = Instant::now();
    let table = args.table.to_lowercase();
    let warehouse = Warehouse::open(warehouse).map_err(|e| e.to_string())?;
    let schema = match &args.schema {
        Some(text) => Some(with_runtime(threads.min(2), async {
            quarry_engine::parse_schema(text).await.map_err(|e| format!("--schema: {}", quarry_engine::user_message(&e)))
        })?),
        None => None,
    };
    let options = LoadOptions {
        append: args.append,
        format: args.format.clone(),
        schema,
        csv: CsvOptions {
            delimiter: single_byte(args.delimiter, "--delimiter")?,
            escape: args.escape.map(|c| single_byte(c, "--escape")).transpose()?,
            has_header: !args.no_header,
            null_text: args.null.clone(),
            ..CsvOptions::default()
        },
        segments: SegmentOptions { bloom_filter_columns: args.bloom_filter.clone(), page_encoding: args.page_encoding, ..Default::default() },
    };
    let bar = rows_bar(&table, None);
    let manifest = load_table(&warehouse, &table, LoadSource::File(args.path.clone()), &options, &|rows| bar.set_position(rows)).map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    eprintln!(
        "{table}: {} rows in {} segments (version {}), {:.2}s",
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
