//! Quarry's table format and warehouse catalog.
//!
//! A *warehouse* is a directory of *tables*. A table is a set of standard Parquet *segment* files
//! plus a versioned JSON *manifest* (schema, segments, row counts, per-segment per-column
//! min/max/null counts, sort key, encodings). Commits are atomic (see [`warehouse`]): a reader
//! always sees one committed version, and a crash at any point leaves the previous one intact.
//!
//! This crate knows nothing of SQL or networking; the storage node reads tables through
//! [`Warehouse`] and the loaders write them through [`TableWriter`].

pub mod checksum;
pub mod csv_import;
pub mod error;
pub mod ingest;
pub mod layout_sample;
pub mod manifest;
pub mod scrub;
pub mod segment;
pub mod sketch;
pub mod warehouse;

pub use checksum::{BlockChecksums, DamagedBlock};
pub use error::{Result, TableError};
pub use manifest::{ColumnStats, Manifest, SegmentMeta, SortedVersion, TableSchema, Zones, rows_differ_by_range};
pub use scrub::{Damage, ScrubReport};
pub use segment::{ColumnLayoutSpec, PageEncoding, SegmentOptions, SegmentWriter};
pub use sketch::DistinctSketch;
pub use warehouse::{TableSnapshot, TableWriter, Warehouse, WriteMode};
