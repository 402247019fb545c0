//! `quarry calibrate`: measures this machine's CPU cost of the operators storage nodes run, for
//! the placement cost model. A node reads the result from its warehouse
//! (`.calibration.json`) and reports it to hosts; a device profile's slowdown scales it.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use quarry_engine::{EngineOptions, PushdownMode, QuarrySession, user_message};
use quarry_storage::{CALIBRATION_FILE, Calibration, LocalStorageNode};
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
    let calibration = result?;
    std::fs::create_dir_all(warehouse_dir).map_err(|e| format!("creating {}: {e}", warehouse_dir.display()))?;
    let path = warehouse_dir.join(CALIBRATION_FILE);
    let text = serde_json::to_string_pretty(&calibration).expect("calibration serializes");
    std::fs::write(&path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    println!("decode     {:>8.3} ns/byte", calibration.decode_ns_per_byte);
    println!("filter     {:>8.3} ns/row", calibration.filter_ns_per_row);
    println!("aggregate  {:>8.3} ns/row", calibration.aggregate_ns_per_row);
    println!("join       {:>8.3} ns/row", calibration.join_ns_per_row);
    println!("written to {}", path.display());
    Ok(())
}

/// Each figure is one thread's time for a query that isolates the operator, less the decode
/// time of the columns it reads.
fn calibrate(scratch: &Path, rows: u64, threads: usize) -> CliResult<Calibration> {
    let warehouse = Warehouse::open(scratch).map_err(|e| e.to_string())?;
    let table = quarry_gen::synthetic::synthetic_table("calibration", COLUMNS, rows, 7);
    generate_tables(&warehouse, &[table], &[], PageEncoding::default(), threads)?;
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
        Ok(Calibration { decode_ns_per_byte: decode, filter_ns_per_row: filter, aggregate_ns_per_row: aggregate, join_ns_per_row: join, ..Calibration::default() })
    })
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
