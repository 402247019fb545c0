//! `quarry gen`: benchmark data straight into the warehouse, chunk-parallel.

use std::path::Path;
use std::time::Instant;

use clap::{Args, Subcommand};
use quarry_gen::TableGenerator;
use quarry_table::ingest::write_chunks_parallel;
use quarry_table::{PageEncoding, SegmentOptions, Warehouse, WriteMode};

use crate::CliResult;
use crate::progress::rows_bar;
use crate::target::Target;

#[derive(Debug, Args)]
pub struct GenArgs {
    #[command(subcommand)]
    dataset: Dataset,
    /// How data pages are encoded: compact (dictionary; Snappy on text columns), dictionary (dictionary, no
    /// further compression) or plain (PLAIN, uncompressed: the Smart SSD paper's uncompressed
    /// pages, which selective scans skip through cheaply).
    #[arg(long, global = true, default_value = "compact")]
    page_encoding: PageEncoding,
}

#[derive(Debug, Subcommand)]
enum Dataset {
    /// The Star Schema Benchmark: lineorder, customer, supplier, part, date.
    Ssb {
        /// Scale factor (1 = 6M lineorder rows).
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        /// Random seed; the same seed gives the same data.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Rows per segment, about (smaller segments spread a small table over more nodes).
        #[arg(long, default_value_t = quarry_gen::CHUNK_ROWS_TARGET)]
        segment_rows: u64,
    },
    /// TPC-H (via the tpchgen crate): the eight TPC-H tables.
    Tpch {
        /// Scale factor (1 = 6M lineitem rows).
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        /// Rows per segment, about.
        #[arg(long, default_value_t = quarry_gen::CHUNK_ROWS_TARGET)]
        segment_rows: u64,
    },
    /// The Smart SSD paper's Synthetic4/16/64 tables of uniform integers.
    Synthetic {
        /// Number of integer columns (the paper uses 4, 16 and 64).
        #[arg(long)]
        columns: usize,
        /// Number of rows.
        #[arg(long)]
        rows: u64,
        /// Table name (default synthetic<columns>).
        #[arg(long)]
        name: Option<String>,
        /// Random seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Manifest properties recording how a table was made.
type Properties = Vec<(String, String)>;

pub fn run(target: &Target, args: GenArgs, threads: usize) -> CliResult {
    target.write_tables(threads, false, |warehouse| generate(warehouse, args, threads))
}

fn generate(warehouse: &Path, args: GenArgs, threads: usize) -> CliResult {
    let warehouse = Warehouse::open(warehouse).map_err(|e| e.to_string())?;
    let (tables, properties): (Vec<Box<dyn TableGenerator>>, Properties) = match args.dataset {
        Dataset::Ssb { sf, seed, segment_rows } => {
            check_sf(sf)?;
            (quarry_gen::ssb::ssb_tables_chunked(sf, seed, check_segment_rows(segment_rows)?), vec![prop("generator", "ssb"), prop("scale_factor", sf), prop("seed", seed)])
        }
        Dataset::Tpch { sf, segment_rows } => {
            check_sf(sf)?;
            (quarry_gen::tpch::tpch_tables_chunked(sf, check_segment_rows(segment_rows)?), vec![prop("generator", "tpch"), prop("scale_factor", sf)])
        }
        Dataset::Synthetic { columns, rows, name, seed } => {
            if columns == 0 {
                return Err("--columns must be at least 1".into());
            }
            let name = name.unwrap_or_else(|| format!("synthetic{columns}"));
            let table = quarry_gen::synthetic::synthetic_table(&name, columns, rows, seed);
            (vec![table], vec![prop("generator", "synthetic"), prop("rows", rows), prop("seed", seed)])
        }
    };
    generate_tables(&warehouse, &tables, &properties, args.page_encoding, threads)
}

fn check_sf(sf: f64) -> CliResult {
    if sf.is_finite() && sf > 0.0 { Ok(()) } else { Err(format!("--sf must be a positive number, not {sf}")) }
}

fn check_segment_rows(rows: u64) -> CliResult<u64> {
    if rows >= 1000 { Ok(rows) } else { Err(format!("--segment-rows must be at least 1000, not {rows}")) }
}

fn prop(key: &str, value: impl ToString) -> (String, String) {
    (key.to_string(), value.to_string())
}

/// Generates and commits each table in turn; a failure leaves every table as it was.
pub fn generate_tables(
    warehouse: &Warehouse,
    tables: &[Box<dyn TableGenerator>],
    properties: &[(String, String)],
    page_encoding: PageEncoding,
    threads: usize,
) -> CliResult {
    for table in tables {
        let started = Instant::now();
        let options = SegmentOptions { bloom_filter_columns: table.bloom_filter_columns(), page_encoding, ..Default::default() };
        let writer = warehouse
            .begin_write(table.name(), &table.schema(), WriteMode::Replace, options, table.sort_key())
            .map_err(|e| e.to_string())?;
        let bar = rows_bar(table.name(), Some(table.estimated_rows()));
        let segments = write_chunks_parallel(&writer, table.chunk_count(), threads, |i| table.chunk(i), &|rows| bar.set_position(rows))
            .map_err(|e| e.to_string())?;
        bar.finish_and_clear();
        let manifest = writer.commit(segments, properties.to_vec()).map_err(|e| e.to_string())?;
        eprintln!(
            "{:>12}: {} rows in {} segments, {:.1} MB, {:.1}s",
            table.name(),
            manifest.total_rows(),
            manifest.segments.len(),
            manifest.total_bytes() as f64 / 1e6,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
