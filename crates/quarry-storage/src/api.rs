//! The storage interface: what a host may ask of a storage node.
//!
//! Every type here is plain data (names, Arrow schemas and batches, logical expressions), so the
//! same trait can be served in-process ([`crate::LocalStorageNode`]) or over the network: nothing
//! assumes shared memory or a shared file system between host and node. (A fragment's
//! [`FragmentProgress`] is the one exception: each side of a transport keeps its own.)

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::common::ColumnStatistics;
use datafusion::error::Result;
use futures::stream::BoxStream;
use quarry_table::PageEncoding;
use serde::{Deserialize, Serialize};

use crate::profile::NodeDescription;

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
    /// How the table's pages are encoded (the cost of reading selected rows depends on it).
    pub page_encoding: PageEncoding,
    /// Per column (in schema order): the stored (compressed) bytes of its chunks over all
    /// segments, what reading it costs; `None` where a segment does not say.
    pub column_bytes: Vec<Option<u64>>,
    /// Per column (in schema order): the bytes of its chunks once decompressed, over all
    /// segments (a string column's values and lengths, what decoding it copies); `None` where a
    /// segment does not say.
    pub column_decoded_bytes: Vec<Option<u64>>,
    /// Columns `segments` are sorted by (empty if none).
    pub sort_key: Vec<String>,
    /// Further copies of the rows, each sorted by its own key (`quarry layout apply`); a scan
    /// reads each segment range (see [`SegmentInfo::range`]) from `segments` or one of these,
    /// whichever reads fewer bytes of it.
    pub versions: Vec<SortedCopy>,
}

/// A sorted copy of a table's rows: the same rows as [`TableInfo::segments`] in each segment
/// range, in segments of its own (in older manifests, appended ones shared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortedCopy {
    /// Columns the copy is sorted by.
    pub sort_key: Vec<String>,
    /// Its segments.
    pub segments: Vec<SegmentInfo>,
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
    /// Per column, the segment's bounds and order (empty where the node did not send them),
    /// with which the host finds partitions that hold disjoint keys, in order.
    pub columns: Vec<SegmentColumn>,
    /// Its row groups' bounds in the column its copy is sorted by (a sorted copy's segments).
    pub zones: Option<quarry_table::Zones>,
    /// The segment range its rows belong to ([`quarry_table::SegmentMeta::range`]): each copy
    /// of the table holds every range's rows, so a scan may read each range from another copy.
    pub range: u64,
}

/// One column's bounds in one segment, in the manifest's canonical text form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentColumn {
    /// Column name.
    pub name: String,
    /// Lower bound of its non-NULL values, if known.
    pub min: Option<String>,
    /// Upper bound, if known.
    pub max: Option<String>,
    /// NULLs, if known.
    pub null_count: Option<u64>,
    /// The segment's rows are in non-decreasing order of this column (no NULLs).
    pub ascending: bool,
    /// Stored (compressed) bytes of the column's chunks, if known.
    pub bytes: Option<u64>,
}

/// What one leaf of a fragment reads: some of a table's segments, by name. A leaf names tables,
/// versions, segment ids and columns, never files: the node resolves them in its own catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanLeaf {
    /// Table name.
    pub table: String,
    /// Version the segments belong to (from [`TableInfo::version`]).
    pub version: u64,
    /// Segment ids to read, a subset of that version's segments.
    pub segments: Vec<String>,
    /// Columns to return, by name, in this order; empty returns batches of row counts only.
    pub projection: Vec<String>,
    /// Stop after this many rows (only for leaves with no filter above them).
    pub limit: Option<usize>,
}

/// A fragment of a query plan for a node to run next to its data: a DataFusion physical plan
/// (datafusion-proto bytes, see [`crate::fragment`], or the plan itself for a node in the
/// host's process) whose leaves are [`ScanLeaf`]s. A bare leaf
/// is *passthrough* (projected columns, unfiltered, as a plain storage server returns them);
/// operators above it (filter, projection, partial aggregation, top-k, a join of two leaves)
/// are pushdown.
#[derive(Debug, Clone)]
pub struct Fragment {
    /// The plan.
    pub plan: FragmentPlan,
    /// How the node's transport compresses the batches it sends (the host's cost model picks
    /// it; a node in the host's process hands batches over in memory and ignores it).
    pub link_codec: LinkCodec,
    /// The host's estimate of the fragment's weighted memory demand (Hetero-DB's eq. (2),
    /// `admission.rs`), bytes: the node admits it when it fits beside the work it runs.
    pub demand: u64,
    /// Where the node reports, while it runs the fragment, how many stored bytes it has read
    /// (the host's progress bar). Not part of the wire form: a remote node's transport carries
    /// its reports in messages of their own.
    pub progress: FragmentProgress,
}

/// A fragment's plan: encoded, as it crosses a wire, or as the host's process built it, for a
/// node in that process. Nothing crosses a wire there, and the codec's round trip would only
/// cost time: TPC-DS q85's join filter, a list of 13K two-column keys, took 200 of its 450 ms
/// to encode, decode and check by encoding.
#[derive(Debug, Clone)]
pub enum FragmentPlan {
    /// datafusion-proto bytes, from the host or a wire: decoded and validated by the node.
    Encoded(bytes::Bytes),
    /// Built in this process: validated by the node as a decoded plan is.
    Built(Arc<dyn datafusion::physical_plan::ExecutionPlan>),
}

/// The stored bytes a running fragment has read so far, as last reported: shared by the node
/// (or the transport relaying it), which raises it, and the host, which reads it.
#[derive(Debug, Clone, Default)]
pub struct FragmentProgress(Arc<AtomicU64>);

impl FragmentProgress {
    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Records that `bytes` have been read in all; a report lower than an earlier one (they
    /// can arrive out of order) changes nothing.
    pub fn report(&self, bytes: u64) {
        self.0.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Records `bytes` more read.
    pub fn add(&self, bytes: u64) {
        self.0.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Whether `other` is this same fragment's progress (a clone of it).
    pub fn same(&self, other: &FragmentProgress) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Compression of the Arrow IPC a node sends over the link: Arrow's own buffer compression,
/// which the receiving reader undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkCodec {
    /// Uncompressed buffers.
    #[default]
    None,
    /// LZ4 frames: fast on both ends, a modest ratio.
    Lz4,
    /// Zstandard: a better ratio for more CPU on the node.
    Zstd,
}

impl LinkCodec {
    /// Every codec, in the order the cost model considers them.
    pub const ALL: [LinkCodec; 3] = [LinkCodec::None, LinkCodec::Lz4, LinkCodec::Zstd];

    /// The name shown in EXPLAIN.
    pub fn name(self) -> &'static str {
        match self {
            LinkCodec::None => "none",
            LinkCodec::Lz4 => "lz4",
            LinkCodec::Zstd => "zstd",
        }
    }

    /// Arrow IPC's compression for this codec.
    pub fn ipc(self) -> Option<arrow::ipc::CompressionType> {
        match self {
            LinkCodec::None => None,
            LinkCodec::Lz4 => Some(arrow::ipc::CompressionType::LZ4_FRAME),
            LinkCodec::Zstd => Some(arrow::ipc::CompressionType::ZSTD),
        }
    }

    /// The byte that stands for this codec on the wire.
    pub fn tag(self) -> u8 {
        match self {
            LinkCodec::None => 0,
            LinkCodec::Lz4 => 1,
            LinkCodec::Zstd => 2,
        }
    }

    /// The codec a wire byte stands for.
    pub fn from_tag(tag: u8) -> Option<LinkCodec> {
        LinkCodec::ALL.into_iter().find(|c| c.tag() == tag)
    }
}

/// A read of stored bytes: byte ranges of one segment file of a table version, as a plain
/// storage device serves them (passthrough: the host decodes the pages itself). Ranges are
/// checked against the segment's size; the segment must belong to the version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRead {
    /// Table name.
    pub table: String,
    /// Version the segment belongs to.
    pub version: u64,
    /// Segment id.
    pub segment: String,
    /// Byte ranges of the segment file, each non-empty.
    pub ranges: Vec<std::ops::Range<u64>>,
}

impl SegmentRead {
    /// The most bytes one read may ask for: a node holds a read in memory while it serves it,
    /// so readers split larger requests ([`SegmentRead::split`]).
    pub const MAX_BYTES: u64 = 64 << 20;

    /// The reads, each of at most `max_bytes` (> 0), that together cover `ranges` in order;
    /// a range longer than `max_bytes` is cut into consecutive pieces.
    pub fn split(table: &str, version: u64, segment: &str, ranges: &[std::ops::Range<u64>], max_bytes: u64) -> Vec<SegmentRead> {
        assert!(max_bytes > 0, "a segment read must be allowed some bytes");
        let mut reads = Vec::new();
        let mut current: Vec<std::ops::Range<u64>> = Vec::new();
        let mut current_bytes = 0;
        for range in ranges {
            let mut start = range.start;
            while start < range.end {
                if current_bytes == max_bytes {
                    reads.push(std::mem::take(&mut current));
                    current_bytes = 0;
                }
                let end = range.end.min(start + (max_bytes - current_bytes));
                current.push(start..end);
                current_bytes += end - start;
                start = end;
            }
        }
        if !current.is_empty() {
            reads.push(current);
        }
        reads.into_iter().map(|ranges| SegmentRead { table: table.to_string(), version, segment: segment.to_string(), ranges }).collect()
    }

    /// The bytes of each of `ranges` from the answers to their [`SegmentRead::split`] reads,
    /// in order: pieces of one range are concatenated again.
    pub fn join(ranges: &[std::ops::Range<u64>], pieces: Vec<bytes::Bytes>) -> std::result::Result<Vec<bytes::Bytes>, String> {
        let mut pieces = pieces.into_iter();
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            let want = (range.end - range.start) as usize;
            let first = pieces.next().unwrap_or_default();
            if first.len() == want {
                out.push(first);
                continue;
            }
            let mut joined = Vec::with_capacity(want);
            joined.extend_from_slice(&first);
            while joined.len() < want {
                let Some(piece) = pieces.next() else { break };
                joined.extend_from_slice(&piece);
            }
            if joined.len() != want {
                return Err(format!("got {} bytes for range {range:?} of {want} bytes", joined.len()));
            }
            out.push(bytes::Bytes::from(joined));
        }
        if pieces.next().is_some() {
            return Err("got more pieces than the ranges asked for".to_string());
        }
        Ok(out)
    }

    /// Bytes the ranges cover.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|r| r.end.saturating_sub(r.start)).sum()
    }

    /// Whether the ranges cover no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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

/// Declares a fragment's counters once: each is a field of [`ScanStats`], a metric the host's
/// `FragmentExec` records under the name in [`scan_counter`] (which `--stats` adds up), and a
/// total the node exports; `merge` and [`ScanStats::counters`] come from the same list.
macro_rules! scan_counters {
    ($( $(#[doc = $doc:literal])+ $field:ident: $constant:ident = $metric:literal; )+) => {
        /// Accounting of one fragment on the node.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct ScanStats {
            $( $(#[doc = $doc])+ #[serde(default)] pub $field: u64, )+
            /// The node-side operators, top first.
            #[serde(default)]
            pub operators: Vec<NodeOperatorStats>,
        }

        /// The metric names of [`ScanStats`]' counters.
        pub mod scan_counter {
            $( $(#[doc = $doc])+ pub const $constant: &str = $metric; )+
            /// Every counter's metric name and description, in [`super::ScanStats::counters`]' order.
            pub const ALL: &[(&str, &str)] = &[$( ($metric, concat!($($doc),+)) ),+];
        }

        impl ScanStats {
            /// Each counter's metric name and value, in [`scan_counter::ALL`]'s order.
            pub fn counters(&self) -> [(&'static str, u64); scan_counter::ALL.len()] {
                [$( ($metric, self.$field) ),+]
            }

            fn merge_counters(&mut self, other: &ScanStats) {
                $( self.$field += other.$field; )+
            }
        }
    };
}

scan_counters! {
    /// Segments the request named.
    segments_requested: SEGMENTS_REQUESTED = "segments_requested";
    /// Segments skipped by manifest statistics without opening them.
    segments_pruned: SEGMENTS_PRUNED = "segments_pruned";
    /// Rows in the segments that were opened.
    rows_scanned: ROWS_SCANNED = "rows_scanned";
    /// Rows returned.
    rows_returned: ROWS_RETURNED = "rows_returned";
    /// Bytes read from segment files.
    bytes_read: BYTES_READ = "bytes_read_storage";
    /// Read requests the fragment made of segment files.
    read_requests: READ_REQUESTS = "read_requests";
    /// Bytes of those reads the device delivered: reads whose pages the page cache did not
    /// hold (the rest came from memory).
    bytes_read_device: BYTES_READ_DEVICE = "bytes_read_device";
    /// Time the fragment's reads took, nanoseconds: the reading threads' time in each read
    /// (waiting for the device, or copying from the page cache) and in verifying it, summed
    /// over reads in flight.
    read_wait_ns: READ_WAIT_NS = "read_wait_ns";
    /// Bytes of the Arrow batches returned.
    bytes_returned: BYTES_RETURNED = "bytes_returned";
    /// Bytes that crossed the link: the batches as handed over, or as the transport encoded
    /// and compressed them, or the stored bytes a passthrough read fetched.
    link_bytes: LINK_BYTES = "bytes_over_link";
    /// Node-side wall time of the fragment, nanoseconds.
    elapsed_ns: ELAPSED_NS = "node_time_ns";
    /// CPU time the node's workers spent on the fragment, nanoseconds.
    device_cpu_ns: DEVICE_CPU_NS = "device_cpu_ns";
    /// Time the node's workers paused to emulate a slower device CPU, nanoseconds.
    device_pause_ns: DEVICE_PAUSE_NS = "device_pause_ns";
    /// Time batches waited for the device profile's link bandwidth, nanoseconds.
    link_wait_ns: LINK_WAIT_NS = "link_wait_ns";
    /// Time the node's workers waited for a device thread, held by the fragment's other
    /// workers or by other fragments, nanoseconds (summed over workers).
    thread_wait_ns: THREAD_WAIT_NS = "thread_wait_ns";
    /// Bytes spilled to the node's local files (Grace hash join partitions).
    spilled_bytes: SPILLED_BYTES = "spilled_bytes";
    /// Time the fragment waited for admission (a session slot and room for its memory
    /// demand), nanoseconds.
    queued_ns: QUEUED_NS = "queued_ns";
}

/// Rows and time of one operator that ran on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeOperatorStats {
    /// Operator name, e.g. `FilterExec`.
    pub name: String,
    /// Rows its inputs produced.
    #[serde(default)]
    pub rows_in: u64,
    /// Rows the operator produced.
    pub rows_out: u64,
    /// Bytes of the batches it produced.
    #[serde(default)]
    pub bytes_out: u64,
    /// Time DataFusion attributes to the operator, nanoseconds.
    pub elapsed_ns: u64,
}

impl ScanStats {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &ScanStats) {
        self.merge_counters(other);
        for op in &other.operators {
            match self.operators.iter_mut().find(|o| o.name == op.name) {
                Some(mine) => {
                    mine.rows_in += op.rows_in;
                    mine.rows_out += op.rows_out;
                    mine.bytes_out += op.bytes_out;
                    mine.elapsed_ns += op.elapsed_ns;
                }
                None => self.operators.push(op.clone()),
            }
        }
    }
}

/// A storage node: owns tables and scans them next to the data.
#[async_trait]
pub trait StorageNode: Debug + Send + Sync {
    /// A name for messages (e.g. `local` or the node's address).
    fn name(&self) -> &str;
    /// Whether the node runs in the host's process (embedded): its batches cross no link and
    /// need no decoding, and its work competes with the host's for the same cores.
    fn in_process(&self) -> bool {
        false
    }
    /// Names of the node's tables.
    async fn list_tables(&self) -> Result<Vec<String>>;
    /// The committed state of one table; a `Plan` error naming the table if it does not exist.
    async fn table_info(&self, table: &str) -> Result<TableInfo>;
    /// What the node is: its device profile and calibrated rates, for the host's placement.
    async fn describe(&self) -> Result<NodeDescription>;
    /// Runs a fragment. Errors about the fragment (unknown table, column or segment, an
    /// operator the node does not run) come back here; errors while running come as items of
    /// the stream. Dropping the stream cancels the fragment and frees its grant.
    async fn execute(&self, fragment: Fragment) -> Result<ScanStream>;
    /// Reads stored bytes of a segment (one `Bytes` per range, in order), through the device's
    /// read bandwidth and the link, as a plain storage device would serve them.
    async fn read_segment(&self, read: SegmentRead) -> Result<Vec<bytes::Bytes>>;
    /// Reads every segment of every retained version of `tables` (all if empty) and checks it
    /// against its recorded checksums, at the device's read bandwidth.
    async fn scrub(&self, tables: Vec<String>) -> Result<quarry_table::ScrubReport>;
    /// Begins a write transaction on a table: its segments go to [`StorageNode::put_segment`],
    /// then [`StorageNode::commit_write`] publishes them as one version. The table stays locked
    /// until then, or [`StorageNode::abort_write`], or until the node's write lease runs out with
    /// no segment arriving (a host that died): then the write is aborted and nothing changes.
    /// Returns the write's id.
    async fn begin_write(&self, request: BeginWrite) -> Result<String>;
    /// Writes one segment of a write in progress from `batches` (of `schema`, conformed to the
    /// table's), renewing the write's lease; returns its rows.
    async fn put_segment(&self, write: &str, schema: SchemaRef, batches: BoxStream<'static, Result<RecordBatch>>) -> Result<u64>;
    /// Commits a write with the table properties to record; returns the new version.
    async fn commit_write(&self, write: &str, properties: Vec<(String, String)>) -> Result<u64>;
    /// Aborts a write: its segment files are removed and the table's lock released.
    async fn abort_write(&self, write: &str) -> Result<()>;
    /// Runs a job next to the data: `job` is a request body of the node's jobs
    /// ([`crate::NodeJobs`], e.g. a graph job of `quarry-graph-jobs`, which also reads the
    /// reply). Only the reply comes back; what a job writes stays on the node. Dropping the
    /// future (the host went away) cancels the job. A node made without jobs refuses.
    async fn run_job(&self, job: Vec<u8>) -> Result<Vec<u8>>;
}

/// What a host asks to begin writing a table on a node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BeginWrite {
    /// Table name.
    pub table: String,
    /// Its columns.
    pub schema: quarry_table::manifest::TableSchema,
    /// Replace the table (or append to it).
    pub append: bool,
    /// Columns that get Bloom filters.
    pub bloom_filter_columns: Vec<String>,
    /// Sort key columns.
    pub sort_key: Vec<String>,
    /// How the node writes the table's data pages.
    #[serde(default)]
    pub page_encoding: PageEncoding,
}

/// Bytes of a batch's Arrow buffers as it would cross a link: the bytes its (possibly sliced)
/// arrays address, not the capacity of the buffers they share.
pub fn batch_wire_bytes(batch: &RecordBatch) -> u64 {
    batch.columns().iter().map(|c| c.to_data().get_slice_memory_size().unwrap_or(c.get_array_memory_size()) as u64).sum()
}
