//! The in-process storage node: serves [`StorageNode`] from a local [`Warehouse`].
//!
//! A scan runs next to the data: segments are pruned by the manifest's statistics without being
//! opened, the rest are read by DataFusion's Parquet scan (row-group, page-index and Bloom-filter
//! pruning, predicates evaluated during decode), then filtered, projected and limited here, so
//! only the requested rows and columns leave the node.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, BooleanArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::stats::Precision;
use datafusion::common::{Column, ColumnStatistics, DFSchema, ScalarValue, plan_datafusion_err, plan_err};
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::error::{DataFusionError, Result};
use datafusion::catalog::TableProvider;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::expr_rewriter::unnormalize_cols;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::Expr;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use datafusion::physical_plan::filter::FilterExecBuilder;
use datafusion::physical_plan::limit::GlobalLimitExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{ExecutionPlan, execute_stream};
use datafusion::prelude::SessionConfig;
use futures::StreamExt;
use quarry_table::{SegmentMeta, TableError, TableSnapshot, Warehouse};

use crate::api::{ScanMessage, ScanRequest, ScanStats, ScanStream, SegmentInfo, StorageNode, TableInfo, batch_wire_bytes};

/// A storage node over a warehouse directory on this machine.
#[derive(Debug)]
pub struct LocalStorageNode {
    name: String,
    warehouse: Warehouse,
    state: SessionState,
}

impl LocalStorageNode {
    /// Serves the tables of `warehouse`.
    pub fn new(warehouse: Warehouse) -> Self {
        let mut config = SessionConfig::new().with_target_partitions(1);
        let options = config.options_mut();
        // Late materialization: evaluate predicates while decoding, fetching the other columns
        // only for rows that pass.
        options.execution.parquet.pushdown_filters = true;
        options.execution.parquet.reorder_filters = true;
        options.execution.collect_statistics = false;
        let state = SessionStateBuilder::new().with_config(config).with_default_features().build();
        LocalStorageNode { name: "local".into(), warehouse, state }
    }

    /// The warehouse served.
    pub fn warehouse(&self) -> &Warehouse {
        &self.warehouse
    }
}

/// Maps table-layer errors to DataFusion errors a user can read: a missing table is a planning
/// error; anything else reports the file concerned.
pub fn table_error(e: TableError) -> DataFusionError {
    match e {
        TableError::TableNotFound(name) => plan_datafusion_err!("table '{name}' not found"),
        TableError::InvalidTableName(name) => plan_datafusion_err!("table '{name}' not found (invalid table name)"),
        other => DataFusionError::External(Box::new(other)),
    }
}

/// The schema scans return: strings and binaries as views, which DataFusion processes fastest.
pub fn scan_schema(storage: &Schema) -> SchemaRef {
    let fields: Vec<Field> = storage
        .fields()
        .iter()
        .map(|f| {
            let data_type = match f.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 => DataType::Utf8View,
                DataType::Binary | DataType::LargeBinary => DataType::BinaryView,
                other => other.clone(),
            };
            Field::new(f.name(), data_type, f.is_nullable())
        })
        .collect();
    Arc::new(Schema::new(fields))
}

fn table_info(snapshot: &TableSnapshot) -> TableInfo {
    let schema = scan_schema(&snapshot.schema);
    let column_statistics = (0..schema.fields().len()).map(|i| column_statistics(&snapshot.manifest.segments, i, schema.field(i).data_type())).collect();
    TableInfo {
        column_statistics,
        name: snapshot.manifest.table.clone(),
        version: snapshot.manifest.version,
        schema,
        segments: snapshot
            .manifest
            .segments
            .iter()
            .map(|s| SegmentInfo { id: s.id.clone(), rows: s.rows, bytes: s.bytes })
            .collect(),
    }
}

#[async_trait]
impl StorageNode for LocalStorageNode {
    fn name(&self) -> &str {
        &self.name
    }

    async fn list_tables(&self) -> Result<Vec<String>> {
        self.warehouse.table_names().map_err(table_error)
    }

    async fn table_info(&self, table: &str) -> Result<TableInfo> {
        Ok(table_info(&self.warehouse.table(table).map_err(table_error)?))
    }

    async fn scan(&self, request: ScanRequest) -> Result<ScanStream> {
        let started = Instant::now();
        let snapshot = self.warehouse.table_version(&request.table, request.version).map_err(table_error)?;
        let schema = scan_schema(&snapshot.schema);
        let segments = select_segments(&snapshot, &request.segments)?;
        let filters = unnormalize_cols(request.filters.clone());
        validate_columns(&request, &filters, &schema)?;
        let df_schema = DFSchema::try_from(schema.as_ref().clone())?;
        let predicate = conjunction(filters.clone()).map(|p| self.state.create_physical_expr(p, &df_schema)).transpose()?;

        let mut stats = ScanStats { segments_requested: segments.len() as u64, ..Default::default() };
        let kept: Vec<&SegmentMeta> = match &predicate {
            Some(predicate) => {
                // No pruning predicate means the filter cannot be checked against statistics.
                match PruningPredicateBuilder::new().with_file_schema(Arc::clone(&schema)).build(Arc::clone(predicate)) {
                    Some(pruning) => {
                        let keep = pruning.prune(&SegmentStatistics { segments: &segments, schema: &schema })?;
                        segments.iter().zip(keep).filter_map(|(s, keep)| keep.then_some(*s)).collect()
                    }
                    None => segments,
                }
            }
            None => segments,
        };
        stats.segments_pruned = stats.segments_requested - kept.len() as u64;
        stats.rows_scanned = kept.iter().map(|s| s.rows).sum();
        if kept.is_empty() {
            stats.elapsed_ns = started.elapsed().as_nanos() as u64;
            return Ok(futures::stream::once(async move { Ok(ScanMessage::Finished(stats)) }).boxed());
        }

        for segment in &kept {
            check_segment_file(&snapshot, segment)?;
        }
        let plan = self.plan_scan(&snapshot, &kept, &schema, &request, &filters).await?;
        let batches = execute_stream(Arc::clone(&plan), self.state.task_ctx())?;
        // The trailing `Finished` is a marker; the closure fills in the statistics it accumulated.
        let stream = batches
            .map(|batch| batch.map(ScanMessage::Batch))
            .chain(futures::stream::once(async { Ok(ScanMessage::Finished(ScanStats::default())) }))
            .map(move |item| match item {
                Ok(ScanMessage::Batch(batch)) => {
                    stats.rows_returned += batch.num_rows() as u64;
                    stats.bytes_returned += batch_wire_bytes(&batch);
                    Ok(ScanMessage::Batch(batch))
                }
                Ok(ScanMessage::Finished(_)) => {
                    stats.bytes_read = bytes_scanned(plan.as_ref());
                    stats.elapsed_ns = started.elapsed().as_nanos() as u64;
                    Ok(ScanMessage::Finished(stats.clone()))
                }
                Err(e) => Err(e),
            });
        Ok(stream.boxed())
    }
}

impl LocalStorageNode {
    /// Parquet scan of `segments` with the request's filters, projection and limit applied.
    async fn plan_scan(
        &self,
        snapshot: &TableSnapshot,
        segments: &[&SegmentMeta],
        schema: &SchemaRef,
        request: &ScanRequest,
        filters: &[Expr],
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let urls = segments
            .iter()
            .map(|s| {
                let path = snapshot.segment_path(s);
                ListingTableUrl::parse(path.to_str().ok_or_else(|| plan_datafusion_err!("non-UTF-8 path {}", path.display()))?)
            })
            .collect::<Result<Vec<_>>>()?;
        let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
            .with_file_extension(".parquet");
        let config = ListingTableConfig::new_with_multi_paths(urls).with_listing_options(options).with_schema(Arc::clone(schema));
        let table = ListingTable::try_new(config)?;

        // Read the projected columns plus those the filters need; drop the latter after filtering.
        let index_of = |name: &str| schema.index_of(name).map_err(DataFusionError::from);
        let mut read: Vec<usize> = request.projection.iter().map(|c| index_of(c)).collect::<Result<_>>()?;
        for filter in filters {
            for column in filter.column_refs() {
                let index = index_of(&column.name)?;
                if !read.contains(&index) {
                    read.push(index);
                }
            }
        }
        let scan_limit = if filters.is_empty() { request.limit } else { None };
        let mut plan = table.scan(&self.state, Some(&read), filters, scan_limit).await?;
        let output: Vec<usize> = (0..request.projection.len()).collect();
        if let Some(filter) = conjunction(filters.to_vec()) {
            let read_schema = DFSchema::try_from(plan.schema().as_ref().clone())?;
            let predicate = self.state.create_physical_expr(filter, &read_schema)?;
            plan = Arc::new(FilterExecBuilder::new(predicate, plan).apply_projection(Some(output))?.build()?);
        } else if read.len() != request.projection.len() {
            let read_schema = plan.schema();
            let columns: Vec<(Arc<dyn datafusion::physical_expr::PhysicalExpr>, String)> = output
                .iter()
                .map(|&i| {
                    let name = read_schema.field(i).name();
                    (Arc::new(datafusion::physical_plan::expressions::Column::new(name, i)) as _, name.clone())
                })
                .collect();
            plan = Arc::new(ProjectionExec::try_new(columns, plan)?);
        }
        if let Some(limit) = request.limit {
            plan = Arc::new(GlobalLimitExec::new(plan, 0, Some(limit)));
        }
        Ok(plan)
    }
}

/// The requested segments of the snapshot, in request order; unknown ids are an error.
fn select_segments<'a>(snapshot: &'a TableSnapshot, ids: &[String]) -> Result<Vec<&'a SegmentMeta>> {
    let by_id: HashMap<&str, &SegmentMeta> = snapshot.manifest.segments.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut seen = HashSet::new();
    ids.iter()
        .map(|id| {
            if !seen.insert(id.as_str()) {
                return plan_err!("segment '{id}' requested twice");
            }
            by_id.get(id.as_str()).copied().ok_or_else(|| {
                plan_datafusion_err!("table '{}' version {} has no segment '{id}'", snapshot.manifest.table, snapshot.manifest.version)
            })
        })
        .collect()
}

/// Bounds and NULL count of column `index` over `segments`; a bound stays unknown unless every
/// segment with values has one.
fn column_statistics(segments: &[SegmentMeta], index: usize, data_type: &DataType) -> ColumnStatistics {
    let parse = |text: &Option<String>| text.as_ref().and_then(|t| ScalarValue::try_from_string(t.clone(), data_type).ok());
    let mut min: Option<ScalarValue> = None;
    let mut max: Option<ScalarValue> = None;
    let mut bounds_known = true;
    let mut null_count = Some(0u64);
    for segment in segments {
        let Some(column) = segment.columns.get(index) else { return ColumnStatistics::new_unknown() };
        null_count = null_count.zip(column.null_count).map(|(a, b)| a + b);
        if column.null_count == Some(segment.rows) {
            continue; // all NULL: no bounds to contribute
        }
        match (parse(&column.min), parse(&column.max)) {
            (Some(lo), Some(hi)) => {
                min = Some(match min { Some(m) if m <= lo => m, _ => lo });
                max = Some(match max { Some(m) if m >= hi => m, _ => hi });
            }
            _ => bounds_known = false,
        }
    }
    let mut statistics = ColumnStatistics::new_unknown();
    if bounds_known {
        statistics.min_value = min.map_or(Precision::Absent, Precision::Inexact);
        statistics.max_value = max.map_or(Precision::Absent, Precision::Inexact);
    }
    statistics.null_count = null_count.map_or(Precision::Absent, |n| Precision::Exact(n as usize));
    statistics
}

/// A segment the manifest names must exist with the size recorded at commit; anything else is
/// damage to report, never a table that silently lost rows.
fn check_segment_file(snapshot: &TableSnapshot, segment: &SegmentMeta) -> Result<()> {
    let path = snapshot.segment_path(segment);
    let reason = match std::fs::metadata(&path) {
        Ok(meta) if meta.len() == segment.bytes => return Ok(()),
        Ok(meta) => format!("{} bytes on disk, the manifest says {}", meta.len(), segment.bytes),
        Err(e) => e.to_string(),
    };
    Err(DataFusionError::External(Box::new(TableError::CorruptSegment { path, reason })))
}

/// Every column the request names must exist: a request is never trusted.
fn validate_columns(request: &ScanRequest, filters: &[Expr], schema: &Schema) -> Result<()> {
    let mut seen = HashSet::new();
    for name in &request.projection {
        if schema.index_of(name).is_err() {
            return plan_err!("table '{}' has no column '{name}'", request.table);
        }
        if !seen.insert(name) {
            return plan_err!("column '{name}' projected twice");
        }
    }
    for filter in filters {
        for column in filter.column_refs() {
            if schema.index_of(&column.name).is_err() {
                return plan_err!("table '{}' has no column '{}'", request.table, column.name);
            }
        }
    }
    Ok(())
}

/// Bytes the plan's Parquet scans read from files.
fn bytes_scanned(plan: &dyn ExecutionPlan) -> u64 {
    let own = plan.metrics().and_then(|m| m.sum_by_name("bytes_scanned")).map(|v| v.as_usize() as u64).unwrap_or(0);
    own + plan.children().iter().map(|c| bytes_scanned(c.as_ref())).sum::<u64>()
}

/// Manifest statistics of segments, in the form DataFusion's pruning predicate evaluates.
struct SegmentStatistics<'a> {
    segments: &'a [&'a SegmentMeta],
    schema: &'a SchemaRef,
}

impl SegmentStatistics<'_> {
    fn bound(&self, column: &Column, max: bool) -> Option<ArrayRef> {
        let index = self.schema.index_of(&column.name).ok()?;
        let data_type = self.schema.field(index).data_type();
        let values = self.segments.iter().map(|s| {
            let text = s.columns.get(index).and_then(|c| if max { c.max.clone() } else { c.min.clone() });
            // An unparsable bound is treated as unknown, which never prunes.
            text.and_then(|t| ScalarValue::try_from_string(t, data_type).ok())
                .unwrap_or_else(|| ScalarValue::try_new_null(data_type).expect("null of column type"))
        });
        ScalarValue::iter_to_array(values).ok()
    }
}

impl PruningStatistics for SegmentStatistics<'_> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.bound(column, false)
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.bound(column, true)
    }

    fn num_containers(&self) -> usize {
        self.segments.len()
    }

    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        let index = self.schema.index_of(&column.name).ok()?;
        Some(Arc::new(UInt64Array::from_iter(self.segments.iter().map(|s| s.columns.get(index).and_then(|c| c.null_count)))))
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        Some(Arc::new(UInt64Array::from_iter_values(self.segments.iter().map(|s| s.rows))))
    }

    fn contained(&self, _column: &Column, _values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        None
    }
}
