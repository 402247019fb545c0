//! `StorageScanExec`: the host's leaf operator that reads a table through a [`StorageNode`].
//!
//! Each output partition sends one [`ScanRequest`] for its share of the segments and passes the
//! node's batches on, checking each against the plan's schema (the node is not trusted to send
//! what was asked). The node's closing statistics become this operator's metrics, which
//! `EXPLAIN ANALYZE` shows and [`crate::QueryStats`] adds up.

use std::fmt;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{ColumnStatistics, Statistics, internal_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream};
use futures::{StreamExt, TryStreamExt};
use quarry_storage::{ScanMessage, ScanRequest, SegmentInfo, StorageNode, batch_wire_bytes};

/// Metric names this operator records (also read by [`crate::QueryStats`]).
pub mod metric {
    /// Bytes the node read from segment files.
    pub const BYTES_READ_STORAGE: &str = "bytes_read_storage";
    /// Bytes of Arrow batches the node handed to the host.
    pub const BYTES_OVER_LINK: &str = "bytes_over_link";
    /// Segments the scan asked for.
    pub const SEGMENTS_REQUESTED: &str = "segments_requested";
    /// Segments the node skipped using manifest statistics.
    pub const SEGMENTS_PRUNED: &str = "segments_pruned";
    /// Rows in the segments the node opened.
    pub const ROWS_SCANNED: &str = "rows_scanned";
    /// Node-side time of the scans, nanoseconds.
    pub const NODE_TIME_NS: &str = "node_time_ns";
}

/// Reads a table's segments through a storage node, one request per partition.
#[derive(Debug)]
pub struct StorageScanExec {
    node: Arc<dyn StorageNode>,
    table: String,
    version: u64,
    partitions: Vec<Vec<SegmentInfo>>,
    projection: Vec<String>,
    filters: Vec<Expr>,
    limit: Option<usize>,
    schema: SchemaRef,
    statistics: Arc<Statistics>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

/// What a [`StorageScanExec`] reads.
#[derive(Debug, Clone)]
pub struct ScanSpec {
    /// Table name.
    pub table: String,
    /// Table version planned against.
    pub version: u64,
    /// Segments per output partition.
    pub partitions: Vec<Vec<SegmentInfo>>,
    /// Projected column names.
    pub projection: Vec<String>,
    /// Filters the node applies exactly.
    pub filters: Vec<Expr>,
    /// Row limit the node applies after filtering.
    pub limit: Option<usize>,
    /// Output schema (the projected columns).
    pub schema: SchemaRef,
    /// Estimated output statistics.
    pub statistics: Statistics,
}

impl StorageScanExec {
    /// A scan of `spec` through `node`.
    pub fn new(node: Arc<dyn StorageNode>, spec: ScanSpec) -> Self {
        assert_eq!(spec.schema.fields().len(), spec.projection.len(), "schema must be the projection");
        let partition_count = spec.partitions.len().max(1);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&spec.schema)),
            Partitioning::UnknownPartitioning(partition_count),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        StorageScanExec {
            node,
            table: spec.table,
            version: spec.version,
            partitions: spec.partitions,
            projection: spec.projection,
            filters: spec.filters,
            limit: spec.limit,
            schema: spec.schema,
            statistics: Arc::new(spec.statistics),
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The table scanned.
    pub fn table(&self) -> &str {
        &self.table
    }
}

impl DisplayAs for StorageScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let segments: usize = self.partitions.iter().map(Vec::len).sum();
        write!(
            f,
            "StorageScanExec: table={}@v{}, node={}, segments={segments}, partitions={}, projection=[{}]",
            self.table,
            self.version,
            self.node.name(),
            self.partitions.len(),
            self.projection.join(", ")
        )?;
        if !self.filters.is_empty() {
            let filters: Vec<String> = self.filters.iter().map(ToString::to_string).collect();
            write!(f, ", filters=[{}]", filters.join(", "))?;
        }
        if let Some(limit) = self.limit {
            write!(f, ", limit={limit}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for StorageScanExec {
    fn name(&self) -> &str {
        "StorageScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() { Ok(self) } else { internal_err!("StorageScanExec has no children") }
    }

    fn execute(&self, partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let segments = match self.partitions.get(partition) {
            Some(segments) => segments,
            None if self.partitions.is_empty() && partition == 0 => &Vec::new(),
            None => return internal_err!("StorageScanExec has no partition {partition}"),
        };
        let request = ScanRequest {
            table: self.table.clone(),
            version: self.version,
            segments: segments.iter().map(|s| s.id.clone()).collect(),
            projection: self.projection.clone(),
            filters: self.filters.clone(),
            limit: self.limit,
        };
        let counter = |name: &'static str| MetricBuilder::new(&self.metrics).counter(name, partition);
        let counters = ScanCounters {
            output_rows: MetricBuilder::new(&self.metrics).output_rows(partition),
            bytes_read: counter(metric::BYTES_READ_STORAGE),
            bytes_over_link: counter(metric::BYTES_OVER_LINK),
            segments_requested: counter(metric::SEGMENTS_REQUESTED),
            segments_pruned: counter(metric::SEGMENTS_PRUNED),
            rows_scanned: counter(metric::ROWS_SCANNED),
            node_time_ns: counter(metric::NODE_TIME_NS),
        };
        let node = Arc::clone(&self.node);
        let checker = ResponseChecker { node_name: node.name().to_string(), schema: Arc::clone(&self.schema), counters, finished: false };
        let response = futures::stream::once(async move { node.scan(request).await }).try_flatten().boxed();
        let batches = futures::stream::unfold(Some((response, checker)), |state| async move {
            let (mut response, mut checker) = state?;
            loop {
                match checker.check(response.next().await) {
                    Checked::Continue => continue,
                    Checked::End => return None,
                    Checked::Item(Ok(batch)) => return Some((Ok(batch), Some((response, checker)))),
                    Checked::Item(Err(e)) => return Some((Err(e), None)),
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), batches)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    #[allow(deprecated)]
    fn partition_statistics(&self, partition: Option<usize>) -> Result<Arc<Statistics>> {
        match partition {
            None => Ok(Arc::clone(&self.statistics)),
            Some(_) => Ok(Arc::new(Statistics::new_unknown(&self.schema))),
        }
    }

    fn supports_limit_pushdown(&self) -> bool {
        false
    }
}

/// Validates a node's response stream and turns its closing statistics into metrics.
struct ResponseChecker {
    node_name: String,
    schema: SchemaRef,
    counters: ScanCounters,
    finished: bool,
}

enum Checked {
    Item(Result<RecordBatch>),
    Continue,
    End,
}

impl ResponseChecker {
    fn check(&mut self, item: Option<Result<ScanMessage>>) -> Checked {
        let node = &self.node_name;
        match item {
            Some(Ok(ScanMessage::Batch(_))) if self.finished => {
                Checked::Item(Err(DataFusionError::Execution(format!("node {node} sent a batch after finishing the scan"))))
            }
            Some(Ok(ScanMessage::Batch(batch))) => {
                if batch.schema().fields() != self.schema.fields() {
                    return Checked::Item(Err(DataFusionError::Execution(format!(
                        "node {node} returned columns {:?}, expected {:?}",
                        batch.schema().fields(),
                        self.schema.fields()
                    ))));
                }
                self.counters.output_rows.add(batch.num_rows());
                self.counters.bytes_over_link.add(batch_wire_bytes(&batch) as usize);
                Checked::Item(Ok(batch))
            }
            Some(Ok(ScanMessage::Finished(stats))) => {
                self.finished = true;
                self.counters.bytes_read.add(stats.bytes_read as usize);
                self.counters.segments_requested.add(stats.segments_requested as usize);
                self.counters.segments_pruned.add(stats.segments_pruned as usize);
                self.counters.rows_scanned.add(stats.rows_scanned as usize);
                self.counters.node_time_ns.add(stats.elapsed_ns as usize);
                Checked::Continue
            }
            Some(Err(e)) => Checked::Item(Err(e)),
            // A stream that ends without its statistics was cut off: never pass a partial
            // result on as complete.
            None if !self.finished => Checked::Item(Err(DataFusionError::Execution(format!(
                "node {node} ended the scan without its final statistics (the result would be incomplete)"
            )))),
            None => Checked::End,
        }
    }
}

struct ScanCounters {
    output_rows: Count,
    bytes_read: Count,
    bytes_over_link: Count,
    segments_requested: Count,
    segments_pruned: Count,
    rows_scanned: Count,
    node_time_ns: Count,
}

/// Statistics of a scan of a table of `rows` rows and `bytes` bytes. Unfiltered, the row count
/// is exact; with filters the node applies, it is an upper bound, and the host-side filter above
/// the scan (filters are pushed `Inexact`) estimates the selectivity.
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
