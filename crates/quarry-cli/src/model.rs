//! `quarry model`: the models that explain runs. `emos` simulates a storage I/O trace's energy;
//! `kim` prints Kim 2015's analytical model beside the paper's figures; `check` compares the
//! placement model's predicted fragment times with the measured ones of finished runs.

use quarry_model::emos::{CacheConfig, EnergyTable, parse_trace, simulate};
use quarry_model::kim;
use quarry_model::sharing::{Demand, in_run};
use quarry_storage::parse_size;

use crate::CliResult;

/// Arguments of `quarry model`.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    model: Model,
}

#[derive(Debug, clap::Subcommand)]
enum Model {
    /// EMOS (Li 2018, ch. 4): the energy of a storage I/O trace through an LRU page cache, from
    /// a platform's energy per KB by request type, size and cache outcome (Table 4.4).
    Emos(EmosArgs),
    /// Kim 2015's analytical model of scans and joins in the host, the SSD's CPU or its flash
    /// controllers: eq. (1)'s bandwidths and Table 3, each beside the paper's figure, and Fig.
    /// 6's throughputs.
    Kim(KimArgs),
    /// Compares the placement model's predicted time of each fragment with its measured time,
    /// in the `--stats` files of finished runs: as priced alone, and stretched over the run's
    /// schedule where fragments running at once share the link and the host's threads.
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// `--stats` JSON files of finished queries.
    #[arg(required = true)]
    runs: Vec<std::path::PathBuf>,
    /// A prediction counts as good when within this share of the measured time.
    #[arg(long, default_value_t = 0.25)]
    within: f64,
    /// Print the comparison as JSON.
    #[arg(long)]
    json: bool,
}

/// One fragment's predicted and measured time.
#[derive(Debug)]
struct FragmentCheck {
    run: String,
    table: String,
    bound: String,
    predicted_ms: f64,
    measured_ms: f64,
    /// predicted / measured - 1.
    error: f64,
    /// Predicted in the run's schedule: its time alone stretched by the fragments running
    /// beside it (`quarry_model::sharing`), from when each started.
    in_run_ms: Option<f64>,
    /// The nodes' counters for it (`node_counters` in the stats: device CPU, pauses, waits).
    counters: serde_json::Value,
    /// When it ran in its query (`span_ms`: from the query's first fragment's start).
    span_ms: serde_json::Value,
}

#[derive(Debug, clap::Args)]
struct KimArgs {
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct EmosArgs {
    /// The trace: one request per line, `SECONDS R|W FILE OFFSET BYTES` (what `quarry serve
    /// --io-trace` records).
    trace: std::path::PathBuf,
    /// The platform: `windows-rt`, `android` (Table 4.4) or a JSON energy table.
    #[arg(long)]
    platform: String,
    /// Size of the simulated page cache, e.g. 512MB.
    #[arg(long)]
    cache: String,
    /// Pages read ahead after a read that missed.
    #[arg(long, default_value_t = 0)]
    prefetch: u64,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ModelArgs) -> CliResult {
    match args.model {
        Model::Emos(args) => emos(args),
        Model::Kim(args) => kim(args),
        Model::Check(args) => check(args),
    }
}

fn check(args: CheckArgs) -> CliResult {
    if !(args.within.is_finite() && args.within > 0.0) {
        return Err(format!("--within must be a positive share (0.25 = 25%), not {}", args.within));
    }
    let mut fragments: Vec<FragmentCheck> = Vec::new();
    for path in &args.runs {
        let first = fragments.len();
        let mut schedule: Option<Vec<(Demand, f64, f64)>> = Some(Vec::new());
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: not a --stats JSON file: {e}", path.display()))?;
        let operators = doc.get("operators").and_then(|o| o.as_array()).ok_or_else(|| format!("{}: no 'operators' list (is it a --stats file?)", path.display()))?;
        for op in operators {
            let number = |key: &str| op.get(key).and_then(|v| v.as_f64());
            let (Some(predicted_ms), Some(measured_ms)) = (number("predicted_ms"), number("measured_ms")) else { continue };
            let text = |key: &str| op.get(key).and_then(|v| v.as_str()).unwrap_or("").to_string();
            let error = if measured_ms > 0.0 { predicted_ms / measured_ms - 1.0 } else { f64::INFINITY };
            let field = |key: &str| op.get(key).cloned().unwrap_or(serde_json::Value::Null);
            let (counters, span_ms) = (field("node_counters"), field("span_ms"));
            let start_ms = span_ms.get(0).and_then(|v| v.as_f64());
            schedule = schedule.zip(demand(op).zip(start_ms)).map(|(mut s, ((demand, host_threads), start))| {
                s.push((demand, start / 1e3, host_threads));
                s
            });
            fragments.push(FragmentCheck { run: path.display().to_string(), table: text("table"), bound: text("bound"), predicted_ms, measured_ms, error, in_run_ms: None, counters, span_ms });
        }
        // Stretched over the run only where every fragment of it states its demand and start.
        if let Some(schedule) = schedule.filter(|s| !s.is_empty()) {
            let demands: Vec<Demand> = schedule.iter().map(|s| s.0).collect();
            let starts: Vec<f64> = schedule.iter().map(|s| s.1).collect();
            let host_threads = schedule.iter().map(|s| s.2).fold(1.0, f64::max);
            for (f, seconds) in fragments[first..].iter_mut().zip(in_run(&demands, &starts, host_threads)) {
                f.in_run_ms = Some(seconds * 1e3);
            }
        }
    }
    let within = |predicted: f64, measured: f64| measured > 0.0 && (predicted / measured - 1.0).abs() <= args.within;
    let good = fragments.iter().filter(|f| f.error.abs() <= args.within).count();
    let share = if fragments.is_empty() { 0.0 } else { good as f64 / fragments.len() as f64 };
    let good_in_run = fragments.iter().filter(|f| f.in_run_ms.is_some_and(|p| within(p, f.measured_ms))).count();
    let share_in_run = if fragments.is_empty() { 0.0 } else { good_in_run as f64 / fragments.len() as f64 };
    if args.json {
        let listed: Vec<serde_json::Value> = fragments
            .iter()
            .map(|f| {
                serde_json::json!({ "run": f.run, "table": f.table, "bound": f.bound, "predicted_ms": f.predicted_ms,
                                    "measured_ms": f.measured_ms, "error": f.error, "predicted_in_run_ms": f.in_run_ms,
                                    "error_in_run": f.in_run_ms.map(|p| p / f.measured_ms - 1.0),
                                    "node_counters": f.counters, "span_ms": f.span_ms })
            })
            .collect();
        let doc = serde_json::json!({ "within": args.within, "fragments": listed, "good": good, "share_good": share,
                                      "good_in_run": good_in_run, "share_good_in_run": share_in_run });
        println!("{}", serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!("{:<40} {:<20} {:<13} {:>12} {:>12} {:>8} {:>12} {:>8}", "run", "table", "bound", "predicted ms", "measured ms", "error", "in run ms", "error");
    for f in &fragments {
        let in_run = f.in_run_ms.map_or(format!("{:>12} {:>8}", "-", "-"), |p| format!("{p:>12.1} {:>7.0}%", (p / f.measured_ms - 1.0) * 100.0));
        println!("{:<40} {:<20} {:<13} {:>12.1} {:>12.1} {:>7.0}% {in_run}", f.run, f.table, f.bound, f.predicted_ms, f.measured_ms, f.error * 100.0);
    }
    println!("{good} of {} fragments ({:.0}%) predicted within {:.0}% of their measured time", fragments.len(), share * 100.0, args.within * 100.0);
    println!(
        "{good_in_run} of {} fragments ({:.0}%) within {:.0}% when predicted in their run's schedule (sharing the link and host threads with the fragments beside them)",
        fragments.len(),
        share_in_run * 100.0,
        args.within * 100.0
    );
    Ok(())
}

/// A fragment's demand and the host threads it assumed, from its `predicted_demand` in a
/// `--stats` file (milliseconds there).
fn demand(op: &serde_json::Value) -> Option<(Demand, f64)> {
    let d = op.get("predicted_demand")?;
    let number = |key: &str| d.get(key).and_then(|v| v.as_f64());
    let demand = Demand {
        seconds: number("alone_ms")? / 1e3,
        link_s: number("link_ms")? / 1e3,
        host_s: number("host_ms")? / 1e3,
        decode_threads: number("decode_threads")?,
        overlapped: d.get("overlapped")?.as_bool()?,
        // Stats written before these were stated: one stream, no fixed cost apart, no saving.
        link_streams: number("link_streams").unwrap_or(1.0),
        fixed_s: number("fixed_ms").unwrap_or(0.0) / 1e3,
        warm_saving_s: number("warm_saving_ms").unwrap_or(0.0) / 1e3,
    };
    Some((demand, number("host_threads")?))
}

fn kim(args: KimArgs) -> CliResult {
    let (bandwidths, table3, throughputs) = (kim::bandwidths(), kim::table3(), kim::throughputs());
    if args.json {
        let doc = serde_json::json!({ "bandwidths": bandwidths, "table3": table3, "throughputs": throughputs });
        println!("{}", serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!("Kim et al. 2015, eq. (1): flash array bandwidth (8 KB pages, t_R 50 us, 8 ways)");
    println!("{:>8} {:>14} {:>12} {:>12}", "channels", "interface MB/s", "model MB/s", "paper MB/s");
    for b in &bandwidths {
        println!("{:>8} {:>14} {:>12.0} {:>12}", b.channels, b.interface_mb_s, b.model_mb_s, b.paper_mb_s);
    }
    println!("\nTable 3: model vs the paper's model and simulation, 200 MHz cycles (8 channels, 8 ways, 100 MB/s)");
    println!("{:<5} {:<8} {:>14} {:>14} {:>7} {:>14}  data", "op", "arch", "model", "paper model", "error", "paper sim.");
    for c in &table3 {
        println!(
            "{:<5} {:<8} {:>14.0} {:>14.0} {:>6.1}% {:>14.0}  {}",
            c.operation,
            c.architecture,
            c.model_cycles,
            c.paper_model_cycles,
            c.error * 100.0,
            c.paper_simulation_cycles,
            c.data
        );
    }
    println!(
        "Table 3's scan cells imply runs of different sizes: the model's CPU-ISP/HW-ISP ratio does not depend on the size \
         and is {:.2}, Table 3's {:.2} (see quarry-model's kim.rs)",
        kim::scan_ratio(&table3, |c| c.model_cycles),
        kim::scan_ratio(&table3, |c| c.paper_model_cycles)
    );
    println!("\nFig. 6: throughput over the whole SF 1 tables (lineitem scan; part joined with lineitem)");
    println!("{:>8} {:>14} {:<8} {:>10} {:>10}", "channels", "interface MB/s", "arch", "scan MB/s", "join MB/s");
    for t in &throughputs {
        println!("{:>8} {:>14} {:<8} {:>10.0} {:>10.0}", t.channels, t.interface_mb_s, t.architecture, t.scan_mb_s, t.join_mb_s);
    }
    Ok(())
}

fn emos(args: EmosArgs) -> CliResult {
    let table = EnergyTable::load(&args.platform)?;
    let text = std::fs::read_to_string(&args.trace).map_err(|e| format!("reading the trace {}: {e}", args.trace.display()))?;
    let trace = parse_trace(&text).map_err(|e| format!("{}: {e}", args.trace.display()))?;
    let cache = CacheConfig { bytes: parse_size(&args.cache).map_err(|e| format!("--cache: {e}"))?, prefetch_pages: args.prefetch };
    let summary = simulate(&table, &trace, cache);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!("platform {} ({}), cache {}, read-ahead {} pages", table.platform, table.source, args.cache, args.prefetch);
    println!(
        "{} requests over {:.1} s: {} reads ({:.1} MB), {} writes ({:.1} MB); {:.1} MB from the cache, {:.1} MB missed, {} pages read ahead",
        summary.requests,
        summary.duration_s,
        summary.reads,
        summary.bytes_read as f64 / 1e6,
        summary.requests - summary.reads,
        summary.bytes_written as f64 / 1e6,
        summary.hit_bytes as f64 / 1e6,
        summary.miss_bytes as f64 / 1e6,
        summary.prefetched_pages
    );
    println!("{:<18} {:>6} {:>12} {:>12} {:>10}", "request", "cache", "MB", "energy J", "uJ/KB");
    for category in &summary.by_category {
        let access = serde_json::to_value(category.access).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        let cached = if category.hit { "hit" } else { "miss" };
        println!("{access:<18} {cached:>6} {:>12.1} {:>12.3} {:>10.1}", category.bytes as f64 / 1e6, category.energy_uj / 1e6, category.uj_per_kb);
    }
    println!("total energy {:.3} J", summary.energy_j);
    Ok(())
}
