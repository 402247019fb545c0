//! Decimal arithmetic in 64 bits where the values allow it.
//!
//! SQL declares money as `DECIMAL(15,2)`, so a product of two such columns is typed
//! `DECIMAL(31,4)` and arrow-rs computes it in `i128`, each row a checked multiplication: TPC-H
//! Q01 spent 3.3 of its 5.4 CPU seconds (SF 10) in two of them. The values themselves are small
//! (a price times a discount fits in 40 bits), so [`DecimalArithRule`] wraps each `+`, `-` and
//! `*` over `Decimal128` operands in a [`NarrowDecimalExpr`], which checks per batch the largest
//! magnitude on each side (null slots included) and, when the result cannot leave 64 bits,
//! computes with `i64` arithmetic that the compiler vectorizes, widening the answer to the
//! declared `Decimal128` type. Nested arithmetic stays in 64 bits between its steps, each
//! step's magnitude bounded by its operands' bounds. Otherwise it computes exactly what DataFusion would. DuckDB does
//! the same with its statistics (`DecimalMultiplyOverflowCheck`).

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Decimal128Array};
use arrow::buffer::NullBuffer;
use arrow::compute::kernels::numeric;
use arrow::datatypes::{DataType, Decimal128Type, FieldRef, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::expressions::BinaryExpr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::datum::apply;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::ExecutionPlan;

/// Rewrites decimal `+`, `-`, `*` in the host's projections, filters and aggregate arguments
/// into [`NarrowDecimalExpr`]. Runs after placement: a fragment's plan goes to its node as
/// DataFusion built it.
#[derive(Debug, Default)]
pub struct DecimalArithRule;

impl PhysicalOptimizerRule for DecimalArithRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
                let schema = projection.input().schema();
                let mut changed = false;
                let exprs: Vec<ProjectionExpr> = projection
                    .expr()
                    .iter()
                    .map(|p| {
                        let (expr, yes) = narrow(&p.expr, &schema)?;
                        changed |= yes;
                        Ok(ProjectionExpr { expr, alias: p.alias.clone() })
                    })
                    .collect::<Result<_>>()?;
                if changed {
                    return Ok(Transformed::yes(Arc::new(ProjectionExec::try_new(exprs, Arc::clone(projection.input()))?) as Arc<dyn ExecutionPlan>));
                }
            } else if let Some(filter) = node.downcast_ref::<FilterExec>() {
                if let (predicate, true) = narrow(filter.predicate(), &filter.input().schema())? {
                    return Ok(Transformed::yes(Arc::new(FilterExecBuilder::from(filter).with_predicate(predicate).build()?) as Arc<dyn ExecutionPlan>));
                }
            } else if let Some(aggregate) = node.downcast_ref::<AggregateExec>() {
                let schema = aggregate.input_schema();
                let mut changed = false;
                let mut aggr_exprs = Vec::with_capacity(aggregate.aggr_expr().len());
                for aggr in aggregate.aggr_expr() {
                    let mut args = Vec::new();
                    for arg in aggr.expressions() {
                        let (arg, yes) = narrow(&arg, &schema)?;
                        changed |= yes;
                        args.push(arg);
                    }
                    let order_by = aggr.order_bys().iter().map(|s| Arc::clone(&s.expr)).collect();
                    match aggr.with_new_expressions(args, order_by) {
                        Some(rewritten) => aggr_exprs.push(Arc::new(rewritten)),
                        None => return Ok(Transformed::no(node)),
                    }
                }
                if changed {
                    return Ok(Transformed::yes(Arc::new(aggregate.with_new_aggr_exprs(aggr_exprs)) as Arc<dyn ExecutionPlan>));
                }
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "quarry_decimal_arith"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `expr` with each decimal `+`, `-`, `*` wrapped; whether anything changed.
fn narrow(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Result<(Arc<dyn PhysicalExpr>, bool)> {
    let rewritten = Arc::clone(expr).transform_up(|e| {
        let Some(binary) = e.downcast_ref::<BinaryExpr>() else {
            return Ok(Transformed::no(e));
        };
        let decimal = |side: &Arc<dyn PhysicalExpr>| matches!(side.data_type(schema), Ok(DataType::Decimal128(..)));
        if matches!(binary.op(), Operator::Plus | Operator::Minus | Operator::Multiply) && decimal(binary.left()) && decimal(binary.right()) {
            let narrowed = NarrowDecimalExpr::new(*binary.op(), Arc::clone(binary.left()), Arc::clone(binary.right()));
            return Ok(Transformed::yes(Arc::new(narrowed) as Arc<dyn PhysicalExpr>));
        }
        Ok(Transformed::no(e))
    })?;
    Ok((rewritten.data, rewritten.transformed))
}

/// `left op right` over `Decimal128` values, in `i64` when a batch's values allow (see the module
/// documentation); the result is the one DataFusion's `BinaryExpr` gives.
#[derive(Debug, Eq)]
pub struct NarrowDecimalExpr {
    op: Operator,
    left: Arc<dyn PhysicalExpr>,
    right: Arc<dyn PhysicalExpr>,
}

// By hand: deriving them on `Arc<dyn PhysicalExpr>` fields trips rust-lang/rust#78808.
impl PartialEq for NarrowDecimalExpr {
    fn eq(&self, other: &Self) -> bool {
        self.op == other.op && self.left.eq(&other.left) && self.right.eq(&other.right)
    }
}

impl Hash for NarrowDecimalExpr {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.op.hash(state);
        self.left.hash(state);
        self.right.hash(state);
    }
}

impl NarrowDecimalExpr {
    /// `op` must be `+`, `-` or `*`.
    pub fn new(op: Operator, left: Arc<dyn PhysicalExpr>, right: Arc<dyn PhysicalExpr>) -> Self {
        assert!(matches!(op, Operator::Plus | Operator::Minus | Operator::Multiply), "narrow decimal arithmetic has no {op}");
        Self { op, left, right }
    }

    /// DataFusion's own expression for the same computation (types, nullability, fallback).
    fn binary(&self) -> BinaryExpr {
        BinaryExpr::new(Arc::clone(&self.left), self.op, Arc::clone(&self.right))
    }

    /// What arrow-rs computes, on operands already evaluated.
    fn wide(&self, left: &ColumnarValue, right: &ColumnarValue) -> Result<ColumnarValue> {
        match self.op {
            Operator::Plus => apply(left, right, numeric::add),
            Operator::Minus => apply(left, right, numeric::sub),
            _ => apply(left, right, numeric::mul),
        }
    }
}

/// A decimal operand in 64 bits: its unscaled values (one for a scalar), nulls, precision and
/// scale, and a bound on the values' magnitude, null slots included (their values are
/// arbitrary: bounding them too keeps the 64-bit arithmetic on them from overflowing).
pub(crate) struct Narrow {
    values: Values,
    nulls: Option<NullBuffer>,
    precision: u8,
    scale: i8,
    bound: u128,
}

enum Values {
    Array(Vec<i64>),
    Scalar(i64),
}

impl Narrow {
    /// `value` in 64 bits; `None` for a null scalar, anything but `Decimal128`, or a value
    /// past 64 bits.
    fn of(value: &ColumnarValue) -> Option<Narrow> {
        let limit = i64::MAX as u128;
        match value {
            ColumnarValue::Array(array) => {
                let DataType::Decimal128(precision, scale) = array.data_type() else { return None };
                let decimals: &Decimal128Array = array.as_primitive::<Decimal128Type>();
                let bound = decimals.values().iter().fold(0u128, |m, v| m.max(v.unsigned_abs()));
                (bound <= limit).then(|| Narrow { values: Values::Array(decimals.values().iter().map(|&v| v as i64).collect()), nulls: decimals.nulls().cloned(), precision: *precision, scale: *scale, bound })
            }
            ColumnarValue::Scalar(ScalarValue::Decimal128(Some(v), precision, scale)) if v.unsigned_abs() <= limit => {
                Some(Narrow { values: Values::Scalar(*v as i64), nulls: None, precision: *precision, scale: *scale, bound: v.unsigned_abs() })
            }
            ColumnarValue::Scalar(_) => None,
        }
    }

    /// `left op right` in 64 bits, with the precision and scale arrow-rs's decimal kernels give
    /// it; `None` where the operands' bounds allow a result past 64 bits.
    fn apply(op: Operator, left: Narrow, right: Narrow) -> Option<Narrow> {
        if matches!((&left.values, &right.values), (Values::Scalar(_), Values::Scalar(_))) {
            return None;
        }
        let limit = i64::MAX as u128;
        let (l, r) = (&left, &right);
        let (scale, precision, l_factor, r_factor) = match op {
            Operator::Multiply => {
                let scale = l.scale.checked_add(r.scale).filter(|s| *s <= arrow::datatypes::DECIMAL128_MAX_SCALE)?;
                (scale, (l.precision + r.precision + 1).min(arrow::datatypes::DECIMAL128_MAX_PRECISION), 1, 1)
            }
            _ => {
                let scale = l.scale.max(r.scale);
                let integer_digits = (l.precision as i16 - l.scale as i16).max(r.precision as i16 - r.scale as i16);
                let precision = (integer_digits + scale as i16 + 1).clamp(1, arrow::datatypes::DECIMAL128_MAX_PRECISION as i16) as u8;
                (scale, precision, power_of_ten(scale - l.scale)?, power_of_ten(scale - r.scale)?)
            }
        };
        let bound = match op {
            Operator::Multiply => l.bound.checked_mul(r.bound),
            _ => l.bound.checked_mul(l_factor as u128).zip(r.bound.checked_mul(r_factor as u128)).and_then(|(a, b)| a.checked_add(b)),
        }
        .filter(|&b| b <= limit)?;
        // One loop per operator (a function pointer would keep the compiler from vectorizing).
        let values = match op {
            Operator::Plus => combine(&left.values, &right.values, l_factor, r_factor, i64::wrapping_add),
            Operator::Minus => combine(&left.values, &right.values, l_factor, r_factor, i64::wrapping_sub),
            _ => combine(&left.values, &right.values, l_factor, r_factor, i64::wrapping_mul),
        };
        let nulls = NullBuffer::union(left.nulls.as_ref(), right.nulls.as_ref());
        Some(Narrow { values: Values::Array(values), nulls, precision, scale, bound })
    }

    /// The unscaled values of an array (not a scalar), their nulls, and their scale.
    pub(crate) fn array(&self) -> Option<(&[i64], Option<&NullBuffer>, i8)> {
        match &self.values {
            Values::Array(values) => Some((values, self.nulls.as_ref(), self.scale)),
            Values::Scalar(_) => None,
        }
    }

    /// The values as the `Decimal128` array DataFusion's `BinaryExpr` would have computed.
    fn widen(self) -> Option<ArrayRef> {
        let Values::Array(values) = self.values else { return None };
        let values: Vec<i128> = values.into_iter().map(i128::from).collect();
        let array = Decimal128Array::new(values.into(), self.nulls).with_precision_and_scale(self.precision, self.scale).ok()?;
        Some(Arc::new(array))
    }
}

/// `10^exponent` as a 64-bit factor, if it is one.
fn power_of_ten(exponent: i8) -> Option<i64> {
    u32::try_from(exponent).ok().and_then(|e| 10i64.checked_pow(e))
}

impl NarrowDecimalExpr {
    /// The 64-bit computation on operands already evaluated, or `None` where it could overflow
    /// or does not apply.
    fn narrow(&self, left: &ColumnarValue, right: &ColumnarValue) -> Option<ArrayRef> {
        Narrow::apply(self.op, Narrow::of(left)?, Narrow::of(right)?)?.widen()
    }

    /// This expression over `batch` in 64 bits throughout: an operand that is itself narrow
    /// decimal arithmetic stays in 64 bits, bounded by its operands' bounds rather than by a
    /// pass over its values (TPC-H Q01's `price * (1 - discount) * (1 + tax)` made and scanned
    /// three `i128` arrays per batch). `None` where a bound allows more than 64 bits.
    pub(crate) fn evaluate_narrow(&self, batch: &RecordBatch) -> Result<Option<Narrow>> {
        let operand = |expr: &Arc<dyn PhysicalExpr>| -> Result<Option<Narrow>> {
            match expr.downcast_ref::<NarrowDecimalExpr>() {
                Some(inner) => inner.evaluate_narrow(batch),
                None => Ok(Narrow::of(&expr.evaluate(batch)?)),
            }
        };
        let Some(left) = operand(&self.left)? else { return Ok(None) };
        let Some(right) = operand(&self.right)? else { return Ok(None) };
        Ok(Narrow::apply(self.op, left, right))
    }
}

/// `f` over the operands rescaled by their factors. Bounded above, so neither the rescaling
/// nor `f` wraps; `wrapping_*` only spares the checks.
#[inline(always)]
fn combine(left: &Values, right: &Values, l_factor: i64, r_factor: i64, f: impl Fn(i64, i64) -> i64) -> Vec<i64> {
    match (left, right) {
        (Values::Array(a), Values::Array(b)) => a.iter().zip(b).map(|(x, y)| f(x.wrapping_mul(l_factor), y.wrapping_mul(r_factor))).collect(),
        (Values::Array(a), Values::Scalar(y)) => {
            let y = y.wrapping_mul(r_factor);
            a.iter().map(|x| f(x.wrapping_mul(l_factor), y)).collect()
        }
        (Values::Scalar(x), Values::Array(b)) => {
            let x = x.wrapping_mul(l_factor);
            b.iter().map(|y| f(x, y.wrapping_mul(r_factor))).collect()
        }
        (Values::Scalar(_), Values::Scalar(_)) => unreachable!("two scalars take arrow's path"),
    }
}

impl fmt::Display for NarrowDecimalExpr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "narrow({} {} {})", self.left, self.op, self.right)
    }
}

impl PhysicalExpr for NarrowDecimalExpr {
    fn data_type(&self, input_schema: &Schema) -> Result<DataType> {
        self.binary().data_type(input_schema)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.binary().nullable(input_schema)
    }

    fn return_field(&self, input_schema: &Schema) -> Result<FieldRef> {
        self.binary().return_field(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        if let Some(array) = self.evaluate_narrow(batch)?.and_then(Narrow::widen) {
            return Ok(ColumnarValue::Array(array));
        }
        // A bound too loose for 64 bits: the operands as computed, narrowed by their values.
        let left = self.left.evaluate(batch)?;
        let right = self.right.evaluate(batch)?;
        match self.narrow(&left, &right) {
            Some(array) => Ok(ColumnarValue::Array(array)),
            None => self.wide(&left, &right),
        }
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.left, &self.right]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        let [left, right]: [Arc<dyn PhysicalExpr>; 2] = children.try_into().map_err(|_| datafusion::error::DataFusionError::Internal("narrow decimal arithmetic takes two operands".into()))?;
        Ok(Arc::new(NarrowDecimalExpr::new(self.op, left, right)))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.binary().fmt_sql(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::{Column, Literal};

    /// Both paths against arrow-rs's kernels, by value and type: small values (64-bit path),
    /// values near the 64-bit edge and beyond it (arrow's path), nulls with garbage under them,
    /// mixed scales, and scalars on either side.
    #[test]
    fn narrow_arithmetic_equals_arrows() {
        let big = i64::MAX as i128;
        let cases: Vec<(Vec<Option<i128>>, (u8, i8), Vec<Option<i128>>, (u8, i8))> = vec![
            (vec![Some(1_049_495_0), Some(-3), None, Some(0)], (15, 2), vec![Some(4), Some(10), Some(7), None], (15, 2)),
            (vec![Some(123_456), Some(-99)], (15, 2), vec![Some(5), Some(-77_777)], (12, 4)),
            (vec![Some(3_037_000_499), Some(1)], (20, 0), vec![Some(3_037_000_499), Some(2)], (20, 0)),
            (vec![Some(3_037_000_500), Some(1)], (20, 0), vec![Some(3_037_000_500), Some(2)], (20, 0)),
            (vec![Some(big), Some(-big)], (38, 0), vec![Some(1), Some(1)], (38, 0)),
            (vec![Some(big / 10 + 1), Some(1)], (30, 1), vec![Some(1), Some(1)], (30, 0)),
        ];
        let ops = [Operator::Plus, Operator::Minus, Operator::Multiply];
        for (left, (lp, ls), right, (rp, rs)) in cases {
            let mut l = Decimal128Array::from(left.clone()).with_precision_and_scale(lp, ls).unwrap();
            // Garbage under a null slot must not matter.
            if left.iter().any(Option::is_none) {
                let values: Vec<i128> = left.iter().map(|v| v.unwrap_or(big * 1000)).collect();
                l = Decimal128Array::new(values.into(), l.nulls().cloned()).with_precision_and_scale(lp, ls).unwrap();
            }
            let r = Decimal128Array::from(right.clone()).with_precision_and_scale(rp, rs).unwrap();
            let schema = Arc::new(Schema::new(vec![Field::new("l", l.data_type().clone(), true), Field::new("r", r.data_type().clone(), true)]));
            let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(l.clone()), Arc::new(r.clone())]).unwrap();
            let l_col: Arc<dyn PhysicalExpr> = Arc::new(Column::new("l", 0));
            let r_col: Arc<dyn PhysicalExpr> = Arc::new(Column::new("r", 1));
            let scalar = ScalarValue::Decimal128(right[0], rp, rs);
            let r_lit: Arc<dyn PhysicalExpr> = Arc::new(Literal::new(scalar));
            for op in ops {
                for (a, b) in [(&l_col, &r_col), (&l_col, &r_lit), (&r_lit, &l_col)] {
                    let expected = BinaryExpr::new(Arc::clone(a), op, Arc::clone(b)).evaluate(&batch).map(|v| v.into_array(batch.num_rows()).unwrap());
                    let narrow = NarrowDecimalExpr::new(op, Arc::clone(a), Arc::clone(b));
                    let actual = narrow.evaluate(&batch).map(|v| v.into_array(batch.num_rows()).unwrap());
                    match (expected, actual) {
                        (Ok(expected), Ok(actual)) => {
                            assert_eq!(expected.data_type(), actual.data_type(), "{op} {a} {b}");
                            assert_eq!(expected.data_type(), &narrow.data_type(&schema).unwrap(), "{op} {a} {b}: declared type");
                            assert_eq!(&expected, &actual, "{op} {a} {b}");
                        }
                        (Err(_), Err(_)) => {}
                        (expected, actual) => panic!("{op} {a} {b}: arrow {expected:?}, narrow {actual:?}"),
                    }
                }
            }
        }
    }

    /// The rule reaches arithmetic in projections, filters and aggregate arguments (which
    /// EXPLAIN cannot show: an aggregate displays its name), and leaves integers alone.
    #[tokio::test]
    async fn the_rule_wraps_decimal_arithmetic_wherever_the_host_computes() {
        use datafusion::datasource::MemTable;
        use datafusion::execution::SessionStateBuilder;
        use datafusion::prelude::SessionContext;
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("p", DataType::Decimal128(15, 2), true),
            Field::new("d", DataType::Decimal128(15, 2), true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(arrow::array::Int64Array::from(vec![1, 2])),
                Arc::new(Decimal128Array::from(vec![Some(100), None]).with_precision_and_scale(15, 2).unwrap()),
                Arc::new(Decimal128Array::from(vec![Some(5), Some(7)]).with_precision_and_scale(15, 2).unwrap()),
            ],
        )
        .unwrap();
        let state = SessionStateBuilder::new().with_default_features().with_physical_optimizer_rule(Arc::new(DecimalArithRule)).build();
        let ctx = SessionContext::new_with_state(state);
        ctx.register_table("t", Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())).unwrap();
        let narrowed = |plan: &Arc<dyn ExecutionPlan>| {
            let mut found = Vec::new();
            plan.apply(|node| {
                if let Some(aggregate) = node.downcast_ref::<AggregateExec>() {
                    found.extend(aggregate.aggr_expr().iter().flat_map(|a| a.expressions()).map(|e| e.is::<NarrowDecimalExpr>()));
                }
                if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
                    found.extend(projection.expr().iter().map(|p| p.expr.is::<NarrowDecimalExpr>()));
                }
                if let Some(filter) = node.downcast_ref::<FilterExec>() {
                    found.push(filter.predicate().to_string().contains("narrow("));
                }
                Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
            })
            .unwrap();
            found
        };
        for (sql, expected) in [
            ("select g, sum(p * d), sum(p - 1) from t group by g", vec![true, true]),
            ("select p * (1 - d), g + 1 from t", vec![true, false]),
            ("select g from t where p * d > 0", vec![true]),
        ] {
            let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            let found = narrowed(&plan);
            // Partial and final aggregates: the partial one evaluates the arguments.
            assert!(found.starts_with(&expected) || found.ends_with(&expected), "{sql}: {found:?}\n{}", datafusion::physical_plan::displayable(plan.as_ref()).indent(true));
            let results = datafusion::physical_plan::collect(plan, ctx.task_ctx()).await.unwrap();
            assert!(!results.is_empty(), "{sql}");
        }
    }

    /// Nested arithmetic (TPC-H Q01's charge, `p * (1 - d) * (1 + t)`) equals arrow-rs's: in
    /// 64 bits throughout where the bounds allow, and where a bound is too loose (a huge price
    /// times a factor that is 0) or the values do leave 64 bits.
    #[test]
    fn nested_arithmetic_equals_arrows() {
        let decimals = |values: Vec<Option<i128>>| Arc::new(Decimal128Array::from(values).with_precision_and_scale(15, 2).unwrap()) as ArrayRef;
        let schema = Arc::new(Schema::new(["p", "d", "t"].map(|n| Field::new(n, DataType::Decimal128(15, 2), true)).to_vec()));
        let one: Arc<dyn PhysicalExpr> = Arc::new(Literal::new(ScalarValue::Decimal128(Some(100), 15, 2)));
        let column = |i: usize| Arc::new(Column::new(["p", "d", "t"][i], i)) as Arc<dyn PhysicalExpr>;
        let tree = |make: &dyn Fn(Operator, Arc<dyn PhysicalExpr>, Arc<dyn PhysicalExpr>) -> Arc<dyn PhysicalExpr>| {
            let discounted = make(Operator::Multiply, column(0), make(Operator::Minus, Arc::clone(&one), column(1)));
            make(Operator::Multiply, discounted, make(Operator::Plus, Arc::clone(&one), column(2)))
        };
        let arrow = tree(&|op, l, r| Arc::new(BinaryExpr::new(l, op, r)));
        let narrow = tree(&|op, l, r| Arc::new(NarrowDecimalExpr::new(op, l, r)));
        let cases: [(Vec<Option<i128>>, Vec<Option<i128>>, bool); 3] = [
            (vec![Some(10_494_950), None, Some(-1), Some(90_100)], vec![Some(4), Some(10), Some(100), None], true),
            (vec![Some(100_000_000_000_000_000), Some(1)], vec![Some(100), Some(0)], false),
            (vec![Some(90_000_000_000_000_000), Some(1)], vec![Some(-100), Some(0)], false),
        ];
        for (prices, discounts, in_64_bits) in cases {
            let taxes: Vec<Option<i128>> = (0..prices.len() as i128).map(|i| (i != 1).then_some(i * 3)).collect();
            let batch = RecordBatch::try_new(Arc::clone(&schema), vec![decimals(prices.clone()), decimals(discounts), decimals(taxes)]).unwrap();
            let expected = arrow.evaluate(&batch).and_then(|v| v.into_array(batch.num_rows()));
            let actual = narrow.evaluate(&batch).and_then(|v| v.into_array(batch.num_rows()));
            match (expected, actual) {
                (Ok(expected), Ok(actual)) => {
                    assert_eq!(expected.data_type(), actual.data_type(), "{prices:?}");
                    assert_eq!(&expected, &actual, "{prices:?}");
                }
                (Err(_), Err(_)) => {}
                (expected, actual) => panic!("{prices:?}: arrow {expected:?}, narrow {actual:?}"),
            }
            let whole = narrow.downcast_ref::<NarrowDecimalExpr>().unwrap().evaluate_narrow(&batch).unwrap();
            assert_eq!(whole.is_some(), in_64_bits, "{prices:?}: 64 bits throughout");
        }
    }

    #[test]
    fn small_products_take_the_64_bit_path() {
        let l = Decimal128Array::from(vec![Some(1_049_495_0_i128), None]).with_precision_and_scale(15, 2).unwrap();
        let r = Decimal128Array::from(vec![Some(96_i128), Some(100)]).with_precision_and_scale(16, 2).unwrap();
        let narrow = NarrowDecimalExpr::new(Operator::Multiply, Arc::new(Column::new("l", 0)), Arc::new(Column::new("r", 1)));
        let (l, r) = (ColumnarValue::Array(Arc::new(l)), ColumnarValue::Array(Arc::new(r)));
        assert!(narrow.narrow(&l, &r).is_some(), "a price times a discount fits 64 bits");
        let huge = ColumnarValue::Scalar(ScalarValue::Decimal128(Some(i64::MAX as i128), 38, 0));
        assert!(narrow.narrow(&l, &huge).is_none(), "a product past 64 bits takes arrow's path");
    }
}
