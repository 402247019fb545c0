//! Choosing which copy of a table a scan reads (HippogriffDB's query-adaptive versions, Li 2018
//! ch. 2.3): `quarry layout apply` may keep, beside the table's own segments, copies of its rows
//! sorted by other keys, and each append adds its rows to every copy in that copy's order. So
//! a table's rows fall into segment ranges (those of one commit), each held once by every copy;
//! a scan reads each range from the copy from which it reads the fewest stored bytes of its
//! columns in that range. At planning time that is judged by the segments, and the row groups
//! of segments with zone maps, that the scan's own filters keep; a star probe pushed to a node
//! judges again once its dimensions are built, by the row groups (zone maps) that hold their
//! kept keys, which is exactly what the node will read.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::pruning::PruningStatistics;
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::pruning::{PruningPredicate, PruningPredicateBuilder};
use quarry_storage::catalog::{SegmentBounds, SegmentStatistics};
use quarry_storage::zones::ProbeKeys;
use quarry_storage::{SegmentInfo, TableInfo};
use quarry_table::Zones;

/// One copy of a table's rows.
#[derive(Debug, Clone)]
pub struct TableCopy {
    /// Columns it is sorted by (empty: as stored, unsorted or sorted by the table's key).
    pub sort_key: Vec<String>,
    /// Its segments.
    pub segments: Vec<SegmentInfo>,
}

/// A table's copies: its own segments first, then each sorted copy; every copy holds the rows
/// of each segment range ([`SegmentInfo::range`]).
#[derive(Debug)]
pub struct SortedCopies {
    copies: Vec<TableCopy>,
    /// The segment ranges, in the order of the table's own segments.
    ranges: Vec<u64>,
}

/// The copy chosen for each segment range of a scan, with every copy's estimated bytes.
#[derive(Debug, Clone)]
pub struct CopyChoice {
    pub copies: Arc<SortedCopies>,
    /// Per segment range (in [`SortedCopies`]' order), the index of the copy read.
    pub chosen: Vec<usize>,
    /// Per segment range, per copy, the stored bytes the scan would read of it.
    pub bytes: Vec<Vec<f64>>,
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
        let mut ranges: Vec<u64> = Vec::new();
        for segment in &info.segments {
            if !ranges.contains(&segment.range) {
                ranges.push(segment.range);
            }
        }
        Some(Arc::new(SortedCopies { copies, ranges }))
    }

    /// The copies, the table's own first.
    pub fn copies(&self) -> &[TableCopy] {
        &self.copies
    }

    /// For each segment range, the copy that reads the fewest bytes of `columns` in it, where
    /// `share(copy, segment)` gives the share of a segment's rows the scan reads (indices into
    /// the copies and their segments); ties go to the earlier copy.
    fn cheapest(self: &Arc<Self>, columns: &[String], share: impl Fn(usize, usize) -> f64, at_run_time: bool) -> CopyChoice {
        let bytes: Vec<Vec<f64>> = self
            .ranges
            .iter()
            .map(|&range| {
                self.copies
                    .iter()
                    .enumerate()
                    .map(|(c, copy)| copy.segments.iter().enumerate().filter(|(_, s)| s.range == range).map(|(s, segment)| share(c, s) * column_bytes(segment, columns)).sum())
                    .collect()
            })
            .collect();
        let chosen = bytes.iter().map(|each| (0..each.len()).fold(0, |best, c| if each[c] < each[best] { c } else { best })).collect();
        CopyChoice { copies: Arc::clone(self), chosen, bytes, at_run_time }
    }

    /// The copy of each segment range a scan of `columns` reads the fewest bytes of when the
    /// segments, and the row groups of segments with zone maps, that `predicate` (over
    /// `schema`, the table's) rules out by their bounds are skipped.
    pub fn cheapest_for_filter(self: &Arc<Self>, columns: &[String], predicate: Option<&Arc<dyn PhysicalExpr>>, schema: &SchemaRef) -> Result<CopyChoice> {
        let pruning = predicate.and_then(|p| PruningPredicateBuilder::new().with_file_schema(Arc::clone(schema)).build(Arc::clone(p)));
        let mut shares: Vec<Vec<f64>> = Vec::with_capacity(self.copies.len());
        for copy in &self.copies {
            let segments: Vec<&SegmentInfo> = copy.segments.iter().collect();
            let statistics = SegmentStatistics { segments: &segments, schema };
            let Some(pruning) = pruning.as_ref().filter(|_| statistics.num_containers() > 0) else {
                shares.push(vec![1.0; segments.len()]);
                continue;
            };
            let kept = pruning.prune(&statistics)?;
            let mut copy_shares = Vec::with_capacity(segments.len());
            for (segment, kept) in segments.iter().zip(kept) {
                copy_shares.push(match (&segment.zones, kept) {
                    (_, false) => 0.0,
                    (None, true) => 1.0,
                    (Some(zones), true) => zone_share(zones, pruning, schema, segment.rows)?,
                });
            }
            shares.push(copy_shares);
        }
        Ok(self.cheapest(columns, |c, s| shares[c][s], false))
    }

    /// The copy of each segment range a star probe reading `columns` with `keys` reads the
    /// fewest bytes of: a segment whose range in a joined column misses the dimension's keys is
    /// skipped, and of a segment with zone maps only the row groups that hold kept keys are
    /// read (as the node does).
    pub fn cheapest_for_probe(self: &Arc<Self>, columns: &[String], keys: ProbeKeys<'_>) -> CopyChoice {
        self.cheapest(columns, |c, s| probe_share(&self.copies[c].segments[s], keys), true)
    }
}

/// One row group of a segment with zone maps, as pruning sees it: its rows and its bounds in
/// the zones' column (other columns unknown, which never prunes).
struct ZoneBounds<'a> {
    zones: &'a Zones,
    column: usize,
    group: usize,
}

impl SegmentBounds for ZoneBounds<'_> {
    fn rows(&self) -> u64 {
        self.zones.rows[self.group]
    }

    fn bounds(&self, index: usize) -> (Option<&String>, Option<&String>, Option<u64>) {
        if index == self.column { (self.zones.min[self.group].as_ref(), self.zones.max[self.group].as_ref(), None) } else { (None, None, None) }
    }
}

/// The share of a segment's `rows` in the row groups of `zones` that `pruning` keeps.
fn zone_share(zones: &Zones, pruning: &PruningPredicate, schema: &SchemaRef, rows: u64) -> Result<f64> {
    let Ok(column) = schema.index_of(&zones.column) else { return Ok(1.0) };
    let groups: Vec<ZoneBounds<'_>> = (0..zones.rows.len()).map(|group| ZoneBounds { zones, column, group }).collect();
    let groups: Vec<&ZoneBounds<'_>> = groups.iter().collect();
    let kept = pruning.prune(&SegmentStatistics { segments: &groups, schema })?;
    let kept_rows: u64 = zones.rows.iter().zip(kept).filter(|(_, k)| *k).map(|(r, _)| r).sum();
    Ok(kept_rows as f64 / rows.max(1) as f64)
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
    /// The segments read: each range's from the copy chosen for it, in the table's order of
    /// ranges.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let copies = &self.copies;
        copies.ranges.iter().zip(&self.chosen).flat_map(|(&range, &c)| copies.copies[c].segments.iter().filter(move |s| s.range == range).cloned()).collect()
    }
}

impl fmt::Display for CopyChoice {
    /// One range: `reads the copy sorted by lo_suppkey (chosen when its dimensions were built)
    /// of [lo_orderdate 471.4 MB, lo_suppkey 310.2 MB]`; several: `reads per segment range: ...`,
    /// each range's rows (the version that added them) with its choice.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let copies = &self.copies.copies;
        let name = |copy: &TableCopy| if copy.sort_key.is_empty() { "as stored".to_string() } else { copy.sort_key.join(", ") };
        let what = |c: usize| if copies[c].sort_key.is_empty() { "the copy as stored".to_string() } else { format!("the copy sorted by {}", name(&copies[c])) };
        let each = |bytes: &[f64]| copies.iter().zip(bytes).map(|(copy, bytes)| format!("{} {:.1} MB", name(copy), bytes / 1e6)).collect::<Vec<_>>().join(", ");
        let when = if self.at_run_time { " (chosen when its dimensions were built)" } else { "" };
        match (self.chosen.as_slice(), self.bytes.as_slice()) {
            ([chosen], [bytes]) => write!(f, "reads {}{when} of [{}]", what(*chosen), each(bytes)),
            _ => {
                let ranges: Vec<String> =
                    self.copies.ranges.iter().zip(&self.chosen).zip(&self.bytes).map(|((range, &c), bytes)| format!("rows of version {range}: {} of [{}]", what(c), each(bytes))).collect();
                write!(f, "reads per segment range{when}: {}", ranges.join("; "))
            }
        }
    }
}
