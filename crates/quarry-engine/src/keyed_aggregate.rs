//! Aggregation in one step where a fragment's partitions already hold disjoint keys.
//!
//! DataFusion aggregates in two steps: a partial aggregate per input partition, a hash
//! repartition on the group keys, and a final aggregate. When one of the group keys is a
//! column whose values the fragment's partitions hold in disjoint ranges (the segments'
//! bounds say so: a table stored in key order, split into contiguous runs of segments), every
//! group lives in one partition, and each partition can compute its groups' final values at
//! once (`AggregateMode::SinglePartitioned`): TPC-H Q18's 15M groups by `l_orderkey` were
//! aggregated twice and shuffled once. Where the partitions also stream their rows in that
//! column's order (each segment written in order, read as stored), the fragment declares it,
//! and DataFusion's aggregate then streams (`ordering_mode=Sorted`): it emits each group when
//! the key moves past it, so its hash table holds a few groups instead of millions.
//!
//! The rule runs after DataFusion's own (and after its plan checks, which know only hash
//! partitioning): it establishes the distribution the single-step aggregate needs itself.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::physical_expr::Partitioning;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;

use crate::scan::{FragmentExec, KeyRange};

/// Physical rule: a final aggregate over a hash repartition over a partial aggregate whose
/// input's partitions hold disjoint values of a group key becomes one single-step aggregate
/// per partition (see the module docs).
#[derive(Debug, Default)]
pub struct KeyedAggregateRule;

impl PhysicalOptimizerRule for KeyedAggregateRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(plan.transform_up(|node| Ok(single_step(&node)?.map_or_else(|| Transformed::no(node), Transformed::yes)))?.data)
    }

    fn name(&self) -> &str {
        "quarry_keyed_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `node` as one aggregate step, if it is the final step of an aggregate whose input holds
/// disjoint keys per partition.
fn single_step(node: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(last) = node.downcast_ref::<AggregateExec>() else { return Ok(None) };
    if *last.mode() != AggregateMode::FinalPartitioned {
        return Ok(None);
    }
    let Some(repartition) = last.input().downcast_ref::<RepartitionExec>() else { return Ok(None) };
    if !matches!(repartition.partitioning(), Partitioning::Hash(..)) {
        return Ok(None);
    }
    let Some(partial) = repartition.input().downcast_ref::<AggregateExec>() else { return Ok(None) };
    if *partial.mode() != AggregateMode::Partial || !partial.group_expr().is_single() {
        return Ok(None);
    }
    let input = partial.input();
    let mut disjoint_key = None;
    for (expr, _) in partial.group_expr().expr() {
        let Some(column) = expr.downcast_ref::<Column>() else { continue };
        if let Some(ranges) = key_ranges(input, column.index())?
            && disjoint(ranges)
        {
            disjoint_key = Some(column.index());
            break;
        }
    }
    let Some(key) = disjoint_key else { return Ok(None) };
    let input = in_key_order(input, key)?.unwrap_or_else(|| Arc::clone(input));
    let aggregate = AggregateExec::try_new(
        AggregateMode::SinglePartitioned,
        partial.group_expr().clone(),
        partial.aggr_expr().to_vec(),
        partial.filter_expr().to_vec(),
        input,
        partial.input_schema(),
    )?
    .with_limit_options(last.limit_options());
    // The final step's output is what the plan above expects, by name and type.
    if aggregate.schema().fields() != last.schema().fields() {
        return Ok(None);
    }
    Ok(Some(Arc::new(aggregate)))
}

/// Whether no two ranges overlap: each key value lies in one partition.
fn disjoint(mut ranges: Vec<KeyRange>) -> bool {
    ranges.sort_by(|a, b| a.min.partial_cmp(&b.min).unwrap_or(std::cmp::Ordering::Equal));
    ranges.windows(2).all(|pair| pair[0].max < pair[1].min)
}

/// The operator that reads output column `column` of `plan` from its input unchanged, with
/// the input's column index, if it keeps each row in its partition.
fn passes_column(plan: &Arc<dyn ExecutionPlan>, column: usize) -> Option<(&Arc<dyn ExecutionPlan>, usize)> {
    if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        let source = projection.expr().get(column)?.expr.downcast_ref::<Column>()?;
        return Some((projection.input(), source.index()));
    }
    if let Some(filter) = plan.downcast_ref::<FilterExec>() {
        return Some((filter.input(), filter.projection().as_ref().map_or(column, |p| p[column])));
    }
    None
}

/// Per partition, the range of output column `column` of `plan`, if it comes unchanged from
/// a fragment's column whose segments record their bounds.
fn key_ranges(plan: &Arc<dyn ExecutionPlan>, column: usize) -> Result<Option<Vec<KeyRange>>> {
    if let Some(fragment) = plan.downcast_ref::<FragmentExec>() {
        return fragment.key_ranges(plan.schema().field(column).name());
    }
    match passes_column(plan, column) {
        Some((input, column)) => key_ranges(input, column),
        None => Ok(None),
    }
}

/// `plan` with its fragment declaring its partitions' rows ascending in the key, if they are.
fn in_key_order(plan: &Arc<dyn ExecutionPlan>, column: usize) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(fragment) = plan.downcast_ref::<FragmentExec>() {
        return Ok(fragment.with_ascending_output(column)?.map(|f| Arc::new(f) as Arc<dyn ExecutionPlan>));
    }
    let Some((input, input_column)) = passes_column(plan, column) else { return Ok(None) };
    match in_key_order(input, input_column)? {
        Some(input) => Ok(Some(replace_children_if_necessary(Arc::clone(plan), vec![input])?)),
        None => Ok(None),
    }
}
