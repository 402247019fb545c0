//! The node's catalog: table information for hosts, and the checks and statistics a scan of
//! a table's segments relies on.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::stats::Precision;
use datafusion::common::{Column, ColumnStatistics, ScalarValue, plan_datafusion_err, plan_err};
use datafusion::error::{DataFusionError, Result};
use quarry_table::{DistinctSketch, SegmentMeta, TableError, TableSnapshot};

use crate::api::{SegmentColumn, SegmentInfo, SortedCopy, TableInfo};

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

pub fn table_info(snapshot: &TableSnapshot) -> TableInfo {
    let schema = scan_schema(&snapshot.schema);
    let column_statistics = (0..schema.fields().len()).map(|i| column_statistics(&snapshot.manifest.segments, i, schema.field(i).data_type())).collect();
    let segments = &snapshot.manifest.segments;
    let column_sum = |bytes: fn(&quarry_table::ColumnStats) -> u64| -> Vec<Option<u64>> {
        (0..schema.fields().len()).map(|i| segments.iter().map(|s| s.columns.get(i).map(bytes)).sum::<Option<u64>>()).collect()
    };
    let (column_bytes, column_decoded_bytes) = (column_sum(|c| c.compressed_bytes), column_sum(|c| c.uncompressed_bytes));
    TableInfo {
        column_statistics,
        column_bytes,
        column_decoded_bytes,
        name: snapshot.manifest.table.clone(),
        version: snapshot.manifest.version,
        page_encoding: snapshot.manifest.page_encoding,
        schema,
        segments: segment_infos(&snapshot.manifest.segments),
        sort_key: snapshot.manifest.sort_key.clone(),
        versions: snapshot.manifest.versions.iter().map(|v| SortedCopy { sort_key: v.sort_key.clone(), segments: segment_infos(&v.segments) }).collect(),
    }
}

fn segment_infos(segments: &[SegmentMeta]) -> Vec<SegmentInfo> {
    segments
        .iter()
        .map(|s| SegmentInfo {
            id: s.id.clone(),
            rows: s.rows,
            bytes: s.bytes,
            zones: s.zones.clone(),
            range: s.range,
            columns: s
                .columns
                .iter()
                .map(|c| SegmentColumn {
                    name: c.name.clone(),
                    min: c.min.clone(),
                    max: c.max.clone(),
                    null_count: c.null_count,
                    ascending: c.ascending,
                    bytes: Some(c.compressed_bytes),
                })
                .collect(),
        })
        .collect()
}

/// The requested segments of the snapshot, in request order; unknown ids are an error, and so
/// are ids of one segment range from two copies of the table (its own segments and a sorted
/// version's), whose rows overlap. Each range may come from another copy (a segment that
/// copies share belongs to each of them).
pub fn select_segments<'a>(snapshot: &'a TableSnapshot, ids: &[String]) -> Result<Vec<&'a SegmentMeta>> {
    let manifest = &snapshot.manifest;
    // Per segment id, the segment and the copies holding it.
    let mut by_id: HashMap<&str, (&SegmentMeta, Vec<usize>)> = HashMap::new();
    for (copy, segments) in manifest.copies().enumerate().map(|(c, (_, segments))| (c, segments)) {
        for segment in segments {
            by_id.entry(segment.id.as_str()).or_insert_with(|| (segment, Vec::new())).1.push(copy);
        }
    }
    // Per range, its first id and the copies that hold every id of it so far.
    let mut ranges: HashMap<u64, (&str, Vec<usize>)> = HashMap::new();
    let mut seen = HashSet::new();
    ids.iter()
        .map(|id| {
            if !seen.insert(id.as_str()) {
                return plan_err!("segment '{id}' requested twice");
            }
            let Some((segment, holders)) = by_id.get(id.as_str()) else {
                return plan_err!("table '{}' version {} has no segment '{id}'", manifest.table, manifest.version);
            };
            let (first, copies) = ranges.entry(segment.range).or_insert_with(|| (id.as_str(), holders.clone()));
            copies.retain(|c| holders.contains(c));
            if copies.is_empty() {
                return plan_err!("table '{}' version {}: segment '{id}' belongs to another sorted copy than segment '{first}'", manifest.table, manifest.version);
            }
            Ok(*segment)
        })
        .collect()
}

/// Bounds, NULL count and distinct count of column `index` over `segments`; a bound stays
/// unknown unless every segment with values has one, and the distinct count unless every
/// segment has a sketch.
fn column_statistics(segments: &[SegmentMeta], index: usize, data_type: &DataType) -> ColumnStatistics {
    let parse = |text: &Option<String>| text.as_ref().and_then(|t| ScalarValue::try_from_string(t.clone(), data_type).ok());
    let mut min: Option<ScalarValue> = None;
    let mut max: Option<ScalarValue> = None;
    let mut bounds_known = true;
    let mut null_count = Some(0u64);
    let mut distinct = Some(DistinctSketch::default());
    for segment in segments {
        let Some(column) = segment.columns.get(index) else { return ColumnStatistics::new_unknown() };
        null_count = null_count.zip(column.null_count).map(|(a, b)| a + b);
        if let Some(union) = &mut distinct {
            match column.distinct.as_deref().and_then(DistinctSketch::decode) {
                Some(sketch) => union.merge(&sketch),
                None => distinct = None,
            }
        }
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
    // A sketch's estimate can exceed the rows it saw by its error; no column has more distinct
    // values than non-NULL rows.
    let non_null = segments.iter().map(|s| s.rows).sum::<u64>().saturating_sub(null_count.unwrap_or(0));
    statistics.distinct_count = distinct.map_or(Precision::Absent, |d| Precision::Inexact(d.estimate().min(non_null) as usize));
    statistics
}

/// A segment the manifest names must exist with the size recorded at commit; anything else is
/// damage to report, never a table that silently lost rows.
pub fn check_segment_file(snapshot: &TableSnapshot, segment: &SegmentMeta) -> Result<()> {
    let path = snapshot.segment_path(segment);
    let reason = match std::fs::metadata(&path) {
        Ok(meta) if meta.len() == segment.bytes => return Ok(()),
        Ok(meta) => format!("{} bytes on disk, the manifest says {}", meta.len(), segment.bytes),
        Err(e) => e.to_string(),
    };
    Err(DataFusionError::External(Box::new(TableError::CorruptSegment { path, reason })))
}

/// A segment's rows and per-column bounds, as the node's manifest ([`SegmentMeta`]) or the
/// host's table information ([`SegmentInfo`]) holds them.
pub trait SegmentBounds {
    /// Rows in the segment.
    fn rows(&self) -> u64;
    /// Lower and upper bound (canonical text) and NULL count of column `index`.
    fn bounds(&self, index: usize) -> (Option<&String>, Option<&String>, Option<u64>);
}

impl SegmentBounds for SegmentMeta {
    fn rows(&self) -> u64 {
        self.rows
    }

    fn bounds(&self, index: usize) -> (Option<&String>, Option<&String>, Option<u64>) {
        self.columns.get(index).map_or((None, None, None), |c| (c.min.as_ref(), c.max.as_ref(), c.null_count))
    }
}

impl SegmentBounds for SegmentInfo {
    fn rows(&self) -> u64 {
        self.rows
    }

    fn bounds(&self, index: usize) -> (Option<&String>, Option<&String>, Option<u64>) {
        self.columns.get(index).map_or((None, None, None), |c| (c.min.as_ref(), c.max.as_ref(), c.null_count))
    }
}

/// Segment statistics, in the form DataFusion's pruning predicate evaluates.
pub struct SegmentStatistics<'a, S: SegmentBounds = SegmentMeta> {
    /// Segments, one container each.
    pub segments: &'a [&'a S],
    /// The table's full scan schema.
    pub schema: &'a SchemaRef,
}

impl<S: SegmentBounds> SegmentStatistics<'_, S> {
    fn bound(&self, column: &Column, max: bool) -> Option<ArrayRef> {
        let index = self.schema.index_of(&column.name).ok()?;
        let data_type = self.schema.field(index).data_type();
        let values = self.segments.iter().map(|s| {
            let (lo, hi, _) = s.bounds(index);
            let text = if max { hi } else { lo };
            // An unparsable bound is treated as unknown, which never prunes.
            text.and_then(|t| ScalarValue::try_from_string(t.clone(), data_type).ok())
                .unwrap_or_else(|| ScalarValue::try_new_null(data_type).expect("null of column type"))
        });
        ScalarValue::iter_to_array(values).ok()
    }
}

impl<S: SegmentBounds> PruningStatistics for SegmentStatistics<'_, S> {
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
        Some(Arc::new(UInt64Array::from_iter(self.segments.iter().map(|s| s.bounds(index).2))))
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        Some(Arc::new(UInt64Array::from_iter_values(self.segments.iter().map(|s| s.rows()))))
    }

    fn contained(&self, _column: &Column, _values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        None
    }
}
