//! `quarry calibrate`: measures this machine's CPU cost of the operators storage nodes run, for
//! the placement cost model. A node reads the result from its warehouse
//! (`.calibration.json`) and reports it to hosts; a device profile's slowdown scales it.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use quarry_engine::{EngineOptions, PushdownMode, QuarrySession, Side, user_message};
use arrow::array::RecordBatch;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use quarry_engine::placement::plain_selection_terms;
use quarry_gen::synthetic::SYNTHETIC_VALUE_RANGE;
use quarry_storage::local_files::evict_from_page_cache;
use quarry_storage::{CALIBRATION_FILE, Calibration, DeviceProfile, LinkCodec, LocalStorageNode, scan_counter};
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
    let result = calibrate(&scratch, args.rows.max(100_000), threads).and_then(|mut calibration| {
        calibrate_ipc(&mut calibration, &scratch)?;
        Ok(calibration)
    });
    let _ = std::fs::remove_dir_all(&scratch);
    let calibration = result?;
    std::fs::create_dir_all(warehouse_dir).map_err(|e| format!("creating {}: {e}", warehouse_dir.display()))?;
    let path = warehouse_dir.join(CALIBRATION_FILE);
    let text = serde_json::to_string_pretty(&calibration).expect("calibration serializes");
    std::fs::write(&path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    println!("decode     {:>8.3} ns/byte", calibration.decode_ns_per_byte);
    println!("values     {:>8.3} ns/value, strings {:.3} ns/byte more", calibration.value_ns, calibration.string_ns_per_byte);
    println!("filter     {:>8.3} ns/row", calibration.filter_ns_per_row);
    println!("aggregate  {:>8.3} ns/row", calibration.aggregate_ns_per_row);
    println!("join       {:>8.3} ns/row", calibration.join_ns_per_row);
    println!("fragment   {:>8.3} ms", calibration.fragment_ns / 1e6);
    println!("column     {:>8.3} ms more a column read", calibration.column_ns / 1e6);
    println!("filtered   {:>8.3} ms more a fragment whose scan is filtered", calibration.filtered_fragment_ns / 1e6);
    println!("warm       {:>8.3} ms less a fragment opening right after another", calibration.warm_fragment_saving_ns / 1e6);
    println!("node CPU   {:>8.3} ms a fragment", calibration.fragment_cpu_ns / 1e6);
    println!("transfer   {:>8.3} ns/byte", calibration.transfer_ns_per_byte);
    println!("spill      {:>8.3} ns/byte", calibration.spill_ns_per_byte);
    println!("star probe {:>8.3} ns/row on the host, {:.3} on a node", calibration.star_probe_ns_per_row, calibration.star_scan_ns_per_row);
    let [copy, row, selected, run, page] = calibration.plain_selection_rates();
    println!("plain      {copy:>8.3} ns/byte copied, {row:.3} ns/row, {selected:.3} ns/selected row, {run:.3} ns/run/column, {page:.1} ns/page");
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
    let plain = quarry_gen::synthetic::synthetic_table(PLAIN_TABLE, COLUMNS, rows, 8);
    let text = quarry_gen::synthetic::text_table(TEXT_TABLE, rows, 9);
    generate_tables(&warehouse, &[table, tiny, text], &[], PageEncoding::default(), threads)?;
    generate_tables(&warehouse, &[plain], &[], PageEncoding::Plain, threads)?;
    generate_tables(&warehouse, &quarry_gen::ssb::ssb_tables(star_scale_factor(rows), 1), &[], PageEncoding::default(), threads)?;
    // Measured on files the node reads into the page cache itself, as it reads a served
    // warehouse's: a file just written is cached in large folios, which the node's maps fault in
    // at about half the CPU of pages its own maps read in (PLAIN select of 0.1% of 8M rows, one
    // thread: 94-110 ms written, 167-189 ms read back), and rates measured on written files
    // priced served tables at half their cost.
    evict_files(scratch)?;
    with_runtime(threads, async move {
        let session = |pushdown, device_threads| {
            let mut profile = DeviceProfile::load("native").expect("the built-in native profile parses");
            profile.device_threads = device_threads;
            let node = LocalStorageNode::with_profile(warehouse.clone(), profile).map(Arc::new);
            async move {
                let node = node.map_err(|e| user_message(&e))?;
                QuarrySession::try_new(vec![node], EngineOptions { threads: 1, pushdown, ..EngineOptions::default() }).await.map_err(|e| user_message(&e))
            }
        };
        // Every rate is one thread's: the host runs on one, and a node's operators on one
        // device thread (the model divides a fragment's work by its side's threads). Measured
        // on all of a node's threads, the filter came out at half its cost, below the decoding
        // it was taken from, and was clamped to 0.1 ns/row.
        let off = session(PushdownMode::Off, None).await?;
        let on_one_thread = session(PushdownMode::On, Some(1)).await?;
        let mut passes = Vec::with_capacity(PASSES);
        for _ in 0..PASSES {
            passes.push(measure(&warehouse, &off, &on_one_thread, rows).await?);
        }
        Ok(median_calibration(&passes))
    })
}

/// Passes over every measurement; each figure is the median of its passes'. A pass's figures
/// are each the best of three runs, yet on a shared 2-core machine they vary by up to 4x from
/// pass to pass (one-pass calibrations on one machine: the fixed cost 0.26-1.21 ms, 2.6-5.0 ns
/// a value; four calibrations of three passes: 0.34-0.56 ms, 3.7-3.9 ns).
const PASSES: usize = 3;

/// One pass of the measurements, on the sessions without pushdown (`off`) and with it on one
/// device thread.
async fn measure(warehouse: &Warehouse, off: &QuarrySession, on_one_thread: &QuarrySession, rows: u64) -> CliResult<Calibration> {
    let n = rows as f64;
    let decode = best(off, "SELECT * FROM calibration").await? / (n * 4.0 * COLUMNS as f64);
    // A predicate no row passes and no statistics can prune (a bound on one column would
    // skip every segment unread): column against column.
    let filter = (best(on_one_thread, "SELECT col1 FROM calibration WHERE col2 < col3 - 100000000").await? / n - decode * 8.0).max(0.1);
    let aggregate = (best(on_one_thread, "SELECT col1 % 1000, SUM(col2) FROM calibration GROUP BY 1").await? / n - decode * 8.0).max(0.1);
    let join = (best(off, "SELECT COUNT(*) FROM calibration a JOIN calibration b ON a.col1 = b.col1").await? / (2.0 * n) - decode * 4.0).max(0.1);
    // The fixed cost, with a part per column: one column of the tiny table, then all.
    let one_column = fragment_wait_after_work(off, "SELECT col1 FROM calibration_tiny").await?;
    let all_columns = fragment_wait_after_work(off, "SELECT * FROM calibration_tiny").await?;
    let column_ns = ((all_columns - one_column) / (COLUMNS - 1) as f64).max(0.0);
    // The same fragment right after itself: what an opening saves right after another.
    let warm = least_fragment_wait(off, Some("SELECT col1 FROM calibration_tiny"), "SELECT col1 FROM calibration_tiny").await?;
    // A bound half the rows pass, which no statistics can skip: the scan reads the page
    // index and keeps the table's one page.
    let filtered = fragment_wait_after_work(off, &format!("SELECT col1 FROM calibration_tiny WHERE col2 >= {}", quarry_gen::synthetic::SYNTHETIC_VALUE_RANGE / 2)).await?;
    // A predicate no statistics can prune, so the node opens the segment and filters.
    let fragment_cpu_ns = fragment_node_cpu(on_one_thread, "SELECT col1 FROM calibration_tiny WHERE col2 < col3 - 100000000").await?;
    let mut calibration = Calibration {
        decode_ns_per_byte: decode,
        filter_ns_per_row: filter,
        aggregate_ns_per_row: aggregate,
        join_ns_per_row: join,
        fragment_ns: (one_column - column_ns).max(0.0),
        column_ns,
        filtered_fragment_ns: (filtered - one_column).max(0.0),
        warm_fragment_saving_ns: (one_column - warm).max(0.0),
        fragment_cpu_ns,
        measured: true,
        ..Calibration::default()
    };
    (calibration.value_ns, calibration.string_ns_per_byte) = column_rates(warehouse, off, n, calibration.fixed_ns(1)).await?;
    calibration.set_plain_selection_rates(plain_selection_rates(on_one_thread, rows, &calibration, filter).await?);
    (calibration.star_probe_ns_per_row, calibration.star_scan_ns_per_row) = star_rates(off, on_one_thread, decode, calibration.fixed_ns(STAR_FACT_COLUMNS)).await?;
    Ok(calibration)
}

/// Each figure of `passes` (not empty) the median of its values in them.
fn median_calibration(passes: &[Calibration]) -> Calibration {
    let figures: Vec<serde_json::Map<String, serde_json::Value>> = passes
        .iter()
        .map(|pass| match serde_json::to_value(pass).expect("calibration serializes") {
            serde_json::Value::Object(figures) => figures,
            other => unreachable!("a calibration serializes to an object, not {other}"),
        })
        .collect();
    let mut median = figures[0].clone();
    for (name, value) in median.iter_mut() {
        let mut values: Vec<f64> = figures.iter().filter_map(|pass| pass.get(name).and_then(serde_json::Value::as_f64)).collect();
        if value.is_f64() && values.len() == figures.len() {
            values.sort_by(f64::total_cmp);
            *value = serde_json::json!(values[values.len() / 2]);
        }
    }
    serde_json::from_value(serde_json::Value::Object(median)).expect("a calibration's figures deserialize")
}

/// Drops every file under `dir` from the page cache.
fn evict_files(dir: &Path) -> CliResult<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| format!("listing {}: {e}", dir.display()))? {
        let path = entry.map_err(|e| format!("listing {}: {e}", dir.display()))?.path();
        if path.is_dir() {
            evict_files(&path)?;
        } else {
            evict_from_page_cache(&path).map_err(|e| format!("evicting {} from the page cache: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// The table of a dictionary-encoded `Int32` and a long string the column rates are measured on.
const TEXT_TABLE: &str = "calibration_text";

/// Decoding a whole column, as passthrough does it on the host: per value of a
/// dictionary-encoded `Int32` (the fragment's wait, less its fixed cost, per row), and per
/// decompressed byte of a long string's values beyond that (bytes as the manifest counts them,
/// as the placement model reads them). Each scan follows work, as the fixed cost was measured:
/// measured right after itself, a scan of 100,000 rows waited less than that fixed cost and its
/// 0.4 ms of decoding (CI, a 2-core machine: `value_ns` clamped to its floor).
async fn column_rates(warehouse: &Warehouse, session: &QuarrySession, rows: f64, fixed_ns: f64) -> CliResult<(f64, f64)> {
    let value_ns = ((fragment_wait_after_work(session, &format!("SELECT code FROM {TEXT_TABLE}")).await? - fixed_ns) / rows).max(0.1);
    let snapshot = warehouse.table(TEXT_TABLE).map_err(|e| e.to_string())?;
    let text_bytes: u64 = snapshot.manifest.segments.iter().filter_map(|s| s.columns.iter().find(|c| c.name == "text")).map(|c| c.uncompressed_bytes).sum();
    if text_bytes == 0 {
        return Err(format!("calibrating string decoding: the manifest of '{TEXT_TABLE}' gives no bytes for its text column"));
    }
    let text_ns = fragment_wait_after_work(session, &format!("SELECT text FROM {TEXT_TABLE}")).await? - fixed_ns - value_ns * rows;
    Ok((value_ns, (text_ns / text_bytes as f64).max(0.01)))
}

/// The PLAIN-page table the selection rates are measured on (another seed than `calibration`).
const PLAIN_TABLE: &str = "calibration_plain";

/// The rates of a selection over PLAIN pages (`PlainSelectExec`, the predicate evaluated in it):
/// the fragment's time, less its fixed cost and a projection's, for `SELECT * | col2 ... WHERE
/// col1 < c` at four selectivities, fitted by non-negative least squares to the terms the
/// placement model prices them by.
async fn plain_selection_rates(session: &QuarrySession, rows: u64, calibration: &Calibration, filter_ns_per_row: f64) -> CliResult<[f64; 5]> {
    let input = rows as f64;
    let mut equations = Vec::new();
    for (select, columns) in [("*", COLUMNS), ("col2", 2)] {
        for selectivity in [0.001, 0.1, 0.5, 0.999] {
            let bound = (selectivity * f64::from(SYNTHETIC_VALUE_RANGE)) as i64;
            let sql = format!("SELECT {select} FROM {PLAIN_TABLE} WHERE col1 < {bound}");
            let measured = fragment_wait(session, &sql).await?;
            let other_columns = (columns - 1) as f64;
            // Int32 columns: 4 bytes a value.
            let terms = plain_selection_terms(input, selectivity, 4.0, 4.0 * other_columns, other_columns, columns as f64);
            // A projection to `col2` is priced apart, half the filter rate per row it passes.
            let projection = if columns < COLUMNS { input * selectivity * 0.5 * filter_ns_per_row } else { 0.0 };
            equations.push((terms, measured - calibration.fixed_ns(columns) - projection));
        }
    }
    Ok(nonnegative_least_squares(&equations))
}

/// The non-negative `x` that best fits `terms · x = y` over `equations` (Lawson-Hanson's
/// active set, simplified: an unknown that comes out negative is fixed at 0 and the others are
/// fitted again).
fn nonnegative_least_squares<const N: usize>(equations: &[([f64; N], f64)]) -> [f64; N] {
    let mut free = [true; N];
    loop {
        let x = least_squares(equations, &free);
        match (0..N).find(|&i| free[i] && x[i] < 0.0) {
            Some(negative) => free[negative] = false,
            None => return x,
        }
    }
}

/// Least squares over the `free` unknowns (the others 0): the normal equations, solved by
/// Gaussian elimination with partial pivoting; an unknown no equation determines is 0.
fn least_squares<const N: usize>(equations: &[([f64; N], f64)], free: &[bool; N]) -> [f64; N] {
    let index: Vec<usize> = (0..N).filter(|&i| free[i]).collect();
    let k = index.len();
    // The normal equations scaled column by column, as the terms span many orders of magnitude.
    let scale: Vec<f64> = index.iter().map(|&i| equations.iter().map(|(t, _)| t[i] * t[i]).sum::<f64>().sqrt().max(f64::MIN_POSITIVE)).collect();
    let mut a = vec![vec![0.0; k + 1]; k];
    for (terms, y) in equations {
        for r in 0..k {
            let tr = terms[index[r]] / scale[r];
            for c in 0..k {
                a[r][c] += tr * terms[index[c]] / scale[c];
            }
            a[r][k] += tr * y;
        }
    }
    for col in 0..k {
        let pivot = (col..k).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs())).expect("a column to pivot on");
        a.swap(col, pivot);
        if a[col][col].abs() < 1e-12 {
            continue;
        }
        for row in 0..k {
            if row != col {
                let factor = a[row][col] / a[col][col];
                for c in col..=k {
                    a[row][c] -= factor * a[col][c];
                }
            }
        }
    }
    let mut x = [0.0; N];
    for (r, &i) in index.iter().enumerate() {
        if a[r][r].abs() >= 1e-12 {
            x[i] = a[r][k] / a[r][r] / scale[r];
        }
    }
    x
}

/// The SSB scale factor the star join is measured on: about as many `lineorder` rows (6M per
/// unit) as the synthetic table has.
fn star_scale_factor(rows: u64) -> f64 {
    (rows as f64 / 6e6).clamp(0.01, 1.0)
}

/// A star join every fact row passes: two dimensions, grouped by an attribute of each.
const STAR_SQL: &str = "SELECT d_year, s_region, SUM(lo_revenue) FROM lineorder, date, supplier \
    WHERE lo_orderdate = d_datekey AND lo_suppkey = s_suppkey GROUP BY d_year, s_region";

/// Bytes a fact row of [`STAR_SQL`] decodes to: `lo_orderdate` and `lo_suppkey` (Int32),
/// `lo_revenue` (Int64).
const STAR_ROW_BYTES: f64 = 16.0;

/// The fact columns [`STAR_SQL`] reads.
const STAR_FACT_COLUMNS: usize = 3;

/// The star join's probe per fact row, as the placement model prices it: on the host over
/// decoded rows (`off`, the query's time on one thread), and on a node over the stored values
/// as its pages are read (`on_one_thread`, the fact fragment's wait), each less a fragment's
/// fixed cost and the decoding of the fact columns (priced with the scan). A plan without the
/// star join on the side measured is an error, not a figure of something else.
async fn star_rates(off: &QuarrySession, on_one_thread: &QuarrySession, decode_ns_per_byte: f64, fixed_ns: f64) -> CliResult<(f64, f64)> {
    let fact_rows = |stats: &quarry_engine::QueryStats| stats.operators.iter().filter(|op| op.table.as_deref() == Some("lineorder")).map(|op| op.rows_in).sum::<u64>() as f64;
    let ran_star = |stats: &quarry_engine::QueryStats, side: Side| stats.operators.iter().any(|op| op.side == side && op.operator.starts_with("Star"));
    let mut rates = [f64::INFINITY; 2];
    for (rate, session, side) in rates.iter_mut().zip([(off, Side::Host), (on_one_thread, Side::Storage)]).map(|(r, (s, side))| (r, s, side)) {
        for _ in 0..3 {
            let started = Instant::now();
            let result = session.query(STAR_SQL).await.map_err(|e| user_message(&e))?;
            let wall = started.elapsed().as_secs_f64() * 1e9;
            let rows = fact_rows(&result.stats);
            if !ran_star(&result.stats, side) || rows == 0.0 {
                return Err(format!("calibrating the star join: '{STAR_SQL}' ran no star join on the {side:?} side"));
            }
            let waited = match side {
                Side::Host => wall,
                Side::Storage => result.stats.operators.iter().filter_map(|op| op.measured_ms).fold(0.0, f64::max) * 1e6,
            };
            *rate = rate.min(((waited - fixed_ns) / rows - decode_ns_per_byte * STAR_ROW_BYTES).max(0.1));
        }
    }
    Ok((rates[0], rates[1]))
}

/// Arrow IPC, on TPC-H `lineitem` batches (numbers, dates, short strings and comments, as query
/// results carry them): reading it (a host's receiving), writing and reading it through a file
/// (a join's spill), and compression for the link: each codec's extra time over plain IPC to
/// write and to read, per byte of plain IPC, and its size against plain IPC.
fn calibrate_ipc(calibration: &mut Calibration, scratch: &Path) -> CliResult {
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
    // What a host pays to receive a node's batches: reading their IPC.
    calibration.transfer_ns_per_byte = plain_read / n;
    // A Grace hash join's spill: IPC written through a buffer to a file, and read back (the
    // model charges each once per byte spilled).
    let spill_path = scratch.join("spill.arrows");
    let spill_write = timed(&|| {
        let file = std::io::BufWriter::new(std::fs::File::create(&spill_path).map_err(|e| format!("creating {}: {e}", spill_path.display()))?);
        let mut writer = StreamWriter::try_new(file, &schema).map_err(|e| e.to_string())?;
        for batch in &batches {
            writer.write(batch).map_err(|e| e.to_string())?;
        }
        writer.finish().map_err(|e| e.to_string())?;
        Ok(0)
    })?;
    let spill_read = timed(&|| {
        let file = std::io::BufReader::new(std::fs::File::open(&spill_path).map_err(|e| format!("opening {}: {e}", spill_path.display()))?);
        let reader = StreamReader::try_new(file, None).map_err(|e| e.to_string())?;
        reader.map(|b| b.map(|b| b.num_rows()).map_err(|e| e.to_string())).sum()
    })?;
    calibration.spill_ns_per_byte = (spill_write + spill_read) / (2.0 * n);
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
    least_fragment_wait(session, None, sql).await
}

/// The least of three runs' fragment waits of `sql`, each run after `before` if given.
async fn least_fragment_wait(session: &QuarrySession, before: Option<&str>, sql: &str) -> CliResult<f64> {
    let mut least = f64::INFINITY;
    for _ in 0..3 {
        if let Some(before) = before {
            session.query(before).await.map_err(|e| user_message(&e))?;
        }
        let result = session.query(sql).await.map_err(|e| user_message(&e))?;
        let waited = result.stats.operators.iter().filter_map(|op| op.measured_ms).fold(f64::NAN, f64::max);
        if waited.is_nan() {
            return Err(format!("calibrating the fragment cost: '{sql}' reported no fragment time"));
        }
        least = least.min(waited * 1e6);
    }
    Ok(least)
}

/// [`fragment_wait`] of a tiny fragment that follows a scan of the calibration table, as most
/// of a suite's tiny fragments follow work: a join's other sides, or an earlier statement. A
/// tiny fragment right after a scan waits twice as long as one right after itself (TPC-H SF 10
/// `nation` filtered by name, kim-isp-2015: 0.27-0.48 ms after itself, 0.63-0.95 ms after a
/// scan of `lineitem`, in one process), and calibrated after itself the fixed cost priced the
/// suites' `nation`, `region` and `date` fragments at half their time.
async fn fragment_wait_after_work(session: &QuarrySession, sql: &str) -> CliResult<f64> {
    least_fragment_wait(session, Some("SELECT * FROM calibration"), sql).await
}

/// The least CPU over three runs that a node spent on the one fragment of `sql`, nanoseconds.
async fn fragment_node_cpu(session: &QuarrySession, sql: &str) -> CliResult<f64> {
    let mut least = f64::INFINITY;
    for _ in 0..3 {
        let result = session.query(sql).await.map_err(|e| user_message(&e))?;
        let cpu = result.stats.operators.iter().filter_map(|op| op.node_counters.get(scan_counter::DEVICE_CPU_NS)).copied().max();
        let Some(cpu) = cpu.filter(|&ns| ns > 0) else {
            return Err(format!("calibrating a fragment's node CPU: '{sql}' reported none"));
        };
        least = least.min(cpu as f64);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each figure is the middle one of the passes', taken apart from the others' passes.
    #[test]
    fn a_calibration_takes_each_figures_median_over_passes() {
        let pass = |fragment_ns: f64, value_ns: f64| Calibration { fragment_ns, value_ns, measured: true, ..Calibration::default() };
        let median = median_calibration(&[pass(1.0e6, 2.5), pass(0.3e6, 4.0), pass(0.4e6, 3.0)]);
        assert_eq!((median.fragment_ns, median.value_ns), (0.4e6, 3.0));
        assert!(median.measured);
        assert_eq!(median.join_ns_per_row, Calibration::default().join_ns_per_row);
    }
}
