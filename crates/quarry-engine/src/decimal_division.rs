//! Division of decimals in double precision: an analyzer rule, before type coercion.
//!
//! DataFusion divides decimals in decimals: `DECIMAL(p1,s1) / DECIMAL(p2,s2)` keeps `s1 + 4`
//! decimals, truncated. A ratio of two sums of money then keeps 6 to 8 decimals whatever its
//! magnitude: TPC-DS q66's sales per square foot lose their 7th significant digit, q61's
//! percentage its 8th, and q49's return ratios tie values that differ past the 8th decimal, so
//! `rank()` ranks them equal. What a ratio needs is relative precision, which a double has
//! (about 16 significant digits at any magnitude). So Quarry divides as DuckDB does: a `/` with
//! a decimal operand (the other decimal or integer) casts both to DOUBLE, and its result is a
//! DOUBLE. Integer division keeps DataFusion's (and PostgreSQL's) integer result.
//!
//! The rule runs before type coercion, so the casts it adds are coerced like any written in
//! the query and every expression above sees the DOUBLE type; the expressions keep their
//! names (a projection's `a / b` is still called that).

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{BinaryExpr, Expr, ExprSchemable, LogicalPlan, Operator, cast};
use datafusion::optimizer::AnalyzerRule;

/// The rule (see the module docs).
#[derive(Debug, Default)]
pub struct DecimalDivisionRule;

impl DecimalDivisionRule {
    /// Its name, and that of the rule it must run before.
    pub const NAME: &str = "quarry_decimal_division";
    pub const BEFORE: &str = "type_coercion";
}

impl AnalyzerRule for DecimalDivisionRule {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        Ok(plan.transform_up_with_subqueries(rewrite_plan)?.data)
    }
}

fn rewrite_plan(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let mut schema = DFSchema::empty();
    for input in plan.inputs() {
        schema.merge(input.schema());
    }
    if let LogicalPlan::TableScan(scan) = &plan {
        schema.merge(&DFSchema::try_from_qualified_schema(scan.table_name.clone(), &scan.source.schema())?);
    }
    let names = NamePreserver::new(&plan);
    let rewritten = plan.map_expressions(|expr| {
        let name = names.save(&expr);
        expr.transform_up(|e| divide_in_double(e, &schema)).map(|t| t.update_data(|e| name.restore(e)))
    })?;
    if rewritten.transformed { rewritten.map_data(|plan| plan.recompute_schema()) } else { Ok(rewritten) }
}

fn divide_in_double(expr: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::BinaryExpr(BinaryExpr { left, op: Operator::Divide, right }) = &expr else { return Ok(Transformed::no(expr)) };
    // A type that cannot be told here (an unresolved reference) is left to DataFusion.
    let (Ok(l), Ok(r)) = (left.get_type(schema), right.get_type(schema)) else { return Ok(Transformed::no(expr)) };
    let decimal = |t: &DataType| matches!(t, DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..));
    let number = |t: &DataType| decimal(t) || t.is_integer();
    if !((decimal(&l) && number(&r)) || (number(&l) && decimal(&r))) {
        return Ok(Transformed::no(expr));
    }
    let Expr::BinaryExpr(BinaryExpr { left, right, .. }) = expr else { unreachable!("matched above") };
    Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(Box::new(cast(*left, DataType::Float64)), Operator::Divide, Box::new(cast(*right, DataType::Float64))))))
}
