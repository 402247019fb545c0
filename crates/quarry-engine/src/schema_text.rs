//! Parsing column lists such as `a INT, b VARCHAR, c DECIMAL(10,2)` with the SQL engine's types.

use arrow::datatypes::SchemaRef;
use datafusion::common::plan_err;
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};

/// The Arrow schema of a SQL column list, typed exactly as `CREATE TABLE` would type it.
pub async fn parse_schema(columns: &str) -> Result<SchemaRef> {
    let state = SessionStateBuilder::new().with_default_features().build();
    let plan = state.create_logical_plan(&format!("CREATE TABLE schema_text ({columns})")).await?;
    match plan {
        LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(create)) => Ok(create.input.schema().inner().clone()),
        _ => plan_err!("'{columns}' is not a column list"),
    }
}
