//! The storage interface: what a host may ask of a storage node.
//!
//! Every type here is plain data (names, Arrow schemas and batches, logical expressions), so the
//! same trait can be served in-process ([`crate::LocalStorageNode`]) or over the network: nothing
//! assumes shared memory or a shared file system between host and node.

use std::fmt::Debug;

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::common::ColumnStatistics;
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

/// What a host needs to plan over a table: its committed version, schema and segments.
#[derive(Debug, Clone)]
pub struct TableInfo {
    /// Table name.
    pub name: String,
    /// Committed version the information describes; scans name it to read a consistent snapshot.
    pub version: u64,
    /// Schema as scans return it (strings as `Utf8View`).
    pub schema: SchemaRef,
    /// Segments in table order.
    pub segments: Vec<SegmentInfo>,
    /// Per column (in schema order): bounds and NULL count over all segments, for the host's
    /// cost-based decisions (join order, build sides). Bounds are inexact (strings may be
    /// truncated), counts exact.
    pub column_statistics: Vec<ColumnStatistics>,
}

impl TableInfo {
    /// Rows over all segments.
    pub fn total_rows(&self) -> u64 {
        self.segments.iter().map(|s| s.rows).sum()
    }

    /// Bytes of all segment files.
    pub fn total_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }
}

/// A segment as the host sees it: an opaque id and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Segment id, unique within the table.
    pub id: String,
    /// Rows in the segment.
    pub rows: u64,
    /// Bytes of the segment file.
    pub bytes: u64,
}

/// A scan of some of a table's segments.
#[derive(Debug, Clone)]
pub struct ScanRequest {
    /// Table name.
    pub table: String,
    /// Version the segments belong to (from [`TableInfo::version`]).
    pub version: u64,
    /// Segment ids to read, a subset of that version's segments.
    pub segments: Vec<String>,
    /// Columns to return, by name, in this order; empty returns batches of row counts only.
    pub projection: Vec<String>,
    /// Predicates over the table's columns, all of which rows must satisfy.
    pub filters: Vec<Expr>,
    /// Stop after this many rows (after filtering).
    pub limit: Option<usize>,
}

/// One item of a scan's response stream: batches, then exactly one `Finished` at the end.
#[derive(Debug, Clone)]
pub enum ScanMessage {
    /// Rows, in the projected schema.
    Batch(RecordBatch),
    /// The scan completed; its accounting.
    Finished(ScanStats),
}

/// A scan's response stream.
pub type ScanStream = BoxStream<'static, Result<ScanMessage>>;

/// Accounting of one scan on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanStats {
    /// Segments the request named.
    pub segments_requested: u64,
    /// Segments skipped by manifest statistics without opening them.
    pub segments_pruned: u64,
    /// Rows in the segments that were opened.
    pub rows_scanned: u64,
    /// Rows returned.
    pub rows_returned: u64,
    /// Bytes read from segment files.
    pub bytes_read: u64,
    /// Bytes of the Arrow batches returned.
    pub bytes_returned: u64,
    /// Node-side wall time of the scan, nanoseconds.
    pub elapsed_ns: u64,
}

impl ScanStats {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &ScanStats) {
        self.segments_requested += other.segments_requested;
        self.segments_pruned += other.segments_pruned;
        self.rows_scanned += other.rows_scanned;
        self.rows_returned += other.rows_returned;
        self.bytes_read += other.bytes_read;
        self.bytes_returned += other.bytes_returned;
        self.elapsed_ns += other.elapsed_ns;
    }
}

/// A storage node: owns tables and scans them next to the data.
#[async_trait]
pub trait StorageNode: Debug + Send + Sync {
    /// A name for messages (e.g. `local` or the node's address).
    fn name(&self) -> &str;
    /// Names of the node's tables.
    async fn list_tables(&self) -> Result<Vec<String>>;
    /// The committed state of one table; a `Plan` error naming the table if it does not exist.
    async fn table_info(&self, table: &str) -> Result<TableInfo>;
    /// Starts a scan. Errors about the request (unknown table, column or segment) come back
    /// here; errors while reading come as items of the stream.
    async fn scan(&self, request: ScanRequest) -> Result<ScanStream>;
}

/// Bytes of a batch's Arrow buffers as it would cross a link: the bytes its (possibly sliced)
/// arrays address, not the capacity of the buffers they share.
pub fn batch_wire_bytes(batch: &RecordBatch) -> u64 {
    batch.columns().iter().map(|c| c.to_data().get_slice_memory_size().unwrap_or(c.get_array_memory_size()) as u64).sum()
}
