//! Graph jobs as a storage node's jobs: the node side ([`GraphJobs`]) and the host side
//! ([`run_on_node`]). The request and the reply are a [`GraphJob`] and a [`GraphJobOutput`] in
//! JSON; the node admits the job by the memory it asks for (`quarry_storage::NodeJob`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use datafusion::error::{DataFusionError, Result};
use quarry_graph::Cancel;
use quarry_storage::{NodeJob, NodeJobs, StorageNode};
use quarry_table::{ScrubReport, Warehouse};

use crate::{GraphHome, GraphJob, GraphJobOutput, run_graph_job};

/// The graph jobs, for `LocalStorageNode::with_jobs`: a node made with them runs graph jobs
/// hosts send, and scrubs its graphs' files with its tables.
#[derive(Debug, Default)]
pub struct GraphJobs;

impl NodeJobs for GraphJobs {
    fn parse(&self, body: &[u8]) -> Result<Box<dyn NodeJob>, String> {
        let job: GraphJob = serde_json::from_slice(body).map_err(|e| format!("malformed graph job: {e}"))?;
        Ok(Box::new(job))
    }

    fn scrub(&self, warehouse: &Warehouse, pace: &mut dyn FnMut(u64), report: &mut ScrubReport) -> Result<(), String> {
        GraphHome::open(warehouse)?.scrub(pace, report)
    }
}

impl NodeJob for GraphJob {
    fn memory_bytes(&self) -> Option<u64> {
        GraphJob::memory_bytes(self)
    }

    fn run(self: Box<Self>, warehouse: &Warehouse, threads: usize, cancel: Arc<AtomicBool>) -> Result<Vec<u8>, String> {
        let output = run_graph_job(warehouse, *self, threads, None, Cancel::new(cancel))?;
        serde_json::to_vec(&output).map_err(|e| format!("encoding a graph job's reply: {e}"))
    }
}

/// Runs `job` on `node` (remote or local); only its summary comes back, a run's result stays a
/// table of the node.
pub async fn run_on_node(node: &dyn StorageNode, job: &GraphJob) -> Result<GraphJobOutput> {
    let body = serde_json::to_vec(job).map_err(|e| DataFusionError::Internal(format!("encoding a graph job: {e}")))?;
    let reply = node.run_job(body).await?;
    serde_json::from_slice(&reply).map_err(|e| DataFusionError::Execution(format!("storage node {}: malformed graph job reply: {e}", node.name())))
}
