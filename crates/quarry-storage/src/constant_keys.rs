//! Aggregates grouped by keys their input holds constant run as plain hash aggregates.
//!
//! A filter such as `d_year = 2000` makes `d_year` a constant of every plan above it (a join
//! keeps its build side's constants; DataFusion also infers constants from statistics, where
//! a filter's range leaves one value). DataFusion counts a constant group key as an ordered
//! one: `GROUP BY d_year, ss_item_sk` runs with `ordering_mode=PartiallySorted([0])`, through
//! its ordered aggregate streams. Those emit a group only when the ordered keys move on, which
//! a constant never does, so the order buys nothing; and they cost more than the plain hash
//! aggregate: they never skip a partial aggregation that does not reduce, and keep streaming
//! group values. TPC-DS q78 at SF 1, its store-sales CTE (500K rows into 490K groups): partial
//! aggregate 210 -> 16 ms, final 200 -> 59 ms as a plain hash aggregate.
//!
//! The rule puts a [`HideConstantsExec`] below an aggregate whose ordered group keys are all
//! constants of its input, and rebuilds the aggregate over it; the aggregate then sees its
//! input unordered. The constants stay true of the rows (nothing reorders or changes them), so
//! no decision taken above on their account becomes wrong; only the aggregates above stop
//! treating them as an order. The host's plan gets it from [`ConstantKeysRule`]; a node, for
//! the partial aggregates of the fragments it runs, when it binds them ([`hide_constant_order`]).

use std::fmt;
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::internal_err;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::execution_plan::{CardinalityEffect, replace_children_if_necessary};
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, InputOrderMode, PlanProperties, Statistics};

/// Physical rule: an aggregate whose input is ordered only by constant group keys aggregates
/// its input as unordered (see the module docs). Runs on the host's finished plan.
#[derive(Debug, Default)]
pub struct ConstantKeysRule;

impl PhysicalOptimizerRule for ConstantKeysRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(plan.transform_up(|node| Ok(hide_constant_order(&node)?.map_or_else(|| Transformed::no(node), Transformed::yes)))?.data)
    }

    fn name(&self) -> &str {
        "quarry_constant_keys"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `node` over its input with the constants hidden, if it is an aggregate ordered only by
/// constant group keys and needs no order of its own.
pub fn hide_constant_order(node: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(aggregate) = node.downcast_ref::<AggregateExec>() else { return Ok(None) };
    // Sorted: every key is ordered; if all are constant there is one group, cheap either way.
    let InputOrderMode::PartiallySorted(ordered) = aggregate.input_order_mode() else { return Ok(None) };
    // An order-sensitive aggregate (`array_agg(x ORDER BY y)`) or a limit reads the order.
    if aggregate.aggr_expr().iter().any(|a| !a.order_bys().is_empty()) || aggregate.limit_options().is_some() {
        return Ok(None);
    }
    let input = aggregate.input();
    let equivalence = &input.properties().eq_properties;
    let keys = aggregate.group_expr().expr();
    if !ordered.iter().all(|&i| equivalence.is_expr_constant(&keys[i].0).is_some()) {
        return Ok(None);
    }
    let hidden: Arc<dyn ExecutionPlan> = Arc::new(HideConstantsExec::new(Arc::clone(input)));
    Ok(Some(replace_children_if_necessary(Arc::clone(node), vec![hidden])?))
}

/// Passes its input through unchanged, declaring no constants and no order: the aggregate above
/// it then runs as a plain hash aggregate. Partitioning, emission and statistics are its input's.
#[derive(Debug)]
pub struct HideConstantsExec {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl HideConstantsExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let inner = input.properties();
        let properties = PlanProperties::new(EquivalenceProperties::new(input.schema()), inner.partitioning.clone(), inner.emission_type, inner.boundedness);
        HideConstantsExec { input, properties: Arc::new(properties) }
    }

    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl DisplayAs for HideConstantsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "HideConstantsExec")
    }
}

impl ExecutionPlan for HideConstantsExec {
    fn name(&self) -> &str {
        "HideConstantsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        match <[_; 1]>::try_from(children) {
            Ok([input]) => Ok(Arc::new(HideConstantsExec::new(input))),
            Err(_) => internal_err!("HideConstantsExec has one input"),
        }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn statistics_from_inputs(&self, input_stats: &[Arc<Statistics>], _args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        match input_stats {
            [input] => Ok(Arc::clone(input)),
            _ => internal_err!("HideConstantsExec has one input"),
        }
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::Equal
    }
}
