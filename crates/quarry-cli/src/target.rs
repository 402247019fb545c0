//! What a command works on: the embedded node over the warehouse directory, or remote storage
//! nodes (`--nodes`), and how queries use them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use quarry_engine::{EngineOptions, Objective, PushdownMode, QuarrySession, user_message};
use quarry_flight::{RemoteStorageNode, read_token_file, upload_table};
use quarry_graph_jobs::GraphJobs;
use quarry_model::energy::HostPower;
use quarry_storage::{DeviceProfile, LocalStorageNode, StorageNode};
use quarry_table::manifest::storage_schema;
use quarry_table::{SegmentOptions, Warehouse, WriteMode};

use crate::CliResult;

/// The storage a command talks to.
#[derive(Debug, Clone)]
pub struct Target {
    /// The warehouse directory (embedded mode, and staging for `--nodes` loads).
    pub warehouse: PathBuf,
    /// Remote storage nodes; empty means embedded.
    pub nodes: Vec<String>,
    /// Token file for the nodes.
    pub token_file: Option<PathBuf>,
    /// CA certificate file for nodes serving TLS.
    pub tls_ca: Option<PathBuf>,
    /// Pushdown choice.
    pub pushdown: PushdownMode,
    /// What automatic pushdown minimizes.
    pub objective: Objective,
    /// A JSON file of the host's power figures (None: Do 2013's server).
    pub host_power: Option<PathBuf>,
    /// Whether star joins run fused.
    pub star_join: bool,
    /// Device profile of the embedded node.
    pub profile: Option<String>,
    /// Host threads.
    pub threads: usize,
    /// The host's memory budget in bytes (`None`: no limit).
    pub memory: Option<usize>,
}

impl Target {
    /// Whether commands go to remote nodes.
    pub fn is_remote(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// Connects to the remote nodes.
    pub async fn remote_nodes(&self) -> CliResult<Vec<RemoteStorageNode>> {
        let token = self.token_file.as_deref().map(read_token_file).transpose()?;
        let tls_ca = match &self.tls_ca {
            Some(path) => Some(std::fs::read(path).map_err(|e| format!("reading the TLS CA certificate {}: {e}", path.display()))?),
            None => None,
        };
        let mut nodes = Vec::with_capacity(self.nodes.len());
        for url in &self.nodes {
            nodes.push(RemoteStorageNode::connect(url.trim(), token.as_deref(), tls_ca.as_deref()).await?);
        }
        Ok(nodes)
    }

    /// The storage nodes queries run over: the remote ones, or an in-process node over the
    /// warehouse (under `--profile`, if given).
    pub async fn storage_nodes(&self) -> CliResult<Vec<Arc<dyn StorageNode>>> {
        if self.is_remote() {
            return Ok(self.remote_nodes().await?.into_iter().map(|n| Arc::new(n) as Arc<dyn StorageNode>).collect());
        }
        let warehouse = Warehouse::open(&self.warehouse).map_err(|e| e.to_string())?;
        let node = match &self.profile {
            Some(name) => LocalStorageNode::with_profile(warehouse, DeviceProfile::load(name)?).map_err(|e| user_message(&e))?,
            None => LocalStorageNode::new(warehouse),
        };
        Ok(vec![Arc::new(node.with_jobs(Arc::new(GraphJobs)))])
    }

    /// Runs `write` (which writes tables into the warehouse directory it is given). With
    /// `--nodes`, it writes into a local staging warehouse whose tables are then spread over the
    /// nodes segment by segment.
    pub fn write_tables(&self, threads: usize, append: bool, write: impl FnOnce(&Path) -> CliResult) -> CliResult {
        if !self.is_remote() {
            return write(&self.warehouse);
        }
        let staging = std::env::temp_dir().join(format!("quarry-staging-{}", std::process::id()));
        let _cleanup = RemoveOnDrop(staging.clone());
        write(&staging)?;
        let warehouse = Warehouse::open(&staging).map_err(|e| e.to_string())?;
        crate::with_runtime(threads, async {
            let nodes = self.remote_nodes().await?;
            let mut sent = 0;
            for table in warehouse.table_names().map_err(|e| e.to_string())? {
                sent += upload_table(&warehouse, &table, &nodes, append, sent).await?;
                eprintln!("{table}: sent to {} storage node(s)", nodes.len());
            }
            Ok(())
        })
    }

    /// Creates `table` in the staging warehouse, empty, with the columns it has on the nodes (if
    /// any node has it), so that data staged for an append is parsed with the table's types.
    pub fn stage_remote_schema(&self, staging: &Path, table: &str, threads: usize) -> CliResult {
        let info = crate::with_runtime(threads, async {
            for node in self.remote_nodes().await? {
                if node.list_tables().await.map_err(|e| user_message(&e))?.iter().any(|t| t == table) {
                    return Ok(Some(node.table_info(table).await.map_err(|e| user_message(&e))?));
                }
            }
            Ok(None)
        })?;
        let Some(info) = info else { return Ok(()) };
        let warehouse = Warehouse::open(staging).map_err(|e| e.to_string())?;
        let schema = storage_schema(&info.schema);
        let writer = warehouse.begin_write(table, &schema, WriteMode::Replace, SegmentOptions::default(), Vec::new()).map_err(|e| e.to_string())?;
        writer.commit(Vec::new(), Vec::new()).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// A SQL session over the target's nodes.
    pub async fn session(&self) -> CliResult<QuarrySession> {
        let nodes = self.storage_nodes().await?;
        let host_power = match &self.host_power {
            Some(path) => HostPower::load(&path.display().to_string())?,
            None => HostPower::do_2013(),
        };
        let options = EngineOptions {
            threads: self.threads,
            pushdown: self.pushdown,
            objective: self.objective,
            host_power,
            star_join: self.star_join,
            memory_limit: self.memory,
            // `quarry calibrate` run on this machine writes its rates into the warehouse
            // directory, the embedded node's and the host's alike.
            host_rates: quarry_storage::read_calibration(&self.warehouse),
        };
        QuarrySession::try_new(nodes, options).await.map_err(|e| user_message(&e))
    }
}

/// The host's memory budget when `--memory` is not given: 80% of physical memory (DuckDB's
/// default), read from /proc/meminfo; none where that cannot be read.
pub fn default_memory_budget() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some((kib * 1024 / 10 * 8) as usize)
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
