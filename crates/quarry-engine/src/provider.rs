//! DataFusion catalog integration: the node's tables appear as SQL tables.

use std::sync::{Arc, OnceLock};

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, DFSchema, Statistics, plan_err};
use datafusion::logical_expr::utils::conjunction;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use quarry_storage::{ScanLeaf, ScanLeafExec, SegmentInfo, StorageNode, TableInfo};

use crate::scan::{FragmentExec, FragmentPartition};
use crate::sorted_copies::SortedCopies;

/// The schema of all tables the storage nodes serve. A table may be spread over several nodes
/// (each holding some of its segments); its schema must then agree on all of them. Table names
/// are listed once, when the session is created; each lookup fetches the table's current
/// version, so every query plans against the latest commit.
#[derive(Debug)]
pub struct NodeSchemaProvider {
    /// Each node with the tables it holds (listed once, with the names).
    nodes: Vec<(Arc<dyn StorageNode>, Vec<String>)>,
    names: Vec<String>,
}

impl NodeSchemaProvider {
    /// Lists the tables of all `nodes`.
    pub async fn try_new(nodes: Vec<Arc<dyn StorageNode>>) -> Result<Self> {
        let mut listed = Vec::with_capacity(nodes.len());
        for node in nodes {
            let tables = node.list_tables().await?;
            listed.push((node, tables));
        }
        let mut names: Vec<String> = listed.iter().flat_map(|(_, tables)| tables.iter().cloned()).collect();
        names.sort();
        names.dedup();
        Ok(NodeSchemaProvider { nodes: listed, names })
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
        let mut parts: Vec<(Arc<dyn StorageNode>, TableInfo)> = Vec::new();
        for (node, tables) in &self.nodes {
            if !tables.iter().any(|n| n == name) {
                continue;
            }
            let info = node.table_info(name).await?;
            if let Some((first, first_info)) = parts.first()
                && first_info.schema.fields() != info.schema.fields()
            {
                return plan_err!("table '{name}' has different columns on nodes {} and {}", first.name(), node.name());
            }
            parts.push((Arc::clone(node), info));
        }
        if parts.is_empty() {
            return Ok(None);
        }
        Ok(Some(Arc::new(StorageTable { parts, statistics: OnceLock::new() })))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

/// One table, as the nodes holding its segments describe it at planning time.
#[derive(Debug)]
pub struct StorageTable {
    parts: Vec<(Arc<dyn StorageNode>, TableInfo)>,
    /// The whole table's statistics, merged over the nodes once: the planner's estimates ask
    /// for them at every relation of every region (TPC-DS q14 asked hundreds of times).
    statistics: OnceLock<Statistics>,
}

impl StorageTable {
    /// The whole table's statistics (for the join-ordering rule's estimates), merged once.
    pub fn table_statistics(&self) -> &Statistics {
        self.statistics.get_or_init(|| {
            let columns = (0..self.info().schema.fields().len()).map(|i| self.column_statistics(i)).collect();
            let decoded_bytes = (self.total_rows() as f64 * crate::placement::row_width(&self.info().schema)) as u64;
            scan_statistics(self.total_rows(), decoded_bytes, columns, false)
        })
    }

    fn info(&self) -> &TableInfo {
        &self.parts[0].1
    }

    fn total_rows(&self) -> u64 {
        self.parts.iter().map(|(_, i)| i.total_rows()).sum()
    }

    fn total_bytes(&self) -> u64 {
        self.parts.iter().map(|(_, i)| i.total_bytes()).sum()
    }

    /// The sum over all nodes of a per-column figure of `indices`, if every node knows it.
    fn known_column_sum(&self, indices: &[usize], figure: impl Fn(&TableInfo) -> &[Option<u64>]) -> Option<u64> {
        self.parts.iter().flat_map(|(_, info)| indices.iter().map(|&i| figure(info).get(i).copied().flatten())).sum()
    }

    /// What a leaf reading the columns `indices` reads: their stored bytes where every node
    /// knows them, else the columns' share of the table's bytes (which misjudges tables whose
    /// columns compress unlike each other: SSB q2.1's four `lineorder` columns are 4 of 17 but
    /// 781 MB of 2 GB).
    fn projected_bytes(&self, indices: &[usize]) -> u64 {
        self.known_column_sum(indices, |info| &info.column_bytes).unwrap_or_else(|| {
            let share = indices.len().max(1) as f64 / self.info().schema.fields().len().max(1) as f64;
            (self.total_bytes() as f64 * share) as u64
        })
    }

    /// The decompressed bytes per row of the string columns among `indices`, where every node
    /// knows them (a string's cost to decode grows with its length: TPC-H's comments are 30 to
    /// 128 bytes, its flags 1).
    fn string_bytes_per_row(&self, indices: &[usize]) -> Option<f64> {
        let strings: Vec<usize> = indices.iter().copied().filter(|&i| crate::placement::is_string(self.info().schema.field(i).data_type())).collect();
        let bytes = self.known_column_sum(&strings, |info| &info.column_decoded_bytes);
        let rows = self.total_rows();
        bytes.filter(|_| rows > 0).map(|b| b as f64 / rows as f64)
    }

    /// Column statistics over all nodes: bounds widen, NULL counts add up. Distinct counts of
    /// a column that is (nearly) unique on every node add up, as a key's do; others take the
    /// largest node's count, as an attribute's with the same values everywhere does.
    fn column_statistics(&self, index: usize) -> ColumnStatistics {
        let mut merged: Option<ColumnStatistics> = None;
        let mut unique_everywhere = true;
        for (_, info) in &self.parts {
            let c = info.column_statistics.get(index).cloned().unwrap_or_else(ColumnStatistics::new_unknown);
            unique_everywhere &= c.distinct_count.get_value().is_some_and(|&d| d as f64 >= 0.9 * info.total_rows() as f64);
            merged = Some(match merged {
                None => c,
                Some(m) => ColumnStatistics {
                    null_count: m.null_count.add(&c.null_count),
                    min_value: m.min_value.min(&c.min_value),
                    max_value: m.max_value.max(&c.max_value),
                    distinct_count: if unique_everywhere { m.distinct_count.add(&c.distinct_count) } else { m.distinct_count.max(&c.distinct_count) },
                    ..ColumnStatistics::new_unknown()
                },
            });
        }
        merged.unwrap_or_else(ColumnStatistics::new_unknown)
    }
}

#[async_trait]
impl TableProvider for StorageTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.info().schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn statistics(&self) -> Option<Statistics> {
        Some(self.table_statistics().clone())
    }

    /// Filters over this table's columns can run on the node; anything else (subqueries,
    /// volatile functions) stays on the host. They are reported `Inexact`, so DataFusion keeps
    /// a filter operator above the scan: the placement rule then decides whether it runs on the
    /// node (pushed into the fragment) or on the host, and the host's filter estimates its
    /// selectivity from column statistics, which orders joins well.
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
        let info = self.info();
        let indices: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..info.schema.fields().len()).collect(),
        };
        let schema = Arc::new(info.schema.project(&indices)?);
        let projection = indices.iter().map(|&i| info.schema.field(i).name().clone()).collect();
        let columns = indices.iter().map(|&i| self.table_statistics().column_statistics[i].clone()).collect();
        let stored_bytes = self.projected_bytes(&indices);
        let string_bytes_per_row = self.string_bytes_per_row(&indices);
        // DataFusion's byte sizes are decoded sizes: it builds a hash join on the side with
        // fewer, and stored bytes misjudge it (TPC-H Q12's 15M `orders` keys, 70 MB stored,
        // were built instead of 12M estimated `lineitem` rows of 85 MB stored).
        let decoded_bytes = (self.total_rows() as f64 * crate::placement::row_width(&schema)) as u64;
        let statistics = scan_statistics(self.total_rows(), decoded_bytes, columns, !filters.is_empty());
        // A limit only holds for the leaf when nothing filters above it.
        let limit = if filters.is_empty() { limit } else { None };
        let leaf = ScanLeaf { table: info.name.clone(), version: info.version, segments: Vec::new(), projection, limit };
        let root = ScanLeafExec::new(leaf, schema).with_statistics(statistics).with_stored_bytes(stored_bytes).with_page_encoding(info.page_encoding).with_string_bytes_per_row(string_bytes_per_row);
        let root = Arc::new(match TableProvider::statistics(self) {
            Some(table) => root.with_filter_selectivity(crate::cardinality::scan_selectivity(filters, &table, &info.schema)),
            None => root,
        });
        let fragment = FragmentExec::try_new(root, spread_partitions(&self.parts, state.config().target_partitions().max(1)))?;
        // A table with sorted copies on one node: the copy its filters leave the fewest bytes of.
        if let [(_, info)] = self.parts.as_slice()
            && let Some(copies) = SortedCopies::of(info)
        {
            let names: Vec<String> = indices.iter().map(|&i| info.schema.field(i).name().clone()).collect();
            let shippable: Vec<Expr> = filters.iter().filter(|f| node_can_evaluate(f)).cloned().collect();
            let predicate = match conjunction(shippable) {
                Some(filter) => DFSchema::try_from_qualified_schema(info.name.as_str(), &info.schema).and_then(|schema| state.create_physical_expr(filter, &schema)).ok(),
                None => None,
            };
            let choice = copies.cheapest_for_filter(&names, predicate.as_ref(), &info.schema)?;
            return Ok(Arc::new(fragment.with_copy(choice)?));
        }
        Ok(Arc::new(fragment))
    }
}

/// Partitions over the nodes holding a table: each node's segments split into a share of
/// `target` partitions proportional to its bytes (at least one per node with segments).
fn spread_partitions(parts: &[(Arc<dyn StorageNode>, TableInfo)], target: usize) -> Vec<FragmentPartition> {
    let total: u64 = parts.iter().map(|(_, i)| i.total_bytes().max(1)).sum();
    let mut partitions = Vec::new();
    for (node, info) in parts {
        if info.segments.is_empty() && parts.len() > 1 {
            continue;
        }
        let share = ((target as u64 * info.total_bytes().max(1)).div_ceil(total) as usize).max(1);
        for segments in split_segments(&info.segments, share) {
            partitions.push(FragmentPartition { node: Arc::clone(node), leaves: vec![(info.version, segments)] });
        }
    }
    if partitions.is_empty() {
        let (node, info) = &parts[0];
        partitions.push(FragmentPartition { node: Arc::clone(node), leaves: vec![(info.version, Vec::new())] });
    }
    partitions
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

/// Statistics of a scan of a table of `rows` rows and `bytes` bytes. Unfiltered, the row count
/// is exact; with filters above it, it is an upper bound, and the filter operator above the scan
/// estimates the selectivity.
pub fn scan_statistics(rows: u64, bytes: u64, columns: Vec<ColumnStatistics>, filtered: bool) -> Statistics {
    let precision = |n: u64| if filtered { Precision::Inexact(n as usize) } else { Precision::Exact(n as usize) };
    let columns = columns
        .into_iter()
        .map(|mut c| {
            if filtered {
                c.null_count = c.null_count.to_inexact();
            }
            c
        })
        .collect();
    Statistics { num_rows: precision(rows), total_byte_size: Precision::Inexact(bytes as usize), column_statistics: columns }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segments(sizes: &[u64]) -> Vec<SegmentInfo> {
        sizes.iter().enumerate().map(|(i, &bytes)| SegmentInfo { id: i.to_string(), rows: 1, bytes, columns: Vec::new(), zones: None, range: 0 }).collect()
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
