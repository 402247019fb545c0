//! The host: SQL through DataFusion over storage nodes, query accounting and result output.
//!
//! A [`QuarrySession`] registers the storage nodes' tables as a DataFusion schema. Each table is a
//! [`provider::StorageTable`] whose scans become [`scan::FragmentExec`] operators; the
//! [`placement::PlacementRule`] then moves the operators a node can run (filter, projection,
//! partial aggregation, top-k, a join on one node) into the fragment when the cost model (or
//! `--pushdown on`) says so. The rest runs on the host in DataFusion's own operators.

pub mod accounting;
pub mod cardinality;
pub mod conjunct_order;
pub mod decimal_arith;
pub mod decimal_division;
pub mod few_group_sums;
pub mod fragment_timing;
pub mod filter_estimate;
pub mod grouping_sets;
pub mod join_bounds;
pub mod join_key_lists;
pub mod join_order;
pub mod key_set_filter;
pub mod keyed_aggregate;
pub mod magic_set;
pub mod null_rejecting_keys;
pub mod output;
pub mod placement;
pub mod probe_yield;
pub mod progress;
pub mod provider;
pub mod query_stop;
pub mod running_window;
pub mod scan;
pub mod schema_text;
pub mod session;
pub mod shared_subplan;
pub mod small_group_aggregate;
pub mod sorted_copies;
pub mod star_exec;
pub mod star_join;
pub mod stored_scan;

pub use accounting::{DeviceStats, OperatorStats, QueryStats, Side};
pub use placement::{Objective, PlacementRule, PushdownMode};
pub use progress::QueryProgress;
pub use query_stop::QueryStop;
pub use output::{FormatSink, OutputFormat, ResultSink};
pub use schema_text::parse_schema;
pub use session::{EngineOptions, QuarrySession, QueryResult, user_message};
