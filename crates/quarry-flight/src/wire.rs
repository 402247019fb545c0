//! What travels in Flight actions: table information, node descriptions and write requests,
//! as JSON. Schemas travel as Arrow IPC; statistics bounds as text parsed with the column's
//! type, like the manifest stores them.

use std::sync::Arc;

use arrow::datatypes::Schema;
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::{SchemaAsIpc, SchemaResult};
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, ScalarValue};
use datafusion::error::{DataFusionError, Result};
pub use quarry_storage::BeginWrite;
use quarry_storage::{Fragment, FragmentPlan, LinkCodec, ScanStats, SegmentColumn, SegmentInfo, SortedCopy, TableInfo, encode_plan};
use quarry_table::{PageEncoding, Zones};
use serde::{Deserialize, Serialize};

/// Action names.
pub mod action {
    /// List the node's tables.
    pub const LIST_TABLES: &str = "list_tables";
    /// One table's information.
    pub const TABLE_INFO: &str = "table_info";
    /// The node's profile and calibration.
    pub const DESCRIBE: &str = "describe";
    /// Start a write transaction.
    pub const BEGIN_WRITE: &str = "begin_write";
    /// Commit a write transaction.
    pub const COMMIT_WRITE: &str = "commit_write";
    /// Abort a write transaction.
    pub const ABORT_WRITE: &str = "abort_write";
    /// Run one of the node's jobs (`quarry_storage::NodeJobs`, e.g. a graph job of
    /// `quarry-graph-jobs`); the body and the answer are the job's own.
    pub const JOB: &str = "job";
    /// Stored bytes of a segment (`quarry_storage::SegmentRead`, passthrough); the answer is
    /// the ranges' bytes in order, in results of at most [`super::STORED_BYTES_CHUNK`] bytes,
    /// each with its offset in the answer ([`super::encode_stored_chunk`]).
    pub const READ_SEGMENT: &str = "read_segment";
    /// Verify tables' segments against their checksums (`quarry_table::ScrubReport`).
    pub const SCRUB: &str = "scrub";
}

/// The first byte of a `do_get` ticket: what follows is the link codec's tag and a fragment.
const TICKET_MARK: u8 = b'Q';

/// A fragment as a `do_get` ticket: the mark, the link codec's tag, then the encoded plan.
pub fn encode_ticket(fragment: &Fragment) -> Result<bytes::Bytes> {
    let plan = encode_plan(&fragment.plan)?;
    let mut ticket = Vec::with_capacity(plan.len() + TICKET_HEADER);
    ticket.extend_from_slice(&[TICKET_MARK, fragment.link_codec.tag()]);
    ticket.extend_from_slice(&fragment.demand.to_le_bytes());
    ticket.extend_from_slice(&plan);
    Ok(ticket.into())
}

/// A ticket's bytes before the plan: the mark, the link codec's tag, the demand (u64, LE).
const TICKET_HEADER: usize = 10;

/// The fragment a `do_get` ticket carries.
pub fn decode_ticket(ticket: bytes::Bytes) -> std::result::Result<Fragment, String> {
    let (Some(&[TICKET_MARK, tag]), Some(demand)) = (ticket.get(..2), ticket.get(2..TICKET_HEADER)) else {
        return Err("the ticket is not a Quarry fragment".to_string());
    };
    let link_codec = LinkCodec::from_tag(tag).ok_or_else(|| format!("the fragment ticket asks for link codec {tag}, which this node does not know"))?;
    let demand = u64::from_le_bytes(demand.try_into().expect("eight bytes"));
    Ok(Fragment { plan: FragmentPlan::Encoded(ticket.slice(TICKET_HEADER..)), link_codec, demand, progress: Default::default() })
}

/// A `do_get` response's messages without data (no IPC header): reports of the node's progress
/// while it runs the fragment, then its statistics as the last message.
#[derive(Debug)]
pub enum FragmentReport {
    /// Stored bytes read so far.
    Progress(u64),
    /// The fragment's accounting, and how many data messages (schema, dictionaries, batches)
    /// the node sent before it; nothing follows.
    Finished { stats: ScanStats, data_messages: u64 },
}

/// A progress report's metadata: `{"progress_bytes_read": N}`, which no statistics message has.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgressWire {
    progress_bytes_read: u64,
}

/// The closing report's metadata.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FinishedWire {
    data_messages: u64,
    stats: ScanStats,
}

impl FragmentReport {
    /// The message's `app_metadata`.
    pub fn encode(&self) -> bytes::Bytes {
        let json = match self {
            FragmentReport::Progress(bytes) => serde_json::to_vec(&ProgressWire { progress_bytes_read: *bytes }),
            FragmentReport::Finished { stats, data_messages } => serde_json::to_vec(&FinishedWire { data_messages: *data_messages, stats: stats.clone() }),
        };
        bytes::Bytes::from(json.expect("report serializes"))
    }

    /// The report in a message's `app_metadata`.
    pub fn decode(metadata: &[u8]) -> std::result::Result<FragmentReport, String> {
        if let Ok(progress) = serde_json::from_slice::<ProgressWire>(metadata) {
            return Ok(FragmentReport::Progress(progress.progress_bytes_read));
        }
        serde_json::from_slice::<FinishedWire>(metadata)
            .map(|f| FragmentReport::Finished { stats: f.stats, data_messages: f.data_messages })
            .map_err(|e| format!("malformed statistics: {e}"))
    }
}

/// A `do_get` data message's `app_metadata`: its place among the response's data messages
/// (0, 1, 2, ...), so that the host finds a message lost, repeated or out of order, which
/// decoding alone may not (two batches swapped, or one repeated, still decode).
pub fn encode_sequence(sequence: u64) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(&sequence.to_le_bytes())
}

/// The sequence number in a data message's `app_metadata`.
pub fn decode_sequence(metadata: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(metadata.try_into().ok()?))
}

/// A result of `read_segment`: the offset of its bytes in the answer (u64, LE), then the bytes,
/// so that the host places every chunk where it belongs or finds it misplaced.
pub fn encode_stored_chunk(offset: u64, bytes: &[u8]) -> bytes::Bytes {
    let mut chunk = Vec::with_capacity(8 + bytes.len());
    chunk.extend_from_slice(&offset.to_le_bytes());
    chunk.extend_from_slice(bytes);
    chunk.into()
}

/// A `read_segment` result's offset and bytes.
pub fn decode_stored_chunk(chunk: bytes::Bytes) -> Option<(u64, bytes::Bytes)> {
    let offset = u64::from_le_bytes(chunk.get(..8)?.try_into().ok()?);
    Some((offset, chunk.slice(8..)))
}

/// The most bytes one result of `read_segment` carries (well under gRPC's 4 MiB default
/// message limit).
pub const STORED_BYTES_CHUNK: usize = 1 << 20;

/// Bytes of Arrow data per Flight message at most (arrow-flight's default, stated). Batches are
/// cut to half of it before they are encoded (`view_compaction::link_batches`), so that the
/// encoder's own split, which would send view columns' buffers with every slice, never runs.
pub const LINK_MESSAGE_BYTES: usize = 2 << 20;

/// [`TableInfo`] on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub struct TableInfoWire {
    name: String,
    version: u64,
    schema_ipc: Vec<u8>,
    segments: Vec<(String, u64, u64)>,
    columns: Vec<ColumnStatsWire>,
    #[serde(default)]
    page_encoding: PageEncoding,
    /// Per segment, per column: bounds and NULL count (absent from older nodes).
    #[serde(default)]
    segment_columns: Vec<Vec<SegmentColumnWire>>,
    /// Per segment, its zones (absent from older nodes).
    #[serde(default)]
    segment_zones: Vec<Option<Zones>>,
    /// Per segment, its segment range (absent from older nodes: one range).
    #[serde(default)]
    segment_ranges: Vec<u64>,
    #[serde(default)]
    sort_key: Vec<String>,
    /// Sorted copies: each its sort key, segments and their columns.
    #[serde(default)]
    versions: Vec<SortedCopyWire>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SortedCopyWire {
    sort_key: Vec<String>,
    segments: Vec<(String, u64, u64)>,
    segment_columns: Vec<Vec<SegmentColumnWire>>,
    segment_zones: Vec<Option<Zones>>,
    #[serde(default)]
    segment_ranges: Vec<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SegmentColumnWire {
    min: Option<String>,
    max: Option<String>,
    null_count: Option<u64>,
    #[serde(default)]
    ascending: bool,
    #[serde(default)]
    bytes: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ColumnStatsWire {
    min: Option<String>,
    max: Option<String>,
    null_count: Option<u64>,
    #[serde(default)]
    distinct_count: Option<u64>,
    #[serde(default)]
    stored_bytes: Option<u64>,
    #[serde(default)]
    decoded_bytes: Option<u64>,
}

impl TableInfoWire {
    /// Encodes `info`.
    pub fn from_info(info: &TableInfo) -> Self {
        let schema: SchemaResult = SchemaAsIpc::new(&info.schema, &IpcWriteOptions::default()).try_into().expect("a table schema encodes as IPC");
        let text = |p: &Precision<ScalarValue>| p.get_value().filter(|v| !v.is_null()).map(|v| v.to_string());
        TableInfoWire {
            name: info.name.clone(),
            version: info.version,
            schema_ipc: schema.schema.to_vec(),
            page_encoding: info.page_encoding,
            segments: segment_list(&info.segments),
            segment_columns: segment_columns(&info.segments),
            segment_zones: info.segments.iter().map(|s| s.zones.clone()).collect(),
            segment_ranges: info.segments.iter().map(|s| s.range).collect(),
            sort_key: info.sort_key.clone(),
            versions: info
                .versions
                .iter()
                .map(|v| SortedCopyWire {
                    sort_key: v.sort_key.clone(),
                    segments: segment_list(&v.segments),
                    segment_columns: segment_columns(&v.segments),
                    segment_zones: v.segments.iter().map(|s| s.zones.clone()).collect(),
                    segment_ranges: v.segments.iter().map(|s| s.range).collect(),
                })
                .collect(),
            columns: info
                .column_statistics
                .iter()
                .zip(info.column_bytes.iter().zip(&info.column_decoded_bytes))
                .map(|(c, (&stored_bytes, &decoded_bytes))| ColumnStatsWire {
                    min: text(&c.min_value),
                    max: text(&c.max_value),
                    null_count: c.null_count.get_value().map(|&n| n as u64),
                    distinct_count: c.distinct_count.get_value().map(|&n| n as u64),
                    stored_bytes,
                    decoded_bytes,
                })
                .collect(),
        }
    }

    /// Decodes and checks the information a node sent.
    pub fn into_info(self, node: &str) -> Result<TableInfo> {
        let bad = |what: String| DataFusionError::Execution(format!("node {node} sent bad table information for '{}': {what}", self.name));
        let encoded = SchemaResult { schema: self.schema_ipc.clone().into() };
        let schema = Schema::try_from(&encoded).map_err(|e| bad(e.to_string()))?;
        if self.columns.len() != schema.fields().len() {
            return Err(bad(format!("{} column statistics for {} columns", self.columns.len(), schema.fields().len())));
        }
        let column_statistics = self
            .columns
            .iter()
            .zip(schema.fields())
            .map(|(c, field)| {
                let parse = |t: &Option<String>| {
                    t.as_ref()
                        .and_then(|t| ScalarValue::try_from_string(t.clone(), field.data_type()).ok())
                        .map_or(Precision::Absent, Precision::Inexact)
                };
                ColumnStatistics {
                    min_value: parse(&c.min),
                    max_value: parse(&c.max),
                    null_count: c.null_count.map_or(Precision::Absent, |n| Precision::Exact(n as usize)),
                    distinct_count: c.distinct_count.map_or(Precision::Absent, |n| Precision::Inexact(n as usize)),
                    ..ColumnStatistics::new_unknown()
                }
            })
            .collect();
        let segments = segment_infos(&self.segments, &self.segment_columns, &self.segment_zones, &self.segment_ranges, &schema).map_err(bad)?;
        let mut versions = Vec::with_capacity(self.versions.len());
        for copy in &self.versions {
            let copy_segments = segment_infos(&copy.segments, &copy.segment_columns, &copy.segment_zones, &copy.segment_ranges, &schema).map_err(bad)?;
            if let Some(key) = copy.sort_key.iter().find(|k| schema.field_with_name(k).is_err()) {
                return Err(bad(format!("a sorted copy's key '{key}' is not a column")));
            }
            let by_range = |segments: &[SegmentInfo]| segments.iter().map(|s| (s.range, s.rows)).collect::<Vec<_>>();
            if quarry_table::rows_differ_by_range(by_range(&copy_segments), by_range(&segments)).is_some() {
                return Err(bad("a sorted copy holds other rows than the table".into()));
            }
            versions.push(SortedCopy { sort_key: copy.sort_key.clone(), segments: copy_segments });
        }
        if let Some(key) = self.sort_key.iter().find(|k| schema.field_with_name(k).is_err()) {
            return Err(bad(format!("sort key '{key}' is not a column")));
        }
        Ok(TableInfo {
            sort_key: self.sort_key.clone(),
            versions,
            name: self.name.clone(),
            version: self.version,
            schema: Arc::new(schema),
            segments,
            column_statistics,
            column_bytes: self.columns.iter().map(|c| c.stored_bytes).collect(),
            column_decoded_bytes: self.columns.iter().map(|c| c.decoded_bytes).collect(),
            page_encoding: self.page_encoding,
        })
    }
}

fn segment_list(segments: &[SegmentInfo]) -> Vec<(String, u64, u64)> {
    segments.iter().map(|s| (s.id.clone(), s.rows, s.bytes)).collect()
}

fn segment_columns(segments: &[SegmentInfo]) -> Vec<Vec<SegmentColumnWire>> {
    segments
        .iter()
        .map(|s| s.columns.iter().map(|c| SegmentColumnWire { min: c.min.clone(), max: c.max.clone(), null_count: c.null_count, ascending: c.ascending, bytes: c.bytes }).collect())
        .collect()
}

/// Segments and their columns as sent, checked against the schema.
fn segment_infos(list: &[(String, u64, u64)], columns: &[Vec<SegmentColumnWire>], zones: &[Option<Zones>], ranges: &[u64], schema: &Schema) -> std::result::Result<Vec<SegmentInfo>, String> {
    if !columns.is_empty() && columns.len() != list.len() {
        return Err(format!("column bounds for {} segments of {}", columns.len(), list.len()));
    }
    if !zones.is_empty() && zones.len() != list.len() {
        return Err(format!("zones for {} segments of {}", zones.len(), list.len()));
    }
    if !ranges.is_empty() && ranges.len() != list.len() {
        return Err(format!("segment ranges for {} segments of {}", ranges.len(), list.len()));
    }
    if let Some(bounds) = columns.iter().find(|c| c.len() != schema.fields().len()) {
        return Err(format!("a segment's bounds of {} columns for {} columns", bounds.len(), schema.fields().len()));
    }
    let mut segments = Vec::with_capacity(list.len());
    for (i, (id, rows, bytes)) in list.iter().enumerate() {
        let columns = match columns.get(i) {
            Some(bounds) => bounds
                .iter()
                .zip(schema.fields())
                .map(|(b, field)| SegmentColumn { name: field.name().clone(), min: b.min.clone(), max: b.max.clone(), null_count: b.null_count, ascending: b.ascending, bytes: b.bytes })
                .collect(),
            None => Vec::new(),
        };
        let zones = zones.get(i).cloned().flatten();
        if let Some(z) = &zones
            && (z.rows.iter().sum::<u64>() != *rows || z.min.len() != z.rows.len() || z.max.len() != z.rows.len() || schema.field_with_name(&z.column).is_err())
        {
            return Err(format!("segment '{id}' has zones that do not match its rows or columns"));
        }
        segments.push(SegmentInfo { id: id.clone(), rows: *rows, bytes: *bytes, columns, zones, range: ranges.get(i).copied().unwrap_or(0) });
    }
    Ok(segments)
}

/// Commits a write on a node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommitWrite {
    /// The write's id (from `begin_write`).
    pub write: String,
    /// Table properties to record.
    pub properties: Vec<(String, String)>,
}

/// What a `do_put` of one segment names.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PutSegment {
    /// The write's id.
    pub write: String,
}
