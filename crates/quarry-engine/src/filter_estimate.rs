//! Filter estimates for the physical plan: a physical optimizer rule that gives each filter
//! directly above a table scan the selectivity Quarry's cardinality model estimates for it
//! ([`crate::cardinality::scan_selectivity`]) as its default selectivity.
//!
//! DataFusion's filter analysis estimates only conjunctions of comparisons of columns with
//! literals; for anything else (an `OR`, a comparison of two columns) it keeps a fixed 20% of the
//! rows. TPC-H Q12's `lineitem` filter passes 0.5%, but 20% of 60M rows looked larger than the
//! 15M `orders`, so the join built its hash table on `orders`. DataFusion chooses a join's
//! build side and mode from these estimates after the logical join order is fixed.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use quarry_storage::ScanLeafExec;

use crate::scan::FragmentExec;

/// The rule (see the module docs).
#[derive(Debug, Default)]
pub struct FilterEstimateRule;

impl PhysicalOptimizerRule for FilterEstimateRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(filter) = node.downcast_ref::<FilterExec>() else { return Ok(Transformed::no(node)) };
            let selectivity = filter
                .input()
                .downcast_ref::<FragmentExec>()
                .and_then(|fragment| fragment.root().downcast_ref::<ScanLeafExec>())
                .and_then(ScanLeafExec::filter_selectivity);
            let Some(selectivity) = selectivity else { return Ok(Transformed::no(node)) };
            // Whole percents; a filter estimated to pass almost nothing still passes some.
            let percent = (selectivity * 100.0).round().clamp(1.0, 100.0) as u8;
            if percent == filter.default_selectivity() {
                return Ok(Transformed::no(node));
            }
            Ok(Transformed::yes(Arc::new(FilterExecBuilder::from(filter).with_default_selectivity(percent).build()?) as Arc<dyn ExecutionPlan>))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "quarry_filter_estimate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
