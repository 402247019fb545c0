//! The storage node proper: runs fragments over a local [`Warehouse`], within a device profile.
//!
//! A fragment is decoded and validated against the node's catalog, its leaves are bound to
//! Parquet scans of the named segments (pruned first by the manifest's statistics under the
//! filter directly above the leaf), a join of two leaves becomes a Grace hash join within the
//! device's memory, and DataFusion's physical optimizer pushes the filter into the Parquet
//! decoder (row-group, page-index and Bloom pruning, late materialization). Each output
//! partition then runs on its own worker under the profile: pushdown work pauses in proportion
//! to the CPU it used and takes one of the device's threads while it runs; every batch waits
//! for the link. Passthrough fragments (a bare leaf) stand for a plain storage device: they use
//! no device compute budget.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::{FileScanConfig, ParquetSource};
use datafusion::datasource::physical_plan::parquet::{CachedParquetFileReaderFactory, ParquetAccessPlan, RowGroupAccess};
use datafusion::execution::cache::cache_manager::FileMetadataCache;
use datafusion::datasource::source::DataSourceExec;
use datafusion::common::{internal_err, plan_err};
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::error::{DataFusionError, Result};
use datafusion::catalog::TableProvider;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryReservation, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_expr::{PhysicalExpr, conjunction_opt};
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, SendableRecordBatchStream};
use datafusion::prelude::SessionConfig;
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream};
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use quarry_table::segment::conform_batch;
use quarry_table::{PageEncoding, ScrubReport, SegmentMeta, SegmentOptions, TableSnapshot, TableWriter, Warehouse, WriteMode};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::api::{BeginWrite, Fragment, FragmentProgress, LinkCodec, NodeOperatorStats, ScanLeaf, ScanMessage, ScanStats, scan_counter, ScanStream, SegmentRead, StorageNode, TableInfo, batch_wire_bytes};
use crate::constant_keys::hide_constant_order;
use crate::catalog::{SegmentStatistics, check_segment_file, scan_schema, select_segments, table_error, table_info};
use crate::fragment::{LeafResolver, ScanLeafExec, decode_fragment};
use crate::plan_metrics::{operator_io, plan_metric_sum};
use crate::admission::{Admission, MemoryAdmission, Patience, PoolHold};
use crate::blocking::blocking;
use crate::grace_join::GraceHashJoinExec;
use crate::node_ops::NodeOp;
use crate::node_job::NodeJobs;
use crate::plain_select::{PlainSegment, PlainSelectExec};
use crate::page_select::{PageSelectExec, PagedSegment};
use crate::star::{StarProbeExec, StarScanExec};
use crate::zones::ProbeKeys;
use crate::read_account::ReadAccount;
use crate::verified_store::VerifiedStore;
use crate::profile::{BandwidthLimiter, Calibration, DeviceProfile, NodeDescription, ThrottledStore, read_calibration};
use crate::device_pacing::{PacedSteps, Pacing, WorkerTimes, pace_task_inputs};

/// Default number of fragments admitted at once.
const DEFAULT_MAX_SESSIONS: usize = 64;

/// A storage node over a warehouse directory on this machine.
#[derive(Debug)]
pub struct LocalStorageNode {
    name: String,
    warehouse: Warehouse,
    state: SessionState,
    profile: DeviceProfile,
    calibration: Calibration,
    /// Reads of segment files, counted and throttled.
    store: Arc<ThrottledStore>,
    /// The same reads, verified against the segments' checksums: every reader reads through it.
    verified: Arc<VerifiedStore>,
    link: Option<Arc<BandwidthLimiter>>,
    device_threads: Arc<Semaphore>,
    sessions: Arc<Semaphore>,
    /// Admits fragments and graph jobs by their weighted memory demand.
    admission: Arc<MemoryAdmission>,
    counters: Arc<NodeCounters>,
    /// Segments that passthrough reads found in their version's manifest: their file and size
    /// (segments never change once committed, so a read need not parse the manifest again).
    stored_segments: std::sync::Mutex<HashMap<(String, u64, String), (ObjectPath, u64)>>,
    /// Committed table versions, each parsed once (shared with the leaf resolver).
    snapshots: Arc<SnapshotCache>,
    /// Write transactions hosts began, by id.
    writes: std::sync::Mutex<HashMap<String, PendingWrite>>,
    next_write: AtomicU64,
    write_lease: Duration,
    /// The jobs it runs beside fragments (none unless registered).
    jobs: Option<Arc<dyn NodeJobs>>,
}

/// A write transaction a host began: it holds the table's lock until committed, aborted, or
/// its lease runs out (the host died or went away), whichever comes first.
struct PendingWrite {
    writer: Arc<TableWriter>,
    segments: Vec<SegmentMeta>,
    expires: Instant,
}

impl fmt::Debug for PendingWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingWrite").field("segments", &self.segments.len()).field("expires", &self.expires).finish()
    }
}

/// A table-layer error of a write, in its own words.
fn table_write_error(e: impl fmt::Display) -> DataFusionError {
    DataFusionError::Execution(e.to_string())
}

/// How long work waits for its weighted demand (and a fragment's scans, for their memory) before
/// it is admitted anyway: 2 s with no admitted work making progress (a stall: the host may be
/// waiting on the work that waits), 30 s in all (see `admission.rs`).
const ADMISSION_PATIENCE: Patience = Patience { stalled: Duration::from_secs(2), limit: Duration::from_secs(30) };

/// How long a write lives without a segment arriving, unless the node is told otherwise.
const DEFAULT_WRITE_LEASE: Duration = Duration::from_secs(60);

/// A segment file's path in the object store: the one form every reader and the checksum
/// registry use (DataFusion's listing scan names local files the same way).
/// The leaf a star probe reads, directly or through a filter that keeps every column, and that
/// filter's predicate; no leaf for any other input.
fn probe_leaf(probe: &StarProbeExec) -> (Option<&ScanLeafExec>, Option<&Arc<dyn PhysicalExpr>>) {
    match probe.input().downcast_ref::<FilterExec>() {
        Some(filter) if filter.projection().is_none() => (filter.input().downcast_ref::<ScanLeafExec>(), Some(filter.predicate())),
        Some(_) => (None, None),
        None => (probe.input().downcast_ref::<ScanLeafExec>(), None),
    }
}

/// Which row groups of `segment` a probe with `keys` reads, by the segment's zone maps; `None`
/// (all) without zones on a probed key. The rows skipped leave `stats.rows_scanned`.
fn zone_mask(keys: Option<ProbeKeys<'_>>, segment: &SegmentMeta, stats: &mut ScanStats) -> Option<Vec<bool>> {
    let zones = segment.zones.as_ref()?;
    let mask = keys?.kept_row_groups(zones)?;
    let skipped: u64 = zones.rows.iter().zip(&mask).filter(|(_, kept)| !**kept).map(|(rows, _)| rows).sum();
    stats.rows_scanned = stats.rows_scanned.saturating_sub(skipped);
    Some(mask)
}

/// `plan` with each Parquet file that has a mask in `masks` (by object path) reading only the
/// row groups the mask keeps (DataFusion's `ParquetAccessPlan`).
fn with_row_group_masks(plan: Arc<dyn ExecutionPlan>, masks: &HashMap<ObjectPath, Vec<bool>>) -> Result<Arc<dyn ExecutionPlan>> {
    if masks.is_empty() {
        return Ok(plan);
    }
    let masked = plan.transform_up(|node| {
        let Some(config) = node.downcast_ref::<DataSourceExec>().and_then(|exec| exec.data_source().downcast_ref::<FileScanConfig>()) else {
            return Ok(Transformed::no(node));
        };
        let mut config = config.clone();
        config.file_groups = std::mem::take(&mut config.file_groups)
            .into_iter()
            .map(|group| {
                group
                    .into_inner()
                    .into_iter()
                    .map(|file| match masks.get(&file.object_meta.location) {
                        Some(mask) => file.with_extension(ParquetAccessPlan::new(mask.iter().map(|&keep| if keep { RowGroupAccess::Scan } else { RowGroupAccess::Skip }).collect())),
                        None => file,
                    })
                    .collect()
            })
            .collect();
        Ok(Transformed::yes(DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>))
    })?;
    Ok(masked.data)
}

/// `plan` with its Parquet scans reading through `store` (instead of the store registered for
/// local files, which every fragment shares), footers kept in `footers` as DataFusion keeps them.
fn with_reader_store(plan: Arc<dyn ExecutionPlan>, store: Arc<VerifiedStore>, footers: Arc<FileMetadataCache>) -> Result<Arc<dyn ExecutionPlan>> {
    let rebound = plan.transform_up(|node| {
        let Some(config) = node.downcast_ref::<DataSourceExec>().and_then(|exec| exec.data_source().downcast_ref::<FileScanConfig>()) else {
            return Ok(Transformed::no(node));
        };
        let Some(source) = config.file_source.downcast_ref::<ParquetSource>() else { return Ok(Transformed::no(node)) };
        let factory = Arc::new(CachedParquetFileReaderFactory::new(Arc::clone(&store) as Arc<dyn ObjectStore>, Arc::clone(&footers)));
        let mut config = config.clone();
        config.file_source = Arc::new(source.clone().with_parquet_file_reader_factory(factory));
        Ok(Transformed::yes(DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>))
    })?;
    Ok(rebound.data)
}

fn object_path(file: &std::path::Path) -> Result<ObjectPath> {
    ObjectPath::from_absolute_path(file).map_err(|e| DataFusionError::Execution(format!("{}: {e}", file.display())))
}

/// Scrubs `tables` of `warehouse` on a blocking thread, each block read within `limit` and
/// counted; with no tables named, the files of the node's `jobs` too.
async fn scrub_paced(
    warehouse: Warehouse,
    tables: Vec<String>,
    jobs: Option<Arc<dyn NodeJobs>>,
    limit: Option<Arc<BandwidthLimiter>>,
    counters: Arc<NodeCounters>,
) -> Result<ScrubReport> {
    let runtime = tokio::runtime::Handle::current();
    let scrub = tokio::task::spawn_blocking(move || {
        let mut pace = |bytes: u64| {
            counters.scrub_bytes.fetch_add(bytes, Ordering::Relaxed);
            if let Some(limit) = &limit {
                runtime.block_on(limit.consume(bytes));
            }
        };
        let mut report = warehouse.scrub(&tables, &mut pace).map_err(table_error)?;
        if let (true, Some(jobs)) = (tables.is_empty(), jobs) {
            jobs.scrub(&warehouse, &mut pace, &mut report).map_err(DataFusionError::Execution)?;
        }
        Ok(report)
    });
    scrub.await.map_err(|e| DataFusionError::Execution(format!("scrub failed: {e}")))?
}

/// Table versions remembered before the memo starts over.
const SNAPSHOTS_REMEMBERED: usize = 256;

/// Committed table versions that table_info, fragments' leaves and passthrough reads name,
/// parsed once: a version never changes once committed (versions only grow, even across a
/// table's replacement), and its manifest is tens of kilobytes to a megabyte of JSON, which
/// every fragment partition would otherwise parse again.
struct SnapshotCache {
    warehouse: Warehouse,
    parsed: std::sync::Mutex<HashMap<(String, u64), Arc<TableSnapshot>>>,
}

impl std::fmt::Debug for SnapshotCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotCache").field("parsed", &self.parsed.lock().map(|p| p.len()).unwrap_or(0)).finish()
    }
}

impl SnapshotCache {
    fn get(&self, table: &str, version: u64) -> Result<Arc<TableSnapshot>> {
        let key = (table.to_string(), version);
        if let Some(snapshot) = self.parsed.lock().expect("snapshots lock").get(&key) {
            return Ok(Arc::clone(snapshot));
        }
        let snapshot = Arc::new(self.warehouse.table_version(table, version).map_err(table_error)?);
        let mut parsed = self.parsed.lock().expect("snapshots lock");
        if parsed.len() >= SNAPSHOTS_REMEMBERED {
            parsed.clear();
        }
        parsed.insert(key, Arc::clone(&snapshot));
        Ok(snapshot)
    }
}

/// Segments remembered for passthrough reads before the memo starts over.
const STORED_SEGMENTS_REMEMBERED: usize = 100_000;

/// Segment footers a page scan opens at once (see `paged_segments`).
const FOOTERS_AT_ONCE: usize = 8;

/// Cumulative counters since the node started (exported in Prometheus text format): the
/// fragments' own counters ([`ScanStats::counters`]) summed, and what only the node sees.
#[derive(Debug, Default)]
pub struct NodeCounters {
    fragments_started: AtomicU64,
    fragments_rejected: AtomicU64,
    fragments_active: AtomicU64,
    fragments_queued: AtomicU64,
    /// Each of [`scan_counter::ALL`], summed over finished fragments.
    fragment_totals: [AtomicU64; scan_counter::ALL.len()],
    stored_bytes_served: AtomicU64,
    scrub_bytes: AtomicU64,
    scrub_passes: AtomicU64,
    scrub_damage: AtomicU64,
}

impl NodeCounters {
    /// Adds a finished fragment's counters to the totals.
    fn add_fragment(&self, stats: &ScanStats) {
        for (total, (_, value)) in self.fragment_totals.iter().zip(stats.counters()) {
            total.fetch_add(value, Ordering::Relaxed);
        }
    }

    fn total(&self, metric: &str) -> &AtomicU64 {
        let index = scan_counter::ALL.iter().position(|(name, _)| *name == metric).expect("a scan counter");
        &self.fragment_totals[index]
    }
}

impl LocalStorageNode {
    /// Serves the tables of `warehouse` with no device limits.
    pub fn new(warehouse: Warehouse) -> Self {
        Self::with_profile(warehouse, DeviceProfile::load("native").expect("the built-in native profile parses"))
            .expect("the native profile is valid")
    }

    /// Serves the tables of `warehouse` within `profile`.
    pub fn with_profile(warehouse: Warehouse, profile: DeviceProfile) -> Result<Self> {
        profile.validate().map_err(DataFusionError::Configuration)?;
        let threads = profile.threads();
        let memory = profile.memory();
        let mut config = SessionConfig::new().with_target_partitions(threads);
        let options = config.options_mut();
        // No late materialization in the Parquet decoder: arrow-rs decoding the other columns
        // row run by row run was slower than decoding them whole and filtering the batch
        // (SSB SF 10, `lo_quantity < 2`, 2% of rows: 489 vs 407 ms; q1.1 2.2x slower). The
        // filter still prunes segments, row groups and pages by their statistics.
        options.execution.parquet.pushdown_filters = false;
        options.execution.collect_statistics = false;
        // One pool of the device's memory for every fragment's operators and graph job. Greedy,
        // not fair shares: a consumer that cannot get memory spills or waits for it while
        // holding none, which a share that shrinks as consumers register could make wait forever.
        let pool = TrackConsumersPool::new(GreedyMemoryPool::new(memory as usize), NonZeroUsize::new(5).expect("5 is not zero"));
        let runtime = RuntimeEnvBuilder::new().with_memory_pool(Arc::new(pool)).build_arc()?;
        let local = Arc::new(object_store::local::LocalFileSystem::new());
        let read_limit = profile.read_mbps.map(|mbps| Arc::new(BandwidthLimiter::new(mbps)));
        let store = Arc::new(ThrottledStore::new(local, read_limit));
        let verified = Arc::new(VerifiedStore::over_files(Arc::clone(&store)));
        runtime.register_object_store(ObjectStoreUrl::local_filesystem().as_ref(), Arc::clone(&verified) as _);
        let state = SessionStateBuilder::new().with_config(config).with_runtime_env(runtime).with_default_features().build();
        let calibration = read_calibration(warehouse.root()).unwrap_or_default();
        Ok(LocalStorageNode {
            name: "local".into(),
            link: profile.link_mbps.map(|mbps| Arc::new(BandwidthLimiter::new(mbps))),
            device_threads: Arc::new(Semaphore::new(threads)),
            sessions: Arc::new(Semaphore::new(profile.max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS))),
            admission: MemoryAdmission::new(memory),
            counters: Arc::new(NodeCounters::default()),
            stored_segments: Default::default(),
            snapshots: Arc::new(SnapshotCache { warehouse: warehouse.clone(), parsed: Default::default() }),
            writes: Default::default(),
            next_write: AtomicU64::new(0),
            write_lease: DEFAULT_WRITE_LEASE,
            jobs: None,
            warehouse,
            state,
            profile,
            calibration,
            store,
            verified,
        })
    }

    /// Aborts a write that no segment renewed for `lease`.
    pub fn with_write_lease(mut self, lease: Duration) -> Self {
        self.write_lease = lease;
        self
    }

    /// How long a write lives without a segment arriving.
    pub fn write_lease(&self) -> Duration {
        self.write_lease
    }

    /// Aborts the writes whose lease ran out and that no segment upload is using: dropping the
    /// writer removes its segment files and releases the table's lock.
    pub async fn expire_writes(&self) -> Result<()> {
        let now = Instant::now();
        let mut expired = Vec::new();
        self.writes.lock().expect("writes lock").retain(|_, w| {
            let live = w.expires > now || Arc::strong_count(&w.writer) > 1;
            if !live {
                expired.push(Arc::clone(&w.writer));
            }
            live
        });
        if expired.is_empty() { Ok(()) } else { blocking("aborting expired writes", move || Ok(drop(expired))).await }
    }

    /// The writer of a write in progress, its lease renewed.
    fn renew(&self, write: &str) -> Result<Arc<TableWriter>> {
        let mut writes = self.writes.lock().expect("writes lock");
        let pending = writes.get_mut(write).ok_or_else(|| DataFusionError::Execution(format!("no write '{write}' in progress (aborted, or its lease ran out)")))?;
        pending.expires = Instant::now() + self.write_lease;
        Ok(Arc::clone(&pending.writer))
    }

    /// Runs `jobs` (and scrubs their files with the tables).
    pub fn with_jobs(mut self, jobs: Arc<dyn NodeJobs>) -> Self {
        self.jobs = Some(jobs);
        self
    }

    /// Names the node (its listen address) in messages and metrics.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// `bytes` of the device's memory pool for a consumer that cannot spill, once the pool has
    /// them: it waits, as for a session slot, while concurrent work holds the memory (what it
    /// holds is bounded and returned when it finishes). Dropping the future stops the wait.
    async fn reserve_waiting(&self, name: &str, bytes: usize) -> MemoryReservation {
        let reservation = MemoryConsumer::new(name).register(&self.state.runtime_env().memory_pool);
        let mut pause = Duration::from_millis(2);
        while reservation.try_grow(bytes).is_err() {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
        reservation
    }

    /// The device profile's link, for a transport that paces what it sends itself (compressed
    /// batches: see [`LinkCodec`]).
    pub fn link_limiter(&self) -> Option<Arc<BandwidthLimiter>> {
        self.link.clone()
    }

    /// Scrubs every table (and the files of the node's jobs, its graphs) in the background, over and over: a pass reading at most
    /// `mbps` MB/s, then `pause`. Damage is reported on stderr and counted in the metrics
    /// (`quarry_node_scrub_damage`: what the last pass found). Ends when the node is dropped.
    pub fn start_background_scrub(self: &Arc<Self>, mbps: f64, pause: Duration) -> tokio::task::JoinHandle<()> {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(this) = node.upgrade() else { return };
                let (warehouse, counters, jobs) = (this.warehouse.clone(), Arc::clone(&this.counters), this.jobs.clone());
                let name = this.name.clone();
                drop(this);
                let limit = Some(Arc::new(BandwidthLimiter::new(mbps)));
                match scrub_paced(warehouse, Vec::new(), jobs, limit, Arc::clone(&counters)).await {
                    Ok(report) => {
                        for damage in &report.damage {
                            eprintln!("quarry: {name}: scrub found damage in {} {}: {}", damage.name, damage.location(), damage.reason);
                        }
                        counters.scrub_damage.store(report.damage.len() as u64, Ordering::Relaxed);
                        counters.scrub_passes.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => eprintln!("quarry: {name}: background scrub failed: {e}"),
                }
                tokio::time::sleep(pause).await;
            }
        })
    }

    /// Records every read of segment files from now on into a new file at `path`, in the
    /// trace format of EMOS (`quarry model emos`).
    pub fn record_io_trace(&self, path: &std::path::Path) -> std::result::Result<(), String> {
        self.store.record_trace(path)
    }

    /// Fails, from now on, the reads of segment files that `faults` picks, with an I/O error
    /// (the fault simulation's failing disk, crates/quarry-flight/tests/fault_sim).
    pub fn inject_read_faults(&self, faults: crate::profile::ReadFaults) -> std::result::Result<(), String> {
        self.store.inject_read_faults(faults)
    }

    /// The warehouse served.
    pub fn warehouse(&self) -> &Warehouse {
        &self.warehouse
    }

    /// Corrects the bytes a finished fragment moved over the link in the totals, once the
    /// service knows what crossed: its batches compressed after the fragment counted them, and
    /// the ticket that came the other way (`counted` bytes became `crossed`).
    pub fn correct_link_bytes(&self, counted: u64, crossed: u64) {
        let total = self.counters.total(scan_counter::LINK_BYTES);
        // The fragment added `counted` when it finished, before the service saw its end.
        total.fetch_add(crossed, Ordering::Relaxed);
        total.fetch_sub(counted, Ordering::Relaxed);
    }

    /// The node's cumulative counters in Prometheus text exposition format.
    pub fn metrics_text(&self) -> String {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let node_only: [(&str, &str, &str, u64); 12] = [
            ("quarry_node_fragments_total", "counter", "Fragments started", load(&c.fragments_started)),
            ("quarry_node_fragments_rejected_total", "counter", "Fragments rejected by validation", load(&c.fragments_rejected)),
            ("quarry_node_fragments_active", "gauge", "Fragments running now", load(&c.fragments_active)),
            ("quarry_node_fragments_queued", "gauge", "Fragments waiting for admission", load(&c.fragments_queued)),
            ("quarry_node_admitted_demand_bytes", "gauge", "Weighted memory demand of the admitted work", self.admission.admitted_bytes()),
            ("quarry_node_admissions_overcommitted_total", "counter", "Work admitted though its demand did not fit (admitted work stalled, or the wait reached its limit)", self.admission.overcommitted()),
            ("quarry_node_memory_reserved_bytes", "gauge", "Bytes reserved from the node's memory pool (operators, fragments' scans, jobs)", self.state.runtime_env().memory_pool.reserved() as u64),
            ("quarry_node_bytes_read_total", "counter", "Bytes read from segment files (fragments, passthrough reads and scrubs)", self.store.bytes_read()),
            ("quarry_node_stored_bytes_served_total", "counter", "Stored segment bytes served to hosts (passthrough)", load(&c.stored_bytes_served)),
            ("quarry_node_scrub_bytes_total", "counter", "Bytes read and checked by scrubs", load(&c.scrub_bytes)),
            ("quarry_node_scrub_passes_total", "counter", "Background scrub passes completed", load(&c.scrub_passes)),
            ("quarry_node_scrub_damage", "gauge", "Damaged files or byte ranges the last background scrub pass found", load(&c.scrub_damage)),
        ];
        let mut text = String::new();
        let mut export = |name: &str, kind: &str, help: &str, value: &dyn fmt::Display| {
            text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{node=\"{}\"}} {value}\n", self.name));
        };
        for (name, kind, help, value) in node_only {
            export(name, kind, help, &value);
        }
        // Times are counted in nanoseconds and exported in seconds, as Prometheus names them.
        for ((metric, doc), total) in scan_counter::ALL.iter().zip(&c.fragment_totals) {
            let help = format!("Fragments: {}", doc.split_whitespace().collect::<Vec<_>>().join(" ").replace(", nanoseconds", " (seconds)"));
            match metric.strip_suffix("_ns") {
                Some(stem) => export(&format!("quarry_node_{stem}_seconds_total"), "counter", &help, &(load(total) as f64 / 1e9)),
                None => export(&format!("quarry_node_{metric}_total"), "counter", &help, &load(total)),
            }
        }
        text
    }

    /// The file and size of the segment a passthrough read names, checked against the catalog.
    fn stored_segment(&self, read: &SegmentRead) -> Result<(ObjectPath, u64)> {
        let key = (read.table.clone(), read.version, read.segment.clone());
        if let Some(found) = self.stored_segments.lock().expect("segments lock").get(&key) {
            return Ok(found.clone());
        }
        let snapshot = self.snapshots.get(&read.table, read.version)?;
        let [segment] = select_segments(&snapshot, std::slice::from_ref(&read.segment))?[..] else {
            return internal_err!("one segment id selects one segment");
        };
        let path = self.admit_segment(&snapshot, segment)?;
        let mut memo = self.stored_segments.lock().expect("segments lock");
        if memo.len() >= STORED_SEGMENTS_REMEMBERED {
            memo.clear();
        }
        memo.insert(key, (path.clone(), segment.bytes));
        Ok((path, segment.bytes))
    }

    /// Checks a leaf against the catalog and returns the schema it produces.
    fn resolver(&self) -> LeafResolver {
        let snapshots = Arc::clone(&self.snapshots);
        Arc::new(move |leaf: &ScanLeaf| {
            let snapshot = snapshots.get(&leaf.table, leaf.version)?;
            select_segments(&snapshot, &leaf.segments)?;
            let schema = scan_schema(&snapshot.schema);
            let mut seen = HashSet::new();
            let mut indices = Vec::with_capacity(leaf.projection.len());
            for name in &leaf.projection {
                let Ok(index) = schema.index_of(name) else {
                    return plan_err!("table '{}' has no column '{name}'", leaf.table);
                };
                if !seen.insert(name) {
                    return plan_err!("column '{name}' projected twice");
                }
                indices.push(index);
            }
            Ok(Arc::new(schema.project(&indices)?))
        })
    }

    /// Replaces the fragment's leaves by scans of this node's files and its joins by Grace hash
    /// joins within the device memory.
    fn bind<'a>(&'a self, plan: Arc<dyn ExecutionPlan>, stats: &'a mut ScanStats) -> BoxFuture<'a, Result<Arc<dyn ExecutionPlan>>> {
        async move {
            if let Some(leaf) = plan.downcast_ref::<ScanLeafExec>() {
                let snapshot = self.leaf_snapshot(leaf)?;
                return self.bind_leaf(&snapshot, leaf, None, None, stats).await;
            }
            if let Some(probe) = plan.downcast_ref::<StarProbeExec>()
                && let (Some(leaf), predicate) = probe_leaf(probe)
            {
                let bounds = probe.key_bounds_predicate()?;
                let input_schema = probe.input().schema();
                // A sorted copy's row groups that hold no kept key are skipped (zone maps).
                let keys = probe.tables().map(|tables| ProbeKeys::new(probe.spec(), tables, &input_schema));
                if let Some(scan) = self.bind_star_scan(probe, leaf, predicate, bounds.as_ref(), keys, stats).await? {
                    return Ok(scan);
                }
                // Over an ordinary scan, the bounds filter too: the scan prunes segments by them.
                let snapshot = self.leaf_snapshot(leaf)?;
                let source = probe.input().downcast_ref::<FilterExec>().map_or(probe.input(), |filter| filter.input());
                let input = match conjunction_opt(predicate.cloned().into_iter().chain(bounds)) {
                    Some(predicate) => {
                        let filter: Arc<dyn ExecutionPlan> = Arc::new(FilterExec::try_new(predicate, Arc::clone(source))?);
                        self.bind_filter_over_leaf(&snapshot, &filter, leaf, keys, stats).await?
                    }
                    None => self.bind_leaf(&snapshot, leaf, None, keys, stats).await?,
                };
                return replace_children_if_necessary(Arc::clone(&plan), vec![input]);
            }
            if let Some(filter) = plan.downcast_ref::<FilterExec>()
                && let Some(leaf) = filter.input().downcast_ref::<ScanLeafExec>()
            {
                let snapshot = self.leaf_snapshot(leaf)?;
                return self.bind_filter_over_leaf(&snapshot, &plan, leaf, None, stats).await;
            }
            let mut children = Vec::new();
            for child in plan.children() {
                children.push(self.bind(Arc::clone(child), stats).await?);
            }
            let plan = replace_children_if_necessary(plan, children)?;
            // Rebuilt over the bound leaves, an aggregate sees their constants afresh.
            if let Some(unordered) = hide_constant_order(&plan)? {
                return Ok(unordered);
            }
            if NodeOp::of(plan.as_ref()) == Some(NodeOp::Join) {
                let join = plan.downcast_ref::<HashJoinExec>().expect("NodeOp::Join is a HashJoinExec");
                // The device's memory bounds it; the pool it reserves from decides its share.
                let budget = self.profile.memory() as usize;
                let dir = self.warehouse.root().join(SPILL_DIR);
                std::fs::create_dir_all(&dir).map_err(|e| DataFusionError::Execution(format!("creating {}: {e}", dir.display())))?;
                return Ok(Arc::new(GraceHashJoinExec::try_from_hash_join(join, budget, dir)?));
            }
            Ok(plan)
        }
        .boxed()
    }

    /// `filter` (a [`FilterExec`]) directly over `leaf`: a selection over PLAIN pages, or page
    /// by page, or a filter over a Parquet scan; with `keys`, zone maps skip row groups.
    async fn bind_filter_over_leaf(&self, snapshot: &TableSnapshot, filter_plan: &Arc<dyn ExecutionPlan>, leaf: &ScanLeafExec, keys: Option<ProbeKeys<'_>>, stats: &mut ScanStats) -> Result<Arc<dyn ExecutionPlan>> {
        let filter = filter_plan.downcast_ref::<FilterExec>().expect("a filter over a leaf");
        if let Some(select) = self.bind_plain_select(snapshot, filter, leaf, stats)? {
            return Ok(select);
        }
        if let Some(select) = self.bind_page_select(snapshot, filter, leaf, keys, stats).await? {
            return Ok(select);
        }
        let scan = self.bind_leaf(snapshot, leaf, Some(filter.predicate()), keys, stats).await?;
        replace_children_if_necessary(Arc::clone(filter_plan), vec![scan])
    }

    /// A Parquet scan of the leaf's segments that survive the manifest's statistics under
    /// `predicate` (the filter the fragment applies directly above the leaf); with `keys`,
    /// the row groups of a sorted copy that hold no kept key are skipped.
    async fn bind_leaf(&self, snapshot: &TableSnapshot, leaf: &ScanLeafExec, predicate: Option<&Arc<dyn PhysicalExpr>>, keys: Option<ProbeKeys<'_>>, stats: &mut ScanStats) -> Result<Arc<dyn ExecutionPlan>> {
        let kept = self.kept_segments(snapshot, leaf, predicate, stats)?;
        if kept.is_empty() {
            return Ok(Arc::new(EmptyExec::new(leaf.schema())));
        }
        let table_schema = scan_schema(&snapshot.schema);
        let scan = with_reader_store(self.parquet_scan(snapshot, &kept, &table_schema, leaf.leaf()).await?, self.fragment_store(), self.footers())?;
        let mut masks = HashMap::new();
        for segment in &kept {
            if let Some(mask) = zone_mask(keys, segment, stats) {
                masks.insert(object_path(&snapshot.segment_path(segment))?, mask);
            }
        }
        with_row_group_masks(scan, &masks)
    }

    /// The memory a fragment's scans hold at once: for each leaf, its largest row group of the
    /// columns it reads, decompressed (the manifest's uncompressed bytes per row group), twice
    /// (the pages, and the arrays decoded from them), once for each partition reading at once.
    /// Scans decode outside the operators' reservations, so admission counts this, and on a
    /// device holds it from the pool while the fragment runs (the soak's 512 MB node reached
    /// 702 MiB when only the host's estimate counted).
    fn scan_demand(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<u64> {
        let mut demand = 0u64;
        plan.apply(|node| {
            if let Some(leaf) = node.downcast_ref::<ScanLeafExec>() {
                let request = leaf.leaf();
                let snapshot = self.leaf_snapshot(leaf)?;
                let segments: Vec<&SegmentMeta> = snapshot.manifest.segments.iter().filter(|s| request.segments.contains(&s.id)).collect();
                let row_group = |s: &SegmentMeta| {
                    let bytes: u64 = s.columns.iter().filter(|c| request.projection.contains(&c.name)).map(|c| c.uncompressed_bytes).sum();
                    bytes / u64::from(s.row_groups.max(1))
                };
                let largest = segments.iter().map(|s| row_group(s)).max().unwrap_or(0);
                let readers = (segments.len() as u64).min(self.profile.threads() as u64);
                demand = demand.saturating_add(2 * largest * readers);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(demand)
    }

    /// The table version a leaf names.
    fn leaf_snapshot(&self, leaf: &ScanLeafExec) -> Result<Arc<TableSnapshot>> {
        let request = leaf.leaf();
        self.snapshots.get(&request.table, request.version)
    }

    /// A filter directly over a leaf of a table with PLAIN pages, as a [`PlainSelectExec`]
    /// (which reads selected values by offset); `None` where that does not apply.
    fn bind_plain_select(&self, snapshot: &TableSnapshot, filter: &FilterExec, leaf: &ScanLeafExec, stats: &mut ScanStats) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let request = leaf.leaf();
        let applies = snapshot.manifest.page_encoding == PageEncoding::Plain
            && request.limit.is_none()
            && PlainSelectExec::supports(&leaf.schema(), filter.predicate());
        if !applies {
            return Ok(None);
        }
        let kept = self.kept_segments(snapshot, leaf, Some(filter.predicate()), stats)?;
        if kept.is_empty() {
            return Ok(Some(Arc::new(EmptyExec::new(leaf.schema()))));
        }
        let segments = kept
            .iter()
            .map(|s| {
                Ok(PlainSegment { path: object_path(&snapshot.segment_path(s))?, size: s.bytes })
            })
            .collect::<Result<Vec<_>>>()?;
        let threads = self.profile.threads();
        let store = self.fragment_store() as Arc<dyn ObjectStore>;
        let select: Arc<dyn ExecutionPlan> = Arc::new(PlainSelectExec::try_new(segments, threads, leaf.schema(), Arc::clone(filter.predicate()), store)?);
        // A filter may carry the projection above it.
        Ok(Some(match filter.projection() {
            Some(indices) => {
                let schema = leaf.schema();
                let exprs = indices.iter().map(|&i| (Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>, schema.field(i).name().clone()));
                Arc::new(ProjectionExec::try_new(exprs, select)?)
            }
            None => select,
        }))
    }

    /// A star probe over a (filtered) leaf as a [`StarScanExec`], which reads the segments page
    /// by page; `None` (the probe then runs over an ordinary scan) where a segment has a column
    /// that reader does not read. Segments that fail the probe's key `bounds` are not read.
    async fn bind_star_scan(
        &self,
        probe: &StarProbeExec,
        leaf: &ScanLeafExec,
        predicate: Option<&Arc<dyn PhysicalExpr>>,
        bounds: Option<&Arc<dyn PhysicalExpr>>,
        keys: Option<ProbeKeys<'_>>,
        stats: &mut ScanStats,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(tables) = probe.tables() else { return Ok(None) };
        if leaf.leaf().limit.is_some() {
            return Ok(None);
        }
        let snapshot = self.leaf_snapshot(leaf)?;
        let pruning = conjunction_opt(predicate.into_iter().chain(bounds).cloned());
        let Some(segments) = self.paged_segments(&snapshot, leaf, pruning.as_ref(), keys, stats).await? else { return Ok(None) };
        let store = self.fragment_store();
        let scan = StarScanExec::try_new(segments, self.profile.threads(), leaf.schema(), predicate.cloned(), Arc::clone(probe.spec()), Arc::clone(tables), store)?;
        Ok(Some(Arc::new(scan)))
    }

    /// A filter directly over a leaf as a [`PageSelectExec`], which evaluates the comparisons
    /// it can on the stored values page by page and decodes the other columns only for the rows
    /// that pass; `None` (an ordinary scan and filter) where no comparison of the predicate runs
    /// that way or a segment has a column that reader does not read.
    async fn bind_page_select(&self, snapshot: &TableSnapshot, filter: &FilterExec, leaf: &ScanLeafExec, keys: Option<ProbeKeys<'_>>, stats: &mut ScanStats) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if leaf.leaf().limit.is_some() || !PageSelectExec::supports(&leaf.schema(), filter.predicate()) {
            return Ok(None);
        }
        let Some(segments) = self.paged_segments(snapshot, leaf, Some(filter.predicate()), keys, stats).await? else { return Ok(None) };
        if segments.is_empty() {
            return Ok(Some(Arc::new(EmptyExec::new(filter.schema()))));
        }
        let store = self.fragment_store();
        let projection = filter.projection().as_ref().map(|p| p.to_vec());
        let select = PageSelectExec::try_new(segments, self.profile.threads(), leaf.schema(), Arc::clone(filter.predicate()), projection, store)?;
        Ok(Some(Arc::new(select)))
    }

    /// The leaf's segments that survive the manifest's statistics under `predicate`, opened to
    /// be read page by page (with `keys`, only a sorted copy's row groups that hold kept keys);
    /// `None` (counting nothing) if one of them cannot be.
    async fn paged_segments(&self, snapshot: &TableSnapshot, leaf: &ScanLeafExec, predicate: Option<&Arc<dyn PhysicalExpr>>, keys: Option<ProbeKeys<'_>>, stats: &mut ScanStats) -> Result<Option<Vec<PagedSegment>>> {
        let mut counted = ScanStats::default();
        let kept = self.kept_segments(snapshot, leaf, predicate, &mut counted)?;
        let columns = leaf.schema();
        let (store, footers) = (self.fragment_store(), self.footers());
        // Footers opened a few at a time: cold, each is a read of its own, and a fact table
        // has dozens of segments.
        let opens = kept
            .iter()
            .map(|segment| {
                let (path, size) = (object_path(&snapshot.segment_path(segment))?, segment.bytes);
                let (store, footers, columns) = (Arc::clone(&store), Arc::clone(&footers), Arc::clone(&columns));
                Ok(async move { PagedSegment::open(store.as_ref(), path, size, &columns, footers.as_ref()).await }.boxed())
            })
            .collect::<Result<Vec<_>>>()?;
        let opened: Vec<_> = stream::iter(opens).buffered(FOOTERS_AT_ONCE).try_collect().await?;
        let mut segments = Vec::with_capacity(kept.len());
        let mut footer_bytes = 0u64;
        for (segment, opened) in kept.iter().zip(opened) {
            let Ok((opened, bytes)) = opened else { return Ok(None) };
            footer_bytes += bytes;
            segments.push(match zone_mask(keys, segment, &mut counted) {
                Some(mask) => opened.keeping(&mask),
                None => opened,
            });
        }
        stats.segments_requested += counted.segments_requested;
        stats.segments_pruned += counted.segments_pruned;
        stats.rows_scanned += counted.rows_scanned;
        stats.bytes_read += footer_bytes;
        Ok(Some(segments))
    }

    /// The leaf's segments that survive the manifest's statistics under `predicate` (the
    /// filter the fragment applies directly above the leaf), their files checked.
    fn kept_segments<'s>(&self, snapshot: &'s TableSnapshot, leaf: &ScanLeafExec, predicate: Option<&Arc<dyn PhysicalExpr>>, stats: &mut ScanStats) -> Result<Vec<&'s SegmentMeta>> {
        let request = leaf.leaf();
        let table_schema = scan_schema(&snapshot.schema);
        let output = leaf.schema();
        let segments = select_segments(snapshot, &request.segments)?;
        let requested = segments.len();
        stats.segments_requested += requested as u64;
        // The key tests' bounds prune too (see `key_set::key_bounds`).
        let pruning = predicate.and_then(|p| conjunction_opt(std::iter::once(Arc::clone(p)).chain(crate::key_set::key_bounds(p, &output))));
        let kept: Vec<&SegmentMeta> = match pruning
            .and_then(|p| PruningPredicateBuilder::new().with_file_schema(Arc::clone(&output)).build(p))
        {
            Some(pruning) => {
                let keep = pruning.prune(&SegmentStatistics { segments: &segments, schema: &table_schema })?;
                segments.iter().zip(keep).filter_map(|(s, keep)| keep.then_some(*s)).collect()
            }
            None => segments,
        };
        stats.segments_pruned += (requested - kept.len()) as u64;
        stats.rows_scanned += kept.iter().map(|s| s.rows).sum::<u64>();
        for segment in &kept {
            self.admit_segment(snapshot, segment)?;
        }
        Ok(kept)
    }

    /// Checks that a segment's file is there, whole, and has its reads verified against its
    /// checksums from now on; its path in the object store.
    fn admit_segment(&self, snapshot: &TableSnapshot, segment: &SegmentMeta) -> Result<ObjectPath> {
        check_segment_file(snapshot, segment)?;
        let file = snapshot.segment_path(segment);
        let path = object_path(&file)?;
        let shown = file.strip_prefix(self.warehouse.root()).unwrap_or(&file).to_path_buf();
        self.verified.expect(&path, shown, &snapshot.manifest.table, segment);
        Ok(path)
    }

    async fn parquet_scan(&self, snapshot: &TableSnapshot, segments: &[&SegmentMeta], schema: &SchemaRef, leaf: &ScanLeaf) -> Result<Arc<dyn ExecutionPlan>> {
        let urls = segments
            .iter()
            .map(|s| {
                let path = snapshot.segment_path(s);
                let text = path.to_str().ok_or_else(|| DataFusionError::Execution(format!("non-UTF-8 path {}", path.display())))?;
                ListingTableUrl::parse(text)
            })
            .collect::<Result<Vec<_>>>()?;
        let options = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
        let config = ListingTableConfig::new_with_multi_paths(urls).with_listing_options(options).with_schema(Arc::clone(schema));
        let table = ListingTable::try_new(config)?;
        let indices: Vec<usize> = leaf.projection.iter().map(|c| schema.index_of(c)).collect::<std::result::Result<_, _>>()?;
        table.scan(&self.state, Some(&indices), &[], leaf.limit).await
    }

    /// The footers of segment files read so far (DataFusion's metadata cache, in the node's
    /// runtime: its Parquet scans and the page readers share it).
    fn footers(&self) -> Arc<FileMetadataCache> {
        self.state.runtime_env().cache_manager.get_file_metadata_cache()
    }

    /// The store the fragment being bound reads through: its reads counted in the fragment's
    /// account (the one binding runs in).
    fn fragment_store(&self) -> Arc<VerifiedStore> {
        match ReadAccount::current() {
            Some(account) => self.verified.counting_into(account),
            None => Arc::clone(&self.verified),
        }
    }

    /// DataFusion's physical optimizer over the bound plan: among others it pushes the filter
    /// into the Parquet scan.
    fn optimize(&self, mut plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let config = self.state.config_options();
        for rule in self.state.physical_optimizers() {
            plan = rule.optimize(plan, config)?;
        }
        // The host merges partitions of a top-k as sorted runs: hand it one.
        if let Some(sort) = plan.downcast_ref::<SortExec>()
            && plan.output_partitioning().partition_count() > 1
        {
            let merge = SortPreservingMergeExec::new(sort.expr().clone(), Arc::clone(&plan)).with_fetch(sort.fetch());
            plan = Arc::new(merge);
        }
        Ok(plan)
    }
}

/// The node's calibration file in its warehouse (written by `quarry calibrate`).
pub const CALIBRATION_FILE: &str = ".calibration.json";
/// Where Grace hash joins spill, under the warehouse.
pub const SPILL_DIR: &str = ".spill";

#[async_trait]
impl StorageNode for LocalStorageNode {
    fn name(&self) -> &str {
        &self.name
    }

    fn in_process(&self) -> bool {
        true
    }

    async fn list_tables(&self) -> Result<Vec<String>> {
        self.warehouse.table_names().map_err(table_error)
    }

    async fn table_info(&self, table: &str) -> Result<TableInfo> {
        let version = self.warehouse.current_version(table).map_err(table_error)?;
        Ok(table_info(&*self.snapshots.get(table, version)?))
    }

    async fn scrub(&self, tables: Vec<String>) -> Result<ScrubReport> {
        let limit = self.profile.read_mbps.map(|mbps| Arc::new(BandwidthLimiter::new(mbps)));
        scrub_paced(self.warehouse.clone(), tables, self.jobs.clone(), limit, Arc::clone(&self.counters)).await
    }

    // A job runs as one session: it waits for a grant like a fragment, runs on the device's
    // threads, and may not ask for more than the device's memory.
    async fn run_job(&self, body: Vec<u8>) -> Result<Vec<u8>> {
        let jobs = self.jobs.as_ref().ok_or_else(|| DataFusionError::Plan(format!("storage node {} runs no jobs", self.name)))?;
        let job = jobs.parse(&body).map_err(DataFusionError::Plan)?;
        let Some(asked) = job.memory_bytes() else {
            let warehouse = self.warehouse.clone();
            return blocking("a job", move || job.run(&warehouse, 1, Arc::default()).map_err(DataFusionError::Execution)).await;
        };
        if let Some(memory) = self.profile.device_memory
            && asked > memory
        {
            return plan_err!("the job asks for {asked} bytes of memory; this node's device has {memory}");
        }
        let session = Arc::clone(&self.sessions).acquire_owned().await.map_err(|_| DataFusionError::Execution("node is shutting down".into()))?;
        // Its weighted demand is its whole budget: it holds it throughout.
        let admitted = self.admission.admit(asked.min(self.profile.memory()), None, ADMISSION_PATIENCE).await;
        let memory = (admitted, self.reserve_waiting("job", asked as usize).await);
        let (warehouse, threads) = (self.warehouse.clone(), self.profile.threads());
        let cancel = CancelOnDrop(Arc::new(AtomicBool::new(false)));
        let flag = Arc::clone(&cancel.0);
        let job = tokio::task::spawn_blocking(move || {
            let (_session, _memory) = (session, memory);
            job.run(&warehouse, threads, flag)
        });
        let output = job.await.map_err(|e| DataFusionError::Execution(format!("job failed: {e}")))?;
        drop(cancel);
        output.map_err(DataFusionError::Execution)
    }

    async fn begin_write(&self, request: BeginWrite) -> Result<String> {
        self.expire_writes().await?;
        let schema = Arc::new(request.schema.to_arrow().map_err(DataFusionError::Plan)?);
        let mode = if request.append { WriteMode::Append } else { WriteMode::Replace };
        let options = SegmentOptions { bloom_filter_columns: request.bloom_filter_columns, page_encoding: request.page_encoding, ..Default::default() };
        let (warehouse, table, sort_key) = (self.warehouse.clone(), request.table, request.sort_key);
        let writer = blocking("beginning a write", move || warehouse.begin_write(&table, &schema, mode, options, sort_key).map_err(table_write_error)).await?;
        let id = format!("w{}", self.next_write.fetch_add(1, Ordering::Relaxed));
        let pending = PendingWrite { writer: Arc::new(writer), segments: Vec::new(), expires: Instant::now() + self.write_lease };
        self.writes.lock().expect("writes lock").insert(id.clone(), pending);
        Ok(id)
    }

    async fn put_segment(&self, write: &str, _schema: SchemaRef, mut batches: BoxStream<'static, Result<RecordBatch>>) -> Result<u64> {
        let writer = self.renew(write)?;
        let opened = Arc::clone(&writer);
        let mut segment = blocking("writing a segment", move || opened.new_segment().map_err(table_write_error)).await?;
        while let Some(batch) = batches.next().await {
            let batch = conform_batch(&batch?, writer.schema()).map_err(DataFusionError::Plan)?;
            segment = blocking("writing a segment", move || segment.write(&batch).map(|()| segment).map_err(table_write_error)).await?;
        }
        let meta = blocking("writing a segment", move || segment.finish().map_err(table_write_error)).await?;
        let rows = meta.rows;
        let mut writes = self.writes.lock().expect("writes lock");
        let pending = writes.get_mut(write).ok_or_else(|| DataFusionError::Execution(format!("the write '{write}' was aborted")))?;
        pending.segments.push(meta);
        pending.expires = Instant::now() + self.write_lease;
        Ok(rows)
    }

    async fn commit_write(&self, write: &str, properties: Vec<(String, String)>) -> Result<u64> {
        let pending = self.writes.lock().expect("writes lock").remove(write);
        let pending = pending.ok_or_else(|| DataFusionError::Execution(format!("no write '{write}' in progress (aborted, or its lease ran out)")))?;
        let writer = Arc::try_unwrap(pending.writer).map_err(|_| DataFusionError::Execution("a segment of this write is still being written".into()))?;
        let segments = pending.segments;
        let manifest = blocking("committing a write", move || writer.commit(segments, properties).map_err(table_write_error)).await?;
        Ok(manifest.version)
    }

    async fn abort_write(&self, write: &str) -> Result<()> {
        let pending = self.writes.lock().expect("writes lock").remove(write);
        // Dropping the writer removes its files: on a blocking thread too.
        blocking("aborting a write", move || Ok(drop(pending))).await
    }

    async fn describe(&self) -> Result<NodeDescription> {
        Ok(NodeDescription { name: self.name.clone(), profile: self.profile.clone(), calibration: self.calibration.clone() })
    }

    async fn execute(&self, fragment: Fragment) -> Result<ScanStream> {
        let started = Instant::now();
        let counters = Arc::clone(&self.counters);
        counters.fragments_queued.fetch_add(1, Ordering::Relaxed);
        let admitted = Arc::clone(&self.sessions).acquire_owned().await;
        let ctx = self.state.task_ctx();
        let (fragment_codec, progress) = (fragment.link_codec, fragment.progress.clone());
        let decoded = decode_fragment(&fragment, &ctx, self.resolver()).and_then(|plan| Ok((self.scan_demand(&plan)?, plan)));
        let (scan_demand, decoded) = match decoded {
            Ok(decoded) => decoded,
            Err(e) => {
                counters.fragments_queued.fetch_sub(1, Ordering::Relaxed);
                counters.fragments_rejected.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        // A session slot, then room for the fragment's weighted memory demand: the host's
        // estimate of its operators, and its scans' working set, which only the node knows.
        let memory_bytes = self.profile.memory();
        let demand = fragment.demand.saturating_add(scan_demand).min(memory_bytes);
        // On a device, the scans' working set is also held from the pool the operators reserve
        // from, so the two share the device's one budget: at most half of it, for the fragment's
        // own operators need the rest (a 256 KB device's Grace join was refused 776 bytes while
        // its scans held the whole pool). A node without a device memory has no budget to keep
        // (its pool is a ceiling for operators), and holding there would only take room from joins.
        let scans = self.profile.device_memory.is_some().then(|| PoolHold {
            reservation: MemoryConsumer::new("fragment scans").register(&self.state.runtime_env().memory_pool),
            bytes: scan_demand.min(memory_bytes / 2) as usize,
        });
        let memory = self.admission.admit(demand, scans, ADMISSION_PATIENCE).await;
        counters.fragments_queued.fetch_sub(1, Ordering::Relaxed);
        let session = admitted.map_err(|_| DataFusionError::Execution("node is shutting down".into()))?;
        let queued_ns = started.elapsed().as_nanos() as u64;

        let passthrough = decoded.is::<ScanLeafExec>();
        let mut stats = ScanStats { queued_ns, ..Default::default() };
        // Binding reads footers, and hands each scan the store it reads through: all counted here.
        let reads = Arc::new(ReadAccount::default());
        let bound = ReadAccount::scope(Arc::clone(&reads), self.bind(decoded, &mut stats)).await?;
        let plan = self.optimize(bound)?;
        counters.fragments_started.fetch_add(1, Ordering::Relaxed);

        // Passthrough stands for a plain storage device, which spends no device compute.
        let pacing = (!passthrough).then(|| Pacing { threads: Arc::clone(&self.device_threads), slowdown: self.profile.compute_slowdown });
        let cpu = Arc::new(WorkerTimes::default());
        let plan = pace_task_inputs(plan, pacing.as_ref(), &cpu)?;
        let partitions = plan.output_partitioning().partition_count();
        let (tx, rx) = mpsc::channel(2 * partitions.max(1));
        let mut workers = JoinSet::new();
        for partition in 0..partitions {
            let stream = plan.execute(partition, Arc::clone(&ctx))?;
            let steps = PacedSteps::new(pacing.clone(), Arc::clone(&cpu));
            workers.spawn(drive_partition(stream, tx.clone(), steps, Arc::clone(&self.admission)));
        }
        drop(tx);
        counters.fragments_active.fetch_add(1, Ordering::Relaxed);
        let run = FragmentRun {
            rx,
            workers,
            _session: session,
            _memory: memory,
            // A transport that compresses paces the link on the bytes it sends.
            link: if fragment_codec == LinkCodec::None { self.link.clone() } else { None },
            plan,
            stats,
            cpu,
            reads,
            started,
            counters,
            progress,
            reported: started,
            finished: false,
        };
        Ok(futures::stream::unfold(run, |mut run| async move {
            let item = run.next_message().await?;
            Some((item, run))
        })
        .boxed())
    }

    /// What a plain storage device does: the stored bytes, through the device's read
    /// bandwidth and the link at once.
    async fn read_segment(&self, read: SegmentRead) -> Result<Vec<bytes::Bytes>> {
        let (path, size) = self.stored_segment(&read)?;
        if read.len() > SegmentRead::MAX_BYTES {
            return plan_err!("a read of {} bytes of segment '{}' exceeds the node's limit of {} bytes per request", read.len(), read.segment, SegmentRead::MAX_BYTES);
        }
        if let Some(bad) = read.ranges.iter().find(|r| r.start >= r.end || r.end > size) {
            return plan_err!("cannot read bytes {}..{} of segment '{}' of table '{}': it has {size} bytes", bad.start, bad.end, read.segment, read.table);
        }
        let total = read.len();
        // A device streams what it reads onto the link: the two overlap, as they do for pushdown.
        let sending = async {
            if let Some(link) = &self.link {
                link.consume(total).await;
            }
        };
        let (bytes, ()) = tokio::join!(self.verified.get_ranges(&path, &read.ranges), sending);
        let bytes = bytes.map_err(|e| DataFusionError::External(Box::new(e)))?;
        self.counters.stored_bytes_served.fetch_add(total, Ordering::Relaxed);
        Ok(bytes)
    }
}

/// Sets its flag when dropped: a job's future dropped before the job ended cancels it.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Drives one output partition, sending its batches to the fragment's stream, each computed
/// as a device step ([`PacedSteps`]).
async fn drive_partition(mut stream: SendableRecordBatchStream, tx: mpsc::Sender<Result<RecordBatch>>, mut steps: PacedSteps, admission: Arc<MemoryAdmission>) {
    loop {
        let Some(item) = steps.next(&mut stream).await else { return };
        admission.progressed();
        let failed = item.is_err();
        if tx.send(item).await.is_err() || failed {
            return;
        }
    }
}

/// A running fragment: its workers, its admission grant and its accounting. Dropping it aborts
/// the workers and returns the grant.
struct FragmentRun {
    rx: mpsc::Receiver<Result<RecordBatch>>,
    workers: JoinSet<()>,
    _session: OwnedSemaphorePermit,
    _memory: Admission,
    link: Option<Arc<BandwidthLimiter>>,
    plan: Arc<dyn ExecutionPlan>,
    stats: ScanStats,
    cpu: Arc<WorkerTimes>,
    reads: Arc<ReadAccount>,
    started: Instant,
    counters: Arc<NodeCounters>,
    progress: FragmentProgress,
    /// When progress was last reported.
    reported: Instant,
    finished: bool,
}

/// How often a running fragment reports its progress while no batch is ready.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

impl FragmentRun {
    async fn next_message(&mut self) -> Option<Result<ScanMessage>> {
        if self.finished {
            return None;
        }
        let received = loop {
            if self.reported.elapsed() >= PROGRESS_INTERVAL {
                self.progress.report(self.bytes_read());
                self.reported = Instant::now();
            }
            match tokio::time::timeout(PROGRESS_INTERVAL, self.rx.recv()).await {
                Ok(received) => break received,
                Err(_elapsed) => continue,
            }
        };
        match received {
            Some(Ok(batch)) => {
                let bytes = batch_wire_bytes(&batch);
                if let Some(link) = &self.link {
                    self.stats.link_wait_ns += link.consume(bytes).await.as_nanos() as u64;
                }
                self.stats.rows_returned += batch.num_rows() as u64;
                self.stats.bytes_returned += bytes;
                self.stats.link_bytes += bytes;
                Some(Ok(ScanMessage::Batch(batch)))
            }
            Some(Err(e)) => {
                self.finished = true;
                Some(Err(e))
            }
            None => {
                self.finished = true;
                // Every worker has dropped its sender; one that panicked must not pass for
                // one that finished, or its partition's rows would silently be missing.
                while let Some(joined) = self.workers.join_next().await {
                    if let Err(e) = joined {
                        return Some(Err(DataFusionError::Execution(format!("a worker of the fragment failed: {}", panic_message(e)))));
                    }
                }
                Some(Ok(ScanMessage::Finished(self.final_stats())))
            }
        }
    }

    /// The bytes the fragment's scans have read so far (footers aside).
    fn bytes_read(&self) -> u64 {
        plan_metric_sum(self.plan.as_ref(), &|m| m.sum_by_name("bytes_scanned").map(|v| v.as_usize()))
    }

    fn final_stats(&mut self) -> ScanStats {
        let mut stats = std::mem::take(&mut self.stats);
        stats.bytes_read += self.bytes_read();
        self.progress.report(stats.bytes_read);
        stats.elapsed_ns = self.started.elapsed().as_nanos() as u64;
        stats.device_cpu_ns = self.cpu.cpu_ns.load(Ordering::Relaxed);
        stats.device_pause_ns = self.cpu.pause_ns.load(Ordering::Relaxed);
        stats.thread_wait_ns = self.cpu.thread_wait_ns.load(Ordering::Relaxed);
        stats.read_requests = self.reads.requests();
        stats.bytes_read_device = self.reads.device_bytes();
        stats.read_wait_ns = self.reads.wait_ns();
        stats.spilled_bytes = plan_metric_sum(self.plan.as_ref(), &|m| m.spilled_bytes());
        operator_stats(self.plan.as_ref(), &mut stats.operators);
        self.counters.add_fragment(&stats);
        stats
    }
}

/// What a worker's failure says: its panic's message, if it panicked.
fn panic_message(error: tokio::task::JoinError) -> String {
    if !error.is_panic() {
        return error.to_string();
    }
    let payload = error.into_panic();
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "it panicked".into())
}

impl Drop for FragmentRun {
    fn drop(&mut self) {
        self.counters.fragments_active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Rows and bytes in and out and time of each operator of the node's plan, top first.
fn operator_stats(plan: &dyn ExecutionPlan, out: &mut Vec<NodeOperatorStats>) {
    if plan.metrics().is_some() {
        let io = operator_io(plan);
        out.push(NodeOperatorStats { name: plan.name().to_string(), rows_in: io.rows_in, rows_out: io.rows_out, bytes_out: io.bytes_out, elapsed_ns: io.elapsed_ns });
    }
    for child in plan.children() {
        operator_stats(child.as_ref(), out);
    }
}
