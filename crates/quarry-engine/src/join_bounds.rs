//! Segments a hash join's key bounds rule out.
//!
//! A hash join hands its probe side a dynamic filter once its build side is in: the bounds of
//! the build keys (`inv_date_sk >= 2451180 AND inv_date_sk <= 2451550`) and their set. Quarry
//! ships only the key sets to a node as row filters (bounds that pass nearly every row cost
//! their evaluation for nothing, see `scan::with_join_filters`), so the bounds never reached
//! the segments: TPC-DS q72 read all 12 segments of `inventory` (11.7M rows), stored in date
//! order, for the weeks of one year in three of them. Before a fragment's partition starts (the
//! join has built by then), its segments whose bounds lie outside a join bound are left out;
//! that costs a comparison per segment and no row filter.

use std::sync::Arc;

use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_expr::{PhysicalExpr, split_conjunction};
use datafusion::physical_expr_common::physical_expr::snapshot_physical_expr;
use quarry_storage::SegmentInfo;

/// One column's bound from a join filter: its values lie within `[low, high]` (either side
/// open), strict bounds taken as inclusive (a segment is left out only when no value of it can
/// pass either way).
#[derive(Debug, Clone, PartialEq)]
struct ColumnBound {
    column: String,
    low: Option<ScalarValue>,
    high: Option<ScalarValue>,
}

/// The bounds `join_filters` put on columns in their current state; `None` when a filter is
/// the constant `false` (its join's build side is empty: nothing passes).
fn current_bounds(join_filters: &[Arc<dyn PhysicalExpr>]) -> Result<Option<Vec<ColumnBound>>> {
    let mut bounds = Vec::new();
    for filter in join_filters {
        let snapshot = snapshot_physical_expr(Arc::clone(filter))?;
        for conjunct in split_conjunction(&snapshot) {
            if let Some(literal) = conjunct.downcast_ref::<Literal>()
                && literal.value() == &ScalarValue::Boolean(Some(false))
            {
                return Ok(None);
            }
            bounds.extend(column_bound(conjunct));
        }
    }
    Ok(Some(bounds))
}

/// `column op literal` (or mirrored) as a bound on the column.
fn column_bound(conjunct: &Arc<dyn PhysicalExpr>) -> Option<ColumnBound> {
    let binary = conjunct.downcast_ref::<BinaryExpr>()?;
    let (column, op, value) = match (binary.left().downcast_ref::<Column>(), binary.right().downcast_ref::<Literal>()) {
        (Some(column), Some(literal)) => (column, *binary.op(), literal.value()),
        _ => {
            let column = binary.right().downcast_ref::<Column>()?;
            let literal = binary.left().downcast_ref::<Literal>()?;
            (column, binary.op().swap()?, literal.value())
        }
    };
    if value.is_null() {
        return None;
    }
    let (low, high) = match op {
        Operator::Gt | Operator::GtEq => (Some(value.clone()), None),
        Operator::Lt | Operator::LtEq => (None, Some(value.clone())),
        Operator::Eq => (Some(value.clone()), Some(value.clone())),
        _ => return None,
    };
    Some(ColumnBound { column: column.name().to_string(), low, high })
}

/// Whether `segment` may hold a row within `bound` (its recorded bounds say so, or it records
/// none for the column).
fn may_hold(segment: &SegmentInfo, bound: &ColumnBound) -> bool {
    let Some(stats) = segment.columns.iter().find(|c| c.name == bound.column) else { return true };
    let parse = |text: &Option<String>, like: &ScalarValue| text.as_ref().and_then(|t| ScalarValue::try_from_string(t.clone(), &like.data_type()).ok());
    if let Some(low) = &bound.low
        && let Some(max) = parse(&stats.max, low)
        && max < *low
    {
        return false;
    }
    if let Some(high) = &bound.high
        && let Some(min) = parse(&stats.min, high)
        && min > *high
    {
        return false;
    }
    true
}

/// `segments` less those the current state of `join_filters` rules out, by the segments'
/// bounds in the filters' columns (the names of the scan's columns).
pub fn segments_within_join_bounds(join_filters: &[Arc<dyn PhysicalExpr>], segments: Vec<SegmentInfo>) -> Result<Vec<SegmentInfo>> {
    if join_filters.is_empty() {
        return Ok(segments);
    }
    let Some(bounds) = current_bounds(join_filters)? else { return Ok(Vec::new()) };
    Ok(segments.into_iter().filter(|segment| bounds.iter().all(|bound| may_hold(segment, bound))).collect())
}

#[cfg(test)]
mod tests {
    use datafusion::physical_expr::expressions::lit;
    use quarry_storage::api::SegmentColumn;

    use super::*;

    fn binary(left: Arc<dyn PhysicalExpr>, op: Operator, right: Arc<dyn PhysicalExpr>) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(left, op, right))
    }

    fn segment(id: &str, min: i32, max: i32) -> SegmentInfo {
        let column = SegmentColumn { name: "k".into(), min: Some(min.to_string()), max: Some(max.to_string()), null_count: Some(0), ascending: true, bytes: None };
        SegmentInfo { id: id.into(), rows: 10, bytes: 100, columns: vec![column], zones: None, range: 0 }
    }

    fn ids(segments: &[SegmentInfo]) -> Vec<&str> {
        segments.iter().map(|s| s.id.as_str()).collect()
    }

    #[test]
    fn segments_outside_the_bounds_are_left_out() {
        let k: Arc<dyn PhysicalExpr> = Arc::new(Column::new("k", 0));
        let segments = vec![segment("a", 0, 9), segment("b", 10, 19), segment("c", 20, 29), segment("d", 30, 39)];
        // 12 <= k AND k < 20, the second one mirrored: b only; c starts at the strict bound.
        let filter = binary(binary(lit(12i32), Operator::LtEq, Arc::clone(&k)), Operator::And, binary(Arc::clone(&k), Operator::Lt, lit(20i32)));
        assert_eq!(ids(&segments_within_join_bounds(&[Arc::clone(&filter)], segments.clone()).unwrap()), ["b", "c"]);
        // A bound on a column no segment records keeps them all; `false` keeps none.
        let other = binary(Arc::new(Column::new("x", 1)), Operator::GtEq, lit(100i32));
        assert_eq!(segments_within_join_bounds(&[other], segments.clone()).unwrap().len(), 4);
        assert!(segments_within_join_bounds(&[lit(false)], segments.clone()).unwrap().is_empty());
        // Not a bound: kept.
        let unequal = binary(Arc::clone(&k), Operator::NotEq, lit(5i32));
        assert_eq!(segments_within_join_bounds(&[unequal], segments).unwrap().len(), 4);
    }
}
