//! Common subplan reuse: a physical optimizer rule and the operator it adds.
//!
//! DataFusion copies a view or CTE into every place that names it, so TPC-H Q15 computes its
//! revenue view (a scan and aggregation of a quarter of `lineitem`) twice: once to join it to
//! `supplier`, once for its `max`. This rule, run after all the others, finds aggregates
//! (grouped, final) over storage fragments that occur more than once in the finished plan with
//! the same text, and replaces each occurrence by a [`SharedExec`] over one instance: the first
//! execution of any of them runs it once, keeps its output partitions in memory (reserved from
//! the session's memory pool), and every occurrence reads them from there.
//!
//! The same text means the same computation with one exception: a dynamic filter (a hash
//! join's key set, pushed into its probe side) filled by a join above that occurrence differs
//! between occurrences, so a subplan that reads one is never shared. One filled by a join inside
//! the subplan is part of its computation (TPC-DS q23's CTEs join `store_sales` to `date_dim`
//! and `customer`, and are named by both branches of a UNION: not sharing them scanned
//! `store_sales` six times). An aggregate's output is usually small beside its input; it is what
//! DuckDB materializes for a CTE as well.
//!
//! A star join's dimension is shared the same way, by the text of its plan: the star joins
//! that name it build it once and each looks its fact rows up in the one result (TPC-DS q04's
//! six star joins, one per channel and year, all grouped by the same `customer` columns).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, internal_err};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PhysicalExpr, PlanProperties, SendableRecordBatchStream, displayable, replace_children_if_necessary,
};
use futures::{StreamExt, TryStreamExt};
use quarry_storage::batch_wire_bytes;

use crate::scan::FragmentExec;
use crate::star_exec::{DimensionCell, StarAggregateExec};

/// The rule (see the module docs).
#[derive(Debug, Default)]
pub struct SharedSubplanRule;

impl PhysicalOptimizerRule for SharedSubplanRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        // Dimensions first: a star join's text names the dimensions it shares.
        let plan = share_dimensions(plan)?;
        let mut occurrences: HashMap<String, usize> = HashMap::new();
        plan.apply(|node| {
            if let Some(form) = shareable_form(node)? {
                *occurrences.entry(fingerprint(&form)).or_default() += 1;
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        occurrences.retain(|_, n| *n > 1);
        if occurrences.is_empty() {
            return Ok(plan);
        }
        share(plan, &occurrences, &mut HashMap::new())
    }

    fn name(&self) -> &str {
        "quarry_shared_subplan"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A subplan's identity: its plan text, every operator with its expressions and parameters.
fn fingerprint(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(true).to_string()
}

/// `plan` in the form its occurrences share, if it is a grouped final aggregate (or a star
/// join's, which is one) over storage fragments: with the join filters its fragments read from
/// joins outside it left out (those joins still join; a fragment only drops their rows early),
/// and `None` if another operator reads such a filter. TPC-DS q01's CTE, named twice, read
/// different filters from the joins above each occurrence and was computed twice.
fn shareable_form(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let grouped_final = match plan.downcast_ref::<AggregateExec>() {
        Some(aggregate) => {
            !aggregate.group_expr().is_empty()
                && matches!(aggregate.mode(), AggregateMode::Final | AggregateMode::FinalPartitioned | AggregateMode::Single | AggregateMode::SinglePartitioned)
        }
        None => plan.is::<StarAggregateExec>(),
    };
    if !grouped_final {
        return Ok(None);
    }
    let reads = OutsideReads::of(plan)?;
    if !reads.storage || reads.by_others {
        return Ok(None);
    }
    if !reads.by_fragments {
        return Ok(Some(Arc::clone(plan)));
    }
    let stripped = Arc::clone(plan).transform_up(|node| {
        let Some(fragment) = node.downcast_ref::<FragmentExec>() else { return Ok(Transformed::no(node)) };
        Ok(Transformed::yes(Arc::new(fragment.without_join_filters(|filter| reads.is_outside(filter))?) as Arc<dyn ExecutionPlan>))
    })?;
    Ok(Some(stripped.data))
}

/// Whether `plan` reads storage and no dynamic filter but those its own joins fill.
fn self_contained(plan: &Arc<dyn ExecutionPlan>) -> Result<bool> {
    let reads = OutsideReads::of(plan)?;
    Ok(reads.storage && !reads.by_fragments && !reads.by_others)
}

/// Which operators of a subplan read dynamic filters filled by joins outside it.
struct OutsideReads {
    /// The identities of the filters the subplan's own joins fill.
    filled_inside: HashSet<Option<u64>>,
    /// It reads a storage fragment.
    storage: bool,
    by_fragments: bool,
    by_others: bool,
}

impl OutsideReads {
    fn of(plan: &Arc<dyn ExecutionPlan>) -> Result<Self> {
        let mut filled_inside = HashSet::new();
        plan.apply(|node| {
            filled_inside.extend(node.dynamic_expressions_produced().iter().map(|e| e.expression_id()));
            Ok(TreeNodeRecursion::Continue)
        })?;
        let mut reads = OutsideReads { filled_inside, storage: false, by_fragments: false, by_others: false };
        plan.apply(|node| {
            let fragment = node.downcast_ref::<FragmentExec>().is_some();
            reads.storage |= fragment;
            node.apply_expressions(&mut |expr: &Arc<dyn PhysicalExpr>| {
                if reads.is_outside(expr) {
                    if fragment { reads.by_fragments = true } else { reads.by_others = true }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(reads)
    }

    /// Whether `expr` reads a dynamic filter not filled inside (one without an identity cannot
    /// be placed: taken as filled outside).
    fn is_outside(&self, expr: &Arc<dyn PhysicalExpr>) -> bool {
        let mut outside = false;
        expr.apply(|e| {
            if e.downcast_ref::<DynamicFilterPhysicalExpr>().is_some() {
                let id = e.expression_id();
                outside |= id.is_none() || !self.filled_inside.contains(&id);
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .expect("visiting an expression cannot fail");
        outside
    }
}

/// `plan` with every occurrence of a subplan in `occurrences` replaced by a [`SharedExec`]; the
/// first one seen owns it (and shows it in EXPLAIN and its metrics), the others read it.
fn share(plan: Arc<dyn ExecutionPlan>, occurrences: &HashMap<String, usize>, shared: &mut HashMap<String, Arc<SharedResult>>) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some(form) = shareable_form(&plan)? {
        let key = fingerprint(&form);
        if let Some(&readers) = occurrences.get(&key) {
            let plan = form;
            if let Some(result) = shared.get(&key) {
                return Ok(Arc::new(SharedExec::new(Arc::clone(result), false)));
            }
            let result = Arc::new(SharedResult { id: shared.len() + 1, readers, plan, partitions: tokio::sync::OnceCell::new(), reservations: Mutex::new(Vec::new()) });
            shared.insert(key, Arc::clone(&result));
            return Ok(Arc::new(SharedExec::new(result, true)));
        }
    }
    let children = plan.children().into_iter().map(|child| share(Arc::clone(child), occurrences, shared)).collect::<Result<Vec<_>>>()?;
    replace_children_if_necessary(plan, children)
}

/// `plan` with the dimensions that several of its star joins build from the same plan built
/// once: TPC-DS q04's six star joins each built the same 100K-row `customer` dimension.
fn share_dimensions(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let mut occurrences: HashMap<String, usize> = HashMap::new();
    plan.apply(|node| {
        if let Some(star) = node.downcast_ref::<StarAggregateExec>() {
            for dim in star.dimensions() {
                if self_contained(&dim.plan)? {
                    *occurrences.entry(fingerprint(&dim.plan)).or_default() += 1;
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    occurrences.retain(|_, n| *n > 1);
    if occurrences.is_empty() {
        return Ok(plan);
    }
    let mut cells: HashMap<String, DimensionCell> = HashMap::new();
    let shared = plan.transform_up(|node| {
        let Some(star) = node.downcast_ref::<StarAggregateExec>() else { return Ok(Transformed::no(node)) };
        let shared: Vec<Option<DimensionCell>> = star
            .dimensions()
            .iter()
            .map(|dim| {
                let key = fingerprint(&dim.plan);
                occurrences.contains_key(&key).then(|| Arc::clone(cells.entry(key).or_default()))
            })
            .collect();
        if shared.iter().all(Option::is_none) {
            return Ok(Transformed::no(node));
        }
        Ok(Transformed::yes(Arc::new(star.with_shared_dimensions(shared)?) as Arc<dyn ExecutionPlan>))
    })?;
    Ok(shared.data)
}

/// One shared subplan and, once computed, its output partitions.
struct SharedResult {
    /// Numbers the shared subplans of a query (EXPLAIN).
    id: usize,
    /// Occurrences that read it.
    readers: usize,
    plan: Arc<dyn ExecutionPlan>,
    partitions: tokio::sync::OnceCell<std::result::Result<Arc<Vec<Vec<RecordBatch>>>, Arc<DataFusionError>>>,
    /// The memory its partitions hold, released with it.
    reservations: Mutex<Vec<MemoryReservation>>,
}

impl SharedResult {
    /// The output partitions, computed by the first caller (all partitions at once, each on a
    /// task of its own), awaited by the others.
    async fn partitions(&self, context: Arc<TaskContext>) -> Result<Arc<Vec<Vec<RecordBatch>>>> {
        let outcome = self.partitions.get_or_init(|| async { self.compute(context).await.map(Arc::new).map_err(Arc::new) }).await;
        outcome.clone().map_err(DataFusionError::Shared)
    }

    async fn compute(&self, context: Arc<TaskContext>) -> Result<Vec<Vec<RecordBatch>>> {
        let count = self.plan.properties().partitioning.partition_count();
        let mut tasks = Vec::with_capacity(count);
        for partition in 0..count {
            let mut stream = self.plan.execute(partition, Arc::clone(&context))?;
            let reservation = MemoryConsumer::new(format!("SharedExec[{}] partition {partition}", self.id)).register(context.memory_pool());
            tasks.push(SpawnedTask::spawn(async move {
                let mut batches = Vec::new();
                while let Some(batch) = stream.next().await {
                    let batch = batch?;
                    // The bytes its arrays' slices address, not the whole buffers under them: an
                    // aggregate emits its groups as slices of one array, and counting that array
                    // once per slice charged TPC-H Q18's 15M groups (about 360 MB) as 18 GB.
                    reservation.try_grow(batch_wire_bytes(&batch) as usize)?;
                    batches.push(batch);
                }
                Ok::<_, DataFusionError>((batches, reservation))
            }));
        }
        let mut partitions = Vec::with_capacity(count);
        for task in tasks {
            let (batches, reservation) = task.join_unwind().await.map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
            self.reservations.lock().expect("not poisoned").push(reservation);
            partitions.push(batches);
        }
        Ok(partitions)
    }
}

/// An occurrence of a shared subplan (see the module docs).
pub struct SharedExec {
    result: Arc<SharedResult>,
    /// The occurrence that shows the subplan as its child; the others have none.
    owner: bool,
    properties: Arc<PlanProperties>,
}

impl SharedExec {
    fn new(result: Arc<SharedResult>, owner: bool) -> Self {
        let properties = Arc::clone(result.plan.properties());
        SharedExec { result, owner, properties }
    }
}

impl fmt::Debug for SharedExec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SharedExec({}, owner: {})", self.result.id, self.owner)
    }
}

impl DisplayAs for SharedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        if self.owner {
            write!(f, "SharedExec: subplan {} computed once for its {} occurrences", self.result.id, self.result.readers)
        } else {
            write!(f, "SharedExec: reads subplan {} (shown at its first occurrence)", self.result.id)
        }
    }
}

impl ExecutionPlan for SharedExec {
    fn name(&self) -> &str {
        "SharedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        if self.owner { vec![&self.result.plan] } else { vec![] }
    }

    fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        // The subplan is shared by pointer: replacing it in one occurrence would split it.
        let same = children.len() == self.children().len() && children.iter().zip(self.children()).all(|(a, b)| Arc::ptr_eq(a, b));
        if same { Ok(self) } else { internal_err!("a shared subplan cannot be replaced") }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let result = Arc::clone(&self.result);
        let stream = futures::stream::once(async move {
            let partitions = result.partitions(context).await?;
            let batches = partitions.get(partition).cloned().unwrap_or_default();
            Ok::<_, DataFusionError>(futures::stream::iter(batches.into_iter().map(Ok)))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), stream)))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::memory_pool::GreedyMemoryPool;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;

    use super::*;

    /// A result that arrives as slices of one array is charged about its own size: it fits a
    /// budget of twice that, where charging the array once per slice would take 100 times it.
    #[tokio::test]
    async fn sliced_batches_are_charged_once() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let whole = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from_iter_values(0..100_000))]).unwrap();
        let slices: Vec<RecordBatch> = (0..100).map(|i| whole.slice(i * 1_000, 1_000)).collect();
        let plan = MemorySourceConfig::try_new_exec(&[slices], schema, None).unwrap();
        let result = Arc::new(SharedResult { id: 1, readers: 1, plan, partitions: tokio::sync::OnceCell::new(), reservations: Mutex::new(Vec::new()) });
        let budget = 2 * whole.get_array_memory_size();
        let runtime = RuntimeEnvBuilder::new().with_memory_pool(Arc::new(GreedyMemoryPool::new(budget))).build_arc().unwrap();
        let context = Arc::new(TaskContext::default().with_runtime(runtime));
        let shared: Arc<dyn ExecutionPlan> = Arc::new(SharedExec::new(result, true));
        let batches = datafusion::physical_plan::collect(shared, context).await.unwrap();
        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 100_000);
    }
}
