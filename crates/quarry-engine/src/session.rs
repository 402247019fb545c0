//! A host session: SQL text in, results and accounting out.

use std::collections::{BTreeMap, HashSet};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::SchemaRef;
use datafusion::common::plan_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::memory_pool::{FairSpillPool, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::optimizer::{Analyzer, AnalyzerRule};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::analyze::AnalyzeExec;
use datafusion::physical_plan::{SendableRecordBatchStream, execute_stream};
use datafusion::catalog::{CatalogProviderList, MemoryCatalogProvider, MemoryCatalogProviderList};
use datafusion::prelude::{DataFrame, SQLOptions, SessionConfig, SessionContext};
use datafusion::sql::parser::{DFParser, Statement};
use datafusion::sql::sqlparser::dialect::{GenericDialect, dialect_from_str};
use futures::StreamExt;
use quarry_model::energy::{COMPONENTS, DevicePower, Energy, HostPower, joules};
use quarry_storage::constant_keys::ConstantKeysRule;
use quarry_storage::{Calibration, StorageNode};

use crate::accounting::QueryStats;
use crate::filter_estimate::FilterEstimateRule;
use crate::grouping_sets::GroupingSetRule;
use crate::join_order::JoinOrderRule;
use crate::key_set_filter::KeySetRule;
use crate::keyed_aggregate::KeyedAggregateRule;
use crate::magic_set::MagicSetRule;
use crate::null_rejecting_keys::NullRejectingKeysRule;
use crate::probe_yield::ProbeYieldRule;
use crate::query_stop::QueryStop;
use crate::conjunct_order::ConjunctOrderRule;
use crate::decimal_arith::DecimalArithRule;
use crate::decimal_division::DecimalDivisionRule;
use crate::shared_subplan::SharedSubplanRule;
use crate::small_group_aggregate::SmallGroupAggregateRule;
use crate::running_window::RunningWindowRule;
use crate::star_join::with_star_joins;
use crate::output::ResultSink;
use crate::placement::{Objective, PlacementRule, PushdownMode};
use crate::progress::QueryProgress;
use crate::provider::NodeSchemaProvider;

/// How a session runs queries.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Threads the host uses (DataFusion's target partitions).
    pub threads: usize,
    /// Which operators go to the storage nodes.
    pub pushdown: PushdownMode,
    /// What `--pushdown auto` minimizes: time or energy.
    pub objective: Objective,
    /// The host's power figures (default: Do 2013's server).
    pub host_power: HostPower,
    /// Whether aggregates over star joins run as one fused star join (`StarAggregateExec`)
    /// rather than as a tree of hash joins.
    pub star_join: bool,
    /// The host's memory budget for query state (hash tables, aggregates, sorts, shared
    /// subplans), in bytes: every operator reserves from it before it allocates; sorts and
    /// aggregates spill beyond their share, and what cannot spill fails with an error naming
    /// the budget. `None`: no limit.
    pub memory_limit: Option<usize>,
    /// The host's own operator rates (`quarry calibrate` on this machine). `None`: those of a
    /// storage node in this process, which runs on this machine, else the defaults.
    pub host_rates: Option<Calibration>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { threads: std::thread::available_parallelism().map_or(1, |n| n.get()), pushdown: PushdownMode::Auto, objective: Objective::Time, host_power: HostPower::do_2013(), star_join: true, memory_limit: None, host_rates: None }
    }
}

/// DataFusion settings of the host, each changed for a measured reason (SSB and TPC-H at SF 10,
/// 2 threads; see the issue notes).
fn tune_host(config: &mut SessionConfig) {
    let optimizer = &mut config.options_mut().optimizer;
    // A dimension table of up to a few million rows is built once and shared by every probe
    // partition (CollectLeft) rather than hash-partitioning both sides: repartitioning the 60M
    // rows of a fact table cost more than building the table on one thread (SSB q3.1: the
    // customer join took the partitioned path at DataFusion's 1 MB / 128K-row default).
    optimizer.hash_join_single_partition_threshold = 256 << 20;
    optimizer.hash_join_single_partition_threshold_rows = 4 << 20;
    // A join's key set reaches the storage nodes only as an IN list (a hash table lookup cannot
    // travel in a fragment); DataFusion's 150 keys leave TPC-H Q21's 4K Saudi suppliers as
    // bounds that span the whole key range. The page reader looks larger lists up in a bitmap.
    optimizer.hash_join_inlist_pushdown_max_distinct_values = 16 << 10;
    optimizer.hash_join_inlist_pushdown_max_size = 1 << 20;
}

/// DataFusion's analyzer rules, with Quarry's decimal division before type coercion.
fn analyzer_rules() -> Vec<Arc<dyn AnalyzerRule + Send + Sync>> {
    let mut rules = Analyzer::new().rules;
    let at = rules.iter().position(|r| r.name() == DecimalDivisionRule::BEFORE).unwrap_or(0);
    rules.insert(at, Arc::new(DecimalDivisionRule));
    rules
}

/// DataFusion options set by environment variables, DataFusion's own convention
/// (`DATAFUSION_OPTIMIZER_PREFER_HASH_JOIN=false` sets `datafusion.optimizer.prefer_hash_join`),
/// over Quarry's tuning: how a user or an experiment changes a knob without a rebuild.
fn apply_environment(config: &mut SessionConfig) -> Result<()> {
    for entry in config.options().entries() {
        let variable = entry.key.to_uppercase().replace('.', "_");
        if let Some(value) = std::env::var_os(&variable) {
            let value = value.to_string_lossy();
            config.options_mut().set(&entry.key, &value).map_err(|e| DataFusionError::Configuration(format!("environment variable {variable}={value}: {e}")))?;
        }
    }
    Ok(())
}

/// A SQL session over storage nodes.
pub struct QuarrySession {
    ctx: SessionContext,
    nodes: Vec<Arc<dyn StorageNode>>,
    /// The host's power figures, for energy accounting.
    host_power: HostPower,
    /// Each node's power figures (its profile's), by node name.
    device_power: BTreeMap<String, Option<DevicePower>>,
}

/// A collected query result.
#[derive(Debug)]
pub struct QueryResult {
    /// Result schema.
    pub schema: SchemaRef,
    /// Result rows.
    pub batches: Vec<arrow::array::RecordBatch>,
    /// Accounting.
    pub stats: QueryStats,
}

impl QuarrySession {
    /// A session over the tables of `nodes` (a table may be spread over several).
    pub async fn try_new(nodes: Vec<Arc<dyn StorageNode>>, options: EngineOptions) -> Result<Self> {
        if nodes.is_empty() {
            return plan_err!("a session needs at least one storage node");
        }
        let mut config = SessionConfig::new()
            .with_target_partitions(options.threads.max(1))
            .with_information_schema(true)
            .with_default_catalog_and_schema("quarry", "main");
        tune_host(&mut config);
        apply_environment(&mut config)?;
        if let Some(limit) = options.memory_limit {
            // A sort holds back this much for merging its spilled runs; DataFusion's 10 MB would
            // leave a small budget nothing to sort with.
            let execution = &mut config.options_mut().execution;
            execution.sort_spill_reservation_bytes = execution.sort_spill_reservation_bytes.min(limit / 8);
        }
        let mut builder = SessionStateBuilder::new().with_config(config).with_default_features().with_analyzer_rules(analyzer_rules());
        if let Some(limit) = options.memory_limit {
            // Fair shares among the operators that can spill; the top consumers are named when
            // the budget runs out.
            let pool = TrackConsumersPool::new(FairSpillPool::new(limit), NonZeroUsize::new(3).expect("3 > 0"));
            builder = builder.with_runtime_env(RuntimeEnvBuilder::new().with_memory_pool(Arc::new(pool)).build_arc()?);
        }
        let builder = builder
            // Grouping sets over pre-aggregated rows first: the plain aggregate it adds below
            // them is ordered, and may become a star join, like any other.
            .with_optimizer_rule(Arc::new(GroupingSetRule))
            // Outer joins a join above makes inner, before the rules that order inner joins.
            .with_optimizer_rule(Arc::new(NullRejectingKeysRule))
            // The magic-set rule next: the semi joins it adds are placed by join ordering.
            .with_optimizer_rule(Arc::new(MagicSetRule))
            .with_optimizer_rule(Arc::new(JoinOrderRule));
        let state = if options.star_join { with_star_joins(builder) } else { builder }.build();
        let mut descriptions = Vec::with_capacity(nodes.len());
        for node in &nodes {
            // Placement knows a node by the name the host uses for it.
            let mut description = node.describe().await?;
            description.name = node.name().to_string();
            descriptions.push(description);
        }
        let device_power = descriptions.iter().map(|d| (d.name.clone(), d.profile.power.clone())).collect();
        let in_process: HashSet<String> = nodes.iter().filter(|n| n.in_process()).map(|n| n.name().to_string()).collect();
        // The host's own rates; a node in this process measured them on this machine.
        let host_rates = options
            .host_rates
            .clone()
            .or_else(|| descriptions.iter().find(|d| in_process.contains(&d.name)).map(|d| d.calibration.clone()))
            .unwrap_or_default();
        let host_power = options.host_power.clone();
        let placement =
            PlacementRule::new(options.pushdown, descriptions, in_process, host_rates, options.threads).with_objective(options.objective, host_power.clone());
        // Placement runs first, on the plan as the planner built it (partial aggregates directly
        // above their inputs, before DataFusion adds repartitioning and coalescing).
        // Conjunct order before that: a pushed filter carries its order to the node.
        // Filter estimates first: placement and DataFusion's join selection read them.
        let mut rules: Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> = vec![Arc::new(FilterEstimateRule), Arc::new(ConjunctOrderRule), Arc::new(placement)];
        rules.extend(state.physical_optimizers().iter().cloned());
        // Key sets once the join modes are chosen, before DataFusion hands the joins' dynamic
        // filters down (which sees the key set collectors in place).
        let post_pushdown = rules.iter().position(|r| r.name() == "FilterPushdown(Post)").unwrap_or(rules.len());
        rules.insert(post_pushdown, Arc::new(KeySetRule));
        // Single-step aggregates where partitions hold disjoint keys: after DataFusion's
        // distribution checks, which know only hash partitioning.
        rules.push(Arc::new(KeyedAggregateRule));
        // Decimal arithmetic in 64 bits, on the host's operators (after placement: what goes to
        // a node is DataFusion's own plan).
        rules.push(Arc::new(DecimalArithRule));
        // Aggregates ordered only by constant keys as plain hash aggregates, once no rule adds
        // an aggregate or changes an input's order (before the few-groups rule, which takes
        // unordered partial aggregates only).
        rules.push(Arc::new(ConstantKeysRule));
        // Partial aggregates over few groups, after the decimal rewrite whose expressions they
        // take over.
        rules.push(Arc::new(SmallGroupAggregateRule));
        // Running aggregates of windows, once DataFusion has placed the sorts they read.
        rules.push(Arc::new(RunningWindowRule));
        // Yield and stop points in nested-loop and cross joins, so that a cancelled query
        // stops within a batch (before shared subplans, which may hold such a join).
        rules.push(Arc::new(ProbeYieldRule));
        // Shared subplans last, on the finished plan: nothing may rewrite one occurrence after.
        rules.push(Arc::new(SharedSubplanRule));
        let state = SessionStateBuilder::new_from_existing(state).with_physical_optimizer_rules(rules).build();
        let session = QuarrySession { ctx: SessionContext::new_with_state(state), nodes, host_power, device_power };
        session.refresh_tables().await?;
        Ok(session)
    }

    /// A session of its own over the same nodes, planner rules and memory pool: its settings
    /// and views are its own (each client of a server gets one), and it sees the tables as they
    /// are now.
    pub async fn fork(&self) -> Result<QuarrySession> {
        let catalogs = Arc::new(MemoryCatalogProviderList::new());
        catalogs.register_catalog("quarry".into(), Arc::new(MemoryCatalogProvider::new()));
        let state = SessionStateBuilder::new_from_existing(self.ctx.state()).with_catalog_list(catalogs).build();
        let session = QuarrySession {
            ctx: SessionContext::new_with_state(state),
            nodes: self.nodes.clone(),
            host_power: self.host_power.clone(),
            device_power: self.device_power.clone(),
        };
        session.refresh_tables().await?;
        Ok(session)
    }

    /// Re-reads the node's table list (tables loaded since the session started become visible).
    pub async fn refresh_tables(&self) -> Result<()> {
        let schema = NodeSchemaProvider::try_new(self.nodes.clone()).await?;
        let catalog = self.ctx.catalog("quarry").ok_or_else(|| DataFusionError::Internal("catalog 'quarry' missing".into()))?;
        catalog.register_schema("main", Arc::new(schema))?;
        Ok(())
    }

    /// The DataFusion context (for embedding and tests).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Splits SQL text into statements; syntax errors carry line and column.
    pub fn parse(&self, sql: &str) -> Result<Vec<Statement>> {
        let dialect = self.ctx.state().config().options().sql_parser.dialect;
        let dialect = dialect_from_str(dialect.as_ref()).unwrap_or_else(|| Box::new(GenericDialect {}));
        let statements = DFParser::parse_sql_with_dialect(sql, dialect.as_ref()).map_err(|e| with_end_position(e, sql))?;
        if statements.is_empty() {
            return plan_err!("no SQL statement given");
        }
        Ok(statements.into_iter().collect())
    }

    /// Runs one statement, streaming its rows into `sink`.
    pub async fn execute<'a>(
        &self,
        statement: Statement,
        sink_for: impl FnOnce(&SchemaRef) -> Result<Box<dyn ResultSink + 'a>>,
    ) -> Result<QueryStats> {
        self.execute_watched(statement, sink_for, |_| ()).await
    }

    /// [`Self::execute`], handing `watch` the query's progress as it starts to run.
    pub async fn execute_watched<'a>(
        &self,
        statement: Statement,
        sink_for: impl FnOnce(&SchemaRef) -> Result<Box<dyn ResultSink + 'a>>,
        watch: impl FnOnce(QueryProgress),
    ) -> Result<QueryStats> {
        let started = Instant::now();
        let state = self.ctx.state();
        let plan = state.statement_to_plan(statement).await?;
        check_read_only(&plan)?;
        let df = self.ctx.execute_logical_plan(plan).await?;
        let physical = df.create_physical_plan().await?;
        let plan_ms = started.elapsed().as_secs_f64() * 1e3;
        let schema = physical.schema();
        let mut sink = sink_for(&schema)?;
        watch(QueryProgress::of(&physical));
        let mut stream = execute_stream(Arc::clone(&physical), self.ctx.task_ctx())?;
        let mut rows = 0u64;
        // EXPLAIN ANALYZE's one batch comes after the query ran: it is held back to append the
        // query's energy, which needs the finished metrics.
        let analyze = physical.is::<AnalyzeExec>();
        let mut held = Vec::new();
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            rows += batch.num_rows() as u64;
            if analyze { held.push(batch) } else { sink.write_batch(&batch)? }
        }
        let mut stats = QueryStats::from_plan(&physical, started.elapsed().as_secs_f64() * 1e3, rows);
        stats.plan_ms = plan_ms;
        stats.estimate_energy(&self.host_power, &self.device_power);
        if analyze {
            if let Some(energy) = &stats.energy {
                held.push(energy_row(&schema, energy)?);
            }
            for batch in &held {
                sink.write_batch(batch)?;
            }
        }
        sink.finish()?;
        Ok(stats)
    }

    /// The plan of SQL text of exactly one statement, which must be a query (or a setting, or a
    /// view), its parameters (`$1`, `?`) not yet bound.
    pub async fn plan(&self, sql: &str) -> Result<LogicalPlan> {
        let mut statements = self.parse(sql)?;
        if statements.len() != 1 {
            return plan_err!("expected one SQL statement, found {}", statements.len());
        }
        let plan = self.ctx.state().statement_to_plan(statements.remove(0)).await?;
        check_read_only(&plan)?;
        Ok(plan)
    }

    /// Runs `plan` (from [`Self::plan`], parameters bound), its rows as a stream.
    pub async fn stream(&self, plan: LogicalPlan) -> Result<SendableRecordBatchStream> {
        self.stream_until_stopped(plan, Arc::new(QueryStop::default())).await
    }

    /// [`Self::stream`], ending with an error soon after `stop` is set, even inside an operator
    /// that computes long between yields.
    pub async fn stream_until_stopped(&self, plan: LogicalPlan, stop: Arc<QueryStop>) -> Result<SendableRecordBatchStream> {
        check_read_only(&plan)?;
        let (mut state, plan) = self.ctx.execute_logical_plan(plan).await?.into_parts();
        state.config_mut().set_extension(stop);
        DataFrame::new(state, plan).execute_stream().await
    }

    /// Runs SQL text of exactly one statement and collects the result.
    pub async fn query(&self, sql: &str) -> Result<QueryResult> {
        let mut statements = self.parse(sql)?;
        if statements.len() != 1 {
            return plan_err!("expected one SQL statement, found {}", statements.len());
        }
        let mut schema = None;
        let mut batches = Vec::new();
        let stats = {
            let collected = &mut batches;
            let schema_out = &mut schema;
            self.execute(statements.remove(0), move |s| {
                *schema_out = Some(Arc::clone(s));
                Ok(Box::new(BorrowedCollect { batches: collected }))
            })
            .await?
        };
        Ok(QueryResult { schema: schema.expect("sink created"), batches, stats })
    }
}

struct BorrowedCollect<'a> {
    batches: &'a mut Vec<arrow::array::RecordBatch>,
}

impl ResultSink for BorrowedCollect<'_> {
    fn write_batch(&mut self, batch: &arrow::array::RecordBatch) -> Result<()> {
        self.batches.push(batch.clone());
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

/// EXPLAIN ANALYZE's last row: the query's energy by component.
fn energy_row(schema: &SchemaRef, energy: &Energy) -> Result<RecordBatch> {
    let mut text = energy.summary();
    for component in COMPONENTS {
        text.push_str(&format!("\n  {component}: {}", joules(energy.energy_by_component[component])));
    }
    let columns: Vec<ArrayRef> = match schema.fields().len() {
        2 => vec![Arc::new(StringArray::from(vec!["Query energy"])), Arc::new(StringArray::from(vec![text]))],
        n => return datafusion::common::internal_err!("EXPLAIN ANALYZE returned {n} columns, expected 2"),
    };
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Tables are created by `quarry load` / `quarry gen`, which commit atomically to the warehouse;
/// SQL that would create or change state only in this process's memory is refused rather than
/// silently lost.
fn check_read_only(plan: &LogicalPlan) -> Result<()> {
    let options = SQLOptions::new().with_allow_ddl(false).with_allow_dml(false).with_allow_statements(false);
    match plan {
        LogicalPlan::Ddl(DdlStatement::CreateView(_)) | LogicalPlan::Ddl(DdlStatement::DropView(_)) => Ok(()),
        // Session settings (`SET datafusion.explain.show_statistics = true`) live as long as
        // the session, as the user expects of them.
        LogicalPlan::Statement(datafusion::logical_expr::Statement::SetVariable(_) | datafusion::logical_expr::Statement::ResetVariable(_)) => Ok(()),
        _ => options.verify_plan(plan).map_err(|_| {
            DataFusionError::Plan(format!(
                "only queries are supported in SQL ({} is not); load tables with 'quarry load' or 'quarry gen'",
                plan.display()
            ))
        }),
    }
}

/// The parser reports a position only when it stopped at a token; at the end of the input it
/// does not, so add the position of the end.
fn with_end_position(error: DataFusionError, sql: &str) -> DataFusionError {
    match error {
        DataFusionError::SQL(e, backtrace) if !e.to_string().contains("Line:") => {
            let line = sql.trim_end().lines().count().max(1);
            let column = sql.trim_end().lines().last().map_or(0, |l| l.chars().count()) + 1;
            let message = format!("{} at end of input, Line: {line}, Column: {column}", e.to_string().trim_start_matches("sql parser error: "));
            DataFusionError::SQL(Box::new(datafusion::sql::sqlparser::parser::ParserError::ParserError(message)), backtrace)
        }
        other => other,
    }
}

/// A one-line message for the user: the error's own words, without DataFusion's internal
/// wrapping, with the position for syntax errors.
pub fn user_message(error: &DataFusionError) -> String {
    let message = quarry_storage::verified_store::damage_message(error)
        .or_else(|| storage_node_message(error))
        .unwrap_or_else(|| raw_message(error));
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The words of a failed read from a storage node (passthrough, `stored_scan.rs`), which name
/// the node, if that is what `error` carries under the Parquet reader's and object store's
/// wrapping.
fn storage_node_message(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(object_store::Error::Generic { store: crate::stored_scan::STORE_NAME, source }) = e.downcast_ref::<object_store::Error>() {
            return Some(match source.downcast_ref::<DataFusionError>() {
                Some(inner) => raw_message(inner),
                None => source.to_string(),
            });
        }
        current = e.source();
    }
    None
}

fn raw_message(error: &DataFusionError) -> String {
    match error {
        DataFusionError::SQL(e, _) => format!("SQL syntax error: {}", e.to_string().trim_start_matches("sql parser error: ")),
        DataFusionError::Context(_, inner) | DataFusionError::Diagnostic(_, inner) => raw_message(inner),
        DataFusionError::Shared(inner) => raw_message(inner),
        DataFusionError::External(e) => match e.downcast_ref::<DataFusionError>() {
            Some(inner) => raw_message(inner),
            None => e.to_string(),
        },
        DataFusionError::Collection(errors) if !errors.is_empty() => raw_message(&errors[0]),
        DataFusionError::Plan(m) | DataFusionError::Execution(m) | DataFusionError::NotImplemented(m) => m.trim().to_string(),
        // DataFusion reports some user errors (e.g. an aggregate over an unsupported type) as
        // internal ones; its message is what helps, not the request to file a bug.
        DataFusionError::Internal(m) => m.trim().to_string(),
        DataFusionError::ResourcesExhausted(m) => format!("the query needs more memory than the host's budget (--memory): {}", m.trim()),
        other => other.message().trim().to_string(),
    }
}
