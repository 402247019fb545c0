//! The storage interface and the storage node that serves it.
//!
//! All table reads go through [`StorageNode`]: the host sends a [`Fragment`] (a physical plan
//! over [`ScanLeaf`]s of the operators in [`NodeOp`]) and receives
//! a stream of Arrow batches followed by the fragment's statistics. [`LocalStorageNode`] runs
//! fragments over a warehouse within a [`DeviceProfile`]; the Flight service (`quarry-flight`)
//! serves the same trait over the network, so the host's code path is the same either way.

pub mod admission;
pub mod api;
pub mod blocking;
pub mod catalog;
pub mod constant_keys;
mod device_pacing;
pub mod fragment;
pub mod grace_join;
pub mod key_set;
pub mod local;
pub mod local_files;
pub mod node_job;
pub mod node_ops;
pub mod page_reader;
pub mod page_select;
pub mod plain_select;
pub mod plan_metrics;
pub mod precise_sleep;
pub mod profile;
pub mod read_account;
pub mod star;
pub mod verified_store;
pub mod view_compaction;
pub mod zones;

pub use api::{BeginWrite, Fragment, FragmentPlan, FragmentProgress, LinkCodec, NodeOperatorStats, ScanLeaf, ScanMessage, ScanStats, scan_counter, ScanStream, SegmentColumn, SegmentInfo, SegmentRead, SortedCopy, StorageNode, TableInfo, batch_wire_bytes};
pub use catalog::{scan_schema, table_error};
pub use fragment::{ScanLeafExec, built_fragment, check_shippable, decode_fragment, encode_fragment, encode_plan, validate_fragment};
pub use grace_join::GraceHashJoinExec;
pub use node_job::{NodeJob, NodeJobs};
pub use node_ops::{NODE_JOIN_TYPES, NODE_OPS, NodeOp};
pub use plan_metrics::{OperatorIo, operator_io, plan_metric_sum};
pub use local::{CALIBRATION_FILE, LocalStorageNode};
pub use page_select::PageSelectExec;
pub use plain_select::PlainSelectExec;
pub use profile::{BandwidthLimiter, Calibration, DeviceProfile, NodeDescription, parse_size, read_calibration};
