//! `quarry layout plan`: a column layout (Parquet encoding and codec per column) for a table,
//! chosen for a workload on a device (HippogriffDB's balanced plan, `quarry_model::layout`).
//! Each candidate's bytes and decode time are measured on a sample of the table on this machine
//! (`quarry_table::layout_sample`); the workload's queries say which columns each reads.

use std::path::{Path, PathBuf};

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::logical_expr::LogicalPlan;
use quarry_engine::user_message;
use quarry_model::layout::{ColumnLayout, LayoutProblem, QueryCost, exhaustive, greedy};
use quarry_storage::DeviceProfile;
use quarry_table::layout_sample::{MeasuredLayout, measure_column, sample_rows, stored_column_bytes};
use quarry_table::{PageEncoding, Warehouse};
use serde::Serialize;

use crate::CliResult;
use crate::target::Target;

/// Arguments of `quarry layout`.
#[derive(Debug, clap::Args)]
pub struct LayoutArgs {
    #[command(subcommand)]
    command: LayoutCommand,
}

#[derive(Debug, clap::Subcommand)]
enum LayoutCommand {
    /// Plans a layout for TABLE: per column, the Parquet encoding and codec that minimize the
    /// workload's predicted time on the device profile (`--profile`, which must give a read
    /// bandwidth), from sizes and decode rates measured on a sample of the table here.
    Plan(PlanArgs),
}

#[derive(Debug, clap::Args)]
struct PlanArgs {
    /// The table.
    table: String,
    /// The workload: SQL files, or directories of them (each file one query).
    #[arg(long, required = true, num_args = 1..)]
    workload: Vec<PathBuf>,
    /// Rows of the table to measure the candidates on.
    #[arg(long, default_value_t = 200_000)]
    sample_rows: usize,
    /// Write the plan as JSON to this file.
    #[arg(long)]
    output: Option<PathBuf>,
}

/// Runs `quarry layout`.
pub fn run(target: &Target, args: LayoutArgs) -> CliResult {
    match args.command {
        LayoutCommand::Plan(args) => plan(target, args),
    }
}

/// The plan as written to `--output`.
#[derive(Debug, Serialize)]
struct Plan {
    table: String,
    profile: String,
    read_mbps: f64,
    device_threads: usize,
    compute_slowdown: f64,
    rows: u64,
    sample_rows: usize,
    /// The table's current layout.
    default_layout: String,
    columns: Vec<PlannedColumn>,
    queries: Vec<PlannedQuery>,
    /// The workload's predicted seconds and bytes, default layout and plan.
    default_seconds: f64,
    plan_seconds: f64,
    default_bytes: f64,
    plan_bytes: f64,
    /// The optimum's seconds when the plans were few enough to enumerate.
    optimum_seconds: Option<f64>,
}

#[derive(Debug, Serialize)]
struct PlannedColumn {
    name: String,
    encoding: String,
    codec: String,
    bytes: f64,
    decode_s: f64,
    default_bytes: f64,
    default_decode_s: f64,
    /// What the column's chunks take in the stored segments (the sample's estimate of the
    /// default layout is `default_bytes`).
    stored_bytes: u64,
    /// Every candidate measured, for the record.
    candidates: Vec<ColumnLayout>,
}

#[derive(Debug, Serialize)]
struct PlannedQuery {
    name: String,
    columns: Vec<String>,
    default: QueryFigures,
    plan: QueryFigures,
}

#[derive(Debug, Serialize)]
struct QueryFigures {
    bytes: f64,
    read_s: f64,
    decode_s: f64,
    seconds: f64,
    balanced: bool,
}

impl From<QueryCost> for QueryFigures {
    fn from(cost: QueryCost) -> Self {
        QueryFigures { bytes: cost.bytes, read_s: cost.read_s, decode_s: cost.decode_s, seconds: cost.seconds(), balanced: cost.balanced() }
    }
}

fn plan(target: &Target, args: PlanArgs) -> CliResult {
    if target.is_remote() {
        return Err("layout plan measures the table in the warehouse directory; run it where the table is, without --nodes".into());
    }
    let profile = DeviceProfile::load(target.profile.as_deref().unwrap_or("native"))?;
    let Some(read_mbps) = profile.read_mbps else {
        return Err(format!("layout plan needs a device profile with a read bandwidth (--profile softflash, smartssd-2013, ...); '{}' has none", profile.name));
    };
    let warehouse = Warehouse::open(&target.warehouse).map_err(|e| e.to_string())?;
    let table = warehouse.table(&args.table).map_err(|e| e.to_string())?;
    let rows: u64 = table.manifest.segments.iter().map(|s| s.rows).sum();
    let queries = workload_columns(target, &args.table, &args.workload)?;

    let sample = sample_rows(&table, args.sample_rows).map_err(|e| e.to_string())?;
    let sampled: usize = sample.iter().map(|b| b.num_rows()).sum();
    if sampled == 0 {
        return Err(format!("table '{}' has no rows to measure", args.table));
    }
    let columns: Vec<String> = table.schema.fields().iter().map(|f| f.name().clone()).collect();
    let (threads, slowdown) = (profile.threads(), profile.compute_slowdown);
    // Decoding runs on the device's threads, each `slowdown` times slower than this machine's.
    let scale = |m: &MeasuredLayout| ColumnLayout {
        encoding: m.encoding.clone(),
        codec: m.codec.clone(),
        bytes: m.bytes_per_row * rows as f64,
        decode_s: m.decode_ns_per_row * rows as f64 * 1e-9 * slowdown / threads as f64,
    };
    let default_layout = match table.manifest.page_encoding {
        PageEncoding::Compact => ("RLE_DICTIONARY", "SNAPPY"),
        PageEncoding::Dictionary => ("RLE_DICTIONARY", "UNCOMPRESSED"),
        PageEncoding::Plain => ("PLAIN", "UNCOMPRESSED"),
    };
    let mut candidates = Vec::with_capacity(columns.len());
    let mut defaults = Vec::with_capacity(columns.len());
    for (i, name) in columns.iter().enumerate() {
        let measured: Vec<ColumnLayout> = measure_column(&sample, i).iter().map(scale).collect();
        let default = measured
            .iter()
            .position(|c| (c.encoding.as_str(), c.codec.as_str()) == default_layout)
            .ok_or_else(|| format!("column '{name}': its current layout ({} {}) could not be measured", default_layout.0, default_layout.1))?;
        defaults.push(default);
        candidates.push(measured);
    }
    let stored = stored_column_bytes(&table).map_err(|e| e.to_string())?;
    let problem = LayoutProblem {
        columns: columns.clone(),
        candidates,
        queries: queries.iter().map(|(_, read)| read.iter().filter_map(|c| columns.iter().position(|n| n == c)).map(|i| (i, 1.0)).collect()).collect(),
        read_bytes_per_s: read_mbps * 1e6,
    };
    problem.validate()?;
    let chosen = greedy(&problem);
    let optimum = exhaustive(&problem, 1 << 20).map(|plan| problem.seconds(&plan));
    let (default_costs, plan_costs) = (problem.query_costs(&defaults), problem.query_costs(&chosen));
    let plan = Plan {
        table: args.table.clone(),
        profile: profile.name.clone(),
        read_mbps,
        device_threads: threads,
        compute_slowdown: slowdown,
        rows,
        sample_rows: sampled,
        default_layout: format!("{} {}", default_layout.0, default_layout.1),
        columns: columns
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let (c, d) = (&problem.candidates[i][chosen[i]], &problem.candidates[i][defaults[i]]);
                PlannedColumn {
                    name: name.clone(),
                    encoding: c.encoding.clone(),
                    codec: c.codec.clone(),
                    bytes: c.bytes,
                    decode_s: c.decode_s,
                    default_bytes: d.bytes,
                    default_decode_s: d.decode_s,
                    stored_bytes: stored[i],
                    candidates: problem.candidates[i].clone(),
                }
            })
            .collect(),
        queries: queries
            .iter()
            .zip(default_costs.iter().zip(&plan_costs))
            .map(|((name, read), (d, p))| PlannedQuery { name: name.clone(), columns: read.clone(), default: (*d).into(), plan: (*p).into() })
            .collect(),
        default_seconds: problem.seconds(&defaults),
        plan_seconds: problem.seconds(&chosen),
        default_bytes: default_costs.iter().map(|c| c.bytes).sum(),
        plan_bytes: plan_costs.iter().map(|c| c.bytes).sum(),
        optimum_seconds: optimum,
    };
    print!("{}", report(&plan));
    if let Some(path) = &args.output {
        let text = serde_json::to_string_pretty(&plan).expect("plan serializes");
        std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The plan as text: per column its layout, per query bytes and time, then the totals.
fn report(plan: &Plan) -> String {
    let mb = |b: f64| b / 1e6;
    let mut out = format!(
        "layout plan for {} ({} rows) on {} ({} MB/s read, {} device threads, compute {}x), from {} sampled rows; default {}\n",
        plan.table, plan.rows, plan.profile, plan.read_mbps, plan.device_threads, plan.compute_slowdown, plan.sample_rows, plan.default_layout
    );
    out.push_str(&format!("{:<20} {:<24} {:<14} {:>12} {:>12} {:>12}\n", "column", "encoding", "codec", "MB", "default MB", "stored MB"));
    for c in &plan.columns {
        out.push_str(&format!(
            "{:<20} {:<24} {:<14} {:>12.1} {:>12.1} {:>12.1}\n",
            c.name,
            c.encoding,
            c.codec,
            mb(c.bytes),
            mb(c.default_bytes),
            mb(c.stored_bytes as f64)
        ));
    }
    out.push_str(&format!("{:<20} {:>12} {:>12} {:>10} {:>10} {:>9}\n", "query", "MB", "default MB", "s", "default s", "balanced"));
    for q in &plan.queries {
        out.push_str(&format!(
            "{:<20} {:>12.1} {:>12.1} {:>10.3} {:>10.3} {:>9}\n",
            q.name,
            mb(q.plan.bytes),
            mb(q.default.bytes),
            q.plan.seconds,
            q.default.seconds,
            if q.plan.balanced { "yes" } else { "no" }
        ));
    }
    out.push_str(&format!(
        "workload: {:.1} MB read ({:.2}x the default's {:.1} MB), {:.3} s predicted ({:.2}x the default's {:.3} s){}\n",
        mb(plan.plan_bytes),
        plan.plan_bytes / plan.default_bytes.max(1.0),
        mb(plan.default_bytes),
        plan.plan_seconds,
        plan.plan_seconds / plan.default_seconds.max(1e-12),
        plan.default_seconds,
        plan.optimum_seconds.map_or(String::new(), |o| format!("; the optimum, enumerated: {o:.3} s"))
    ));
    out
}

/// Each workload query's name and the columns of `table` it reads (from its optimized plan).
fn workload_columns(target: &Target, table: &str, workload: &[PathBuf]) -> CliResult<Vec<(String, Vec<String>)>> {
    let mut files = Vec::new();
    for path in workload {
        if path.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "sql"))
                .collect();
            entries.sort();
            files.extend(entries);
        } else {
            files.push(path.clone());
        }
    }
    if files.is_empty() {
        return Err("the workload has no .sql files".into());
    }
    crate::with_runtime(2, async {
        let session = target.session().await?;
        let mut queries = Vec::with_capacity(files.len());
        for file in &files {
            let sql = std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
            let located = |e: datafusion::error::DataFusionError| format!("{}: {}", file.display(), user_message(&e));
            let plan = session.plan(&sql).await.map_err(located)?;
            let plan = session.context().state().optimize(&plan).map_err(located)?;
            queries.push((query_name(file), scanned_columns(&plan, table)));
        }
        Ok(queries)
    })
}

fn query_name(file: &Path) -> String {
    file.file_stem().map_or_else(|| file.display().to_string(), |s| s.to_string_lossy().into_owned())
}

/// The columns of `table` that `plan`'s scans of it read (subqueries included), in first-seen order.
fn scanned_columns(plan: &LogicalPlan, table: &str) -> Vec<String> {
    let mut columns: Vec<String> = Vec::new();
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && scan.table_name.table() == table
        {
            for field in scan.projected_schema.fields() {
                if !columns.contains(field.name()) {
                    columns.push(field.name().clone());
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    columns
}
