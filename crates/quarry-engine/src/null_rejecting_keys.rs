//! Outer joins made inner by a join above them: a logical optimizer rule.
//!
//! An equi-join key never matches NULL, so a join drops every row of an input it does not
//! preserve whose key is NULL. When that input is an outer join and the key is a column of its
//! null-padded side, the padded rows are dropped anyway: the outer join is an inner one (or a
//! full join a one-sided one). TPC-DS q93 writes
//!
//! ```text
//! FROM store_sales LEFT JOIN store_returns ON (...), reason WHERE sr_reason_sk = r_reason_sk
//! ```
//!
//! DataFusion's `EliminateOuterJoin` sees only a filter directly above the outer join; once the
//! comma join and its WHERE became an inner join on `sr_reason_sk = r_reason_sk`, the left join
//! stayed, and probed all 2.88M store_sales rows into store_returns before the one reason
//! filtered them. As an inner join, join ordering starts from the reason instead.
//!
//! The null-rejection analysis is DataFusion's own: the rule asks `EliminateOuterJoin` about
//! `key IS NOT NULL` over the input, which is what the join's keys imply for it.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, NullEquality, Result};
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, Filter, Join, JoinType, LogicalPlan, SubqueryAlias};
use datafusion::optimizer::eliminate_outer_join::EliminateOuterJoin;
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// The rule (see the module docs).
#[derive(Debug, Default)]
pub struct NullRejectingKeysRule;

impl OptimizerRule for NullRejectingKeysRule {
    fn name(&self) -> &str {
        "quarry_null_rejecting_join_keys"
    }

    // Top down: an outer join made inner then rejects NULL keys of its own inputs.
    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(&self, plan: LogicalPlan, config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Join(join) = plan else { return Ok(Transformed::no(plan)) };
        // A null-aware anti join (NOT IN) answers differently when its build side holds a NULL.
        if join.on.is_empty() || join.null_equality != NullEquality::NullEqualsNothing || join.null_aware {
            return Ok(Transformed::no(LogicalPlan::Join(join)));
        }
        let (left_rejects, right_rejects) = drops_null_keys(join.join_type);
        let left = if left_rejects { outer_joins_made_inner(&join.left, join.on.iter().map(|(l, _)| l), config)? } else { None };
        let right = if right_rejects { outer_joins_made_inner(&join.right, join.on.iter().map(|(_, r)| r), config)? } else { None };
        if left.is_none() && right.is_none() {
            return Ok(Transformed::no(LogicalPlan::Join(join)));
        }
        // The inputs keep their schemas (the padded side's fields stay nullable), so the join's
        // schema stands.
        let left = left.unwrap_or_else(|| Arc::clone(&join.left));
        let right = right.unwrap_or_else(|| Arc::clone(&join.right));
        Ok(Transformed::yes(LogicalPlan::Join(Join { left, right, ..join })))
    }
}

/// Whether a join of this type drops the rows of its (left, right) input whose key is NULL:
/// it does for each input it does not preserve.
fn drops_null_keys(join_type: JoinType) -> (bool, bool) {
    match join_type {
        JoinType::Inner | JoinType::LeftSemi | JoinType::RightSemi => (true, true),
        JoinType::Left | JoinType::LeftAnti => (false, true),
        JoinType::Right | JoinType::RightAnti => (true, false),
        // A mark join's mark tells a NULL key's row apart (IN's three-valued answer).
        JoinType::Full | JoinType::LeftMark | JoinType::RightMark => (false, false),
    }
}

/// `input` with the outer joins that `keys IS NOT NULL` makes inner rewritten, if there are any.
fn outer_joins_made_inner<'a>(input: &Arc<LogicalPlan>, keys: impl Iterator<Item = &'a Expr>, config: &dyn OptimizerConfig) -> Result<Option<Arc<LogicalPlan>>> {
    let Some(predicate) = conjunction(keys.map(|key| key.clone().is_not_null())) else { return Ok(None) };
    made_inner(input, predicate, config)
}

fn made_inner(input: &Arc<LogicalPlan>, predicate: Expr, config: &dyn OptimizerConfig) -> Result<Option<Arc<LogicalPlan>>> {
    // `EliminateOuterJoin` looks through projections, not through a subquery's alias: the
    // predicate is restated over the aliased input (its columns in the same positions).
    if let LogicalPlan::SubqueryAlias(alias) = input.as_ref() {
        let inner = alias.input.schema();
        let predicate = predicate
            .transform(|expr| match expr {
                Expr::Column(column) => {
                    let at = alias.schema.index_of_column(&column)?;
                    Ok(Transformed::yes(Expr::Column(Column::from(inner.qualified_field(at)))))
                }
                other => Ok(Transformed::no(other)),
            })?
            .data;
        return match made_inner(&alias.input, predicate, config)? {
            Some(rewritten) => Ok(Some(Arc::new(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(rewritten, alias.alias.clone())?)))),
            None => Ok(None),
        };
    }
    let filter = LogicalPlan::Filter(Filter::try_new(predicate, Arc::clone(input))?);
    match EliminateOuterJoin::new().rewrite(filter, config)? {
        Transformed { transformed: true, data: LogicalPlan::Filter(filter), .. } => Ok(Some(filter.input)),
        _ => Ok(None),
    }
}
