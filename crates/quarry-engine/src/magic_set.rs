//! Filter propagation into grouped subqueries (sideways information passing, "magic sets":
//! Mumick et al., SIGMOD 1990; Seshadri et al., SIGMOD 1996): a logical optimizer rule.
//!
//! A decorrelated subquery becomes an aggregate joined to the outer query on its group keys:
//! TPC-H Q17 averages `l_quantity` for every one of 2M parts, then keeps the ~2K parts the outer
//! filter selects. When a join can only keep aggregate rows whose key the other side has (an
//! inner join, or the aggregate on the filtering side of a semi, anti or outer join), rows of the
//! aggregate's *input* whose key the other side cannot produce are wasted work. Each is removed
//! before grouping by a semi join of the input with a *key source*: a part of the other side
//! (`Filter(part)` in Q17) whose key column holds every non-NULL key value the other side
//! produces. Filtering rows by a group key drops whole groups and leaves the rest as they were,
//! so results do not change.
//!
//! Key sources are found by following the key column down the other side through projections,
//! filters, aliases and joins; an inner or semi join on `a = b` also leads from `a` to `b`. The
//! source with the fewest distinct keys is taken, when the estimates ([`cardinality`]) say it
//! keeps at most half the aggregate's input and evaluating it again reads less than half the rows
//! the semi join saves. The semi join it adds is an ordinary join: the join-order rule moves it
//! onto the relation that holds the key, and at run time its build side's key set filters that
//! relation's scan on the storage node (join filters).

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, NullEquality, Result};
use datafusion::logical_expr::{Aggregate, Expr, Join, JoinType, LogicalPlan, LogicalPlanBuilder, col};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

use crate::cardinality;

/// Prefix of the alias of an added key source; an aggregate whose input has one is not
/// restricted again.
const MAGIC_ALIAS: &str = "__magic";
/// A semi join is added only if it keeps at most this share of the aggregate's input.
const MAX_KEEP: f64 = 0.5;
/// ... and if evaluating the key source reads at most this share of the rows it saves.
const MAX_COST_SHARE: f64 = 0.5;

/// The rule (see the module docs).
#[derive(Debug, Default)]
pub struct MagicSetRule;

impl OptimizerRule for MagicSetRule {
    fn name(&self) -> &str {
        "quarry_magic_set"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(&self, plan: LogicalPlan, config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Join(join) = plan else { return Ok(Transformed::no(plan)) };
        match restrict_join(&join, config)? {
            Some(rewritten) => Ok(Transformed::yes(LogicalPlan::Join(rewritten))),
            None => Ok(Transformed::no(LogicalPlan::Join(join))),
        }
    }
}

/// Which side of a join the aggregate is on.
#[derive(Clone, Copy, PartialEq)]
enum Side {
    Left,
    Right,
}

/// Whether the join drops the rows of `side` that have no partner on the other side (so they
/// cannot affect its output). Mark joins and null-aware anti joins (`NOT IN`) are not among
/// them: a NULL key on the subquery's side decides their result.
fn drops_unmatched(join_type: JoinType, side: Side) -> bool {
    use JoinType::*;
    match side {
        Side::Right => matches!(join_type, Inner | Left | LeftSemi | LeftAnti),
        Side::Left => matches!(join_type, Inner | Right | RightSemi | RightAnti),
    }
}

/// `join` with a semi join added below the aggregate on one of its sides, if one pays.
fn restrict_join(join: &Join, config: &dyn OptimizerConfig) -> Result<Option<Join>> {
    if join.null_equality != NullEquality::NullEqualsNothing || join.null_aware || join.on.is_empty() {
        return Ok(None);
    }
    for side in [Side::Right, Side::Left] {
        if !drops_unmatched(join.join_type, side) {
            continue;
        }
        let (restricted, other) = match side {
            Side::Right => (&join.right, &join.left),
            Side::Left => (&join.left, &join.right),
        };
        let mut best: Option<Choice> = None;
        for (l, r) in &join.on {
            let (Expr::Column(l), Expr::Column(r)) = (l, r) else { continue };
            let (key, other_key) = match side {
                Side::Right => (r, l),
                Side::Left => (l, r),
            };
            let Some(group) = find_group_key(restricted, key) else { continue };
            let Some(choice) = choose_source(group, other, other_key) else { continue };
            if best.as_ref().is_none_or(|b| choice.keep < b.keep) {
                best = Some(choice);
            }
        }
        let Some(choice) = best else { continue };
        let alias = config.alias_generator().next(MAGIC_ALIAS);
        let rewritten = Arc::new(add_semi_join(restricted, &choice, &alias)?);
        let mut join = join.clone();
        match side {
            Side::Right => join.right = rewritten,
            Side::Left => join.left = rewritten,
        }
        return Ok(Some(join));
    }
    Ok(None)
}

/// The aggregate below a join side and the column of its input a join key is grouped by.
struct GroupKey {
    aggregate: Aggregate,
    /// The key as a column of `aggregate.input`.
    input_column: Column,
}

/// Follows `key` from `plan`'s output down through aliases, projections and filters to an
/// aggregate that groups by it as a plain column of its input.
fn find_group_key(plan: &LogicalPlan, key: &Column) -> Option<GroupKey> {
    match plan {
        LogicalPlan::Aggregate(aggregate) => {
            let index = plan.schema().index_of_column(key).ok()?;
            let group = aggregate.group_expr.get(index)?;
            if aggregate.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_))) || has_magic_source(&aggregate.input) {
                return None;
            }
            match group.clone().unalias() {
                Expr::Column(c) => Some(GroupKey { aggregate: aggregate.clone(), input_column: c }),
                _ => None,
            }
        }
        LogicalPlan::Filter(filter) => find_group_key(&filter.input, key),
        LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) => {
            let input = plan.inputs()[0];
            find_group_key(input, &input_column(plan, key)?)
        }
        _ => None,
    }
}

/// The column of `plan`'s single input that output column `column` of a projection or alias is.
fn input_column(plan: &LogicalPlan, column: &Column) -> Option<Column> {
    let index = plan.schema().index_of_column(column).ok()?;
    match plan {
        LogicalPlan::Projection(projection) => match projection.expr.get(index)?.clone().unalias() {
            Expr::Column(c) => Some(c),
            _ => None,
        },
        LogicalPlan::SubqueryAlias(alias) => Some(Column::from(alias.input.schema().qualified_field(index))),
        _ => None,
    }
}

fn has_magic_source(plan: &LogicalPlan) -> bool {
    plan.exists(|p| Ok(matches!(p, LogicalPlan::SubqueryAlias(a) if a.alias.table().starts_with(MAGIC_ALIAS)))).unwrap_or(true)
}

/// A key source chosen for an aggregate.
struct Choice {
    group: GroupKey,
    source: LogicalPlan,
    source_column: Column,
    /// Estimated share of the aggregate's input the semi join keeps.
    keep: f64,
}

/// The cheapest key source for `other_key` in `other`, if it pays for the aggregate of `group`.
fn choose_source(group: GroupKey, other: &LogicalPlan, other_key: &Column) -> Option<Choice> {
    let mut candidates = Vec::new();
    key_sources(other, other_key, &mut candidates);
    let input = &group.aggregate.input;
    let input_estimate = cardinality::estimate(input);
    let input_distinct = input_estimate.column(&group.input_column).distinct.max(1.0);
    let key_type = input.schema().qualified_field_from_column(&group.input_column).ok()?.1.data_type().clone();
    let input_read = rows_read(input);
    let mut best: Option<(f64, f64, LogicalPlan, Column)> = None;
    for (source, column) in candidates {
        let same_type = source.schema().qualified_field_from_column(&column).is_ok_and(|(_, f)| f.data_type() == &key_type);
        if !same_type || is_volatile(&source) {
            continue;
        }
        let estimate = cardinality::estimate(&source);
        let distinct = estimate.column(&column).distinct.min(estimate.rows).max(1.0);
        let keep = (distinct / input_distinct).min(1.0);
        let cost = rows_read(&source);
        let pays = keep <= MAX_KEEP && cost <= MAX_COST_SHARE * input_read * (1.0 - keep);
        if pays && best.as_ref().is_none_or(|(k, c, ..)| (keep, cost) < (*k, *c)) {
            best = Some((keep, cost, source, column));
        }
    }
    best.map(|(keep, _, source, source_column)| Choice { group, source, source_column, keep })
}

/// Every (plan, column) whose column holds all non-NULL values `column` takes in `plan`'s output.
fn key_sources(plan: &LogicalPlan, column: &Column, out: &mut Vec<(LogicalPlan, Column)>) {
    out.push((plan.clone(), column.clone()));
    match plan {
        LogicalPlan::Filter(filter) => key_sources(&filter.input, column, out),
        LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) => {
            if let Some(c) = input_column(plan, column) {
                key_sources(plan.inputs()[0], &c, out);
            }
        }
        LogicalPlan::Join(join) if join.null_equality == NullEquality::NullEqualsNothing => {
            let in_left = join.left.schema().has_column(column);
            let in_right = !in_left && join.right.schema().has_column(column);
            // Through an equi-join condition to the other side's key, where every output row
            // with a non-NULL key had a partner.
            let partner = |ours: fn(&(Expr, Expr)) -> &Expr, theirs: fn(&(Expr, Expr)) -> &Expr| {
                join.on.iter().find_map(|pair| match (ours(pair), theirs(pair)) {
                    (Expr::Column(a), Expr::Column(b)) if a == column => Some(b.clone()),
                    _ => None,
                })
            };
            if in_left {
                key_sources(&join.left, column, out);
                if matches!(join.join_type, JoinType::Inner | JoinType::LeftSemi) && let Some(b) = partner(|p| &p.0, |p| &p.1) {
                    key_sources(&join.right, &b, out);
                }
            } else if in_right {
                key_sources(&join.right, column, out);
                if matches!(join.join_type, JoinType::Inner | JoinType::RightSemi) && let Some(a) = partner(|p| &p.1, |p| &p.0) {
                    key_sources(&join.left, &a, out);
                }
            }
        }
        _ => {}
    }
}

/// Rows the table scans under `plan` read (what evaluating it again costs).
fn rows_read(plan: &LogicalPlan) -> f64 {
    let mut rows = 0.0;
    plan.apply(|p| {
        if matches!(p, LogicalPlan::TableScan(_)) {
            rows += cardinality::estimate(p).rows;
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("the visitor does not fail");
    rows
}

fn is_volatile(plan: &LogicalPlan) -> bool {
    plan.exists(|p| Ok(p.expressions().iter().any(Expr::is_volatile))).unwrap_or(true)
}

/// `plan` with the aggregate below it reading `input ⋉ source` instead of `input`.
fn add_semi_join(plan: &LogicalPlan, choice: &Choice, alias: &str) -> Result<LogicalPlan> {
    if let LogicalPlan::Aggregate(aggregate) = plan
        && aggregate.input == choice.group.aggregate.input
    {
        let source = LogicalPlanBuilder::from(choice.source.clone())
            .project(vec![col(choice.source_column.clone()).alias(choice.source_column.name.clone())])?
            .alias(alias)?
            .build()?;
        let source_key = Column::new(Some(alias), choice.source_column.name.clone());
        let input = LogicalPlanBuilder::from(aggregate.input.as_ref().clone())
            .join(source, JoinType::LeftSemi, (vec![choice.group.input_column.clone()], vec![source_key]), None)?
            .build()?;
        let aggregate = Aggregate::try_new(Arc::new(input), aggregate.group_expr.clone(), aggregate.aggr_expr.clone())?;
        return Ok(LogicalPlan::Aggregate(aggregate));
    }
    let child = add_semi_join(plan.inputs()[0], choice, alias)?;
    plan.with_new_exprs(plan.expressions(), vec![child])
}
