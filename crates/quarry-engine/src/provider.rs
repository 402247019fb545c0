//! DataFusion catalog integration: the node's tables appear as SQL tables.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::common::ColumnStatistics;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use quarry_storage::{SegmentInfo, StorageNode, TableInfo};

use crate::scan::{ScanSpec, StorageScanExec, scan_statistics};

/// The schema of all tables a storage node serves. Table names are listed once, when the session
/// is created; each lookup fetches the table's current version, so every query plans against the
/// latest commit.
#[derive(Debug)]
pub struct NodeSchemaProvider {
    node: Arc<dyn StorageNode>,
    names: Vec<String>,
}

impl NodeSchemaProvider {
    /// Lists `node`'s tables.
    pub async fn try_new(node: Arc<dyn StorageNode>) -> Result<Self> {
        let names = node.list_tables().await?;
        Ok(NodeSchemaProvider { node, names })
    }
}

#[async_trait]
impl SchemaProvider for NodeSchemaProvider {
    fn table_names(&self) -> Vec<String> {
        self.names.clone()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if !self.names.iter().any(|n| n == name) {
            return Ok(None);
        }
        let info = self.node.table_info(name).await?;
        Ok(Some(Arc::new(StorageTable { node: Arc::clone(&self.node), info })))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

/// One table of a storage node, at the version current when the query was planned.
#[derive(Debug)]
pub struct StorageTable {
    node: Arc<dyn StorageNode>,
    info: TableInfo,
}

#[async_trait]
impl TableProvider for StorageTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.info.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Filters over this table's columns run on the node; anything else (subqueries, volatile
    /// functions) stays on the host. Pushed filters are reported `Inexact` so DataFusion keeps
    /// a filter above the scan: the node still removes the rows, but the host's filter operator
    /// estimates their selectivity from column statistics, which orders joins well.
    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| if node_can_evaluate(f) { TableProviderFilterPushDown::Inexact } else { TableProviderFilterPushDown::Unsupported })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let indices: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.info.schema.fields().len()).collect(),
        };
        let schema = Arc::new(self.info.schema.project(&indices)?);
        let projection = indices.iter().map(|&i| self.info.schema.field(i).name().clone()).collect();
        let target = state.config().target_partitions().max(1);
        let columns = indices.iter().map(|&i| self.info.column_statistics.get(i).cloned().unwrap_or_else(ColumnStatistics::new_unknown)).collect();
        let statistics = scan_statistics(self.info.total_rows(), self.info.total_bytes(), columns, !filters.is_empty());
        let spec = ScanSpec {
            table: self.info.name.clone(),
            version: self.info.version,
            partitions: split_segments(&self.info.segments, target),
            projection,
            filters: filters.to_vec(),
            limit,
            schema,
            statistics,
        };
        Ok(Arc::new(StorageScanExec::new(Arc::clone(&self.node), spec)))
    }
}

/// Whether a filter can be shipped to a node: plain expressions over columns, literals and
/// deterministic functions.
fn node_can_evaluate(filter: &Expr) -> bool {
    let mut ok = true;
    filter
        .apply(|e| {
            let shippable = match e {
                Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_) | Expr::OuterReferenceColumn(..) => false,
                Expr::Placeholder(_) | Expr::AggregateFunction(_) | Expr::WindowFunction(_) => false,
                Expr::ScalarFunction(f) => !f.func.signature().volatility.eq(&datafusion::logical_expr::Volatility::Volatile),
                _ => true,
            };
            ok &= shippable;
            Ok(if shippable { TreeNodeRecursion::Continue } else { TreeNodeRecursion::Stop })
        })
        .expect("visiting an expression cannot fail");
    ok
}

/// Splits segments into at most `target` contiguous groups of similar byte size.
pub fn split_segments(segments: &[SegmentInfo], target: usize) -> Vec<Vec<SegmentInfo>> {
    if segments.is_empty() {
        return vec![Vec::new()];
    }
    let groups = target.min(segments.len());
    let total: u64 = segments.iter().map(|s| s.bytes.max(1)).sum();
    let mut out: Vec<Vec<SegmentInfo>> = Vec::with_capacity(groups);
    let mut current = Vec::new();
    let mut acc = 0u64;
    for (i, segment) in segments.iter().enumerate() {
        current.push(segment.clone());
        acc += segment.bytes.max(1);
        let remaining_segments = segments.len() - i - 1;
        let remaining_groups = groups - out.len() - 1;
        let boundary = total * (out.len() as u64 + 1) / groups as u64;
        if remaining_groups > 0 && (acc >= boundary || remaining_segments == remaining_groups) {
            out.push(std::mem::take(&mut current));
        }
    }
    out.push(current);
    debug_assert_eq!(out.iter().map(Vec::len).sum::<usize>(), segments.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segments(sizes: &[u64]) -> Vec<SegmentInfo> {
        sizes.iter().enumerate().map(|(i, &bytes)| SegmentInfo { id: i.to_string(), rows: 1, bytes }).collect()
    }

    #[test]
    fn split_balances_bytes_and_keeps_order() {
        let groups = split_segments(&segments(&[10, 10, 10, 10, 10, 10]), 3);
        let ids: Vec<Vec<&str>> = groups.iter().map(|g| g.iter().map(|s| s.id.as_str()).collect()).collect();
        assert_eq!(ids, [vec!["0", "1"], vec!["2", "3"], vec!["4", "5"]]);
        assert_eq!(split_segments(&segments(&[5, 5]), 8).len(), 2);
        assert_eq!(split_segments(&segments(&[100, 1, 1, 1]), 2).iter().map(Vec::len).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(split_segments(&[], 4), vec![Vec::new()]);
    }
}
