//! The storage interface and its in-process storage node.
//!
//! All table reads go through [`StorageNode`]: scan a table's segments with a projection,
//! filters and a limit, and receive a stream of Arrow batches followed by the scan's statistics.
//! [`LocalStorageNode`] serves it in-process (embedded mode); a networked node serves the same
//! trait, so the host's code path is the same either way.

pub mod api;
pub mod local;

pub use api::{ScanMessage, ScanRequest, ScanStats, ScanStream, SegmentInfo, StorageNode, TableInfo, batch_wire_bytes};
pub use local::{LocalStorageNode, scan_schema};
