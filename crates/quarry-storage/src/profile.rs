//! Device profiles: the budget of a computational-storage device a node is bounded to.
//!
//! A profile limits, for real: the node's read bandwidth from its files (a rate limiter in the
//! object store the Parquet scans read through), its link bandwidth to the host (a rate limiter
//! on the batches it sends), its worker threads and memory, and its compute speed (workers pause
//! in proportion to the CPU time they used). Profiles are JSON files; the built-in ones live in
//! `profiles/` at the repository root and a user adds more by giving a path.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::error::{DataFusionError, Result};
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions,
    PutPayload, PutResult,
};
use quarry_model::energy::DevicePower;
use serde::{Deserialize, Serialize};

/// The limits a node runs under. Absent fields are unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Profile name.
    pub name: String,
    /// What hardware it models.
    #[serde(default)]
    pub description: String,
    /// Internal read bandwidth from the node's files, MB/s (10^6 bytes).
    #[serde(default)]
    pub read_mbps: Option<f64>,
    /// Link bandwidth from the node to the host, MB/s.
    #[serde(default)]
    pub link_mbps: Option<f64>,
    /// Worker threads the device has.
    #[serde(default)]
    pub device_threads: Option<usize>,
    /// Memory the device's operators may use, e.g. "512MB".
    #[serde(default, with = "size_text")]
    pub device_memory: Option<u64>,
    /// How much slower the device CPU is than this machine's (1 = as fast).
    #[serde(default = "one")]
    pub compute_slowdown: f64,
    /// Fragments admitted at once; the rest queue.
    #[serde(default)]
    pub max_sessions: Option<usize>,
    /// Power figures for energy accounting, each with its source. Without them a query on
    /// this node reports no energy.
    #[serde(default)]
    pub power: Option<DevicePower>,
}

fn one() -> f64 {
    1.0
}

const BUILTIN: [(&str, &str); 5] = [
    ("native", include_str!("../../../profiles/native.json")),
    ("smartssd-2013", include_str!("../../../profiles/smartssd-2013.json")),
    ("kim-isp-2015", include_str!("../../../profiles/kim-isp-2015.json")),
    ("softflash", include_str!("../../../profiles/softflash.json")),
    ("bluedbm", include_str!("../../../profiles/bluedbm.json")),
];

impl DeviceProfile {
    /// The profile `name_or_path`: a built-in name, or a JSON file.
    pub fn load(name_or_path: &str) -> Result<Self, String> {
        let (text, origin) = match BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            Some((_, text)) => (text.to_string(), format!("built-in profile '{name_or_path}'")),
            None if std::path::Path::new(name_or_path).is_file() => {
                (std::fs::read_to_string(name_or_path).map_err(|e| format!("reading {name_or_path}: {e}"))?, name_or_path.to_string())
            }
            None => {
                let names: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
                return Err(format!("unknown device profile '{name_or_path}' (built-in: {}; or give a JSON file)", names.join(", ")));
            }
        };
        let profile: DeviceProfile = serde_json::from_str(&text).map_err(|e| format!("{origin}: {e}"))?;
        profile.validate().map_err(|e| format!("{origin}: {e}"))?;
        Ok(profile)
    }

    /// Field values must make sense.
    pub fn validate(&self) -> Result<(), String> {
        for (name, value) in [("read_mbps", self.read_mbps), ("link_mbps", self.link_mbps)] {
            if value.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
                return Err(format!("{name} must be a positive number"));
            }
        }
        if !(self.compute_slowdown.is_finite() && self.compute_slowdown >= 1.0) {
            return Err("compute_slowdown must be at least 1".into());
        }
        if self.device_threads == Some(0) || self.max_sessions == Some(0) {
            return Err("device_threads and max_sessions must be at least 1".into());
        }
        if self.device_memory.is_some_and(|m| m < 64 << 10) {
            return Err("device_memory must be at least 64KiB".into());
        }
        if let Some(power) = &self.power {
            power.validate()?;
        }
        Ok(())
    }

    /// Memory the device's operators may use: the profile's, else 4 GiB.
    pub fn memory(&self) -> u64 {
        self.device_memory.unwrap_or(DEFAULT_DEVICE_MEMORY)
    }

    /// Worker threads, defaulting to the machine's cores.
    pub fn threads(&self) -> usize {
        self.device_threads.unwrap_or_else(machine_cores)
    }
}

/// The cores this process may use, asked once: `available_parallelism` reads the cgroup's
/// files on every call, and the placement rule asks for every fragment it prices.
fn machine_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A device's memory when its profile names none.
const DEFAULT_DEVICE_MEMORY: u64 = 4 << 30;

/// Parses a size such as `512MB`, `2GB`, `64KiB` or a plain byte count.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("'{text}' is not a size (e.g. 512MB)"))?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown size unit '{other}' in '{text}'")),
    };
    Ok((value * factor) as u64)
}

mod size_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_str(&format!("{v}B")),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| super::parse_size(&t).map_err(serde::de::Error::custom)).transpose()
    }
}

/// This machine's CPU cost of the operators a node runs, measured by `quarry calibrate`; the
/// host's cost model divides by a profile's slowdown to get a device's rates. A calibration file
/// written before a figure existed reads that figure from [`Calibration::default`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Calibration {
    /// Decoding Parquet into Arrow, per byte of Arrow output (one thread), measured on uniform
    /// `Int32` columns (too varied for a dictionary): what the operators on a node's pages
    /// (selections) are priced by.
    pub decode_ns_per_byte: f64,
    /// Decoding a whole column, per value (one thread), measured on a dictionary-encoded
    /// `Int32`, as most stored columns are (TPC-H SF 10 `lineitem`'s dates, decimals, flags and
    /// keys all decode at 4-10 ns a value, whatever their Arrow width).
    pub value_ns: f64,
    /// Decoding a string column, per decompressed byte of its values (decompressing, UTF-8
    /// validation, copying), on top of its `value_ns` (one thread).
    pub string_ns_per_byte: f64,
    /// Evaluating a simple predicate, per input row.
    pub filter_ns_per_row: f64,
    /// Partial aggregation, per input row.
    pub aggregate_ns_per_row: f64,
    /// Hash join (build + probe), per input row.
    pub join_ns_per_row: f64,
    /// Receiving a batch from a node: the host's cost per byte (IPC decoding, copies).
    pub transfer_ns_per_byte: f64,
    /// Writing rows to a spill file or reading them back, per byte of Arrow data.
    pub spill_ns_per_byte: f64,
    /// A fragment's fixed cost: sending it, opening its segments, the first batch's way back
    /// (the time its consumer waits for a fragment over one column of a 1,000-row table, less
    /// `column_ns`).
    pub fragment_ns: f64,
    /// A fragment's fixed cost per column its leaves read: fetching and opening a column chunk
    /// (SSB SF 10 `date`, passthrough: 0.2-0.4 ms for one or two columns, 0.6-0.7 for all 17).
    /// One figure for both, calibrated on eight columns, over-predicted SSB SF 10's `date` and
    /// `supplier` fragments (0.3-0.7 ms) under kim-isp-2015 by up to 93%, 18 of 23 beyond 25%.
    pub column_ns: f64,
    /// A fragment's fixed cost more when its scan is filtered: by a filter above it that prunes
    /// its passthrough scan (which reads and tests the page index before the pages), or by a
    /// filter on the node over its leaf (a page selection's setup). Measured in passthrough:
    /// the time its consumer waits for one column of a 1,000-row table under a filter that
    /// prunes nothing, less the time without. TPC-H SF 10 `nation` filtered by
    /// `n_regionkey = 1`, each run after a scan of `lineitem`: kim-isp-2015, one host thread,
    /// 0.38-0.66 ms unfiltered, 0.64-0.79 filtered; native, filtered on the node, 0.43-0.67
    /// and 0.73-0.97.
    pub filtered_fragment_ns: f64,
    /// How much less a fragment's fixed cost is when it opens right after another fragment
    /// opened, as in a star query's dimension scans one after another: the wait for one column
    /// of a 1,000-row table run right after itself, less the wait for it right after a scan
    /// (what `fragment_ns` is measured after). SSB SF 10 under kim-isp-2015: `date` took
    /// 0.3-0.45 ms opening 0.1-0.5 ms after `supplier` opened, 0.6-0.7 ms as a query's first
    /// fragment or after a dimension's scan.
    pub warm_fragment_saving_ns: f64,
    /// A node's CPU for a fragment beyond its rows' work (decoding the plan, opening its
    /// segments, setting up its operators), per partition: measured on one column of a
    /// 1,000-row table filtered on the node. A device pays it `compute_slowdown` times, which
    /// `fragment_ns` (measured in passthrough, the host's speed) does not hold (TPC-H SF 10
    /// `region`, 5 rows filtered under kim-isp-2015: 44-90 µs of CPU, paced to 0.4-1 ms,
    /// measured 2-12 ms where 0.5 was predicted).
    pub fragment_cpu_ns: f64,
    /// A star join's probe of decoded fact rows, per row.
    pub star_probe_ns_per_row: f64,
    /// A star join's probe on a node, over stored values as pages are read, per fact row.
    pub star_scan_ns_per_row: f64,
    /// Selection over PLAIN pages (`PlainSelectExec`): copying values, per byte.
    pub plain_copy_ns_per_byte: f64,
    /// Selection over PLAIN pages: per run of selected rows per column (a copy by offset).
    pub plain_run_ns: f64,
    /// Selection over PLAIN pages: splitting a column chunk into pages, per page.
    pub plain_page_ns: f64,
    /// Selection over PLAIN pages: evaluating the predicate into a selection, per input row.
    pub plain_row_ns: f64,
    /// Selection over PLAIN pages: per selected row (its index, its share of a batch).
    pub plain_selected_row_ns: f64,
    /// LZ4 compression of the Arrow IPC a node sends, per uncompressed byte (one thread).
    pub lz4_compress_ns_per_byte: f64,
    /// Undoing it on the receiving host, per uncompressed byte.
    pub lz4_decompress_ns_per_byte: f64,
    /// Bytes LZ4 leaves of one byte of Arrow IPC (measured on TPC-H `lineitem` batches).
    pub lz4_ratio: f64,
    /// ZSTD compression of the Arrow IPC a node sends, per uncompressed byte (one thread).
    pub zstd_compress_ns_per_byte: f64,
    /// Undoing it on the receiving host, per uncompressed byte.
    pub zstd_decompress_ns_per_byte: f64,
    /// Bytes ZSTD leaves of one byte of Arrow IPC (TPC-H `lineitem` batches).
    pub zstd_ratio: f64,
    /// Whether `quarry calibrate` measured these figures (it sets this): `false` for the
    /// defaults, and for a file written before every figure was measured.
    pub measured: bool,
}

impl Calibration {
    /// The rates of a selection over PLAIN pages, in the order of the terms they price
    /// (`quarry_engine::placement::plain_selection_terms`): per byte copied, per input row, per
    /// selected row, per run per other column, per page.
    pub fn plain_selection_rates(&self) -> [f64; 5] {
        [self.plain_copy_ns_per_byte, self.plain_row_ns, self.plain_selected_row_ns, self.plain_run_ns, self.plain_page_ns]
    }

    /// Sets them, in the same order.
    pub fn set_plain_selection_rates(&mut self, rates: [f64; 5]) {
        [self.plain_copy_ns_per_byte, self.plain_row_ns, self.plain_selected_row_ns, self.plain_run_ns, self.plain_page_ns] = rates;
    }

    /// The fixed cost of a fragment whose leaves read `columns` columns.
    pub fn fixed_ns(&self, columns: usize) -> f64 {
        self.fragment_ns + columns as f64 * self.column_ns
    }

    /// The fixed cost of a fragment whose leaves read `columns` columns, its scan `filtered`
    /// or not.
    pub fn filtered_fixed_ns(&self, columns: usize, filtered: bool) -> f64 {
        self.fixed_ns(columns) + if filtered { self.filtered_fragment_ns } else { 0.0 }
    }

    /// (compress ns/byte, decompress ns/byte, size ratio) of a link codec.
    pub fn link_codec_rates(&self, codec: crate::LinkCodec) -> (f64, f64, f64) {
        match codec {
            crate::LinkCodec::None => (0.0, 0.0, 1.0),
            crate::LinkCodec::Lz4 => (self.lz4_compress_ns_per_byte, self.lz4_decompress_ns_per_byte, self.lz4_ratio),
            crate::LinkCodec::Zstd => (self.zstd_compress_ns_per_byte, self.zstd_decompress_ns_per_byte, self.zstd_ratio),
        }
    }
}

impl Default for Calibration {
    /// Conservative figures for a current server core, used until `quarry calibrate` runs.
    fn default() -> Self {
        Calibration {
            decode_ns_per_byte: 0.5,
            value_ns: 2.0,
            string_ns_per_byte: 0.5,
            filter_ns_per_row: 2.0,
            aggregate_ns_per_row: 10.0,
            join_ns_per_row: 40.0,
            // Measured on the development machine (2 cores): passthrough of 32 MB cost the host
            // about 50 ms more than pushdown.
            transfer_ns_per_byte: 1.5,
            spill_ns_per_byte: 1.0,
            // Measured on the development machine (2 cores), embedded: 0.6-3 ms for the
            // fragments over SSB's `date` and `supplier` at SF 10.
            fragment_ns: 1.0e6,
            // Within `fragment_ns` until measured (as a calibration file written before this
            // figure existed measured it).
            column_ns: 0.0,
            // Within `fragment_ns` until measured.
            filtered_fragment_ns: 0.0,
            // None until measured: every fragment pays its whole fixed cost.
            warm_fragment_saving_ns: 0.0,
            // TPC-H SF 10 `region` and `nation` filtered on a node, development machine.
            fragment_cpu_ns: 50.0e3,
            star_probe_ns_per_row: 10.0,
            star_scan_ns_per_row: 1.0,
            // Synthetic64 with PLAIN pages, 8M rows, `SELECT * WHERE col1 < c` on a node:
            // 406 ms of device CPU at 100% (2 GB copied), 97 ms at 0.1% (25,600 pages split),
            // 326 ms at 10% (45M runs); Synthetic4, `SELECT col2 ...`: 17 ms at 0.1%, 45 ms
            // at 100%.
            plain_copy_ns_per_byte: 0.19,
            plain_run_ns: 4.2,
            plain_page_ns: 3000.0,
            plain_row_ns: 1.1,
            plain_selected_row_ns: 2.7,
            lz4_compress_ns_per_byte: LZ4_DEFAULTS.0,
            lz4_decompress_ns_per_byte: LZ4_DEFAULTS.1,
            lz4_ratio: LZ4_DEFAULTS.2,
            zstd_compress_ns_per_byte: ZSTD_DEFAULTS.0,
            zstd_decompress_ns_per_byte: ZSTD_DEFAULTS.1,
            zstd_ratio: ZSTD_DEFAULTS.2,
            measured: false,
        }
    }
}

/// The calibration `quarry calibrate` wrote into the warehouse at `dir`, if it wrote one there
/// that parses.
pub fn read_calibration(dir: &std::path::Path) -> Option<Calibration> {
    let bytes = std::fs::read(dir.join(crate::CALIBRATION_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// LZ4's (compress ns/byte, decompress ns/byte, ratio) until `quarry calibrate` measures them:
/// its figures on the development machine (2 cores, two runs within 2%).
const LZ4_DEFAULTS: (f64, f64, f64) = (1.3, 0.47, 0.396);
/// ZSTD's, likewise.
const ZSTD_DEFAULTS: (f64, f64, f64) = (2.6, 0.81, 0.234);

/// What a node tells the host about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeDescription {
    /// The node's address or `local`.
    pub name: String,
    /// Its device profile.
    pub profile: DeviceProfile,
    /// The CPU rates of the machine it runs on.
    pub calibration: Calibration,
}

/// The shortest wait the emulation sleeps: a read of a page or two at the flash's rate takes a
/// few microseconds, and a sleep for each would cost more CPU in wake-ups than it emulates.
pub const MIN_WAIT: Duration = Duration::from_micros(50);

/// A shared bandwidth budget that concurrent transfers share as a fluid: while `n` are in
/// flight each moves at `1/n` of the rate (processor sharing, the way NCQ and channel striping
/// interleave a device's requests, and the way `quarry_model::sharing` predicts it). A
/// 25-row table read beside a fragment streaming 26 MB takes twice its own time, not a queue
/// of the other's reads (TPC-H SF 10 Q02 under smartssd-2013: `nation`, 0.5 ms alone, took
/// 20-27 ms behind `part`'s reads when transfers queued whole, and 1-9 ms when they took
/// 250 µs turns, each reserved a turn ahead).
#[derive(Debug)]
pub struct BandwidthLimiter {
    bytes_per_sec: f64,
    flows: std::sync::Mutex<Flows>,
    waited_ns: AtomicU64,
}

/// The transfers in flight, in the virtual time of fair sharing: `served` counts the bytes a
/// transfer in flight all along would have been given, so one asked at `served = s` for `b`
/// bytes is done when `served` reaches `s + b`.
#[derive(Debug)]
struct Flows {
    served: f64,
    at: Instant,
    /// The `served` value at which each transfer in flight is done, ascending.
    finishes: Vec<f64>,
}

impl Flows {
    /// Moves the virtual time on to `now`, retiring the transfers done by then.
    fn advance(&mut self, now: Instant, bytes_per_sec: f64) {
        while let Some(&first) = self.finishes.first() {
            let n = self.finishes.len() as f64;
            let until_first = Duration::from_secs_f64(((first - self.served) * n / bytes_per_sec).max(0.0));
            if self.at + until_first > now {
                self.served += now.duration_since(self.at).as_secs_f64() * bytes_per_sec / n;
                self.at = now;
                return;
            }
            self.served = first;
            self.at += until_first;
            let done = self.finishes.partition_point(|&f| f <= first);
            self.finishes.drain(..done);
        }
        self.at = self.at.max(now);
    }

    /// Puts a transfer in flight that is done when `served` reaches `finish`.
    fn start(&mut self, finish: f64) {
        let at = self.finishes.partition_point(|&f| f <= finish);
        self.finishes.insert(at, finish);
    }

    /// When the transfer done at `finish` ends if no other arrives: the ones before it end in
    /// turn, each leaving its share to the rest.
    fn projected_end(&self, finish: f64, bytes_per_sec: f64) -> Instant {
        let (mut served, mut at, mut n) = (self.served, self.at, self.finishes.len() as f64);
        for &f in self.finishes.iter().take_while(|&&f| f <= finish) {
            at += Duration::from_secs_f64(((f - served) * n / bytes_per_sec).max(0.0));
            served = f;
            n -= 1.0;
        }
        at
    }
}

impl BandwidthLimiter {
    /// A limiter of `mbps` MB/s.
    pub fn new(mbps: f64) -> Self {
        let flows = Flows { served: 0.0, at: Instant::now(), finishes: Vec::new() };
        BandwidthLimiter { bytes_per_sec: mbps * 1e6, flows: std::sync::Mutex::new(flows), waited_ns: AtomicU64::new(0) }
    }

    /// Waits until `bytes` more have crossed at this transfer's fair share of the rate; returns
    /// the time waited. The end is re-projected whenever the sleep ends, as transfers that
    /// arrived meanwhile slow it. Sleeps are precise (`precise_sleep`); a wait shorter than
    /// [`MIN_WAIT`] is not slept but the transfer stays in flight, for the others to share with.
    pub async fn consume(&self, bytes: u64) -> Duration {
        let asked = Instant::now();
        let finish = {
            let mut flows = self.flows.lock().expect("limiter lock");
            flows.advance(asked, self.bytes_per_sec);
            let finish = flows.served + bytes as f64;
            flows.start(finish);
            finish
        };
        loop {
            let end = {
                let mut flows = self.flows.lock().expect("limiter lock");
                let now = Instant::now();
                flows.advance(now, self.bytes_per_sec);
                if flows.served >= finish {
                    break;
                }
                flows.projected_end(finish, self.bytes_per_sec)
            };
            if end <= Instant::now() + MIN_WAIT {
                break;
            }
            crate::precise_sleep::sleep_until(end).await;
        }
        let wait = asked.elapsed();
        self.waited_ns.fetch_add(wait.as_nanos() as u64, Ordering::Relaxed);
        wait
    }

    /// Total time callers waited.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited_ns.load(Ordering::Relaxed))
    }
}

/// The node's object store over its local files (read by `local_files`): it counts the bytes
/// read and, under a read budget, holds each read until the device's internal bandwidth could
/// have delivered it.
#[derive(Debug)]
pub struct ThrottledStore {
    inner: Arc<LocalFileSystem>,
    limiter: Option<Arc<BandwidthLimiter>>,
    bytes_read: AtomicU64,
    trace: std::sync::OnceLock<IoTrace>,
    faults: std::sync::OnceLock<InjectedFaults>,
}

struct InjectedFaults(ReadFaults);

impl fmt::Debug for InjectedFaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InjectedFaults")
    }
}

/// Which reads fail with an I/O error (given the file and the byte range read): the fault
/// simulation's failing disk (`LocalStorageNode::inject_read_faults`).
pub type ReadFaults = Arc<dyn Fn(&Path, &Range<u64>) -> bool + Send + Sync>;

/// A record of every read, one line each: `SECONDS R FILE OFFSET BYTES` (the trace format of
/// EMOS, `quarry model emos`).
#[derive(Debug)]
struct IoTrace {
    started: Instant,
    out: std::sync::Mutex<std::io::BufWriter<std::fs::File>>,
}

impl IoTrace {
    fn record(&self, location: &Path, range: &Range<u64>) {
        use std::io::Write;
        let seconds = self.started.elapsed().as_secs_f64();
        let mut out = self.out.lock().expect("trace lock");
        // A trace that cannot be written is lost, not a failed read.
        let _ = writeln!(out, "{seconds:.6} R /{location} {} {}", range.start, range.end - range.start);
        let _ = out.flush();
    }
}

impl ThrottledStore {
    /// Reads `inner`'s files; `limiter` bounds its read bandwidth.
    pub fn new(inner: Arc<LocalFileSystem>, limiter: Option<Arc<BandwidthLimiter>>) -> Self {
        ThrottledStore { inner, limiter, bytes_read: AtomicU64::new(0), trace: std::sync::OnceLock::new(), faults: std::sync::OnceLock::new() }
    }

    /// Fails, from now on, the reads `faults` picks.
    pub fn inject_read_faults(&self, faults: ReadFaults) -> std::result::Result<(), String> {
        self.faults.set(InjectedFaults(faults)).map_err(|_| "read faults are already injected".to_string())
    }

    /// An I/O error for a read of `ranges` of `location` that the injected faults pick.
    fn injected_fault(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<()> {
        match self.faults.get() {
            Some(InjectedFaults(fails)) if ranges.iter().any(|r| fails(location, r)) => Err(object_store::Error::Generic {
                store: "local",
                source: Box::new(std::io::Error::other(format!("injected I/O error reading /{location}"))),
            }),
            _ => Ok(()),
        }
    }

    /// Records every read from now on into a new file at `path`.
    pub fn record_trace(&self, path: &std::path::Path) -> std::result::Result<(), String> {
        let file = std::fs::File::create(path).map_err(|e| format!("creating the I/O trace {}: {e}", path.display()))?;
        let trace = IoTrace { started: Instant::now(), out: std::sync::Mutex::new(std::io::BufWriter::new(file)) };
        self.trace.set(trace).map_err(|_| "the I/O trace is already being recorded".to_string())
    }

    /// Starts reading `ranges` of `location` into the page cache: what a scan reads next
    /// (`local_files::read_ahead`). Counted, paced and traced when actually read.
    pub fn read_ahead(&self, location: &Path, ranges: Vec<Range<u64>>, account: Option<Arc<crate::read_account::ReadAccount>>) {
        crate::local_files::read_ahead(&self.inner, location, ranges, account);
    }

    /// Bytes read since the node started.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    async fn account(&self, bytes: u64) {
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        if let Some(limiter) = &self.limiter {
            limiter.consume(bytes).await;
        }
    }
}

impl fmt::Display for ThrottledStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ThrottledStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for ThrottledStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        let head = options.head;
        let result = crate::local_files::get_opts(&self.inner, location, options).await?;
        if !head {
            self.injected_fault(location, std::slice::from_ref(&result.range))?;
            if let Some(trace) = self.trace.get() {
                trace.record(location, &result.range);
            }
            self.account(result.range.end - result.range.start).await;
        }
        Ok(result)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        let result = crate::local_files::get_ranges(&self.inner, location, ranges).await?;
        self.injected_fault(location, ranges)?;
        if let Some(trace) = self.trace.get() {
            ranges.iter().for_each(|range| trace.record(location, range));
        }
        self.account(result.iter().map(|b| b.len() as u64).sum()).await;
        Ok(result)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// CPU time the calling thread has used, nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_THREAD_CPUTIME_ID is always
    // available on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Converts a profile error for DataFusion callers.
pub fn profile_error(message: String) -> DataFusionError {
    DataFusionError::Configuration(message)
}
