//! The host: SQL through DataFusion over storage nodes, query accounting and result output.
//!
//! A [`QuarrySession`] registers a storage node's tables as a DataFusion schema. Each table is a
//! [`provider::StorageTable`] whose scans become [`scan::StorageScanExec`] operators: filters,
//! projections and limits travel to the node in a [`quarry_storage::ScanRequest`]; joins,
//! aggregations and sorts run on the host in DataFusion's own operators.

pub mod accounting;
pub mod output;
pub mod provider;
pub mod scan;
pub mod schema_text;
pub mod session;

pub use accounting::{OperatorStats, QueryStats, Side};
pub use output::{FormatSink, OutputFormat, ResultSink};
pub use schema_text::parse_schema;
pub use session::{EngineOptions, QuarrySession, QueryResult, user_message};
