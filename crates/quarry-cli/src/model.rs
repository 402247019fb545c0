//! `quarry model`: the models that explain runs. `emos` simulates a storage I/O trace's energy.

use quarry_model::emos::{CacheConfig, EnergyTable, parse_trace, simulate};
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
    }
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
