//! A multi-column join's `IN` list of key tuples, as one `IN` list per key column.
//!
//! DataFusion's dynamic filter for a join on several columns tests `struct(a, b) IN (...)`, a
//! list of struct literals. Where that filter goes to a fragment's scan it costs more than it
//! saves: the page reader cannot run it on the stored pages, so the other columns are decoded
//! for every row; each row's tuple is hashed as a one-row struct array; and DataFusion's filter
//! pushdown on the node compares the list with itself element by element, hashing every
//! struct (TPC-DS q75: 14K `(wr_order_number, wr_item_sk)` tuples took 15% of the query's
//! CPU in that comparison alone). `a IN (a's keys) AND b IN (b's keys)` passes every row the
//! tuple list passes and a few more, which the join drops; each list the page reader runs as
//! a set test on the stored values.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::Array;
use arrow::datatypes::Schema;
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::physical_expr::expressions::{Column, InListExpr, Literal, in_list, lit};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

/// `conjunct`'s per-column lists when it is a (not negated) `IN` list of key tuples over
/// columns; `None` for any other conjunct. A tuple with a NULL key matches no probe row, so
/// its keys join no list.
pub fn per_column_lists(conjunct: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Result<Option<Vec<Arc<dyn PhysicalExpr>>>> {
    let Some(list) = conjunct.downcast_ref::<InListExpr>() else { return Ok(None) };
    let Some(tuple) = list.expr().downcast_ref::<ScalarFunctionExpr>() else { return Ok(None) };
    if list.negated() || tuple.name() != "struct" {
        return Ok(None);
    }
    let columns: Option<Vec<&Column>> = tuple.args().iter().map(|a| a.downcast_ref::<Column>()).collect();
    let Some(columns) = columns else { return Ok(None) };
    let mut keys: Vec<(Vec<ScalarValue>, HashSet<ScalarValue>)> = columns.iter().map(|_| Default::default()).collect();
    for element in list.list() {
        let Some(ScalarValue::Struct(row)) = element.downcast_ref::<Literal>().map(|l| l.value()) else { return Ok(None) };
        if row.len() != 1 || row.num_columns() != columns.len() {
            return Ok(None);
        }
        let values = (0..columns.len()).map(|i| ScalarValue::try_from_array(row.column(i), 0)).collect::<Result<Vec<_>>>()?;
        if values.iter().any(ScalarValue::is_null) {
            continue;
        }
        for ((ordered, seen), value) in keys.iter_mut().zip(values) {
            if seen.insert(value.clone()) {
                ordered.push(value);
            }
        }
    }
    let lists = columns
        .into_iter()
        .zip(keys)
        .map(|(column, (ordered, _))| {
            let column: Arc<dyn PhysicalExpr> = Arc::new(column.clone());
            if ordered.is_empty() {
                // No tuple without a NULL: no probe row joins.
                return Ok(lit(false));
            }
            in_list(column, ordered.into_iter().map(lit).collect(), &false, schema)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(lists))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StructArray};
    use arrow::datatypes::{DataType, Field, Fields};
    use datafusion::common::config::ConfigOptions;
    use datafusion::functions::core::r#struct as struct_func;

    fn schema() -> Schema {
        Schema::new(vec![Field::new("a", DataType::Int32, true), Field::new("b", DataType::Int64, true)])
    }

    /// `struct(a, b) IN (tuples)` as DataFusion's hash join builds it.
    fn tuple_list(a: Vec<Option<i32>>, b: Vec<Option<i64>>) -> Arc<dyn PhysicalExpr> {
        let schema = schema();
        let fields = Fields::from(vec![Field::new("c0", DataType::Int32, true), Field::new("c1", DataType::Int64, true)]);
        let args: Vec<Arc<dyn PhysicalExpr>> = vec![Arc::new(Column::new("a", 0)), Arc::new(Column::new("b", 1))];
        let tuple = ScalarFunctionExpr::new("struct", struct_func(), args, Arc::new(Field::new("struct", DataType::Struct(fields.clone()), true)), Arc::new(ConfigOptions::default()));
        let values = StructArray::new(fields, vec![Arc::new(Int32Array::from(a)) as ArrayRef, Arc::new(Int64Array::from(b))], None);
        Arc::new(InListExpr::try_new_from_array(Arc::new(tuple), Arc::new(values), false, &schema).unwrap())
    }

    fn passing(exprs: &[Arc<dyn PhysicalExpr>], a: Vec<Option<i32>>, b: Vec<Option<i64>>) -> Vec<bool> {
        let batch = RecordBatch::try_new(Arc::new(schema()), vec![Arc::new(Int32Array::from(a)), Arc::new(Int64Array::from(b))]).unwrap();
        (0..batch.num_rows())
            .map(|row| {
                exprs.iter().all(|e| {
                    let v = e.evaluate(&batch).unwrap().into_array(batch.num_rows()).unwrap();
                    ScalarValue::try_from_array(&v, row).unwrap() == ScalarValue::Boolean(Some(true))
                })
            })
            .collect()
    }

    #[test]
    fn a_tuple_list_becomes_a_list_per_column_that_passes_every_tuple() {
        let list = tuple_list(vec![Some(1), Some(2), Some(2), None], vec![Some(10), Some(20), Some(10), Some(30)]);
        let lists = per_column_lists(&list, &schema()).unwrap().expect("a tuple list");
        assert_eq!(lists.len(), 2);
        let a = lists[0].downcast_ref::<InListExpr>().unwrap();
        let b = lists[1].downcast_ref::<InListExpr>().unwrap();
        // Distinct keys; the tuple with a NULL key adds none (30 is only in it).
        assert_eq!(a.list().len(), 2);
        assert_eq!(b.list().len(), 2);
        let (rows_a, rows_b) = (vec![Some(1), Some(2), Some(1), Some(3), None, Some(2)], vec![Some(10), Some(10), Some(20), Some(10), Some(10), Some(30)]);
        // Every row the tuple list passes, the column lists pass; (1, 20) passes as a
        // superset's extra, and rows with a key in no tuple do not.
        let by_tuples = passing(&[Arc::clone(&list)], rows_a.clone(), rows_b.clone());
        let by_columns = passing(&lists, rows_a, rows_b);
        assert_eq!(by_tuples, vec![true, true, false, false, false, false]);
        assert_eq!(by_columns, vec![true, true, true, false, false, false]);
    }

    #[test]
    fn other_conjuncts_stay() {
        let schema = schema();
        let single = in_list(Arc::new(Column::new("a", 0)), vec![lit(1i32)], &false, &schema).unwrap();
        assert!(per_column_lists(&single, &schema).unwrap().is_none());
        let negated = in_list(Arc::new(Column::new("a", 0)), vec![lit(1i32)], &true, &schema).unwrap();
        assert!(per_column_lists(&negated, &schema).unwrap().is_none());
    }

    #[test]
    fn tuples_all_with_a_null_key_pass_no_row() {
        let list = tuple_list(vec![None], vec![Some(1)]);
        let lists = per_column_lists(&list, &schema()).unwrap().expect("a tuple list");
        assert_eq!(passing(&lists, vec![Some(1)], vec![Some(1)]), vec![false]);
    }
}
