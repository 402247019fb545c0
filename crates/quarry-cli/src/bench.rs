//! `quarry bench`: runs a suite's queries (generating the data if the warehouse lacks it) and
//! reports per-query times.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use quarry_engine::user_message;
use quarry_table::{PageEncoding, Warehouse};
use serde_json::json;

use crate::chart::{Timed, draw, read_peer};
use crate::generate::generate_tables;
use crate::queries::suite;
use crate::target::Target;
use crate::{CliResult, with_runtime};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Suite: ssb or tpch.
    #[arg(value_parser = ["ssb", "tpch"])]
    suite: String,
    /// Scale factor; data of another scale factor is regenerated.
    #[arg(long, default_value_t = 1.0)]
    sf: f64,
    /// Timed runs per query (after one warm-up run); the best is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Run only these queries (comma-separated names, e.g. q1.1,q2.1).
    #[arg(long, value_delimiter = ',')]
    queries: Vec<String>,
    /// Print each query's result (from its last run).
    #[arg(long)]
    print_results: bool,
    /// Also write the times as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also draw the times into this chart (.png or .svg).
    #[arg(long)]
    chart: Option<PathBuf>,
    /// A peer's times to draw beside Quarry's, with the ratios (a `--json` file of another
    /// run: another system's or configuration's).
    #[arg(long, requires = "chart")]
    peer: Option<PathBuf>,
    /// The peer's name on the chart (default: its file's name).
    #[arg(long, requires = "peer")]
    peer_name: Option<String>,
}

pub fn run(target: &Target, args: BenchArgs, threads: usize) -> CliResult {
    let queries = suite(&args.suite).expect("clap checked the suite");
    if !target.is_remote() {
        let warehouse = Warehouse::open(&target.warehouse).map_err(|e| e.to_string())?;
        ensure_data(&warehouse, &args.suite, args.sf, threads)?;
    }
    let repeat = args.repeat.max(1);
    // Read before the runs, so that a bad peer file fails at once.
    let peer = args.peer.as_deref().map(read_peer).transpose()?;
    with_runtime(threads, async {
        let session = target.session().await?;
        let mut results = Vec::new();
        println!("{} SF {} on {threads} threads, best of {repeat} after a warm-up", args.suite, args.sf);
        let chosen: Vec<_> = queries.iter().filter(|(n, _)| args.queries.is_empty() || args.queries.iter().any(|q| q == n)).collect();
        // On a terminal: which query runs, and how many runs are left.
        let bar = crate::progress::steps_bar("", (chosen.len() * (repeat + 1)) as u64, "runs");
        for (name, sql) in chosen {
            bar.set_message(name.to_string());
            let mut times = Vec::with_capacity(repeat);
            let mut last = None;
            for run in 0..=repeat {
                let started = Instant::now();
                let result = session.query(sql).await.map_err(|e| format!("{name}: {}", user_message(&e)))?;
                let ms = started.elapsed().as_secs_f64() * 1e3;
                bar.inc(1);
                if run > 0 {
                    times.push(ms);
                }
                last = Some(result);
            }
            let last = last.expect("at least one run");
            let rows = last.stats.rows_returned;
            if args.print_results {
                let table = arrow::util::pretty::pretty_format_batches(&last.batches).map_err(|e| e.to_string())?;
                bar.suspend(|| println!("-- {name}\n{table}"));
            }
            let best = times.iter().copied().fold(f64::INFINITY, f64::min);
            bar.suspend(|| println!("{name:>6} {best:>10.1} ms  {rows:>8} rows"));
            results.push(json!({"name": name, "times_ms": times, "best_ms": best, "rows": rows}));
        }
        bar.finish_and_clear();
        let geomean = (results.iter().map(|r| r["best_ms"].as_f64().unwrap_or(1.0).ln()).sum::<f64>() / results.len().max(1) as f64).exp();
        println!("{:>6} {geomean:>10.1} ms  (geometric mean)", "all");
        if let Some(path) = &args.json {
            let report = json!({"suite": args.suite, "sf": args.sf, "threads": threads, "queries": results});
            std::fs::write(path, serde_json::to_string_pretty(&report).expect("json") + "\n")
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        if let Some(path) = &args.chart {
            let times: Vec<Timed> = results
                .iter()
                .map(|r| Timed { name: r["name"].as_str().unwrap_or_default().to_string(), ms: r["best_ms"].as_f64().unwrap_or(0.0) })
                .collect();
            let peer_name = args.peer_name.clone().or_else(|| args.peer.as_ref().and_then(|p| p.file_stem()).map(|s| s.to_string_lossy().into_owned()));
            let title = format!("{} SF {} on {threads} threads, best of {repeat}", args.suite, args.sf);
            draw(path, &title, &times, peer.as_ref().map(|times| (peer_name.as_deref().unwrap_or("peer"), times)))?;
        }
        Ok(())
    })
}

/// Generates the suite's tables unless the warehouse holds them at this scale factor.
fn ensure_data(warehouse: &Warehouse, suite_name: &str, sf: f64, threads: usize) -> CliResult {
    let (tables, properties) = match suite_name {
        "ssb" => (quarry_gen::ssb::ssb_tables(sf, 1), vec![("generator", "ssb"), ("seed", "1")]),
        _ => (quarry_gen::tpch::tpch_tables(sf), vec![("generator", "tpch")]),
    };
    let current = tables.iter().all(|t| {
        warehouse.table(t.name()).is_ok_and(|snapshot| {
            let props = &snapshot.manifest.properties;
            props.get("generator").map(String::as_str) == Some(suite_name)
                && props.get("scale_factor").and_then(|v| v.parse::<f64>().ok()) == Some(sf)
        })
    });
    if current {
        return Ok(());
    }
    eprintln!("generating {suite_name} SF {sf} into {}", warehouse.root().display());
    let mut properties: Vec<(String, String)> = properties.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    properties.push(("scale_factor".into(), sf.to_string()));
    generate_tables(warehouse, &tables, &properties, PageEncoding::default(), threads)
}
