//! Per-query accounting: bytes read from storage, bytes over the link, rows and time, gathered
//! from the executed plan's metrics.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use datafusion::physical_plan::ExecutionPlan;
use quarry_model::energy::{DevicePower, DeviceWork, Energy, HostPower, Work};
use quarry_model::sharing::Demand;
use serde::Serialize;

use quarry_storage::{operator_io, scan_counter};

use crate::scan::{FragmentExec, metric};

/// Where an operator ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// On a storage node, next to the data.
    Storage,
    /// On the host.
    Host,
}

/// One operator's share of a query.
#[derive(Debug, Clone, Serialize)]
pub struct OperatorStats {
    /// Operator name (e.g. `StorageScanExec`, `HashJoinExec`).
    pub operator: String,
    /// Where it ran.
    pub side: Side,
    /// Table read, for scans.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Rows its inputs produced (for a fragment: the rows its node scanned).
    pub rows_in: u64,
    /// Rows it produced.
    pub rows_out: u64,
    /// Bytes of the batches it produced (for a fragment: what crossed the link).
    pub bytes_out: u64,
    /// CPU time it reported, milliseconds (node-side time for scans).
    pub compute_ms: f64,
    /// Bytes read from storage, for scans.
    pub bytes_read_storage: u64,
    /// Bytes it sent over the link, for scans.
    pub bytes_over_link: u64,
    /// For a fragment: the placement model's predicted time, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_ms: Option<f64>,
    /// For a fragment: the component the model says bounds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound: Option<String>,
    /// For a fragment: what the model says it asks of the link and the host's threads, which
    /// fragments running at once share (`quarry model check` stretches its time over the run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_demand: Option<PredictedDemand>,
    /// For a fragment: its measured time, milliseconds: the time during which some partition's
    /// consumer waited for its batches, after admission (`crate::fragment_timing`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_ms: Option<f64>,
    /// For a fragment: each of the nodes' counters ([`scan_counter::ALL`]) summed over its
    /// partitions (device CPU, pauses, link and thread waits, queueing: what its time went to).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_counters: BTreeMap<&'static str, u64>,
    /// For a fragment: when it ran, milliseconds from the query's first fragment's start to
    /// its first request and its last batch (which fragments ran at once, sharing a node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub span_ms: Option<[f64; 2]>,
    #[serde(skip)]
    span: Option<(Instant, Instant)>,
}

/// A fragment's demand on what fragments running at once share, as `--stats` lists it
/// (milliseconds; [`quarry_model::sharing::Demand`]).
#[derive(Debug, Clone, Serialize)]
pub struct PredictedDemand {
    /// Its time alone.
    pub alone_ms: f64,
    /// Of that, on the link.
    pub link_ms: f64,
    /// Of that, decoding on the host.
    pub host_ms: f64,
    /// The host threads that decoding keeps busy.
    pub decode_threads: f64,
    /// The host's threads.
    pub host_threads: usize,
    /// Whether its link time overlaps its other work (pushdown).
    pub overlapped: bool,
    /// Its transfers in flight on the link while it sends (its partitions).
    pub link_streams: f64,
    /// Of `host_ms`, the fixed cost a passthrough fragment pays first, on one host thread.
    pub fixed_ms: f64,
    /// How much less that fixed cost is when it opens right after another fragment opened.
    pub warm_saving_ms: f64,
}

impl PredictedDemand {
    fn of(demand: &Demand, host_threads: usize) -> Self {
        PredictedDemand {
            alone_ms: demand.seconds * 1e3,
            link_ms: demand.link_s * 1e3,
            host_ms: demand.host_s * 1e3,
            decode_threads: demand.decode_threads,
            host_threads,
            overlapped: demand.overlapped,
            link_streams: demand.link_streams,
            fixed_ms: demand.fixed_s * 1e3,
            warm_saving_ms: demand.warm_saving_s * 1e3,
        }
    }
}

/// The device's side of a query: what storage nodes spent running its fragments.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceStats {
    /// CPU time of the nodes' workers, milliseconds.
    pub cpu_ms: f64,
    /// Time workers paused for the profiles' compute slowdown, milliseconds.
    pub pause_ms: f64,
    /// Time batches waited for the profiles' link bandwidth, milliseconds.
    pub link_wait_ms: f64,
    /// Bytes spilled by Grace hash joins.
    pub spilled_bytes: u64,
}

/// The reads of segment files that a query's fragments made on the nodes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReadStats {
    /// Read requests.
    pub requests: u64,
    /// Bytes read (as `bytes_read_storage`).
    pub bytes: u64,
    /// Of those, the bytes the device delivered: reads whose pages the page cache did not
    /// hold. The rest came from memory.
    pub bytes_from_device: u64,
    /// Time the reads took (reading threads waiting or copying, and verifying), summed over
    /// reads in flight, milliseconds.
    pub wait_ms: f64,
}

/// The accounting of one query, as `--stats` writes it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueryStats {
    /// Wall time from planning to the last row, milliseconds.
    pub wall_ms: f64,
    /// Of that, the time to plan: the SQL's logical plan, its optimization and the physical
    /// plan (placement included), milliseconds.
    pub plan_ms: f64,
    /// Rows in the result.
    pub rows_returned: u64,
    /// Bytes read from segment files.
    pub bytes_read_storage: u64,
    /// Bytes storage nodes handed to the host (Arrow batch bytes in embedded mode).
    pub bytes_over_link: u64,
    /// Segments scans asked for.
    pub segments_requested: u64,
    /// Segments skipped by manifest statistics.
    pub segments_pruned: u64,
    /// Rows in the segments opened.
    pub rows_scanned: u64,
    /// The nodes' reads of segment files: requests, bytes from the device, wait.
    pub reads: ReadStats,
    /// Node-side fragment time summed over fragments, milliseconds.
    pub storage_ms: f64,
    /// Device CPU, pauses, link waits and spills on the nodes.
    pub device: DeviceStats,
    /// Host CPU time of the host-side operators and of receiving the fragments' output
    /// (decoding stored bytes in passthrough), milliseconds.
    pub host_cpu_ms: f64,
    /// Every operator of the plan, in pre-order.
    pub operators: Vec<OperatorStats>,
    /// What each storage node did, by node name.
    pub nodes: BTreeMap<String, NodeWork>,
    /// The query's energy by component (`energy_j`, `io_subsystem_j`, `energy_by_component`),
    /// when every node's profile has power figures.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub energy: Option<Energy>,
}

/// One storage node's work for a query.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeWork {
    /// Bytes it read from its files.
    pub bytes_read: u64,
    /// Bytes it spilled to its files.
    pub bytes_spilled: u64,
    /// Bytes it sent to the host.
    pub bytes_over_link: u64,
    /// Time its workers computed or paused for the profile's slower CPU, milliseconds: the
    /// device's own CPU time.
    pub device_cpu_ms: f64,
}

impl QueryStats {
    /// Prices the query's work in joules: the host by `host`, each node by its profile's power
    /// figures (`power` by node name). None if a node has no figures.
    pub fn estimate_energy(&mut self, host: &HostPower, power: &BTreeMap<String, Option<DevicePower>>) {
        let mut devices = Vec::with_capacity(self.nodes.len());
        for (name, work) in &self.nodes {
            let Some(Some(figures)) = power.get(name) else {
                self.energy = None;
                return;
            };
            let device = DeviceWork {
                bytes_read: work.bytes_read,
                bytes_written: work.bytes_spilled,
                bytes_over_link: work.bytes_over_link,
                cpu_s: work.device_cpu_ms / 1e3,
            };
            devices.push((figures, device));
        }
        let work = Work { wall_s: self.wall_ms / 1e3, host_cpu_s: self.host_cpu_ms / 1e3, devices };
        self.energy = Some(Energy::of(&work, host));
    }
}

impl QueryStats {
    /// Adds up the metrics of an executed plan.
    pub fn from_plan(plan: &Arc<dyn ExecutionPlan>, wall_ms: f64, rows_returned: u64) -> Self {
        let mut stats = QueryStats { wall_ms, rows_returned, ..Default::default() };
        collect(plan.as_ref(), &mut stats);
        if let Some(origin) = stats.operators.iter().filter_map(|op| op.span).map(|(start, _)| start).min() {
            let ms = |at: Instant| at.duration_since(origin).as_secs_f64() * 1e3;
            for op in &mut stats.operators {
                op.span_ms = op.span.map(|(start, end)| [ms(start), ms(end)]);
            }
        }
        stats
    }
}

fn collect(plan: &dyn ExecutionPlan, stats: &mut QueryStats) {
    let metrics = plan.metrics();
    let sum = |name: &str| metrics.as_ref().and_then(|m| m.sum_by_name(name)).map_or(0, |v| v.as_usize() as u64);
    let io = operator_io(plan);
    match plan.downcast_ref::<FragmentExec>() {
        Some(fragment) => {
            let node_ns = sum(scan_counter::ELAPSED_NS);
            stats.bytes_read_storage += sum(scan_counter::BYTES_READ);
            stats.bytes_over_link += sum(scan_counter::LINK_BYTES);
            stats.segments_requested += sum(scan_counter::SEGMENTS_REQUESTED);
            stats.segments_pruned += sum(scan_counter::SEGMENTS_PRUNED);
            stats.rows_scanned += sum(scan_counter::ROWS_SCANNED);
            stats.storage_ms += node_ns as f64 / 1e6;
            stats.reads.requests += sum(scan_counter::READ_REQUESTS);
            stats.reads.bytes += sum(scan_counter::BYTES_READ);
            stats.reads.bytes_from_device += sum(scan_counter::BYTES_READ_DEVICE);
            stats.reads.wait_ms += sum(scan_counter::READ_WAIT_NS) as f64 / 1e6;
            // Decoding what the node sent (stored bytes in passthrough) is the host's work.
            stats.host_cpu_ms += sum(metric::HOST_RECEIVE_NS) as f64 / 1e6;
            stats.device.cpu_ms += sum(scan_counter::DEVICE_CPU_NS) as f64 / 1e6;
            stats.device.pause_ms += sum(scan_counter::DEVICE_PAUSE_NS) as f64 / 1e6;
            stats.device.link_wait_ms += sum(scan_counter::LINK_WAIT_NS) as f64 / 1e6;
            stats.device.spilled_bytes += sum(scan_counter::SPILLED_BYTES);
            stats.operators.push(OperatorStats {
                operator: plan.name().to_string(),
                side: Side::Storage,
                table: Some(fragment.tables().join(",")),
                rows_in: sum(scan_counter::ROWS_SCANNED),
                rows_out: io.rows_out,
                bytes_out: sum(scan_counter::LINK_BYTES),
                compute_ms: node_ns as f64 / 1e6,
                bytes_read_storage: sum(scan_counter::BYTES_READ),
                bytes_over_link: sum(scan_counter::LINK_BYTES),
                predicted_ms: fragment.prediction().map(|p| p.seconds * 1e3),
                bound: fragment.prediction().map(|p| p.bound.to_string()),
                predicted_demand: fragment.prediction().map(|p| PredictedDemand::of(&p.demand, p.host_threads)),
                measured_ms: fragment.measured_seconds().map(|s| s * 1e3),
                node_counters: scan_counter::ALL.iter().map(|(name, _)| (*name, sum(name))).collect(),
                span_ms: None,
                span: fragment.span(),
            });
            for (node, node_stats) in fragment.node_stats_by_node() {
                let work = stats.nodes.entry(node).or_default();
                work.bytes_read += node_stats.bytes_read;
                work.bytes_spilled += node_stats.spilled_bytes;
                work.bytes_over_link += node_stats.link_bytes;
                work.device_cpu_ms += (node_stats.device_cpu_ns + node_stats.device_pause_ns) as f64 / 1e6;
            }
            // The operators that ran inside the fragment, as the nodes reported them.
            for op in fragment.node_stats().operators {
                stats.operators.push(OperatorStats {
                    operator: op.name,
                    side: Side::Storage,
                    table: None,
                    rows_in: op.rows_in,
                    rows_out: op.rows_out,
                    bytes_out: op.bytes_out,
                    compute_ms: op.elapsed_ns as f64 / 1e6,
                    bytes_read_storage: 0,
                    bytes_over_link: 0,
                    predicted_ms: None,
                    bound: None,
                    predicted_demand: None,
                    measured_ms: None,
                    node_counters: BTreeMap::new(),
                    span_ms: None,
                    span: None,
                });
            }
        }
        None => {
            stats.host_cpu_ms += io.elapsed_ns as f64 / 1e6;
            stats.operators.push(OperatorStats {
                operator: plan.name().to_string(),
                side: Side::Host,
                table: None,
                rows_in: io.rows_in,
                rows_out: io.rows_out,
                bytes_out: io.bytes_out,
                compute_ms: io.elapsed_ns as f64 / 1e6,
                bytes_read_storage: 0,
                bytes_over_link: 0,
                predicted_ms: None,
                bound: None,
                predicted_demand: None,
                measured_ms: None,
                node_counters: BTreeMap::new(),
                span_ms: None,
                span: None,
            });
        }
    }
    for child in plan.children() {
        collect(child.as_ref(), stats);
    }
}
