//! `quarry layout plan`: a column layout (Parquet encoding and codec per column) for a table,
//! chosen for a workload on a device (HippogriffDB's balanced plan, `quarry_model::layout`).
//! Each candidate's bytes and decode time are measured on a sample of the table on this machine
//! (`quarry_table::layout_sample`); the workload's queries say which columns each reads and
//! what they ask of them (filters on the table's columns; joins with filtered tables, whose
//! passing keys are computed), from which sort keys and sorted versions are proposed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, Int64Array, RecordBatch};
use arrow::datatypes::DataType;
use arrow::compute::{cast, concat_batches, sort_to_indices};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::SessionContext;
use quarry_engine::user_message;
use quarry_model::layout::{ColumnLayout, LayoutProblem, QueryCost, exhaustive, greedy};
use quarry_storage::DeviceProfile;
use quarry_table::layout_sample::{MeasuredLayout, measure_column, sample_rows, stored_column_bytes};
use quarry_table::ingest::write_segments_of;
use quarry_table::segment::{ZONE_ROWS, check_column_layouts};
use quarry_table::{ColumnLayoutSpec, PageEncoding, SegmentMeta, SegmentOptions, SortedVersion, TableWriter, Warehouse, WriteMode};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

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
    /// bandwidth), from sizes and decode rates measured on a sample of the table here; and the
    /// sort keys (sorted versions, within --budget-space) that let its queries skip segments.
    Plan(PlanArgs),
    /// Rewrites TABLE into a plan's layout (`layout plan --output`): each column in its
    /// encoding and codec, the rows sorted by the plan's first version's key, and a copy sorted
    /// by each further version's key (queries read whichever copy reads fewer bytes), as one
    /// atomic commit; appends keep the layout and add to every copy.
    Apply(ApplyArgs),
}

#[derive(Debug, clap::Args)]
struct ApplyArgs {
    /// The table.
    table: String,
    /// The plan (JSON from `layout plan --output`).
    plan: PathBuf,
}

/// What `apply` reads of a plan file.
#[derive(Debug, Deserialize)]
struct PlanFile {
    table: String,
    columns: Vec<PlanFileColumn>,
    #[serde(default)]
    versions: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct PlanFileColumn {
    name: String,
    encoding: String,
    codec: String,
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
    /// Space for sorted versions beyond the first, as a multiple of the planned table's size
    /// (1.0: one more version).
    #[arg(long, default_value_t = 0.0)]
    budget_space: f64,
}

/// Runs `quarry layout`.
pub fn run(target: &Target, args: LayoutArgs) -> CliResult {
    match args.command {
        LayoutCommand::Plan(args) => plan(target, args),
        LayoutCommand::Apply(args) => apply(target, args),
    }
}

fn apply(target: &Target, args: ApplyArgs) -> CliResult {
    if target.is_remote() {
        return Err("layout apply rewrites the table in the warehouse directory; run it where the table is, without --nodes".into());
    }
    let text = std::fs::read_to_string(&args.plan).map_err(|e| format!("reading {}: {e}", args.plan.display()))?;
    let plan: PlanFile = serde_json::from_str(&text).map_err(|e| format!("{}: not a layout plan: {e}", args.plan.display()))?;
    if plan.table != args.table {
        return Err(format!("{} is a plan for table '{}', not '{}'", args.plan.display(), plan.table, args.table));
    }
    let warehouse = Warehouse::open(&target.warehouse).map_err(|e| e.to_string())?;
    let table = warehouse.table(&args.table).map_err(|e| e.to_string())?;
    let layouts: Vec<ColumnLayoutSpec> =
        plan.columns.iter().map(|c| ColumnLayoutSpec { column: c.name.clone(), encoding: c.encoding.clone(), codec: c.codec.clone() }).collect();
    check_column_layouts(&table.schema, &layouts).map_err(|e| format!("{}: {e}", args.plan.display()))?;
    if let Some(key) = plan.versions.iter().find(|k| table.schema.field_with_name(k).is_err()) {
        return Err(format!("{}: sort key '{key}' is not a column of '{}'", args.plan.display(), args.table));
    }
    let sort_key = plan.versions.first().cloned();
    // Segments as large as the table's largest: pruning keeps its granularity.
    let segment_rows = table.manifest.segments.iter().map(|s| s.rows as usize).max().unwrap_or(1);
    let options = SegmentOptions {
        bloom_filter_columns: table.manifest.bloom_filter_columns.clone(),
        // Pages compressed where the plan says: nodes read them as they read compact tables.
        page_encoding: PageEncoding::Compact,
        column_layouts: layouts,
        zone_column: None,
    };
    let before: u64 = table.manifest.segments.iter().map(|s| s.bytes).sum();
    let quoted = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    let sorted_sql = |key: Option<&String>| format!("SELECT * FROM {}{}", quoted(&args.table), key.map_or(String::new(), |key| format!(" ORDER BY {}", quoted(key))));
    let name = args.table.clone();
    let further: Vec<String> = plan.versions.iter().skip(1).cloned().collect();
    let manifest = crate::with_runtime(target.threads, async move {
        // The session first: its node tidies aborted writes, which the write below must not be.
        let session = target.session().await?;
        let writer = Arc::new(
            warehouse
                .begin_write(&name, &table.schema, WriteMode::Replace, options, sort_key.iter().cloned().collect())
                .map_err(|e| e.to_string())?,
        );
        // The table's own segments sorted by the first key, then a copy sorted by each further
        // one (small row groups with zone maps), all in one commit.
        let segments = write_copy(&session, &writer, &name, &sorted_sql(sort_key.as_ref()), segment_rows, None).await?;
        let mut versions = Vec::with_capacity(further.len());
        for key in &further {
            let segments = write_copy(&session, &writer, &name, &sorted_sql(Some(key)), segment_rows, Some(key.clone())).await?;
            versions.push(SortedVersion { sort_key: vec![key.clone()], segments });
        }
        let writer = Arc::into_inner(writer).expect("the copies are written");
        writer.commit_with_versions(segments, versions, Vec::new()).map_err(|e| e.to_string())
    })?;
    let after: u64 = manifest.segments.iter().map(|s| s.bytes).sum();
    println!(
        "{}: version {} in the planned layout{}: {} segments, {:.1} MB (was {:.1} MB)",
        args.table,
        manifest.version,
        manifest.sort_key.first().map_or(String::new(), |k| format!(", sorted by {k}")),
        manifest.segments.len(),
        after as f64 / 1e6,
        before as f64 / 1e6
    );
    for copy in &manifest.versions {
        let bytes: u64 = copy.segments.iter().map(|s| s.bytes).sum();
        println!("{}: a copy sorted by {}: {} segments, {:.1} MB", args.table, copy.sort_key.join(", "), copy.segments.len(), bytes as f64 / 1e6);
    }
    Ok(())
}

/// Writes the rows of `sql` (the table, sorted) into new segments of `writer`; with
/// `sorted_by`, a sorted copy's. Rows flow from the query to a writer thread; a failure on
/// either side fails the whole (the caller drops the writer, which removes what it wrote).
async fn write_copy(session: &quarry_engine::QuarrySession, writer: &Arc<TableWriter>, name: &str, sql: &str, segment_rows: usize, sorted_by: Option<String>) -> CliResult<Vec<SegmentMeta>> {
    let rows = session.stream(session.plan(sql).await.map_err(|e| user_message(&e))?).await.map_err(|e| user_message(&e))?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<quarry_table::Result<RecordBatch>>(4);
    let writing = {
        let writer = Arc::clone(writer);
        tokio::task::spawn_blocking(move || write_segments_of(&writer, rx.into_iter(), segment_rows, sorted_by.as_deref(), &|_| {}))
    };
    let (mut rows, mut failed) = (rows, None);
    while let Some(batch) = rows.next().await {
        match batch {
            Ok(batch) => {
                if tx.send(Ok(batch)).is_err() {
                    break;
                }
            }
            Err(e) => {
                failed = Some(format!("reading table '{name}': {}", user_message(&e)));
                break;
            }
        }
    }
    drop(tx);
    let segments = writing.await.map_err(|e| format!("the writer failed: {e}"))?;
    if let Some(message) = failed {
        return Err(message);
    }
    segments.map_err(|e| e.to_string())
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
    /// The table's page encoding, which gives each column its current layout.
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
    /// Each column the workload restricts, as a sort key: the bytes the workload would read
    /// with the table sorted by it (segments whose values all fail a query's restrictions on
    /// it skipped), best first.
    sort_keys: Vec<SortKeyEstimate>,
    /// The sorted versions to keep within `--budget-space`, and the workload's bytes when each
    /// query reads the version that prunes best.
    versions: Vec<String>,
    versions_bytes: f64,
}

#[derive(Debug, Serialize)]
struct SortKeyEstimate {
    column: String,
    workload_bytes: f64,
    /// Per query (workload order), the share of segments it would read.
    read_share: Vec<f64>,
    /// The workload's bytes from a sorted copy by this column (pruned by zone maps).
    copy_workload_bytes: f64,
    /// Per query, the share of a sorted copy's row groups it would read.
    zone_read_share: Vec<f64>,
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
    /// The version (sort key) it reads best from, if any prunes it.
    version: Option<String>,
    /// Its planned bytes on that version.
    version_bytes: f64,
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
    let columns: Vec<String> = table.schema.fields().iter().map(|f| f.name().clone()).collect();
    let queries = workload(target, &args.table, &columns, &args.workload)?;

    let sample = sample_rows(&table, args.sample_rows).map_err(|e| e.to_string())?;
    let sampled: usize = sample.iter().map(|b| b.num_rows()).sum();
    if sampled == 0 {
        return Err(format!("table '{}' has no rows to measure", args.table));
    }
    // Decoding runs on the device's threads, each `slowdown` times slower than this machine's;
    // a profile emulated here has no more threads than this machine's cores (SSB SF 10 under
    // softflash's 8 on 2 cores: a plan of ZSTD pages read 0.56x the bytes in 1.19x the time;
    // planned for 2 threads, 0.66x the bytes in 0.85x the time).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (threads, slowdown) = (profile.threads().min(cores), profile.compute_slowdown);
    let scale = |m: &MeasuredLayout| ColumnLayout {
        encoding: m.encoding.clone(),
        codec: m.codec.clone(),
        bytes: m.bytes_per_row * rows as f64,
        decode_s: m.decode_ns_per_row * rows as f64 * 1e-9 * slowdown / threads as f64,
    };
    let page_encoding = table.manifest.page_encoding;
    let mut candidates = Vec::with_capacity(columns.len());
    let mut defaults = Vec::with_capacity(columns.len());
    for (i, name) in columns.iter().enumerate() {
        let measured: Vec<ColumnLayout> = measure_column(&sample, i).iter().map(scale).collect();
        let default_layout = page_encoding.layout_of(sample[0].schema().field(i).data_type());
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
        queries: queries.iter().map(|q| q.columns.iter().filter_map(|c| columns.iter().position(|n| n == c)).map(|i| (i, 1.0)).collect()).collect(),
        read_bytes_per_s: read_mbps * 1e6,
    };
    problem.validate()?;
    let chosen = greedy(&problem);
    let optimum = exhaustive(&problem, 1 << 20).map(|plan| problem.seconds(&plan));
    let (default_costs, plan_costs) = (problem.query_costs(&defaults), problem.query_costs(&chosen));
    let plan_bytes: Vec<f64> = plan_costs.iter().map(|c| c.bytes).collect();
    let sort_keys = sort_key_estimates(&sample, &queries, &plan_bytes, table.manifest.segments.len(), rows)?;
    let extra_versions = args.budget_space.max(0.0).floor() as usize;
    let (versions, versions_bytes) = choose_versions(&sort_keys, &plan_bytes, extra_versions);
    let best_version = |q: usize| {
        versions
            .iter()
            .filter_map(|v| sort_keys.iter().find(|k| k.column == *v))
            .enumerate()
            .map(|(v, k)| (k.column.clone(), if v == 0 { k.read_share[q] } else { k.zone_read_share[q] }))
            .filter(|(_, share)| *share < 1.0)
            .min_by(|a, b| a.1.total_cmp(&b.1))
    };
    let plan = Plan {
        table: args.table.clone(),
        profile: profile.name.clone(),
        read_mbps,
        device_threads: threads,
        compute_slowdown: slowdown,
        rows,
        sample_rows: sampled,
        default_layout: page_encoding.name().to_string(),
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
            .enumerate()
            .map(|(i, (query, (d, p)))| {
                let version = best_version(i);
                PlannedQuery {
                    name: query.name.clone(),
                    columns: query.columns.clone(),
                    version_bytes: p.bytes * version.as_ref().map_or(1.0, |v| v.1),
                    version: version.map(|v| v.0),
                    default: (*d).into(),
                    plan: (*p).into(),
                }
            })
            .collect(),
        default_seconds: problem.seconds(&defaults),
        plan_seconds: problem.seconds(&chosen),
        default_bytes: default_costs.iter().map(|c| c.bytes).sum(),
        plan_bytes: plan_costs.iter().map(|c| c.bytes).sum(),
        optimum_seconds: optimum,
        sort_keys,
        versions,
        versions_bytes,
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
    for key in plan.sort_keys.iter().take(5) {
        out.push_str(&format!(
            "sorted by {:<20} the workload reads {:.1} MB ({:.2}x unsorted); from a sorted copy by its zones {:.1} MB ({:.2}x)\n",
            key.column,
            mb(key.workload_bytes),
            key.workload_bytes / plan.plan_bytes.max(1.0),
            mb(key.copy_workload_bytes),
            key.copy_workload_bytes / plan.plan_bytes.max(1.0)
        ));
    }
    if !plan.versions.is_empty() {
        out.push_str(&format!(
            "versions sorted by {}: the workload reads {:.1} MB ({:.2}x the default layout's)\n",
            plan.versions.join(", "),
            mb(plan.versions_bytes),
            plan.versions_bytes / plan.default_bytes.max(1.0)
        ));
    }
    out
}

/// For each column the workload restricts: the bytes each query would read with the table
/// sorted by it. The sample, sorted by the column, is cut into as many ranges as the table has
/// segments (`read_share`, the table's own order, pruned by segment) and as it would have row
/// groups in a sorted copy (`zone_read_share`, pruned by zone maps). A query reads a range
/// unless its restrictions on the column rule it out: a join's passing keys, where the column
/// is an integer, when none lies within the range's bounds (every key counts, not only the
/// sampled rows: a sample holds too few rows per range to find the rare keys); other
/// restrictions when every sampled row in the range fails them.
fn sort_key_estimates(sample: &[RecordBatch], queries: &[WorkloadQuery], plan_bytes: &[f64], segments: usize, table_rows: u64) -> CliResult<Vec<SortKeyEstimate>> {
    let Some(first) = sample.first() else { return Ok(Vec::new()) };
    let batch = concat_batches(&first.schema(), sample).map_err(|e| e.to_string())?;
    let rows = batch.num_rows();
    let segment_ranges = segments.clamp(1, rows.max(1));
    let zone_ranges = (table_rows as usize).div_ceil(ZONE_ROWS).clamp(1, rows.max(1));
    let mut columns: Vec<&String> = queries.iter().flat_map(|q| q.restrictions.iter().map(|(c, _)| c)).collect();
    columns.sort();
    columns.dedup();
    let ctx = SessionContext::new();
    let df_schema = DFSchema::try_from(batch.schema().as_ref().clone()).map_err(|e| e.to_string())?;
    let mut estimates = Vec::new();
    for column in columns {
        let Ok(index) = batch.schema().index_of(column) else { continue };
        let values = batch.column(index);
        let order = sort_to_indices(values, None, None).map_err(|e| e.to_string())?;
        // The sampled values as integers, in sorted order, where the column is one.
        let sorted_ints: Option<Vec<i64>> = cast(values, &DataType::Int64).ok().and_then(|ints| {
            let ints = ints.as_any().downcast_ref::<Int64Array>()?.clone();
            (ints.null_count() == 0).then(|| order.values().iter().map(|&i| ints.value(i as usize)).collect())
        });
        // The sampled values as scalars, made once for every query's key sets.
        let mut scalars: Option<Vec<Option<ScalarValue>>> = None;
        let (mut read_share, mut zone_read_share) = (Vec::with_capacity(queries.len()), Vec::with_capacity(queries.len()));
        for query in queries {
            let on_column: Vec<&Restriction> = query.restrictions.iter().filter(|(c, _)| c == column).map(|(_, r)| r).collect();
            // Exact: the one restriction is a join's integer keys.
            let keys: Option<Vec<i64>> = match (on_column.as_slice(), &sorted_ints) {
                ([Restriction::Keys(keys)], Some(_)) => cast(keys, &DataType::Int64).ok().and_then(|k| {
                    let k = k.as_any().downcast_ref::<Int64Array>()?;
                    let mut keys: Vec<i64> = k.iter().flatten().collect();
                    keys.sort_unstable();
                    Some(keys)
                }),
                _ => None,
            };
            let mut passes: Option<Vec<bool>> = None;
            if keys.is_none() {
                for restriction in &on_column {
                    let mask = match restriction {
                        Restriction::Predicate(expr) => {
                            let Ok(physical) = ctx.create_physical_expr(expr.clone(), &df_schema) else { continue };
                            let evaluated = physical.evaluate(&batch).and_then(|v| v.into_array(rows)).map_err(|e| e.to_string())?;
                            let Some(flags) = evaluated.as_any().downcast_ref::<BooleanArray>() else { continue };
                            (0..rows).map(|i| flags.is_valid(i) && flags.value(i)).collect::<Vec<bool>>()
                        }
                        Restriction::Keys(keys) => {
                            let Ok(keys) = cast(keys, values.data_type()) else { continue };
                            let set: HashSet<ScalarValue> = (0..keys.len()).filter_map(|i| ScalarValue::try_from_array(&keys, i).ok()).collect();
                            let scalars = scalars.get_or_insert_with(|| (0..rows).map(|i| ScalarValue::try_from_array(values, i).ok()).collect());
                            scalars.iter().map(|v| v.as_ref().is_some_and(|v| set.contains(v))).collect()
                        }
                    };
                    passes = Some(match passes {
                        Some(p) => p.iter().zip(&mask).map(|(a, b)| *a && *b).collect(),
                        None => mask,
                    });
                }
            }
            let share = |ranges: usize| -> f64 {
                let bounds = |r: usize| r * rows / ranges..(r + 1) * rows / ranges;
                let read = match (&keys, &sorted_ints, &passes) {
                    (Some(keys), Some(ints), _) => (0..ranges)
                        .filter(|&r| {
                            let range = bounds(r);
                            if range.is_empty() {
                                return false;
                            }
                            let (lo, hi) = (ints[range.start], ints[range.end - 1]);
                            let at = keys.partition_point(|&k| k < lo);
                            at < keys.len() && keys[at] <= hi
                        })
                        .count(),
                    (_, _, Some(passes)) => (0..ranges).filter(|&r| bounds(r).any(|i| passes[order.value(i) as usize])).count(),
                    _ => ranges,
                };
                read as f64 / ranges as f64
            };
            read_share.push(share(segment_ranges));
            zone_read_share.push(share(zone_ranges));
        }
        let workload_bytes = read_share.iter().zip(plan_bytes).map(|(share, bytes)| share * bytes).sum();
        let copy_workload_bytes = zone_read_share.iter().zip(plan_bytes).map(|(share, bytes)| share * bytes).sum();
        estimates.push(SortKeyEstimate { column: column.clone(), workload_bytes, read_share, copy_workload_bytes, zone_read_share });
    }
    estimates.sort_by(|a, b| a.workload_bytes.total_cmp(&b.workload_bytes));
    Ok(estimates)
}

/// The best sort key, then up to `extra` more versions (sorted copies, pruned by their zone
/// maps), each the one that lowers most the workload's bytes when every query reads its best
/// version; the versions and those bytes.
fn choose_versions(keys: &[SortKeyEstimate], plan_bytes: &[f64], extra: usize) -> (Vec<String>, f64) {
    let unsorted: f64 = plan_bytes.iter().sum();
    let bytes_with = |chosen: &[&SortKeyEstimate]| -> f64 {
        let share = |q: usize| chosen.iter().enumerate().map(|(v, k)| if v == 0 { k.read_share[q] } else { k.zone_read_share[q] }).fold(1.0, f64::min);
        plan_bytes.iter().enumerate().map(|(q, bytes)| bytes * share(q)).sum()
    };
    let mut chosen: Vec<&SortKeyEstimate> = Vec::new();
    for _ in 0..=extra {
        let best = keys.iter().filter(|k| !chosen.iter().any(|c| c.column == k.column)).min_by(|a, b| {
            let (mut with_a, mut with_b) = (chosen.clone(), chosen.clone());
            with_a.push(a);
            with_b.push(b);
            bytes_with(&with_a).total_cmp(&bytes_with(&with_b))
        });
        match best {
            Some(key) if bytes_with(&[chosen.as_slice(), &[key]].concat()) < bytes_with(&chosen).min(unsorted) => chosen.push(key),
            _ => break,
        }
    }
    let bytes = if chosen.is_empty() { unsorted } else { bytes_with(&chosen) };
    (chosen.iter().map(|k| k.column.clone()).collect(), bytes)
}

/// One workload query as the planner sees it.
struct WorkloadQuery {
    name: String,
    /// The columns of the table it reads.
    columns: Vec<String>,
    /// What it asks of the table's columns: a row whose value fails any of these is not needed.
    restrictions: Vec<(String, Restriction)>,
}

/// A query's restriction on one column of the table.
enum Restriction {
    /// A filter on the column alone (its columns unqualified).
    Predicate(Expr),
    /// A join with a filtered table: the keys that find a partner.
    Keys(ArrayRef),
}

/// The workload's queries (files, or directories of `.sql` files), each planned and optimized:
/// the columns of `table` it reads and its restrictions on them. Star joins are planned as
/// joins here, so that each dimension's filtered keys can be read off the plan.
fn workload(target: &Target, table: &str, table_columns: &[String], workload: &[PathBuf]) -> CliResult<Vec<WorkloadQuery>> {
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
    let target = Target { star_join: false, ..target.clone() };
    crate::with_runtime(2, async {
        let session = target.session().await?;
        let mut queries = Vec::with_capacity(files.len());
        for file in &files {
            let sql = std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
            let located = |e: datafusion::error::DataFusionError| format!("{}: {}", file.display(), user_message(&e));
            let plan = session.plan(&sql).await.map_err(located)?;
            let plan = session.context().state().optimize(&plan).map_err(located)?;
            let mut restrictions = scan_filters(&plan, table, table_columns);
            for (column, keys) in join_keys(&plan, table, table_columns) {
                let batches = session.context().execute_logical_plan(keys).await.map_err(located)?.collect().await.map_err(located)?;
                let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(0).as_ref()).collect();
                if !arrays.is_empty() {
                    restrictions.push((column, Restriction::Keys(arrow::compute::concat(&arrays).map_err(|e| e.to_string())?)));
                }
            }
            queries.push(WorkloadQuery { name: query_name(file), columns: scanned_columns(&plan, table), restrictions });
        }
        Ok(queries)
    })
}

fn query_name(file: &Path) -> String {
    file.file_stem().map_or_else(|| file.display().to_string(), |s| s.to_string_lossy().into_owned())
}

/// Whether `plan` scans `table`.
fn scans(plan: &LogicalPlan, table: &str) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        found |= matches!(node, LogicalPlan::TableScan(scan) if scan.table_name.table() == table);
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    found
}

/// Whether `plan` filters rows: a filter, or a scan with filters pushed into it.
fn filters_rows(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        found |= matches!(node, LogicalPlan::Filter(_)) || matches!(node, LogicalPlan::TableScan(scan) if !scan.filters.is_empty());
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    found
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

/// The filters on one column of `table` that its scans in `plan` carry, unqualified.
fn scan_filters(plan: &LogicalPlan, table: &str, table_columns: &[String]) -> Vec<(String, Restriction)> {
    let mut found = Vec::new();
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && scan.table_name.table() == table
        {
            for filter in &scan.filters {
                let columns = filter.column_refs();
                if let [column] = columns.iter().collect::<Vec<_>>().as_slice()
                    && table_columns.contains(&column.name)
                    && let Ok(unqualified) = unqualify(filter)
                {
                    found.push((column.name.clone(), Restriction::Predicate(unqualified)));
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

fn unqualify(expr: &Expr) -> datafusion::error::Result<Expr> {
    expr.clone()
        .transform(|e| match e {
            Expr::Column(c) => Ok(Transformed::yes(Expr::Column(Column::new_unqualified(c.name)))),
            other => Ok(Transformed::no(other)),
        })
        .map(|t| t.data)
}

/// For each equi-join of a column of `table` with a side that does not scan the table and
/// filters rows: the column, and the plan of that side's distinct join keys.
fn join_keys(plan: &LogicalPlan, table: &str, table_columns: &[String]) -> Vec<(String, LogicalPlan)> {
    let mut found = Vec::new();
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::Join(join) = node {
            for (left, right) in &join.on {
                for (mine, theirs, my_side, other) in [(left, right, &join.left, &join.right), (right, left, &join.right, &join.left)] {
                    let (Expr::Column(column), true, false) = (mine, scans(my_side, table), scans(other, table)) else { continue };
                    if !table_columns.contains(&column.name) || !filters_rows(other) {
                        continue;
                    }
                    let keys = LogicalPlanBuilder::from(other.as_ref().clone()).project(vec![theirs.clone()]).and_then(|b| b.distinct()).and_then(|b| b.build());
                    if let Ok(keys) = keys {
                        found.push((column.name.clone(), keys));
                    }
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}
