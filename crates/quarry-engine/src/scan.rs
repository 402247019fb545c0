//! `FragmentExec`: the host's leaf operator, which runs a plan fragment on storage nodes.
//!
//! A fragment is a small physical plan over [`ScanLeafExec`] templates: a bare leaf
//! (passthrough) as the table provider creates it, grown by the placement rule
//! ([`crate::pushdown`]) with the operators it pushes down. Each output partition sends the
//! fragment, its leaves filled with that partition's segments, to the partition's node, and
//! passes the node's batches on, checking each against the plan's schema (the node is not
//! trusted to send what was asked). The node's closing statistics become this operator's
//! metrics, which `EXPLAIN ANALYZE` shows and [`crate::QueryStats`] adds up.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::config::ConfigOptions;
use arrow::compute::SortOptions;
use datafusion::common::{ScalarValue, Statistics, internal_err};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalSortExpr};
use datafusion::physical_expr::expressions::{Column, InListExpr};
use datafusion::physical_expr::{conjunction, conjunction_opt, split_conjunction};
use datafusion::physical_expr_common::physical_expr::{snapshot_physical_expr, snapshot_physical_expr_opt};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::filter_pushdown::{ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation, PushedDown};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::Boundedness;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream, displayable};
use futures::{StreamExt, TryStreamExt};
use quarry_model::sharing::Demand;
use quarry_storage::constant_keys::hide_constant_order;
use quarry_storage::key_set::KeySetExpr;
use quarry_storage::page_select::Comparison;
use quarry_storage::{FragmentProgress, LinkCodec, NodeOp, ScanLeafExec, ScanMessage, scan_counter, ScanStats, SegmentInfo, StorageNode, built_fragment, encode_fragment};

use crate::join_bounds::segments_within_join_bounds;
use crate::join_key_lists::per_column_lists;
use crate::key_set_filter::{HostKeyFilter, KeySetSlot, ProbeKeySet};
use crate::placement::Placement;
use crate::provider::split_segments;
use crate::fragment_timing::FragmentTiming;
use crate::sorted_copies::CopyChoice;
use crate::stored_scan::stored_scan;

/// Metric names this operator records besides the node's own counters (whose names are
/// [`quarry_storage::scan_counter`]); [`crate::QueryStats`] reads both.
pub mod metric {
    /// Host time spent receiving the fragment's output: decoding the stored bytes of a
    /// passthrough read, or the batches (and their link compression) a node sent, nanoseconds.
    pub const HOST_RECEIVE_NS: &str = "host_receive_ns";
    /// Rows the host dropped by a key set from an in-process node's output.
    pub const KEY_SET_DROPPED_ROWS: &str = "key_set_dropped_rows";
    /// Segments the host left out because a hash join's key bounds rule them out.
    pub const JOIN_PRUNED_SEGMENTS: &str = "join_pruned_segments";
}

/// The values of one column in one partition of a fragment: their bounds (NULLs aside), and
/// whether the partition's rows arrive in ascending order of them.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyRange {
    /// The smallest value in the partition's segments.
    pub min: ScalarValue,
    /// The largest.
    pub max: ScalarValue,
    /// Each segment ascends in the column, and each starts at or above the previous one's end.
    pub ascending: bool,
}

/// One partition of a fragment: the node it runs on and, for each leaf of the fragment (in
/// plan order), the table version and segments it reads.
#[derive(Debug, Clone)]
pub struct FragmentPartition {
    /// The node holding the segments.
    pub node: Arc<dyn StorageNode>,
    /// Version and segments per leaf.
    pub leaves: Vec<(u64, Vec<SegmentInfo>)>,
}

/// Runs a plan fragment on storage nodes, one request per partition.
#[derive(Debug)]
pub struct FragmentExec {
    root: Arc<dyn ExecutionPlan>,
    partitions: Vec<FragmentPartition>,
    /// The placement rule's decisions about this fragment, pushed or kept on the host, in the
    /// order made (`EXPLAIN` shows them).
    decisions: Vec<Placement>,
    /// Whether the node may apply join filters (never in passthrough: `--pushdown off`).
    accepts_join_filters: bool,
    /// Join filters: the key bounds and key set of a hash join whose probe side this fragment
    /// is (DataFusion's dynamic filters), applied on the node so that rows without a join
    /// partner never cross the link (the semi-join reduction of Kim 2015 and Exadata's join
    /// offload). The join fills them once its build side is complete; each partition takes a
    /// snapshot when it starts, which is after the build side (the join polls it first).
    join_filters: Vec<Arc<dyn PhysicalExpr>>,
    /// Key sets of hash joins above whose build sides are too large for DataFusion's `IN`
    /// list, each with the output column it filters (see [`crate::key_set_filter`]).
    key_sets: Vec<ProbeKeySet>,
    /// Passthrough only: the filters above the scan (static, and dynamic ones from joins),
    /// with which the host's reader of the stored bytes skips row groups and pages by their
    /// statistics, as any reader of Parquet files on an object store does. They still run
    /// above the scan.
    pruning_filters: Vec<Arc<dyn PhysicalExpr>>,
    /// How the node compresses the batches it sends (the placement rule's choice).
    link_codec: LinkCodec,
    /// Each partition's weighted memory demand on its node, bytes (the placement rule's
    /// estimate; the node admits the partition when it fits).
    demand: u64,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// The nodes' closing statistics, by node name.
    node_stats: Arc<Mutex<BTreeMap<String, ScanStats>>>,
    /// The placement model's prediction.
    prediction: Option<FragmentPrediction>,
    /// The stated rules the prediction fell back on (unknown estimates or rates).
    assumed: Vec<String>,
    /// When its partitions' consumers waited for it: its measured time.
    timing: Arc<FragmentTiming>,
    /// The output column each partition's rows are declared ascending in (see
    /// [`FragmentExec::with_ascending_output`]).
    ascending: Option<String>,
    /// Per partition, the stored bytes its node has read so far (the query's progress).
    progress: Vec<FragmentProgress>,
    /// Which copy of its table the fragment's one leaf reads, where the table has sorted
    /// copies (see [`crate::sorted_copies`]).
    copy: Option<CopyChoice>,
    /// A copy chosen again when the fragment's star probe had its dimensions, with its
    /// partitions: they replace `copy` and `partitions` (set before any partition runs).
    run_time_copy: Arc<OnceLock<(CopyChoice, Vec<FragmentPartition>)>>,
    /// For a bare fragment under `--pushdown auto`: the placement model, which decides when
    /// its join filters arrive whether the node filters (see [`JoinFilterPricing`]).
    join_filter_pricing: Option<Arc<dyn JoinFilterPricing>>,
    /// The prediction for the fragment as it ran, where its join filters made it a filter on
    /// its node: it replaces `prediction` once set.
    run_time_prediction: Arc<OnceLock<FragmentPrediction>>,
}

/// The placement model's prediction of a fragment: its time alone, the component bounding it,
/// and its demand on what fragments running at once share.
#[derive(Debug, Clone, Copy)]
pub struct FragmentPrediction {
    pub seconds: f64,
    pub bound: &'static str,
    pub demand: Demand,
    /// The host's threads the model assumed.
    pub host_threads: usize,
}

/// The placement model's price of a fragment, for a decision made when it runs: a bare
/// fragment's join filters (an `IN` list or a key set, known only once the join's build side is
/// complete) turn it into a filter its node runs, which pays where the node decodes the
/// filtered column faster than the host decodes all of it, and not on a slow device (TPC-H Q10's
/// `customer` under kim-isp-2015: 3.7 s filtered on the node, 0.27 s predicted as passthrough).
pub trait JoinFilterPricing: fmt::Debug + Send + Sync {
    /// The prediction for `root` over `partitions`.
    fn predict(&self, root: &Arc<dyn ExecutionPlan>, partitions: &[FragmentPartition]) -> FragmentPrediction;
}

impl FragmentExec {
    /// A fragment running `root` (a plan over [`ScanLeafExec`]s) for each of `partitions`.
    pub fn try_new(root: Arc<dyn ExecutionPlan>, partitions: Vec<FragmentPartition>) -> Result<Self> {
        let leaves = leaves(&root).len();
        if partitions.is_empty() || partitions.iter().any(|p| p.leaves.len() != leaves) {
            return internal_err!("every fragment partition needs segments for each of its {leaves} leaves");
        }
        let root_properties = root.properties();
        let properties = PlanProperties::new(
            root_properties.equivalence_properties().clone(),
            Partitioning::UnknownPartitioning(partitions.len()),
            root_properties.emission_type,
            Boundedness::Bounded,
        );
        Ok(FragmentExec {
            root,
            decisions: Vec::new(),
            accepts_join_filters: false,
            join_filters: Vec::new(),
            key_sets: Vec::new(),
            pruning_filters: Vec::new(),
            link_codec: LinkCodec::None,
            demand: 0,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
            node_stats: Arc::new(Mutex::new(BTreeMap::new())),
            prediction: None,
            assumed: Vec::new(),
            timing: Arc::new(FragmentTiming::default()),
            ascending: None,
            progress: partitions.iter().map(|_| FragmentProgress::default()).collect(),
            partitions,
            copy: None,
            run_time_copy: Arc::new(OnceLock::new()),
            join_filter_pricing: None,
            run_time_prediction: Arc::new(OnceLock::new()),
        })
    }

    /// The same fragment reading the copy `choice` chose.
    pub fn with_copy(&self, choice: CopyChoice) -> Result<Self> {
        let partitions = self.copy_partitions(&choice)?;
        let mut fragment = self.with_root(Arc::clone(&self.root), None)?;
        fragment.partitions = partitions;
        fragment.copy = Some(choice);
        Ok(fragment)
    }

    /// Reads the copy `choice` chose instead of the one planned, from now on: a star probe's
    /// choice once its dimensions are built, before any partition runs. `false` (nothing
    /// changed) if a copy was chosen that way before.
    pub fn choose_copy_at_run_time(&self, choice: CopyChoice) -> Result<bool> {
        let partitions = self.copy_partitions(&choice)?;
        Ok(self.run_time_copy.set((choice, partitions)).is_ok())
    }

    /// The partitions reading `choice`'s copy: its segments on the one node holding the
    /// fragment's one leaf, split over as many partitions as the fragment has.
    fn copy_partitions(&self, choice: &CopyChoice) -> Result<Vec<FragmentPartition>> {
        let (Some(first), [_]) = (self.partitions.first(), leaves(&self.root).as_slice()) else {
            return internal_err!("only a fragment of one leaf chooses among its table's copies");
        };
        if self.partitions.iter().any(|p| p.node.name() != first.node.name()) {
            return internal_err!("only a fragment on one node chooses among its table's copies");
        }
        if self.ascending.is_some() {
            // Its order is that of the segments it was planned with.
            return internal_err!("a fragment declared in order of a column keeps its copy");
        }
        let version = first.leaves[0].0;
        let mut groups = split_segments(&choice.segments(), self.partitions.len());
        groups.resize_with(self.partitions.len(), Vec::new);
        Ok(groups.into_iter().map(|segments| FragmentPartition { node: Arc::clone(&first.node), leaves: vec![(version, segments)] }).collect())
    }

    /// The copy of its table the fragment reads, where the table has sorted copies.
    pub fn copy(&self) -> Option<&CopyChoice> {
        self.run_time_copy.get().map(|(choice, _)| choice).or(self.copy.as_ref())
    }

    /// The same fragment, declaring each partition's rows ascending in output column `column`,
    /// if it reads its segments as stored, in order (a bare leaf with no join filter or key
    /// set: a node runs a fragment's segments in parallel) and each partition's segments are
    /// ascending in the column with bounds in the same order. The caller adds no join filter
    /// after (the rule that asks runs last).
    pub fn with_ascending_output(&self, column: usize) -> Result<Option<Self>> {
        let Some(leaf) = self.root.downcast_ref::<ScanLeafExec>() else { return Ok(None) };
        if !self.join_filters.is_empty() || !self.key_sets.is_empty() || leaf.leaf().limit.is_some() {
            return Ok(None);
        }
        let schema = self.schema();
        let name = schema.field(column).name();
        let Some(ranges) = self.key_ranges(name)? else { return Ok(None) };
        if !ranges.iter().all(|partition| partition.ascending) {
            return Ok(None);
        }
        let mut fragment = self.with_root(Arc::clone(&self.root), None)?;
        let sort = PhysicalSortExpr::new(Arc::new(Column::new(name, column)), SortOptions { descending: false, nulls_first: false });
        let equivalence = EquivalenceProperties::new_with_orderings(Arc::clone(&schema), [[sort]]);
        let properties = PlanProperties::new(equivalence, fragment.properties.partitioning.clone(), fragment.properties.emission_type, Boundedness::Bounded);
        fragment.properties = Arc::new(properties);
        fragment.ascending = Some(name.clone());
        Ok(Some(fragment))
    }

    /// Per partition, the range of the leaf column `name` over its segments, and whether its
    /// rows arrive in ascending order of it (each segment ascending, their bounds in order);
    /// `None` unless the fragment reads one leaf and every segment records the column's bounds
    /// and no NULL in it.
    pub fn key_ranges(&self, name: &str) -> Result<Option<Vec<KeyRange>>> {
        let leaves = leaves(&self.root);
        let [leaf] = leaves.as_slice() else { return Ok(None) };
        let Ok(field) = leaf.schema().field_with_name(name).cloned() else { return Ok(None) };
        let mut ranges = Vec::with_capacity(self.partitions.len());
        for partition in &self.partitions {
            let [(_, segments)] = partition.leaves.as_slice() else { return Ok(None) };
            let mut range: Option<KeyRange> = None;
            for segment in segments {
                let Some(bounds) = segment.columns.iter().find(|c| c.name == *name && c.null_count == Some(0)) else { return Ok(None) };
                let (Some(min), Some(max)) = (&bounds.min, &bounds.max) else { return Ok(None) };
                let min = ScalarValue::try_from_string(min.clone(), field.data_type())?;
                let max = ScalarValue::try_from_string(max.clone(), field.data_type())?;
                range = Some(match range {
                    None => KeyRange { ascending: bounds.ascending, min, max },
                    Some(r) => KeyRange {
                        ascending: r.ascending && bounds.ascending && r.max <= min,
                        min: if min < r.min { min } else { r.min },
                        max: if max > r.max { max } else { r.max },
                    },
                });
            }
            if let Some(range) = range {
                ranges.push(range);
            }
        }
        Ok(Some(ranges))
    }

    /// The same partitions running another root (the old one with operators added on top),
    /// with `decision` added to the placement decisions shown.
    pub fn with_root(&self, root: Arc<dyn ExecutionPlan>, decision: Option<Placement>) -> Result<Self> {
        let mut fragment = FragmentExec::try_new(root, self.partitions.clone())?;
        fragment.decisions = self.decisions.iter().cloned().chain(decision).collect();
        fragment.accepts_join_filters = self.accepts_join_filters;
        fragment.join_filters = self.join_filters.clone();
        fragment.key_sets = self.key_sets.clone();
        fragment.link_codec = self.link_codec;
        fragment.demand = self.demand;
        fragment.prediction = self.prediction;
        fragment.assumed = self.assumed.clone();
        fragment.copy = self.copy.clone();
        fragment.run_time_copy = Arc::clone(&self.run_time_copy);
        if fragment.is_passthrough() {
            fragment.join_filter_pricing = self.join_filter_pricing.clone();
            fragment.pruning_filters = self.pruning_filters.clone();
        }
        Ok(fragment)
    }

    /// The same fragment without the join filters `leave_out` picks (a shared subplan's, from
    /// joins above one occurrence only).
    pub fn without_join_filters(&self, mut leave_out: impl FnMut(&Arc<dyn PhysicalExpr>) -> bool) -> Result<Self> {
        let mut fragment = self.with_root(Arc::clone(&self.root), None)?;
        fragment.join_filters.retain(|filter| !leave_out(filter));
        Ok(fragment)
    }

    /// The same fragment, allowed to take join filters (the placement rule allows it unless
    /// `--pushdown off`).
    pub fn accepting_join_filters(&self) -> Result<Self> {
        let mut fragment = self.with_root(Arc::clone(&self.root), None)?;
        fragment.accepts_join_filters = true;
        Ok(fragment)
    }

    /// The same fragment, its output column `column` filtered by the key set `slot` will hold;
    /// `None` if it takes no join filters (`--pushdown off`). A node across a link tests it
    /// before it decodes a row's other columns. So does an in-process node when the set is
    /// selective ([`ProbeKeySet::selective`], judged when the partition starts): over
    /// uncompressed numeric pages, decoding only the rows that pass beat decoding all and
    /// testing after (TPC-H SF 10: Q03 0.81 -> 0.70 s, Q04 0.50 -> 0.37 s, Q05 0.76 -> 0.57 s).
    /// A set that keeps most rows is tested by the host on the decoded batches
    /// ([`HostKeyFilter`], which gives up once it sees that): encoding TPC-H Q09's 15M order
    /// keys into each partition's fragment and decoding them on the node took twice the query.
    pub fn with_key_set(&self, slot: Arc<KeySetSlot>, column: String) -> Result<Option<Self>> {
        if !self.accepts_join_filters {
            return Ok(None);
        }
        let distinct = self.schema().index_of(&column).ok().and_then(|index| {
            let statistics = crate::placement::plan_statistics(&self.root)?;
            statistics.column_statistics.get(index)?.distinct_count.get_value().copied()
        });
        let mut fragment = self.with_root(Arc::clone(&self.root), None)?;
        fragment.key_sets.push(ProbeKeySet { slot, column, distinct });
        Ok(Some(fragment))
    }

    /// The same fragment, its batches compressed with `codec` on the link and each partition
    /// asking its node for `demand` bytes of weighted memory demand.
    pub fn with_shipping(&self, codec: LinkCodec, demand: u64) -> Result<Self> {
        let mut fragment = self.with_root(Arc::clone(&self.root), None)?;
        (fragment.link_codec, fragment.demand) = (codec, demand);
        Ok(fragment)
    }

    /// The same fragment with the placement model's prediction and the stated rules it
    /// `assumed`.
    pub fn with_prediction(&self, prediction: FragmentPrediction, assumed: Vec<String>) -> Self {
        let mut fragment = self.with_root(Arc::clone(&self.root), None).expect("the same root and partitions");
        fragment.prediction = Some(prediction);
        fragment.assumed = assumed;
        fragment
    }

    /// The same fragment deciding, when it runs, by `pricing` whether its join filters go to
    /// its node (only a bare fragment takes it).
    pub fn with_join_filter_pricing(&self, pricing: Arc<dyn JoinFilterPricing>) -> Self {
        let mut fragment = self.with_root(Arc::clone(&self.root), None).expect("the same root and partitions");
        if fragment.is_passthrough() {
            fragment.join_filter_pricing = Some(pricing);
        }
        fragment
    }

    /// The placement model's prediction: for the fragment as it ran, once its join filters
    /// made it a filter on its node.
    pub fn prediction(&self) -> Option<FragmentPrediction> {
        self.run_time_prediction.get().copied().or(self.prediction)
    }

    /// The fragment's measured time, seconds (None before it ran): the time during which some
    /// partition's consumer waited for it, after the partition's admission (see
    /// [`crate::fragment_timing`]). Time every consumer spent elsewhere (a join building its
    /// other side) is not the fragment's.
    pub fn measured_seconds(&self) -> Option<f64> {
        self.timing.measured().map(|d| d.as_secs_f64())
    }

    /// When the fragment ran: the first ask of its first partition to its last item.
    pub fn span(&self) -> Option<(std::time::Instant, std::time::Instant)> {
        self.timing.span()
    }

    /// The node-side plan.
    pub fn root(&self) -> &Arc<dyn ExecutionPlan> {
        &self.root
    }

    /// The partitions (those of a copy chosen at run time, once it is).
    pub fn partitions(&self) -> &[FragmentPartition] {
        self.run_time_copy.get().map_or(&self.partitions, |(_, partitions)| partitions)
    }

    /// Whether the fragment only scans (passthrough).
    pub fn is_passthrough(&self) -> bool {
        self.root.is::<ScanLeafExec>()
    }

    /// Tables the fragment reads.
    pub fn tables(&self) -> Vec<String> {
        leaves(&self.root).iter().map(|l| l.leaf().table.clone()).collect()
    }

    /// The accumulated node-side statistics of the fragment's executions.
    pub fn node_stats(&self) -> ScanStats {
        let mut total = ScanStats::default();
        for stats in self.node_stats.lock().expect("stats lock").values() {
            total.merge(stats);
        }
        total
    }

    /// The same, node by node.
    pub fn node_stats_by_node(&self) -> BTreeMap<String, ScanStats> {
        self.node_stats.lock().expect("stats lock").clone()
    }

    /// Per partition, its progress and the stored bytes it plans to read: each leaf's stored
    /// bytes (of the columns it reads) shared among the partitions by their segments' sizes.
    pub fn progress(&self) -> Vec<(FragmentProgress, u64)> {
        let leaves = leaves(&self.root);
        let leaf_bytes = |p: &FragmentPartition, i: usize| p.leaves[i].1.iter().map(|s| s.bytes).sum::<u64>();
        let all: Vec<u64> = (0..leaves.len()).map(|i| self.partitions().iter().map(|p| leaf_bytes(p, i)).sum()).collect();
        let planned = |p: &FragmentPartition| -> u64 {
            leaves
                .iter()
                .enumerate()
                .map(|(i, leaf)| match (leaf.stored_bytes(), all[i]) {
                    (Some(stored), total) if total > 0 => (stored as f64 * leaf_bytes(p, i) as f64 / total as f64) as u64,
                    _ => leaf_bytes(p, i),
                })
                .sum()
        };
        self.progress.iter().cloned().zip(self.partitions().iter().map(planned)).collect()
    }
}

/// The fragment `root` for one partition: each leaf filled with that partition's segments.
fn bind_leaves(root: &Arc<dyn ExecutionPlan>, partition: &FragmentPartition) -> Result<Arc<dyn ExecutionPlan>> {
    let mut next = 0;
    let bound = Arc::clone(root).transform_up(|plan| {
        let Some(leaf) = plan.downcast_ref::<ScanLeafExec>() else { return Ok(Transformed::no(plan)) };
        let (version, segments) = &partition.leaves[next];
        next += 1;
        let ids = segments.iter().map(|s| s.id.clone()).collect();
        Ok(Transformed::yes(Arc::new(leaf.with_segments(*version, ids)) as Arc<dyn ExecutionPlan>))
    })?;
    Ok(bound.data)
}

/// Whether the fragment's output columns are its one leaf's, by name (a bare leaf, or a filter
/// over it that keeps its columns): then a join filter's bounds are bounds on the leaf's columns.
fn scans_leaf_columns(root: &Arc<dyn ExecutionPlan>) -> bool {
    root.is::<ScanLeafExec>() || root.downcast_ref::<FilterExec>().is_some_and(|filter| filter.projection().is_none() && filter.input().is::<ScanLeafExec>())
}

/// `root` with the current state of `join_filters` applied on top (merged into a filter that sits
/// directly on a leaf, so the node prunes segments with it too). Only the key sets (`IN` lists)
/// go: the key bounds of TPC-H's and SSB's joins span nearly all of the probe side's keys, and
/// a filter over a scan that passes every row costs its evaluation and the page reader's gather
/// for nothing (Q03 took 1.8x as long with them); a hash table lookup cannot travel, but the
/// build side's keys can, as a key set (for a column no `IN` list filters). When a key set or
/// an `IN` list goes, so do the static filters above a passthrough scan (`pruning_filters`):
/// the node then runs a filter anyway, and one that also tests their comparisons it can run on
/// the stored pages (`Comparison`) gathers the other columns only for the rows that pass
/// (TPC-H Q03: 5.85M `lineitem` rows had four columns gathered for a host filter that kept
/// 302K). Other conjuncts (two columns compared, LIKE) cost the node more than they save. The
/// filters above still run, on rows that all pass. A join on several columns sends its key
/// tuples as a list per column ([`per_column_lists`]), which the page reader can run.
fn with_join_filters(
    root: Arc<dyn ExecutionPlan>,
    join_filters: &[Arc<dyn PhysicalExpr>],
    key_sets: &[ProbeKeySet],
    pruning_filters: &[Arc<dyn PhysicalExpr>],
    in_process: bool,
) -> Result<Arc<dyn ExecutionPlan>> {
    let mut conjuncts = Vec::new();
    for filter in join_filters {
        let snapshot = snapshot_physical_expr(Arc::clone(filter))?;
        for conjunct in split_conjunction(&snapshot) {
            if let Some(lists) = per_column_lists(conjunct, &root.schema())? {
                conjuncts.extend(lists);
            } else if conjunct.downcast_ref::<InListExpr>().is_some_and(|l| !l.negated()) {
                conjuncts.push(Arc::clone(conjunct));
            }
        }
    }
    let listed: Vec<String> = conjuncts.iter().filter_map(|c| c.downcast_ref::<InListExpr>()?.expr().downcast_ref::<Column>().map(|c| c.name().to_string())).collect();
    for key_set in key_sets {
        if let Some(set) = key_set.slot.get()
            && !listed.contains(&key_set.column)
        {
            let column = Arc::new(Column::new_with_schema(&key_set.column, &root.schema())?);
            conjuncts.push(Arc::new(KeySetExpr::new(column, set)));
        }
    }
    if !conjuncts.is_empty() {
        let schema = root.schema();
        for filter in pruning_filters {
            let snapshot = snapshot_physical_expr(Arc::clone(filter))?;
            conjuncts.extend(split_conjunction(&snapshot).into_iter().filter(|c| Comparison::compile(c, &schema).is_some()).cloned());
        }
    }
    let shippable: Vec<_> = conjuncts
        .into_iter()
        // A key set always travels; encoding it only to find that out would cost a sort of its
        // keys. A node in this process takes the plan unencoded (see `FragmentPlan`).
        .filter(|c| {
            c.downcast_ref::<KeySetExpr>().is_some()
                || FilterExec::try_new(Arc::clone(c), Arc::clone(&root)).is_ok_and(|f| in_process || encode_fragment(Arc::new(f)).is_ok())
        })
        .collect();
    let Some(predicate) = conjunction_opt(shippable) else { return Ok(root) };
    if let Some(filter) = root.downcast_ref::<FilterExec>()
        && filter.projection().is_none()
        && filter.input().is::<ScanLeafExec>()
    {
        let merged = conjunction([Arc::clone(filter.predicate()), predicate]);
        return Ok(Arc::new(FilterExec::try_new(merged, Arc::clone(filter.input()))?));
    }
    Ok(Arc::new(FilterExec::try_new(predicate, root)?))
}

/// A bare fragment's choice, when its partition starts, between filtering on its node by its
/// join filters and reading the stored bytes as planned (see [`JoinFilterPricing`]).
struct JoinFilterDecision {
    pricing: Arc<dyn JoinFilterPricing>,
    /// The planned passthrough's predicted seconds.
    passthrough_s: f64,
    root: Arc<dyn ExecutionPlan>,
    partitions: Vec<FragmentPartition>,
    /// Where the prediction of the node's filter goes when it is chosen.
    ran: Arc<OnceLock<FragmentPrediction>>,
}

impl JoinFilterDecision {
    /// Whether the node runs the filter the join filters make: the model's price of the
    /// fragment with that filter, passing the share of rows the keys are expected to (each
    /// list's or set's keys over its column's estimated distinct values), beats passthrough.
    fn node_filters(&self, join_filters: &[Arc<dyn PhysicalExpr>], key_sets: &[ProbeKeySet], pruning_filters: &[Arc<dyn PhysicalExpr>], in_process: bool) -> Result<bool> {
        let filtered = with_join_filters(Arc::clone(&self.root), join_filters, key_sets, pruning_filters, in_process)?;
        let Some(filter) = filtered.downcast_ref::<FilterExec>() else { return Ok(true) };
        let statistics = crate::placement::plan_statistics(&self.root);
        let distinct = |column: &str| {
            let index = self.root.schema().index_of(column).ok()?;
            statistics.as_ref()?.column_statistics.get(index)?.distinct_count.get_value().copied()
        };
        let mut share = 1.0f64;
        for conjunct in split_conjunction(filter.predicate()) {
            let keys = if let Some(list) = conjunct.downcast_ref::<InListExpr>() {
                list.expr().downcast_ref::<Column>().map(|c| (list.list().len(), distinct(c.name())))
            } else if let Some(set) = conjunct.downcast_ref::<KeySetExpr>() {
                set.column().map(|c| (set.set().keys().len(), distinct(c.name())))
            } else {
                None
            };
            if let Some((keys, Some(distinct))) = keys {
                share *= (keys as f64 / distinct.max(1) as f64).min(1.0);
            }
        }
        // DataFusion takes a filter it cannot analyze (a key set, a long list) to pass its
        // default selectivity, in whole percent.
        let percent = (share * 100.0).ceil().clamp(1.0, 100.0) as u8;
        let priced: Arc<dyn ExecutionPlan> = Arc::new(FilterExec::try_new(Arc::clone(filter.predicate()), Arc::clone(&self.root))?.with_default_selectivity(percent)?);
        let prediction = self.pricing.predict(&priced, &self.partitions);
        if prediction.seconds >= self.passthrough_s {
            return Ok(false);
        }
        let _ = self.ran.set(prediction);
        Ok(true)
    }
}

/// The leaves of a fragment plan, in plan order.
pub fn leaves(root: &Arc<dyn ExecutionPlan>) -> Vec<ScanLeafExec> {
    let mut out = Vec::new();
    root.apply(|plan| {
        if let Some(leaf) = plan.downcast_ref::<ScanLeafExec>() {
            out.push(leaf.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("visiting a plan cannot fail");
    out
}

impl DisplayAs for FragmentExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let mut nodes: Vec<&str> = self.partitions().iter().map(|p| p.node.name()).collect();
        nodes.dedup();
        let segments: usize = self.partitions().iter().flat_map(|p| p.leaves.iter().map(|(_, s)| s.len())).sum();
        let mode = if self.is_passthrough() { "passthrough (stored bytes, decoded on the host)" } else { "pushdown" };
        write!(f, "FragmentExec: {mode}, nodes=[{}], partitions={}, segments={segments}", nodes.join(", "), self.partitions.len())?;
        if !self.join_filters.is_empty() {
            write!(f, ", join filters={}", self.join_filters.len())?;
        }
        if !self.key_sets.is_empty() {
            write!(f, ", key sets={}", self.key_sets.len())?;
        }
        if !self.pruning_filters.is_empty() {
            write!(f, ", pruning filters={}", self.pruning_filters.len())?;
        }
        if self.link_codec != LinkCodec::None {
            write!(f, ", link codec={}", self.link_codec.name())?;
        }
        if self.demand > 0 {
            write!(f, ", memory demand={:.1} MB", self.demand as f64 / 1e6)?;
        }
        if let Some(column) = &self.ascending {
            write!(f, ", partitions in order of {column}")?;
        }
        if let Some(copy) = self.copy() {
            write!(f, ", {copy}")?;
        }
        for decision in &self.decisions {
            write!(f, ", {decision}")?;
        }
        if let Some(FragmentPrediction { seconds, bound, .. }) = self.prediction {
            write!(f, ", predicted {:.1} ms (bound: {bound})", seconds * 1e3)?;
        }
        if !self.assumed.is_empty() {
            write!(f, ", assumed: [{}]", self.assumed.join("; "))?;
        }
        // The node-side plan, innermost last, on one line; an aggregate as the node binds it
        // (ordered only by constant keys, it runs unordered).
        let mut storage_side = Vec::new();
        self.root
            .apply(|plan| {
                let op = NodeOp::of(plan.as_ref()).map_or("not a node operator", NodeOp::name);
                let bound = hide_constant_order(plan).ok().flatten();
                storage_side.push(format!("{op}: {}", displayable(bound.as_ref().unwrap_or(plan).as_ref()).one_line().to_string().trim()));
                Ok(TreeNodeRecursion::Continue)
            })
            .expect("visiting a plan cannot fail");
        write!(f, ", storage side: [{}]", storage_side.join(" <- "))
    }
}

impl ExecutionPlan for FragmentExec {
    fn name(&self) -> &str {
        "FragmentExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    /// The join filters (a walk over the plan's expressions finds the dynamic filters it reads).
    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        datafusion::physical_plan::apply_expression_roots(&self.join_filters, f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() { Ok(self) } else { internal_err!("FragmentExec has no children") }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let Some(part) = self.partitions().get(partition).cloned() else {
            return internal_err!("FragmentExec has no partition {partition}");
        };
        let root = Arc::clone(&self.root);
        let (progress, planned_bytes) = self.progress().swap_remove(partition);
        let mut join_filters = self.join_filters.clone();
        let pruning_filters = self.pruning_filters.clone();
        let key_sets = self.key_sets.clone();
        // Only a fragment that takes join filters has a choice to make.
        let filtered = !join_filters.is_empty() || !key_sets.is_empty();
        let pricing = match (&self.join_filter_pricing, self.prediction) {
            (Some(pricing), Some(FragmentPrediction { seconds: passthrough_s, .. })) if filtered => {
                Some(JoinFilterDecision { pricing: Arc::clone(pricing), passthrough_s, root: Arc::clone(&self.root), partitions: self.partitions().to_vec(), ran: Arc::clone(&self.run_time_prediction) })
            }
            _ => None,
        };
        let counter = |name: &'static str| MetricBuilder::new(&self.metrics).counter(name, partition);
        let counters = FragmentCounters {
            output_rows: MetricBuilder::new(&self.metrics).output_rows(partition),
            node: std::array::from_fn(|i| counter(scan_counter::ALL[i].0)),
        };
        let node = Arc::clone(&part.node);
        let host_dropped = counter(metric::KEY_SET_DROPPED_ROWS);
        let join_pruned = counter(metric::JOIN_PRUNED_SEGMENTS);
        let pool = Arc::clone(context.memory_pool());
        let schema = self.schema();
        let checker = ResponseChecker {
            node_name: node.name().to_string(),
            schema: Arc::clone(&schema),
            counters,
            node_stats: Arc::clone(&self.node_stats),
            progress: progress.clone(),
            planned_bytes,
            finished: false,
        };
        let stored_schema = Arc::clone(&schema);
        let (link_codec, demand) = (self.link_codec, self.demand);
        let response = futures::stream::once(async move {
            // Decided and encoded at the first poll, not in `execute`: a join filter is
            // complete only once the join has built its hash table, which it does before it
            // polls this side.
            let mut part = part;
            if scans_leaf_columns(&root) {
                for (_, segments) in &mut part.leaves {
                    let planned = segments.len();
                    *segments = segments_within_join_bounds(&join_filters, std::mem::take(segments))?;
                    join_pruned.add(planned - segments.len());
                }
            }
            let bound = bind_leaves(&root, &part)?;
            // Passthrough reads the stored bytes and decodes them here, unless a join filter
            // turns it into a filter the node runs.
            let stored = match (root.downcast_ref::<ScanLeafExec>(), part.leaves.first()) {
                (Some(leaf), Some((version, segments))) => {
                    let mut request = leaf.leaf().clone();
                    request.version = *version;
                    let predicate = conjunction_opt(pruning_filters.iter().chain(&join_filters).cloned());
                    Some((request, segments.clone(), predicate, context))
                }
                _ => None,
            };
            // A key set that keeps most rows is tested on the host where the node would only
            // read stored bytes (embedded, or a bare leaf on a remote node): on the node it turns
            // the compressed pages the host would fetch into decoded rows (TPC-H Q13's 1.5M
            // customer keys, every order's: 545 MB of Arrow instead of 216 MB of pages, 3.7x).
            let bare = bound.is::<ScanLeafExec>();
            let (mut key_sets, mut host_key_sets): (Vec<_>, Vec<_>) = key_sets.into_iter().partition(|set| set.selective() || (!node.in_process() && !bare));
            if let Some(decision) = pricing.filter(|_| bare)
                && !decision.node_filters(&join_filters, &key_sets, &pruning_filters, node.in_process())?
            {
                // Kept on the host: the join filters there, the key sets in the host's filter.
                join_filters.clear();
                host_key_sets.append(&mut key_sets);
            }
            let fragment = with_join_filters(bound, &join_filters, &key_sets, &pruning_filters, node.in_process())?;
            let host_filter = HostKeyFilter::new(&host_key_sets, &stored_schema, host_dropped, &pool)?;
            let stream = match stored {
                Some((leaf, segments, predicate, context)) if fragment.is::<ScanLeafExec>() => {
                    stored_scan(node, &leaf, &segments, stored_schema, predicate, context, progress)?
                }
                _ => {
                    let mut encoded = if node.in_process() { built_fragment(fragment) } else { encode_fragment(fragment)? };
                    encoded.link_codec = link_codec;
                    encoded.demand = demand;
                    encoded.progress = progress;
                    node.execute(encoded).await?
                }
            };
            Ok::<_, DataFusionError>(match host_filter {
                Some(filter) => filter.apply(stream),
                None => stream,
            })
        })
        .try_flatten()
        .boxed();
        let response = self.timing.timed(partition, response, MetricBuilder::new(&self.metrics).subset_time(metric::HOST_RECEIVE_NS, partition));
        let batches = futures::stream::unfold(Some((response, checker)), |state| async move {
            let (mut response, mut checker) = state?;
            loop {
                match checker.check(response.next().await) {
                    Checked::Continue => continue,
                    Checked::End => return None,
                    Checked::Item(Ok(batch)) => return Some((Ok(batch), Some((response, checker)))),
                    Checked::Item(Err(e)) => return Some((Err(e), None)),
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Arc<Statistics>> {
        match partition {
            // The node-side plan's estimate (a pushed filter or aggregate changes the rows).
            None => Ok(crate::placement::plan_statistics(&self.root).unwrap_or_else(|| Arc::new(Statistics::new_unknown(&self.schema())))),
            Some(_) => Ok(Arc::new(Statistics::new_unknown(&self.schema()))),
        }
    }

    /// Accepts the dynamic filters of a hash join above (see `join_filters`) and, in
    /// passthrough, the filters above for pruning (see `pruning_filters`). They are reported as
    /// not pushed: the operators above apply them anyway, so a filter a node cannot use (or one
    /// a snapshot cannot ship) costs only the bytes it would have saved.
    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let filters = vec![PushedDown::No; child_pushdown_result.parent_filters.len()];
        let propagation = FilterPushdownPropagation::with_parent_pushdown_result(filters);
        let mut join_filters = Vec::new();
        let mut pruning_filters = Vec::new();
        for filter in child_pushdown_result.parent_filters.iter().map(|f| &f.filter) {
            let dynamic = snapshot_physical_expr_opt(Arc::clone(filter)).is_ok_and(|snapshot| snapshot.transformed);
            if dynamic && self.accepts_join_filters && phase == FilterPushdownPhase::Post {
                join_filters.push(Arc::clone(filter));
            } else if self.is_passthrough() && !self.pruning_filters.iter().any(|known| known == filter) {
                pruning_filters.push(Arc::clone(filter));
            }
        }
        if join_filters.is_empty() && pruning_filters.is_empty() {
            return Ok(propagation);
        }
        let mut fragment = self.with_root(Arc::clone(&self.root), None)?;
        fragment.join_filters.extend(join_filters);
        fragment.pruning_filters.extend(pruning_filters);
        Ok(propagation.with_updated_node(Arc::new(fragment)))
    }

    fn supports_limit_pushdown(&self) -> bool {
        false
    }
}

/// `batch` under `schema` when its columns are the schema's, by name and type, and their nulls
/// are allowed there. A remote node plans its fragment again from the wire, and may know more of
/// a column's nullability than the host's plan says (TPC-DS q05: a `CAST(0 AS DECIMAL)` that a
/// UNION above makes nullable); `RecordBatch::try_new` refuses a column with NULLs where the
/// schema has none.
fn conformed(batch: RecordBatch, schema: &SchemaRef) -> Option<RecordBatch> {
    let got = batch.schema();
    if got.fields() == schema.fields() {
        return Some(batch);
    }
    let same_columns = got.fields().len() == schema.fields().len()
        && got.fields().iter().zip(schema.fields()).all(|(g, w)| g.name() == w.name() && g.data_type() == w.data_type() && g.metadata() == w.metadata());
    if !same_columns {
        return None;
    }
    RecordBatch::try_new_with_options(Arc::clone(schema), batch.columns().to_vec(), &RecordBatchOptions::new().with_row_count(Some(batch.num_rows()))).ok()
}

/// Validates a node's response stream and turns its closing statistics into metrics.
struct ResponseChecker {
    node_name: String,
    schema: SchemaRef,
    counters: FragmentCounters,
    node_stats: Arc<Mutex<BTreeMap<String, ScanStats>>>,
    progress: FragmentProgress,
    /// The stored bytes the partition planned to read.
    planned_bytes: u64,
    finished: bool,
}

enum Checked {
    Item(Result<RecordBatch>),
    Continue,
    End,
}

impl ResponseChecker {
    fn check(&mut self, item: Option<Result<ScanMessage>>) -> Checked {
        let node = &self.node_name;
        match item {
            Some(Ok(ScanMessage::Batch(_))) if self.finished => {
                Checked::Item(Err(DataFusionError::Execution(format!("node {node} sent a batch after finishing the fragment"))))
            }
            Some(Ok(ScanMessage::Batch(batch))) => {
                let sent = batch.schema();
                let Some(batch) = conformed(batch, &self.schema) else {
                    return Checked::Item(Err(DataFusionError::Execution(format!(
                        "node {node} returned columns {:?}, expected {:?}",
                        sent.fields(),
                        self.schema.fields()
                    ))));
                };
                self.counters.output_rows.add(batch.num_rows());
                Checked::Item(Ok(batch))
            }
            Some(Ok(ScanMessage::Finished(stats))) => {
                self.finished = true;
                // As the node (or, for passthrough, this host's reader) counted them.
                for (count, (_, value)) in self.counters.node.iter().zip(stats.counters()) {
                    count.add(value as usize);
                }
                self.node_stats.lock().expect("stats lock").entry(node.clone()).or_default().merge(&stats);
                // Whatever it planned to read and did not (pruned), it is done with.
                self.progress.report(self.planned_bytes);
                Checked::Continue
            }
            Some(Err(e)) => {
                // A node's own error already names it.
                let message = crate::session::user_message(&e);
                let named = message.starts_with(&format!("storage node {node}"));
                Checked::Item(Err(DataFusionError::Execution(if named { message } else { format!("storage node {node}: {message}") })))
            }
            // A stream that ends without its statistics was cut off: never pass a partial
            // result on as complete.
            None if !self.finished => Checked::Item(Err(DataFusionError::Execution(format!(
                "storage node {node} ended the fragment without its final statistics (the result would be incomplete)"
            )))),
            None => Checked::End,
        }
    }
}

struct FragmentCounters {
    output_rows: Count,
    /// The node's counters, in [`scan_counter::ALL`]'s order.
    node: [Count; scan_counter::ALL.len()],
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::conformed;

    fn batch(nullable: bool, values: Vec<Option<i64>>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, nullable)]));
        let column: ArrayRef = Arc::new(Int64Array::from(values));
        RecordBatch::try_new(schema, vec![column]).expect("valid batch")
    }

    #[test]
    fn a_node_batch_is_taken_under_the_hosts_nullability_only_where_its_values_allow() {
        let nullable = batch(true, vec![Some(1)]).schema();
        let never_null = batch(false, vec![Some(1)]).schema();
        // Stricter on the node than on the host: taken, under the host's schema.
        let taken = conformed(batch(false, vec![Some(1), Some(2)]), &nullable).expect("taken");
        assert_eq!(taken.schema(), nullable);
        assert_eq!(taken.num_rows(), 2);
        // Nullable on the node: taken where no value is NULL, refused where one is.
        assert!(conformed(batch(true, vec![Some(1)]), &never_null).is_some());
        assert!(conformed(batch(true, vec![Some(1), None]), &never_null).is_none());
        // Another name or type: refused.
        let other = Arc::new(Schema::new(vec![Field::new("j", DataType::Int64, true)]));
        assert!(conformed(batch(true, vec![Some(1)]), &other).is_none());
        let wider = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, true)]));
        assert!(conformed(batch(true, vec![Some(1)]), &wider).is_none());
    }
}
