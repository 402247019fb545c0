//! Jobs: work that a crate above storage defines and a node runs beside its fragments (graph
//! analytics, `quarry-graph-jobs`). Storage knows only how to admit a job, not what it does: a
//! node made with [`crate::LocalStorageNode::with_jobs`] parses a request body through its
//! [`NodeJobs`], gives the job a session slot, its memory from the device's pool and the device's
//! threads, and cancels it when the caller goes away. The reply is the job's own bytes.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use quarry_table::{ScrubReport, Warehouse};

/// A job a node has parsed from a request, ready to run.
pub trait NodeJob: Send + 'static {
    /// The memory it asks for, reserved from the device's pool before it starts; `None` for a
    /// job that only reads the node's directory (a listing), which runs at once, without a grant,
    /// so a host can look while the node's slots are busy.
    fn memory_bytes(&self) -> Option<u64>;
    /// Runs it over `warehouse` with `threads` threads (on a blocking thread); it stops with an
    /// error once `cancel` is set. Returns the reply's body, or an error in the job's own words.
    fn run(self: Box<Self>, warehouse: &Warehouse, threads: usize, cancel: Arc<AtomicBool>) -> Result<Vec<u8>, String>;
}

/// The jobs a node runs, registered when the node is made.
pub trait NodeJobs: Debug + Send + Sync {
    /// Parses a request body. It comes from the wire: anything malformed is an error saying what.
    fn parse(&self, body: &[u8]) -> Result<Box<dyn NodeJob>, String>;
    /// Checks the files the jobs keep in `warehouse` (beside its tables) against their recorded
    /// checksums, adding what it finds to `report`; `pace(bytes)` after each block read.
    fn scrub(&self, warehouse: &Warehouse, pace: &mut dyn FnMut(u64), report: &mut ScrubReport) -> Result<(), String>;
}
