//! `quarry calibrate`: measures this machine's CPU cost of the operators storage nodes run, for
//! the placement cost model. A node reads the result from its warehouse
//! (`.calibration.json`) and reports it to hosts; a device profile's slowdown scales it.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use quarry_engine::{EngineOptions, PushdownMode, QuarrySession, user_message};
use arrow::array::RecordBatch;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use quarry_storage::{CALIBRATION_FILE, Calibration, LinkCodec, LocalStorageNode};
use quarry_table::{PageEncoding, Warehouse};

use crate::generate::generate_tables;
use crate::{CliResult, with_runtime};

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Rows of the synthetic table measured on.
    #[arg(long, default_value_t = 4_000_000)]
    rows: u64,
}

const COLUMNS: usize = 8;

pub fn run(warehouse_dir: &Path, args: CalibrateArgs, threads: usize) -> CliResult {
    let scratch = std::env::temp_dir().join(format!("quarry-calibrate-{}", std::process::id()));
    let result = calibrate(&scratch, args.rows.max(100_000), threads);
    let _ = std::fs::remove_dir_all(&scratch);
    let mut calibration = result?;
    calibrate_link_codecs(&mut calibration)?;
    std::fs::create_dir_all(warehouse_dir).map_err(|e| format!("creating {}: {e}", warehouse_dir.display()))?;
    let path = warehouse_dir.join(CALIBRATION_FILE);
    let text = serde_json::to_string_pretty(&calibration).expect("calibration serializes");
    std::fs::write(&path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    println!("decode     {:>8.3} ns/byte", calibration.decode_ns_per_byte);
    println!("filter     {:>8.3} ns/row", calibration.filter_ns_per_row);
    println!("aggregate  {:>8.3} ns/row", calibration.aggregate_ns_per_row);
    println!("join       {:>8.3} ns/row", calibration.join_ns_per_row);
    println!("fragment   {:>8.3} ms", calibration.fragment_ns / 1e6);
    for codec in [LinkCodec::Lz4, LinkCodec::Zstd] {
        let (compress, decompress, ratio) = calibration.link_codec_rates(codec);
        println!("{:<10} {compress:>8.3} ns/byte to compress, {decompress:.3} to decompress, ratio {ratio:.3}", codec.name());
    }
    println!("written to {}", path.display());
    Ok(())
}

/// Each figure is one thread's time for a query that isolates the operator, less the decode
/// time of the columns it reads.
fn calibrate(scratch: &Path, rows: u64, threads: usize) -> CliResult<Calibration> {
    let warehouse = Warehouse::open(scratch).map_err(|e| e.to_string())?;
    let table = quarry_gen::synthetic::synthetic_table("calibration", COLUMNS, rows, 7);
    let tiny = quarry_gen::synthetic::synthetic_table("calibration_tiny", COLUMNS, 1000, 7);
    generate_tables(&warehouse, &[table, tiny], &[], PageEncoding::default(), threads)?;
    with_runtime(threads, async move {
        let session = |pushdown| {
            let node = Arc::new(LocalStorageNode::new(warehouse.clone()));
            async move { QuarrySession::try_new(vec![node], EngineOptions { threads: 1, pushdown, ..EngineOptions::default() }).await.map_err(|e| user_message(&e)) }
        };
        let off = session(PushdownMode::Off).await?;
        let on = session(PushdownMode::On).await?;
        let n = rows as f64;
        let decode = best(&off, "SELECT * FROM calibration").await? / (n * 4.0 * COLUMNS as f64);
        // A predicate no row passes and no statistics can prune (a bound on one column would
        // skip every segment unread): column against column.
        let filter = (best(&on, "SELECT col1 FROM calibration WHERE col2 < col3 - 100000000").await? / n - decode * 8.0).max(0.1);
        let aggregate = (best(&on, "SELECT col1 % 1000, SUM(col2) FROM calibration GROUP BY 1").await? / n - decode * 8.0).max(0.1);
        let join = (best(&off, "SELECT COUNT(*) FROM calibration a JOIN calibration b ON a.col1 = b.col1").await? / (2.0 * n) - decode * 4.0).max(0.1);
        let fragment = fragment_wait(&off, "SELECT * FROM calibration_tiny").await?;
        Ok(Calibration {
            decode_ns_per_byte: decode,
            filter_ns_per_row: filter,
            aggregate_ns_per_row: aggregate,
            join_ns_per_row: join,
            fragment_ns: fragment,
            ..Calibration::default()
        })
    })
}

/// Arrow IPC compression for the link, on TPC-H `lineitem` batches (numbers, dates, short
/// strings and comments, as query results carry them): each codec's extra time over plain IPC
/// to write and to read, per byte of plain IPC, and its size against plain IPC.
fn calibrate_link_codecs(calibration: &mut Calibration) -> CliResult {
    let lineitem = quarry_gen::tpch::tpch_tables_chunked(0.05, 65_536).into_iter().find(|t| t.name() == "lineitem").expect("TPC-H has lineitem");
    let batches: Vec<RecordBatch> = lineitem.chunk(0).collect();
    let schema = lineitem.schema();
    let encode = |codec: LinkCodec| -> CliResult<Vec<u8>> {
        let options = IpcWriteOptions::default().try_with_compression(codec.ipc()).map_err(|e| e.to_string())?;
        let mut writer = StreamWriter::try_new_with_options(Vec::new(), &schema, options).map_err(|e| e.to_string())?;
        for batch in &batches {
            writer.write(batch).map_err(|e| e.to_string())?;
        }
        writer.into_inner().map_err(|e| e.to_string())
    };
    let decode = |bytes: &[u8]| -> CliResult<usize> {
        let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None).map_err(|e| e.to_string())?;
        reader.map(|b| b.map(|b| b.num_rows()).map_err(|e| e.to_string())).sum()
    };
    let timed = |f: &dyn Fn() -> CliResult<usize>| -> CliResult<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let started = Instant::now();
            f()?;
            best = best.min(started.elapsed().as_secs_f64() * 1e9);
        }
        Ok(best)
    };
    let plain = encode(LinkCodec::None)?;
    let plain_write = timed(&|| encode(LinkCodec::None).map(|b| b.len()))?;
    let plain_read = timed(&|| decode(&plain))?;
    let n = plain.len() as f64;
    for codec in [LinkCodec::Lz4, LinkCodec::Zstd] {
        let compressed = encode(codec)?;
        let compress = ((timed(&|| encode(codec).map(|b| b.len()))? - plain_write) / n).max(0.01);
        let decompress = ((timed(&|| decode(&compressed))? - plain_read) / n).max(0.01);
        let ratio = compressed.len() as f64 / n;
        match codec {
            LinkCodec::Lz4 => (calibration.lz4_compress_ns_per_byte, calibration.lz4_decompress_ns_per_byte, calibration.lz4_ratio) = (compress, decompress, ratio),
            LinkCodec::Zstd => (calibration.zstd_compress_ns_per_byte, calibration.zstd_decompress_ns_per_byte, calibration.zstd_ratio) = (compress, decompress, ratio),
            LinkCodec::None => unreachable!("not measured"),
        }
    }
    Ok(())
}

/// The least time, over three runs, the consumer of `sql`'s one fragment waited for it,
/// nanoseconds (what `quarry model check` measures).
async fn fragment_wait(session: &QuarrySession, sql: &str) -> CliResult<f64> {
    let mut least = f64::INFINITY;
    for _ in 0..3 {
        let result = session.query(sql).await.map_err(|e| user_message(&e))?;
        let waited = result.stats.operators.iter().filter_map(|op| op.measured_ms).fold(f64::NAN, f64::max);
        if waited.is_nan() {
            return Err(format!("calibrating the fragment cost: '{sql}' reported no fragment time"));
        }
        least = least.min(waited * 1e6);
    }
    Ok(least)
}

/// Best of three runs, nanoseconds.
async fn best(session: &QuarrySession, sql: &str) -> CliResult<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = Instant::now();
        session.query(sql).await.map_err(|e| user_message(&e))?;
        best = best.min(started.elapsed().as_secs_f64() * 1e9);
    }
    Ok(best)
}
