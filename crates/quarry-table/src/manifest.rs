//! The versioned table manifest: the single source of truth for what a table contains.
//!
//! A table directory holds Parquet segment files under `data/`, one JSON manifest per committed
//! version (`manifest-00000007.json`) and a `CURRENT` file naming the committed manifest. A
//! segment file that no manifest names is not part of the table, whatever its contents.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::checksum::BlockChecksums;
use crate::error::{Result, TableError};
use crate::segment::{ColumnLayoutSpec, PageEncoding};

/// Manifest layout version written by this build; readers reject newer ones.
pub const MANIFEST_FORMAT_VERSION: u32 = 1;

/// One committed version of a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Layout version of this file ([`MANIFEST_FORMAT_VERSION`]).
    pub format_version: u32,
    /// Table name (equal to its directory name).
    pub table: String,
    /// Version number, 1 for the first commit, +1 for each later one.
    pub version: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub committed_at_ms: u64,
    /// Column names and types.
    pub schema: TableSchema,
    /// Columns the rows are (weakly) ordered by; informative, used by pruning heuristics.
    #[serde(default)]
    pub sort_key: Vec<String>,
    /// Columns whose segments carry Parquet Bloom filters.
    #[serde(default)]
    pub bloom_filter_columns: Vec<String>,
    /// How the table's data pages are encoded (appends keep it).
    #[serde(default)]
    pub page_encoding: PageEncoding,
    /// Columns stored in layouts of their own (`quarry layout apply`; appends keep them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub column_layouts: Vec<ColumnLayoutSpec>,
    /// Free-form key/values (e.g. which generator and scale factor made the table).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// The segments, in table order.
    pub segments: Vec<SegmentMeta>,
    /// Further copies of the same rows, each sorted by a key of its own (HippogriffDB's
    /// query-adaptive versions, `quarry layout apply`): a query reads, for each segment range
    /// (see [`SegmentMeta::range`]), whichever of `segments` and these reads the fewest bytes of
    /// it. An append adds a range to every one: its rows sorted by that copy's key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<SortedVersion>,
}

/// A copy of a table's rows sorted by its own key; it holds exactly the rows of each segment
/// range of the table's `segments`, in segments of that range (of its own, or in manifests
/// written before appends sorted their rows into each copy, the table's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SortedVersion {
    /// Columns the copy's rows are ordered by: within each segment range, and within each
    /// segment of an appended range.
    pub sort_key: Vec<String>,
    /// Its segments.
    pub segments: Vec<SegmentMeta>,
}

/// A table's columns as stored in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableSchema {
    /// Columns in order.
    pub fields: Vec<ColumnDef>,
}

/// One column: name, Arrow type (its `Display` form, e.g. `Decimal128(15, 2)`) and nullability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnDef {
    /// Column name.
    pub name: String,
    /// Arrow data type, in the form `DataType`'s `Display`/`FromStr` use.
    pub data_type: String,
    /// Whether NULLs are allowed.
    pub nullable: bool,
}

/// One Parquet segment file and its statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentMeta {
    /// Segment id, unique within the table; the file is `data/<id>.parquet`.
    pub id: String,
    /// Path relative to the table directory.
    pub path: String,
    /// Number of rows.
    pub rows: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// Number of Parquet row groups.
    pub row_groups: u32,
    /// Per-column statistics, in schema order.
    pub columns: Vec<ColumnStats>,
    /// CRC-32C of each block of the file, computed as it was written; absent in manifests
    /// written before checksums existed (their reads are not verified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksums: Option<BlockChecksums>,
    /// Zone maps: each row group's bounds in the column a sorted copy is sorted by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zones: Option<Zones>,
    /// The segment range its rows belong to: the table version whose commit added them (0 in
    /// manifests written before ranges were recorded, and in segments not yet committed).
    /// Every copy of the table holds each range's rows in segments of that range, so a scan
    /// may read each range from another copy.
    #[serde(default)]
    pub range: u64,
}

/// A segment's row groups and their bounds in one column (SoftFlash's zone maps), in the
/// column type's canonical text form; `None` where a row group has no bound (all NULL).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Zones {
    /// The column.
    pub column: String,
    /// Rows of each row group.
    pub rows: Vec<u64>,
    /// Lower bounds.
    pub min: Vec<Option<String>>,
    /// Upper bounds.
    pub max: Vec<Option<String>>,
}

/// Statistics of one column in one segment. `min`/`max` are valid bounds (possibly truncated for
/// long strings), written in the column type's canonical text form; `None` means unknown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnStats {
    /// Column name.
    pub name: String,
    /// Lower bound of the non-NULL values, if known.
    pub min: Option<String>,
    /// Upper bound of the non-NULL values, if known.
    pub max: Option<String>,
    /// Number of NULLs, if known.
    pub null_count: Option<u64>,
    /// Parquet encodings used by the column's pages (e.g. `RLE_DICTIONARY`).
    pub encodings: Vec<String>,
    /// Compression codec (e.g. `SNAPPY`).
    pub compression: String,
    /// Bytes of the column chunks on disk.
    pub compressed_bytes: u64,
    /// Bytes of the column chunks once decompressed.
    pub uncompressed_bytes: u64,
    /// A sketch of the column's distinct values ([`crate::DistinctSketch`]'s stored form), for
    /// the planner's estimates; absent for types without one and in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinct: Option<String>,
    /// The segment's rows are in non-decreasing order of this column, which has no NULLs
    /// (checked as the rows were written; false in older manifests). With bounds that do not
    /// overlap, a reader can aggregate or merge on the column segment by segment.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ascending: bool,
}

impl TableSchema {
    /// The stored form of an Arrow schema. View types are stored as their plain equivalents,
    /// which is what Parquet holds; readers may ask for views again.
    pub fn from_arrow(schema: &Schema) -> Self {
        let fields = schema
            .fields()
            .iter()
            .map(|f| ColumnDef {
                name: f.name().clone(),
                data_type: storage_type(f.data_type()).to_string(),
                nullable: f.is_nullable(),
            })
            .collect();
        TableSchema { fields }
    }

    /// The Arrow schema; fails if a stored type string does not parse.
    pub fn to_arrow(&self) -> std::result::Result<SchemaRef, String> {
        let mut fields = Vec::with_capacity(self.fields.len());
        for column in &self.fields {
            let data_type: DataType = column
                .data_type
                .parse()
                .map_err(|e| format!("column '{}' has unknown type '{}': {e}", column.name, column.data_type))?;
            fields.push(Field::new(&column.name, data_type, column.nullable));
        }
        Ok(Arc::new(Schema::new(fields)))
    }
}

/// The type a column is stored as: string and binary views become their plain forms.
pub fn storage_type(data_type: &DataType) -> DataType {
    match data_type {
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
        other => other.clone(),
    }
}

/// The stored form of a schema as Arrow (views replaced by plain types, metadata dropped).
pub fn storage_schema(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), storage_type(f.data_type()), f.is_nullable()))
        .collect();
    Arc::new(Schema::new(fields))
}

impl Manifest {
    /// Total rows over all segments.
    pub fn total_rows(&self) -> u64 {
        self.segments.iter().map(|s| s.rows).sum()
    }

    /// Total segment bytes.
    pub fn total_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }

    /// Every segment any copy of the table names (the table's own, then each sorted version's),
    /// each once: the files the manifest keeps.
    pub fn all_segments(&self) -> impl Iterator<Item = &SegmentMeta> {
        let mut seen = std::collections::HashSet::new();
        self.segments.iter().chain(self.versions.iter().flat_map(|v| &v.segments)).filter(move |s| seen.insert(s.id.as_str()))
    }

    /// The segment sets a scan may read, each holding every row once: the table's own
    /// (`None`), then each sorted version's (`Some(index)`).
    pub fn copies(&self) -> impl Iterator<Item = (Option<usize>, &[SegmentMeta])> {
        std::iter::once((None, self.segments.as_slice())).chain(self.versions.iter().enumerate().map(|(i, v)| (Some(i), v.segments.as_slice())))
    }

    /// The Arrow schema of the table.
    pub fn arrow_schema(&self, manifest_path: &Path) -> Result<SchemaRef> {
        self.schema.to_arrow().map_err(|reason| TableError::CorruptManifest {
            path: manifest_path.to_path_buf(),
            reason,
        })
    }

    /// Checks the invariants a reader relies on; `path` is only used in the error.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let corrupt = |reason: String| TableError::CorruptManifest { path: path.to_path_buf(), reason };
        if self.format_version > MANIFEST_FORMAT_VERSION {
            return Err(corrupt(format!(
                "format version {} is newer than this build supports ({MANIFEST_FORMAT_VERSION})",
                self.format_version
            )));
        }
        if self.version == 0 {
            return Err(corrupt("version must be at least 1".into()));
        }
        self.arrow_schema(path)?;
        let mut names = std::collections::HashSet::new();
        for column in &self.schema.fields {
            if !names.insert(column.name.as_str()) {
                return Err(corrupt(format!("duplicate column '{}'", column.name)));
            }
        }
        for key in self.sort_key.iter().chain(&self.bloom_filter_columns) {
            if !names.contains(key.as_str()) {
                return Err(corrupt(format!("sort key or Bloom filter column '{key}' is not a column")));
            }
        }
        let schema_names: Vec<&str> = self.schema.fields.iter().map(|c| c.name.as_str()).collect();
        let mut files: std::collections::HashMap<&str, &SegmentMeta> = std::collections::HashMap::new();
        for (copy, segments) in self.copies() {
            let mut ids = std::collections::HashSet::new();
            for segment in segments {
                if !is_valid_segment_id(&segment.id) || segment.path != segment_relative_path(&segment.id) {
                    return Err(corrupt(format!("segment '{}' has an invalid id or path '{}'", segment.id, segment.path)));
                }
                if !ids.insert(segment.id.as_str()) {
                    return Err(corrupt(format!("segment '{}' is listed twice", segment.id)));
                }
                // A segment two copies share is one file: they must describe it alike.
                if files.insert(segment.id.as_str(), segment).is_some_and(|other| other != segment) {
                    return Err(corrupt(format!("segment '{}' is described differently by two copies of the table", segment.id)));
                }
                if let Some(zones) = &segment.zones {
                    let counts = [zones.rows.len(), zones.min.len(), zones.max.len()];
                    if counts.iter().any(|&n| n != segment.row_groups as usize)
                        || zones.rows.iter().sum::<u64>() != segment.rows
                        || !names.contains(zones.column.as_str())
                    {
                        return Err(corrupt(format!("segment '{}' has zones that do not match its row groups or columns", segment.id)));
                    }
                }
                let stat_names: Vec<&str> = segment.columns.iter().map(|c| c.name.as_str()).collect();
                if stat_names != schema_names {
                    return Err(corrupt(format!("segment '{}' statistics do not match the schema's columns", segment.id)));
                }
            }
            if let Some(v) = copy {
                let version = &self.versions[v];
                if let Some(key) = version.sort_key.iter().find(|k| !names.contains(k.as_str())) {
                    return Err(corrupt(format!("sorted version {} has sort key column '{key}', which is not a column", v + 1)));
                }
                if let Some((range, rows, table)) = rows_differ_by_range(segments.iter().map(|s| (s.range, s.rows)), self.segments.iter().map(|s| (s.range, s.rows))) {
                    return Err(corrupt(format!("sorted version {} holds {rows} rows of segment range {range}, the table {table}", v + 1)));
                }
            }
        }
        Ok(())
    }
}

/// The first segment range (by number) in which a copy's `(range, rows)` segments hold another
/// number of rows than the table's: `(range, the copy's rows, the table's)`; `None` if every
/// range holds as many.
pub fn rows_differ_by_range(copy: impl IntoIterator<Item = (u64, u64)>, table: impl IntoIterator<Item = (u64, u64)>) -> Option<(u64, u64, u64)> {
    let by_range = |segments: &mut dyn Iterator<Item = (u64, u64)>| {
        let mut rows = BTreeMap::new();
        for (range, n) in segments {
            *rows.entry(range).or_insert(0u64) += n;
        }
        rows
    };
    let (copy, table) = (by_range(&mut copy.into_iter()), by_range(&mut table.into_iter()));
    let ranges: std::collections::BTreeSet<u64> = copy.keys().chain(table.keys()).copied().collect();
    ranges.into_iter().map(|r| (r, copy.get(&r).copied().unwrap_or(0), table.get(&r).copied().unwrap_or(0))).find(|(_, a, b)| a != b)
}

/// Relative path of a segment's file inside its table directory.
pub fn segment_relative_path(id: &str) -> String {
    format!("data/{id}.parquet")
}

/// Segment ids are generated by us; anything else (path separators, dots) is rejected so a manifest
/// can never point outside its table directory.
pub fn is_valid_segment_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// File name of the manifest of `version`.
pub fn manifest_file_name(version: u64) -> String {
    format!("manifest-{version:08}.json")
}

/// The version encoded in a manifest file name, if it is one.
pub fn parse_manifest_file_name(name: &str) -> Option<u64> {
    name.strip_prefix("manifest-")?.strip_suffix(".json")?.parse().ok()
}
