//! Cardinality estimates over logical plans, for join ordering.
//!
//! The inputs are what the table layer keeps: row counts, per-column bounds, NULL counts and
//! distinct counts (the manifest's HyperLogLog sketches, see `quarry_table::DistinctSketch`).
//! The rules are the textbook ones (Selinger et al. 1979; the distinct-value join estimate of
//! System R, as DataFusion's physical statistics use it): a predicate `col = literal` keeps
//! `1 / distinct(col)` of the rows, a range keeps its share of `[min, max]`, conjuncts multiply,
//! and a join keeps `|L| |R| / max(distinct(L.key), distinct(R.key))`, a composite key's
//! distinct count being the product of its columns' capped by the rows.

use std::collections::HashMap;

use arrow::datatypes::Schema;
use datafusion::common::stats::Precision;
use datafusion::common::{Column, ColumnStatistics, ScalarValue, Statistics};
use datafusion::logical_expr::utils::conjunction;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::{Expr, JoinType, LogicalPlan, Operator};

use crate::provider::StorageTable;

/// Selectivity of a predicate the rules below do not cover (DuckDB and DataFusion use 0.2).
const DEFAULT_SELECTIVITY: f64 = 0.2;
/// Selectivity of `LIKE` with a pattern.
const LIKE_SELECTIVITY: f64 = 0.1;
/// Rows assumed for a plan nothing is known about.
const UNKNOWN_ROWS: f64 = 1e6;

/// What is known of one column of a plan's output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ColumnEstimate {
    /// Distinct non-NULL values.
    pub distinct: f64,
    /// Bounds, for numeric, decimal and date columns.
    pub min: Option<f64>,
    /// See `min`.
    pub max: Option<f64>,
    /// Share of NULLs.
    pub null_fraction: f64,
}

/// Estimated rows and column statistics of a plan's output.
#[derive(Debug, Clone)]
pub struct Estimate {
    /// Rows.
    pub rows: f64,
    /// Per output column (by qualified name).
    pub columns: HashMap<Column, ColumnEstimate>,
}

impl ColumnEstimate {
    /// The estimate of a column of a table of `rows` rows from its statistics.
    fn of(stats: &ColumnStatistics, rows: f64) -> Self {
        let nulls = stats.null_count.get_value().map_or(0.0, |&n| n as f64);
        let distinct = match stats.distinct_count {
            Precision::Exact(d) | Precision::Inexact(d) => d as f64,
            Precision::Absent => rows - nulls,
        };
        ColumnEstimate {
            distinct: distinct.max(1.0),
            min: stats.min_value.get_value().and_then(as_number),
            max: stats.max_value.get_value().and_then(as_number),
            null_fraction: if rows > 0.0 { nulls / rows } else { 0.0 },
        }
    }
}

/// The share of a table's rows that pass `filters` (ANDed), estimated from the table's
/// `statistics` (`schema`'s columns): what a scan's filters keep, for the physical plan's
/// estimates where DataFusion's own analysis gives up.
pub fn scan_selectivity(filters: &[Expr], statistics: &Statistics, schema: &Schema) -> Option<f64> {
    let predicate = conjunction(filters.iter().cloned())?;
    let rows = statistics.num_rows.get_value().map_or(UNKNOWN_ROWS, |&n| n as f64);
    let columns = predicate
        .column_refs()
        .into_iter()
        .filter_map(|column| {
            let stats = statistics.column_statistics.get(schema.index_of(&column.name).ok()?)?;
            Some((column.clone(), ColumnEstimate::of(stats, rows)))
        })
        .collect();
    Some(selectivity(&predicate, &Estimate { rows, columns }))
}

impl Estimate {
    fn unknown(plan: &LogicalPlan, rows: f64) -> Self {
        let columns = plan.schema().columns().into_iter().map(|c| (c, ColumnEstimate { distinct: rows.max(1.0), min: None, max: None, null_fraction: 0.0 })).collect();
        Estimate { rows, columns }
    }

    /// The estimate of `column`; unknown columns are taken as unique.
    pub fn column(&self, column: &Column) -> ColumnEstimate {
        self.columns
            .get(column)
            .or_else(|| self.columns.iter().find(|(c, _)| c.name == column.name && column.relation.is_none()).map(|(_, e)| e))
            .copied()
            .unwrap_or(ColumnEstimate { distinct: self.rows.max(1.0), min: None, max: None, null_fraction: 0.0 })
    }

    /// Distinct values of the combination of `columns`: the product of theirs, at most the rows.
    pub fn distinct_of(&self, columns: &[Column]) -> f64 {
        let product: f64 = columns.iter().map(|c| self.column(c).distinct.max(1.0)).product();
        product.min(self.rows.max(1.0))
    }

    /// The same estimate with `rows` kept in place of `self.rows` by a predicate (or join) that
    /// does not look at the columns: each column keeps the distinct values expected among the
    /// rows that remain.
    fn scaled(&self, rows: f64) -> Estimate {
        let keep = if self.rows > 0.0 { (rows / self.rows).clamp(0.0, 1.0) } else { 0.0 };
        let columns = self
            .columns
            .iter()
            .map(|(c, e)| {
                let per_value = self.rows / e.distinct.max(1.0);
                let distinct = e.distinct * (1.0 - (1.0 - keep).powf(per_value.max(1.0)));
                (c.clone(), ColumnEstimate { distinct: distinct.clamp(rows.min(1.0), rows.max(1.0)), ..*e })
            })
            .collect();
        Estimate { rows, columns }
    }
}

/// The estimated output of `plan`.
pub fn estimate(plan: &LogicalPlan) -> Estimate {
    match plan {
        LogicalPlan::TableScan(scan) => {
            let provider = source_as_provider(&scan.source).ok();
            // A stored table's statistics are read in place; another provider's are copied.
            let owned;
            let statistics = match provider.as_ref().and_then(|p| p.downcast_ref::<StorageTable>()) {
                Some(table) => table.table_statistics(),
                None => match provider.and_then(|p| p.statistics()) {
                    Some(s) => {
                        owned = s;
                        &owned
                    }
                    None => return Estimate::unknown(plan, UNKNOWN_ROWS),
                },
            };
            let rows = statistics.num_rows.get_value().map_or(UNKNOWN_ROWS, |&n| n as f64);
            let source_schema = scan.source.schema();
            let mut columns = HashMap::new();
            for column in plan.schema().columns() {
                let Ok(index) = source_schema.index_of(&column.name) else { continue };
                let Some(stats) = statistics.column_statistics.get(index) else { continue };
                columns.insert(column, ColumnEstimate::of(stats, rows));
            }
            let estimate = Estimate { rows, columns };
            match scan.fetch {
                Some(fetch) if (fetch as f64) < rows => estimate.scaled(fetch as f64),
                _ => estimate,
            }
        }
        LogicalPlan::Filter(filter) => filtered(estimate(&filter.input), &filter.predicate),
        LogicalPlan::Projection(projection) => {
            let input = estimate(&projection.input);
            let columns = projection
                .expr
                .iter()
                .zip(plan.schema().columns())
                .map(|(expr, out)| {
                    let value = match expr.clone().unalias() {
                        Expr::Column(c) => input.column(&c),
                        _ => ColumnEstimate { distinct: input.rows.max(1.0), min: None, max: None, null_fraction: 0.0 },
                    };
                    (out, value)
                })
                .collect();
            Estimate { rows: input.rows, columns }
        }
        LogicalPlan::SubqueryAlias(_) | LogicalPlan::Sort(_) | LogicalPlan::Repartition(_) => {
            let input = estimate(plan.inputs()[0]);
            renamed(plan, &input, input.rows)
        }
        LogicalPlan::Limit(limit) => {
            let input = estimate(&limit.input);
            let fetch = limit.get_fetch_type().ok().and_then(|f| match f {
                datafusion::logical_expr::logical_plan::FetchType::Literal(n) => n,
                _ => None,
            });
            let rows = fetch.map_or(input.rows, |n| input.rows.min(n as f64));
            renamed(plan, &input.scaled(rows), rows)
        }
        LogicalPlan::Aggregate(aggregate) => {
            let input = estimate(&aggregate.input);
            let groups: Vec<Column> = aggregate.group_expr.iter().filter_map(|e| match e.clone().unalias() {
                Expr::Column(c) => Some(c),
                _ => None,
            }).collect();
            let rows = if aggregate.group_expr.is_empty() {
                1.0
            } else if groups.len() == aggregate.group_expr.len() {
                input.distinct_of(&groups)
            } else {
                input.rows.max(1.0)
            };
            let columns = per_output(plan, |i| match groups.get(i) {
                Some(g) if i < aggregate.group_expr.len() => {
                    let e = input.column(g);
                    ColumnEstimate { distinct: e.distinct.min(rows), ..e }
                }
                _ => ColumnEstimate { distinct: rows, min: None, max: None, null_fraction: 0.0 },
            });
            Estimate { rows, columns }
        }
        LogicalPlan::Distinct(_) => {
            let input = estimate(plan.inputs()[0]);
            let all: Vec<Column> = input.columns.keys().cloned().collect();
            let rows = input.distinct_of(&all);
            renamed(plan, &input.scaled(rows), rows)
        }
        LogicalPlan::Join(join) => {
            let (left, right) = (estimate(&join.left), estimate(&join.right));
            let keys: Vec<(Column, Column)> = join
                .on
                .iter()
                .filter_map(|(l, r)| match (l.clone().unalias(), r.clone().unalias()) {
                    (Expr::Column(l), Expr::Column(r)) => Some((l, r)),
                    _ => None,
                })
                .collect();
            let inner = join_rows(&left, &right, &keys);
            let matched_share = |probe: &Estimate, build: &Estimate, probe_keys: Vec<Column>, build_keys: Vec<Column>| {
                (build.distinct_of(&build_keys) / probe.distinct_of(&probe_keys)).clamp(0.0, 1.0)
            };
            let left_keys: Vec<Column> = keys.iter().map(|(l, _)| l.clone()).collect();
            let right_keys: Vec<Column> = keys.iter().map(|(_, r)| r.clone()).collect();
            let (rows, base) = match join.join_type {
                JoinType::Inner => (inner, None),
                JoinType::Left => (inner.max(left.rows), None),
                JoinType::Right => (inner.max(right.rows), None),
                JoinType::Full => (inner.max(left.rows).max(right.rows), None),
                JoinType::LeftSemi => (left.rows * matched_share(&left, &right, left_keys, right_keys), Some(&left)),
                JoinType::LeftAnti => (left.rows * (1.0 - matched_share(&left, &right, left_keys, right_keys)).max(0.1), Some(&left)),
                JoinType::RightSemi => (right.rows * matched_share(&right, &left, right_keys, left_keys), Some(&right)),
                JoinType::RightAnti => (right.rows * (1.0 - matched_share(&right, &left, right_keys, left_keys)).max(0.1), Some(&right)),
                JoinType::LeftMark | JoinType::RightMark => (left.rows.max(right.rows), None),
            };
            let rows = match &join.filter {
                Some(filter) => rows * selectivity(filter, &merged(&left, &right)),
                None => rows,
            };
            match base {
                Some(side) => renamed(plan, &side.scaled(rows), rows),
                None => merged(&left, &right).scaled(rows),
            }
        }
        LogicalPlan::Union(union) => {
            let rows = union.inputs.iter().map(|i| estimate(i).rows).sum();
            Estimate::unknown(plan, rows)
        }
        LogicalPlan::EmptyRelation(empty) => Estimate::unknown(plan, if empty.produce_one_row { 1.0 } else { 0.0 }),
        LogicalPlan::Values(values) => Estimate::unknown(plan, values.values.len() as f64),
        other => {
            let rows = other.inputs().iter().map(|i| estimate(i).rows).fold(0.0, f64::max);
            Estimate::unknown(plan, if rows > 0.0 { rows } else { UNKNOWN_ROWS })
        }
    }
}

/// Rows of an inner equi-join of `left` and `right` on `keys` (left column, right column).
pub fn join_rows(left: &Estimate, right: &Estimate, keys: &[(Column, Column)]) -> f64 {
    if keys.is_empty() {
        return left.rows * right.rows;
    }
    let left_keys: Vec<Column> = keys.iter().map(|(l, _)| l.clone()).collect();
    let right_keys: Vec<Column> = keys.iter().map(|(_, r)| r.clone()).collect();
    let nulls = |e: &Estimate, cols: &[Column]| cols.iter().map(|c| 1.0 - e.column(c).null_fraction).product::<f64>();
    let distinct = left.distinct_of(&left_keys).max(right.distinct_of(&right_keys)).max(1.0);
    left.rows * nulls(left, &left_keys) * right.rows * nulls(right, &right_keys) / distinct
}

/// `input` after keeping the rows that satisfy `predicate`.
pub fn filtered(input: Estimate, predicate: &Expr) -> Estimate {
    let rows = input.rows * selectivity(predicate, &input);
    let mut out = input.scaled(rows);
    // A column compared for equality with a literal has one value left.
    for conjunct in datafusion::logical_expr::utils::split_conjunction(predicate) {
        let Expr::BinaryExpr(b) = conjunct else { continue };
        if b.op != Operator::Eq {
            continue;
        }
        let column = match (column_of(&b.left), literal_of(&b.right), column_of(&b.right), literal_of(&b.left)) {
            (Some(c), Some(_), _, _) | (_, _, Some(c), Some(_)) => c,
            _ => continue,
        };
        if let Some(e) = out.columns.get_mut(column) {
            e.distinct = 1.0;
        }
    }
    out
}

/// The columns of `left` and `right` side by side (a join's output).
fn merged(left: &Estimate, right: &Estimate) -> Estimate {
    let mut columns = left.columns.clone();
    columns.extend(right.columns.iter().map(|(c, e)| (c.clone(), *e)));
    Estimate { rows: left.rows * right.rows, columns }
}

/// `input`'s column estimates under `plan`'s output names (positionally), with `rows`.
fn renamed(plan: &LogicalPlan, input: &Estimate, rows: f64) -> Estimate {
    let input_columns = plan.inputs().first().map(|i| i.schema().columns()).unwrap_or_default();
    let columns = per_output(plan, |i| {
        let value = input_columns.get(i).map(|c| input.column(c)).unwrap_or(ColumnEstimate { distinct: rows.max(1.0), min: None, max: None, null_fraction: 0.0 });
        ColumnEstimate { distinct: value.distinct.min(rows.max(1.0)), ..value }
    });
    Estimate { rows, columns }
}

/// The estimates of `plan`'s output columns, the `i`th given by `column(i)`.
fn per_output(plan: &LogicalPlan, column: impl Fn(usize) -> ColumnEstimate) -> HashMap<Column, ColumnEstimate> {
    plan.schema().columns().into_iter().enumerate().map(|(i, out)| (out, column(i))).collect()
}

/// The share of rows of `input` that satisfy `predicate`.
pub fn selectivity(predicate: &Expr, input: &Estimate) -> f64 {
    let s = match predicate {
        Expr::BinaryExpr(b) => match b.op {
            Operator::And => selectivity(&b.left, input) * selectivity(&b.right, input),
            Operator::Or => {
                let (l, r) = (selectivity(&b.left, input), selectivity(&b.right, input));
                l + r - l * r
            }
            Operator::Eq | Operator::NotEq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq => comparison(&b.left, b.op, &b.right, input),
            _ => DEFAULT_SELECTIVITY,
        },
        Expr::Not(inner) => 1.0 - selectivity(inner, input),
        Expr::Between(between) => match (column_of(&between.expr), literal_of(&between.low), literal_of(&between.high)) {
            (Some(c), Some(low), Some(high)) => {
                let e = input.column(c);
                let inside = range_share(&e, Some(low), Some(high)).unwrap_or(DEFAULT_SELECTIVITY);
                if between.negated { 1.0 - inside } else { inside }
            }
            _ => DEFAULT_SELECTIVITY,
        },
        Expr::InList(list) => match column_of(&list.expr) {
            Some(c) => {
                let share = (list.list.len() as f64 / input.column(c).distinct.max(1.0)).min(1.0);
                if list.negated { 1.0 - share } else { share }
            }
            None => DEFAULT_SELECTIVITY,
        },
        Expr::Like(like) | Expr::SimilarTo(like) => {
            if like.negated { 1.0 - LIKE_SELECTIVITY } else { LIKE_SELECTIVITY }
        }
        Expr::IsNull(inner) => column_of(inner).map_or(DEFAULT_SELECTIVITY, |c| input.column(c).null_fraction),
        Expr::IsNotNull(inner) => column_of(inner).map_or(1.0 - DEFAULT_SELECTIVITY, |c| 1.0 - input.column(c).null_fraction),
        Expr::Literal(ScalarValue::Boolean(Some(b)), _) => *b as u8 as f64,
        Expr::Alias(alias) => selectivity(&alias.expr, input),
        _ => DEFAULT_SELECTIVITY,
    };
    s.clamp(0.0, 1.0)
}

/// Selectivity of `left op right`.
fn comparison(left: &Expr, op: Operator, right: &Expr, input: &Estimate) -> f64 {
    // Put the column on the left.
    let (column, op, other) = match (column_of(left), column_of(right)) {
        (Some(c), _) => (c, op, right),
        (None, Some(c)) => (c, op.swap().unwrap_or(op), left),
        _ => return DEFAULT_SELECTIVITY,
    };
    let e = input.column(column);
    let non_null = 1.0 - e.null_fraction;
    if let Some(other_column) = column_of(other) {
        let o = input.column(other_column);
        return match op {
            Operator::Eq => non_null / e.distinct.max(o.distinct).max(1.0),
            Operator::NotEq => non_null * (1.0 - 1.0 / e.distinct.max(o.distinct).max(1.0)),
            _ => non_null / 3.0,
        };
    }
    let Some(value) = literal_of(other) else { return DEFAULT_SELECTIVITY };
    let equal = non_null / e.distinct.max(1.0);
    match op {
        Operator::Eq => equal,
        Operator::NotEq => non_null - equal,
        Operator::Lt | Operator::LtEq => non_null * range_share(&e, None, Some(value)).map_or(1.0 / 3.0, |s| s.max(equal)),
        Operator::Gt | Operator::GtEq => non_null * range_share(&e, Some(value), None).map_or(1.0 / 3.0, |s| s.max(equal)),
        _ => DEFAULT_SELECTIVITY,
    }
}

/// The share of a column's `[min, max]` that `[low, high]` covers (values taken as uniform).
fn range_share(e: &ColumnEstimate, low: Option<&ScalarValue>, high: Option<&ScalarValue>) -> Option<f64> {
    let (min, max) = (e.min?, e.max?);
    let low = low.map_or(Some(min), as_number)?.max(min);
    let high = high.map_or(Some(max), as_number)?.min(max);
    if high < low {
        return Some(0.0);
    }
    // Integers: a range of k values out of `max - min + 1`.
    let width = max - min;
    Some(if width <= 0.0 { 1.0 } else { ((high - low + 1.0) / (width + 1.0)).clamp(0.0, 1.0) })
}

/// The column an expression reads, looking through casts.
fn column_of(expr: &Expr) -> Option<&Column> {
    match expr {
        Expr::Column(c) => Some(c),
        Expr::Cast(cast) => column_of(&cast.expr),
        Expr::TryCast(cast) => column_of(&cast.expr),
        Expr::Alias(alias) => column_of(&alias.expr),
        _ => None,
    }
}

/// The literal an expression is, looking through casts.
fn literal_of(expr: &Expr) -> Option<&ScalarValue> {
    match expr {
        Expr::Literal(value, _) if !value.is_null() => Some(value),
        Expr::Cast(cast) => literal_of(&cast.expr),
        Expr::TryCast(cast) => literal_of(&cast.expr),
        _ => None,
    }
}

/// A numeric, decimal or date value as a number (dates in days).
fn as_number(value: &ScalarValue) -> Option<f64> {
    use ScalarValue::*;
    Some(match value {
        Int8(Some(v)) => *v as f64,
        Int16(Some(v)) => *v as f64,
        Int32(Some(v)) => *v as f64,
        Int64(Some(v)) => *v as f64,
        UInt8(Some(v)) => *v as f64,
        UInt16(Some(v)) => *v as f64,
        UInt32(Some(v)) => *v as f64,
        UInt64(Some(v)) => *v as f64,
        Float32(Some(v)) => *v as f64,
        Float64(Some(v)) => *v,
        Decimal128(Some(v), _, scale) => *v as f64 / 10f64.powi(*scale as i32),
        Date32(Some(v)) => *v as f64,
        Date64(Some(v)) => *v as f64 / 86_400_000.0,
        _ => return None,
    })
}
