//! `StarAggregateExec`: the host's half of the star join (see `quarry_storage::star`).
//!
//! It builds the dimensions (assembling the keys, group codes and group values of each
//! dimension's `StarDimensionExec`, which runs on the host or on the node holding the
//! dimension), fills the tables of the fact side's
//! [`StarProbeExec`] (on the host, or inside a fragment the placement rule moved it into, which
//! takes them along when it is sent), runs the fact side's partitions, merges their partial
//! aggregates and turns group ids back into the dimensions' attribute values. A dimension key
//! that appears twice would make the star join drop a match: the query then runs its original
//! plan (the fallback) instead.

use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result, Statistics, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ChildStats, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream, StatisticsArgs, collect};
use futures::{StreamExt, TryStreamExt};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use quarry_storage::star::{Assembled, Built, GroupedStates, KeyLookup, StarDimension, StarProbeExec, StarSpec, StarTables, TablesCell, assemble};
use quarry_storage::zones::ProbeKeys;

use crate::scan::{FragmentExec, leaves};

/// A dimension as planned: a `StarDimensionExec` (on the host, or inside the fragment the
/// placement rule moved it into), its key as EXPLAIN names it, and the position of each of its
/// grouped expressions among the aggregate's groups.
#[derive(Debug, Clone)]
pub struct StarDimensionPlan {
    pub plan: Arc<dyn ExecutionPlan>,
    pub key: String,
    pub positions: Vec<usize>,
    /// Where the same dimension plan occurs in several star joins of a query, the one build
    /// they all use (see [`crate::shared_subplan`]).
    pub shared: Option<DimensionCell>,
}

/// A dimension built once for every star join of a query that names it: `None` inside when
/// its keys repeat (each star join then runs its fallback).
pub type DimensionCell = Arc<tokio::sync::OnceCell<Option<Arc<AssembledDimension>>>>;

/// A dimension built: its lookup and, per grouped expression (in the order of the plan's
/// `positions`), its values by group code.
#[derive(Debug)]
pub struct AssembledDimension {
    dimension: StarDimension,
    values: Vec<ArrayRef>,
}

/// See the module docs. Children: the fact side, the dimensions, the fallback.
#[derive(Debug)]
pub struct StarAggregateExec {
    probe: Arc<dyn ExecutionPlan>,
    spec: Arc<StarSpec>,
    tables: TablesCell,
    dims: Vec<StarDimensionPlan>,
    /// Per dimension, the estimated distinct values of the fact's foreign key (for the share of
    /// fact rows that find a partner, which orders the probes).
    fact_distinct: Vec<f64>,
    group_count: usize,
    fallback: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StarAggregateExec {
    /// The star join of `probe` (a [`StarProbeExec`]) with `dims`, producing the schema of
    /// `fallback` (the original aggregate), whose first `group_count` columns are the groups.
    pub fn try_new(probe: Arc<StarProbeExec>, dims: Vec<StarDimensionPlan>, fact_distinct: Vec<f64>, group_count: usize, fallback: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let (spec, tables) = (Arc::clone(probe.spec()), Arc::clone(probe.tables_cell()));
        Self::assemble(probe, spec, tables, dims, fact_distinct, group_count, fallback)
    }

    /// The original aggregate, run instead when a dimension's keys turn out not unique.
    pub fn fallback(&self) -> &Arc<dyn ExecutionPlan> {
        &self.fallback
    }

    pub fn dimensions(&self) -> &[StarDimensionPlan] {
        &self.dims
    }

    /// The same star join, its dimensions built into `cells` where given (one per dimension).
    pub fn with_shared_dimensions(&self, cells: Vec<Option<DimensionCell>>) -> Result<Self> {
        if cells.len() != self.dims.len() {
            return internal_err!("StarAggregateExec: {} shared cells for {} dimensions", cells.len(), self.dims.len());
        }
        let dims = self.dims.iter().zip(cells).map(|(d, shared)| StarDimensionPlan { shared, ..d.clone() }).collect();
        Self::assemble(Arc::clone(&self.probe), Arc::clone(&self.spec), Arc::clone(&self.tables), dims, self.fact_distinct.clone(), self.group_count, Arc::clone(&self.fallback))
    }

    fn assemble(probe: Arc<dyn ExecutionPlan>, spec: Arc<StarSpec>, tables: TablesCell, dims: Vec<StarDimensionPlan>, fact_distinct: Vec<f64>, group_count: usize, fallback: Arc<dyn ExecutionPlan>) -> Result<Self> {
        if dims.len() != spec.keys.len() || fact_distinct.len() != dims.len() {
            return internal_err!("StarAggregateExec: {} dimensions for {} keys", dims.len(), spec.keys.len());
        }
        let schema = fallback.schema();
        let properties = PlanProperties::new(EquivalenceProperties::new(schema), Partitioning::UnknownPartitioning(1), EmissionType::Final, Boundedness::Bounded);
        Ok(StarAggregateExec { probe, spec, tables, dims, fact_distinct, group_count, fallback, properties: Arc::new(properties), metrics: ExecutionPlanMetricsSet::new() })
    }
}

impl DisplayAs for StarAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "StarAggregateExec: dimensions={}, keys=[{}]", self.dims.len(), self.dims.iter().map(|d| d.key.as_str()).collect::<Vec<_>>().join(", "))?;
        let shared: Vec<&str> = self.dims.iter().filter(|d| d.shared.is_some()).map(|d| d.key.as_str()).collect();
        if !shared.is_empty() {
            write!(f, ", built once for the query's star joins: [{}]", shared.join(", "))?;
        }
        if let Some(tables) = self.tables.get() {
            write!(f, ", probe order={:?}", tables.order)?;
        }
        write!(f, ", fallback: ordinary joins if a dimension key repeats")
    }
}

impl ExecutionPlan for StarAggregateExec {
    fn name(&self) -> &str {
        "StarAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        std::iter::once(&self.probe).chain(self.dims.iter().map(|d| &d.plan)).chain(std::iter::once(&self.fallback)).collect()
    }

    /// Its expressions are its children's: the dimensions' own, the probe's, the fallback's.
    fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn datafusion::physical_expr::PhysicalExpr>) -> Result<datafusion::common::tree_node::TreeNodeRecursion>) -> Result<datafusion::common::tree_node::TreeNodeRecursion> {
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != self.dims.len() + 2 {
            return internal_err!("StarAggregateExec has {} children", self.dims.len() + 2);
        }
        let fallback = children.pop().expect("checked");
        let probe = children.remove(0);
        let dims = self.dims.iter().zip(children).map(|(d, plan)| StarDimensionPlan { plan, ..d.clone() }).collect();
        Ok(Arc::new(Self::assemble(probe, Arc::clone(&self.spec), Arc::clone(&self.tables), dims, self.fact_distinct.clone(), self.group_count, fallback)?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("StarAggregateExec has one partition, asked for {partition}");
        }
        let run = Run {
            probe: Arc::clone(&self.probe),
            spec: Arc::clone(&self.spec),
            tables: Arc::clone(&self.tables),
            dims: self.dims.clone(),
            fact_distinct: self.fact_distinct.clone(),
            group_count: self.group_count,
            fallback: Arc::clone(&self.fallback),
            schema: self.schema(),
            build_time: MetricBuilder::new(&self.metrics).subset_time("build_time", 0),
            probe_time: MetricBuilder::new(&self.metrics).subset_time("probe_time", 0),
            output_rows: MetricBuilder::new(&self.metrics).output_rows(0),
            fallbacks: MetricBuilder::new(&self.metrics).counter("fallbacks", 0),
        };
        let schema = self.schema();
        let stream = futures::stream::once(run.run(context)).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// Its output is its fallback's (the aggregate it replaces), in one partition.
    fn child_stats_requests(&self, _partition: Option<usize>) -> Vec<ChildStats> {
        let mut requests = vec![ChildStats::Skip; self.dims.len() + 1];
        requests.push(ChildStats::At(None));
        requests
    }

    fn statistics_from_inputs(&self, input_stats: &[Arc<Statistics>], _args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        match input_stats.last() {
            Some(fallback) if input_stats.len() == self.dims.len() + 2 => Ok(Arc::clone(fallback)),
            _ => internal_err!("StarAggregateExec has {} children", self.dims.len() + 2),
        }
    }
}

/// One execution.
struct Run {
    probe: Arc<dyn ExecutionPlan>,
    spec: Arc<StarSpec>,
    tables: TablesCell,
    dims: Vec<StarDimensionPlan>,
    fact_distinct: Vec<f64>,
    group_count: usize,
    fallback: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    build_time: Time,
    probe_time: Time,
    output_rows: Count,
    fallbacks: Count,
}

impl Run {
    async fn run(self, context: Arc<TaskContext>) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        let timer = self.build_time.timer();
        let builds = build_dimensions(&self.dims, &context).await?;
        let mut built = Vec::with_capacity(self.dims.len());
        for build in builds {
            match build {
                Some(b) => built.push(b),
                None => {
                    self.fallbacks.add(1);
                    // The optimizer may have merged away the coalescing put above it.
                    let fallback = if self.fallback.output_partitioning().partition_count() > 1 { Arc::new(CoalescePartitionsExec::new(Arc::clone(&self.fallback))) as Arc<dyn ExecutionPlan> } else { Arc::clone(&self.fallback) };
                    return Ok(fallback.execute(0, context)?.boxed());
                }
            }
        }
        timer.done();
        // Probe the dimensions that keep the fewest fact rows first.
        let pass: Vec<f64> = built.iter().zip(&self.fact_distinct).map(|(b, &distinct)| b.dimension.lookup.len() as f64 / distinct.max(1.0)).collect();
        let mut order: Vec<usize> = (0..built.len()).collect();
        order.sort_by(|&a, &b| pass[a].total_cmp(&pass[b]));
        let tables = Arc::new(StarTables { dims: built.iter().map(|b| b.dimension.clone()).collect(), order });
        let tables = Arc::clone(self.tables.get_or_init(|| tables));
        choose_probe_copies(&self.probe, &tables)?;

        let timer = self.probe_time.timer();
        let funcs = self.spec.aggregates.iter().map(|a| (a.func, a.domain)).collect::<Vec<_>>();
        let mut states = GroupedStates::new(funcs.clone(), tables.domain());
        let mut partials = partitions_in_parallel(&self.probe, &context)?;
        while let Some(partial) = partials.next().await {
            states.merge(&partial?)?;
        }
        timer.done();
        let batch = self.finish(&states, &tables, &built, &funcs)?;
        self.output_rows.add(batch.num_rows());
        Ok(futures::stream::iter([Ok(batch)]).boxed())
    }

    /// The output: group values decoded from the group ids, then the aggregates.
    fn finish(&self, states: &GroupedStates, tables: &StarTables, built: &[Arc<AssembledDimension>], funcs: &[(quarry_storage::star::AggFunc, quarry_storage::star::Domain)]) -> Result<RecordBatch> {
        let outputs: Vec<_> = self.schema.fields().iter().skip(self.group_count).map(|f| f.data_type().clone()).collect();
        let groups = states.groups();
        if groups.is_empty() && self.group_count == 0 {
            return Ok(RecordBatch::try_new(Arc::clone(&self.schema), GroupedStates::empty_row(funcs, &outputs))?);
        }
        let strides = tables.strides();
        let mut columns: Vec<Option<ArrayRef>> = vec![None; self.group_count];
        for (d, dimension) in built.iter().enumerate() {
            let codes = UInt32Array::from_iter_values(groups.iter().map(|(gid, _)| ((gid / strides[d]) % tables.dims[d].groups as u64) as u32));
            for (&position, values) in self.dims[d].positions.iter().zip(&dimension.values) {
                columns[position] = Some(arrow::compute::take(values.as_ref(), &codes, None)?);
            }
        }
        let slots: Vec<usize> = groups.iter().map(|(_, s)| *s).collect();
        let mut arrays: Vec<ArrayRef> = columns.into_iter().map(|c| c.ok_or_else(|| DataFusionError::Internal("a group no dimension computes".into()))).collect::<Result<_>>()?;
        for (a, output) in outputs.iter().enumerate() {
            arrays.push(states.finish(a, &slots, output)?);
        }
        // Group values are computed as their expressions type them; the aggregate's schema
        // may differ in nullability only.
        let arrays = arrays.iter().zip(self.schema.fields()).map(|(a, f)| if a.data_type() == f.data_type() { Ok(Arc::clone(a)) } else { arrow::compute::cast(a, f.data_type()) }).collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), arrays)?)
    }
}

/// Every output partition of `plan`, each run in a task of its own (DataFusion's coalescing
/// spawns them), their batches as they come.
/// Polled together in the caller's task, a star probe left on the host ran on one core: SSB SF 10
/// under kim-isp-2015 with `--pushdown off` took 1.75x as long (q4.1 6.1 s against 3.4 s;
/// docs/benchmarks/star-probe).
fn partitions_in_parallel(plan: &Arc<dyn ExecutionPlan>, context: &Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
    CoalescePartitionsExec::new(Arc::clone(plan)).execute(0, Arc::clone(context))
}

/// Each fragment of `plan` that runs the star probe on a node over a table with sorted copies
/// reads the copy from which the row groups holding its dimensions' kept keys take the fewest
/// bytes (the node skips the others by their zone maps; see [`crate::sorted_copies`]).
fn choose_probe_copies(plan: &Arc<dyn ExecutionPlan>, tables: &StarTables) -> Result<()> {
    plan.apply(|node| {
        if let Some(fragment) = node.downcast_ref::<FragmentExec>()
            && let Some(planned) = fragment.copy()
            && let Some(probe) = star_probe_in(fragment.root())
            && let [leaf] = leaves(fragment.root()).as_slice()
        {
            let schema = probe.input().schema();
            let choice = planned.copies.cheapest_for_probe(&leaf.leaf().projection, ProbeKeys::new(probe.spec(), tables, &schema));
            fragment.choose_copy_at_run_time(choice)?;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}

/// The star probe in a fragment's node-side plan.
fn star_probe_in(root: &Arc<dyn ExecutionPlan>) -> Option<&StarProbeExec> {
    let mut plan = root;
    loop {
        if let Some(probe) = plan.downcast_ref::<StarProbeExec>() {
            return Some(probe);
        }
        plan = plan.children().into_iter().next()?;
    }
}

/// Every dimension, built at once: each waits on its own scan (TPC-DS q20 read `item`, then
/// `date_dim`: 11.5 ms of build before the probe could start, 9 ms at once).
async fn build_dimensions(dims: &[StarDimensionPlan], context: &Arc<TaskContext>) -> Result<Vec<Option<Arc<AssembledDimension>>>> {
    futures::future::try_join_all(dims.iter().map(|dim| build_dimension(dim, Arc::clone(context)))).await
}

/// The dimension for this star join, built here or (shared) by the first star join to ask;
/// `None` if a key repeats.
async fn build_dimension(dim: &StarDimensionPlan, context: Arc<TaskContext>) -> Result<Option<Arc<AssembledDimension>>> {
    match &dim.shared {
        Some(cell) => Ok(cell.get_or_try_init(|| assemble_dimension(dim, context)).await?.clone()),
        None => assemble_dimension(dim, context).await,
    }
}

/// Builds a dimension from its pieces; `None` if a key repeats.
async fn assemble_dimension(dim: &StarDimensionPlan, context: Arc<TaskContext>) -> Result<Option<Arc<AssembledDimension>>> {
    let pieces = collect(Arc::clone(&dim.plan), context).await?;
    let (keys, codes, values, groups) = match assemble(&pieces, dim.positions.len())? {
        Assembled::Rows { keys, codes, values, groups } => (keys, codes, values, groups),
        Assembled::Duplicate(_) => return Ok(None),
    };
    let lookup = match KeyLookup::build(&keys, &codes)? {
        Built::Unique(lookup) => lookup,
        Built::Duplicate(_) => return Ok(None),
    };
    Ok(Some(Arc::new(AssembledDimension { dimension: StarDimension { lookup, groups }, values })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
    use std::sync::Mutex;
    use std::sync::mpsc::{Receiver, Sender, channel};
    use std::time::Duration;

    /// A partition that, in its first poll, tells the other it started and blocks its thread
    /// until the other says the same: it ends with a row only if both run at once.
    #[derive(Debug)]
    struct Rendezvous {
        schema: SchemaRef,
        tell: Sender<()>,
        hear: Mutex<Option<Receiver<()>>>,
    }

    impl PartitionStream for Rendezvous {
        fn schema(&self) -> &SchemaRef {
            &self.schema
        }

        fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
            let (tell, hear) = (self.tell.clone(), self.hear.lock().unwrap().take().expect("executed once"));
            let schema = Arc::clone(&self.schema);
            let batch = futures::stream::once(async move {
                tell.send(()).expect("the other partition listens");
                hear.recv_timeout(Duration::from_secs(5)).map_err(|_| DataFusionError::Execution("the other partition never ran".into()))?;
                Ok(RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from(vec![1]))])?)
            });
            Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), batch))
        }
    }

    /// A dimension's rows (key, name), yielded only once the other dimension's input has
    /// started too.
    #[derive(Debug)]
    struct Gated {
        schema: SchemaRef,
        key: i64,
        both_started: Arc<tokio::sync::Barrier>,
    }

    impl PartitionStream for Gated {
        fn schema(&self) -> &SchemaRef {
            &self.schema
        }

        fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
            let (schema, both_started, key) = (Arc::clone(&self.schema), Arc::clone(&self.both_started), self.key);
            let batch = futures::stream::once(async move {
                tokio::time::timeout(Duration::from_secs(5), both_started.wait()).await.map_err(|_| DataFusionError::Execution("the other dimension was not being built".into()))?;
                Ok(RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from(vec![key])), Arc::new(arrow::array::StringArray::from(vec!["g"]))])?)
            });
            Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), batch))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dimensions_are_built_at_once() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false), Field::new("name", DataType::Utf8, false)]));
        let both_started = Arc::new(tokio::sync::Barrier::new(2));
        let dims: Vec<StarDimensionPlan> = [1, 2]
            .into_iter()
            .map(|key| {
                let gated: Arc<dyn PartitionStream> = Arc::new(Gated { schema: Arc::clone(&schema), key, both_started: Arc::clone(&both_started) });
                let input = Arc::new(StreamingTableExec::try_new(Arc::clone(&schema), vec![gated], None, Vec::new(), false, None).unwrap());
                let plan = quarry_storage::star::StarDimensionExec::try_new(input, Arc::new(datafusion::physical_expr::expressions::Column::new("k", 0)), vec![Arc::new(datafusion::physical_expr::expressions::Column::new("name", 1))]).unwrap();
                StarDimensionPlan { plan: Arc::new(plan), key: "k".into(), positions: vec![0], shared: None }
            })
            .collect();
        let built = build_dimensions(&dims, &Arc::new(TaskContext::default())).await.unwrap();
        assert!(built.iter().all(|b| b.as_ref().is_some_and(|b| b.dimension.lookup.len() == 1)), "both dimensions built, one key each");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probe_partitions_run_at_once() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let (to_a, from_b) = channel();
        let (to_b, from_a) = channel();
        let partitions: Vec<Arc<dyn PartitionStream>> = vec![
            Arc::new(Rendezvous { schema: Arc::clone(&schema), tell: to_b, hear: Mutex::new(Some(from_b)) }),
            Arc::new(Rendezvous { schema: Arc::clone(&schema), tell: to_a, hear: Mutex::new(Some(from_a)) }),
        ];
        let plan: Arc<dyn ExecutionPlan> = Arc::new(StreamingTableExec::try_new(Arc::clone(&schema), partitions, None, Vec::new(), false, None).unwrap());
        let batches: Vec<RecordBatch> = partitions_in_parallel(&plan, &Arc::new(TaskContext::default())).unwrap().try_collect().await.unwrap();
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
    }
}
