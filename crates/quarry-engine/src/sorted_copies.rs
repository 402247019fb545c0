//! Choosing which copy of a table a scan reads (HippogriffDB's query-adaptive versions, Li 2018
//! ch. 2.3): `quarry layout apply` may keep, beside the table's own segments, copies of its rows
//! sorted by other keys. Each holds every row once, so a scan may read any one of them; it reads
//! the one from which it reads the fewest stored bytes of its columns. At planning time that is
//! judged by the segments the scan's own filters keep; a star probe pushed to a node judges again
//! once its dimensions are built, by the row groups (zone maps) that hold their kept keys, which
//! is exactly what the node will read.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::pruning::PruningStatistics;
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use quarry_storage::catalog::SegmentStatistics;
use quarry_storage::zones::ProbeKeys;
use quarry_storage::{SegmentInfo, TableInfo};

/// One copy of a table's rows.
#[derive(Debug, Clone)]
pub struct TableCopy {
    /// Columns it is sorted by (empty: as stored, unsorted or sorted by the table's key).
    pub sort_key: Vec<String>,
    /// Its segments.
    pub segments: Vec<SegmentInfo>,
}

/// A table's copies: its own segments first, then each sorted copy.
#[derive(Debug)]
pub struct SortedCopies {
    copies: Vec<TableCopy>,
}

/// The copy chosen for a scan, with every copy's estimated bytes.
#[derive(Debug, Clone)]
pub struct CopyChoice {
    pub copies: Arc<SortedCopies>,
    /// Index of the copy read.
    pub chosen: usize,
    /// Per copy, the stored bytes the scan would read of it.
    pub bytes: Vec<f64>,
    /// Whether the choice was made when the star probe's dimensions were built.
    pub at_run_time: bool,
}

impl SortedCopies {
    /// The copies of a table with sorted copies; `None` for one without.
    pub fn of(info: &TableInfo) -> Option<Arc<Self>> {
        if info.versions.is_empty() {
            return None;
        }
        let own = TableCopy { sort_key: info.sort_key.clone(), segments: info.segments.clone() };
        let copies = std::iter::once(own).chain(info.versions.iter().map(|v| TableCopy { sort_key: v.sort_key.clone(), segments: v.segments.clone() })).collect();
        Some(Arc::new(SortedCopies { copies }))
    }

    /// The copies, the table's own first.
    pub fn copies(&self) -> &[TableCopy] {
        &self.copies
    }

    /// The copy that reads the fewest bytes of `columns` where `share(copy, segment)` gives the
    /// share of a segment's rows the scan reads (indices into the copies and their segments);
    /// ties go to the earlier copy.
    fn cheapest(self: &Arc<Self>, columns: &[String], share: impl Fn(usize, usize) -> f64, at_run_time: bool) -> CopyChoice {
        let bytes: Vec<f64> = self
            .copies
            .iter()
            .enumerate()
            .map(|(c, copy)| copy.segments.iter().enumerate().map(|(s, segment)| share(c, s) * column_bytes(segment, columns)).sum())
            .collect();
        let chosen = (0..bytes.len()).fold(0, |best, c| if bytes[c] < bytes[best] { c } else { best });
        CopyChoice { copies: Arc::clone(self), chosen, bytes, at_run_time }
    }

    /// The copy a scan of `columns` reads the fewest bytes of when the segments that `predicate`
    /// (over `schema`, the table's) rules out by their bounds are skipped.
    pub fn cheapest_for_filter(self: &Arc<Self>, columns: &[String], predicate: Option<&Arc<dyn PhysicalExpr>>, schema: &SchemaRef) -> Result<CopyChoice> {
        let pruning = predicate.and_then(|p| PruningPredicateBuilder::new().with_file_schema(Arc::clone(schema)).build(Arc::clone(p)));
        let mut kept: Vec<Vec<bool>> = Vec::with_capacity(self.copies.len());
        for copy in &self.copies {
            let segments: Vec<&SegmentInfo> = copy.segments.iter().collect();
            let statistics = SegmentStatistics { segments: &segments, schema };
            kept.push(match &pruning {
                Some(pruning) if statistics.num_containers() > 0 => pruning.prune(&statistics)?,
                _ => vec![true; segments.len()],
            });
        }
        Ok(self.cheapest(columns, |c, s| if kept[c][s] { 1.0 } else { 0.0 }, false))
    }

    /// The copy a star probe reading `columns` with `keys` reads the fewest bytes of: a segment
    /// whose range in a joined column misses the dimension's keys is skipped, and of a segment
    /// with zone maps only the row groups that hold kept keys are read (as the node does).
    pub fn cheapest_for_probe(self: &Arc<Self>, columns: &[String], keys: ProbeKeys<'_>) -> CopyChoice {
        self.cheapest(columns, |c, s| probe_share(&self.copies[c].segments[s], keys), true)
    }
}

/// The share of `segment`'s rows a probe with `keys` reads.
fn probe_share(segment: &SegmentInfo, keys: ProbeKeys<'_>) -> f64 {
    for column in keys.columns() {
        let Some(bounds) = segment.columns.iter().find(|c| c.name == column) else { continue };
        if let (Some(lo), Some(hi)) = (&bounds.min, &bounds.max)
            && keys.range_may_hold(column, lo, hi) == Some(false)
        {
            return 0.0;
        }
    }
    let Some(zones) = &segment.zones else { return 1.0 };
    let Some(kept) = keys.kept_row_groups(zones) else { return 1.0 };
    let rows: u64 = zones.rows.iter().zip(&kept).filter(|(_, k)| **k).map(|(r, _)| r).sum();
    rows as f64 / segment.rows.max(1) as f64
}

/// The stored bytes of `columns` in `segment` (the segment's size where a column's is unknown).
fn column_bytes(segment: &SegmentInfo, columns: &[String]) -> f64 {
    let known: Option<u64> = columns.iter().map(|name| segment.columns.iter().find(|c| c.name == *name).and_then(|c| c.bytes)).sum();
    known.unwrap_or(segment.bytes) as f64
}

impl CopyChoice {
    /// The chosen copy.
    pub fn copy(&self) -> &TableCopy {
        &self.copies.copies[self.chosen]
    }
}

impl fmt::Display for CopyChoice {
    /// `copy sorted by lo_suppkey (at run time) of [as stored 471.4 MB, lo_suppkey 310.2 MB]`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let name = |copy: &TableCopy| if copy.sort_key.is_empty() { "as stored".to_string() } else { copy.sort_key.join(", ") };
        let each: Vec<String> = self.copies.copies.iter().zip(&self.bytes).map(|(copy, bytes)| format!("{} {:.1} MB", name(copy), bytes / 1e6)).collect();
        let chosen = self.copy();
        let what = if chosen.sort_key.is_empty() { "the copy as stored".to_string() } else { format!("the copy sorted by {}", name(chosen)) };
        write!(f, "reads {what}{} of [{}]", if self.at_run_time { " (chosen when its dimensions were built)" } else { "" }, each.join(", "))
    }
}
