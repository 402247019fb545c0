//! EMOS, Energy Modeling for Storage (Li 2018, ch. 4.4.2): a trace-driven simulator of the
//! energy a device's storage subsystem spends on a sequence of requests.
//!
//! Each request goes through a simulated page cache (LRU over 4 KiB pages, of a given size,
//! with optional read-ahead); the share of its bytes found cached is charged at the platform's
//! measured energy per KB for a cache hit, the rest at the energy for a miss, for its type
//! (random or sequential read or write) and size (Table 4.4). Sizes the table does not list are
//! charged by regression over the sizes it does: energy per KB falls with the request size, so
//! the fit is a power law (least squares in log-log space; through both points when the table
//! has two sizes), which never goes negative when extrapolated.
//!
//! Choices the thesis leaves open, made here: a request is sequential when it starts where the
//! previous request to the same file ended, random otherwise; a request larger than the largest
//! size the table measured is broken into primitive operations of that size ("each IO is broken
//! into small primitive operations", sec. 4.4.2), the first of the request's type and the rest
//! sequential, so the regression only interpolates or goes below the measured sizes, never
//! extrapolates far above them (two points at 8 and 32 KB put a 1 MB cache hit above a miss);
//! writes go into the cache (write back), a write to a cached page being a hit; read-ahead of N
//! pages after a read that missed loads the uncached ones among them, charged as a sequential
//! read miss of N pages.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Bytes per page of the simulated cache.
pub const PAGE_BYTES: u64 = 4096;

/// The request types of Table 4.4's columns, in its column order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// RND_RD.
    RandomRead,
    /// RND_WR.
    RandomWrite,
    /// SEQ_RD.
    SequentialRead,
    /// SEQ_WR.
    SequentialWrite,
}

impl Access {
    /// Every type, in Table 4.4's column order.
    pub const ALL: [Access; 4] = [Access::RandomRead, Access::RandomWrite, Access::SequentialRead, Access::SequentialWrite];

    fn of(write: bool, sequential: bool) -> Access {
        match (write, sequential) {
            (false, false) => Access::RandomRead,
            (true, false) => Access::RandomWrite,
            (false, true) => Access::SequentialRead,
            (true, true) => Access::SequentialWrite,
        }
    }

    fn column(self) -> usize {
        Access::ALL.iter().position(|&a| a == self).expect("every access is a column")
    }
}

/// One row of a platform's table: energy per KB of each request type, for one request size,
/// cached or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnergyRow {
    /// Whether the request was served from the cache.
    pub hit: bool,
    /// Request size, KB.
    pub size_kb: u32,
    /// Microjoules per KB for RND_RD, RND_WR, SEQ_RD, SEQ_WR.
    pub uj_per_kb: [f64; 4],
}

/// A platform's measured storage energy per KB by request type, size and cache outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnergyTable {
    /// Platform name.
    pub platform: String,
    /// Where the numbers come from.
    pub source: String,
    /// The measurements.
    pub rows: Vec<EnergyRow>,
}

const TABLE_4_4: &str = "Li 2018, Table 4.4 (energy per KB, idle energy subtracted; DRAM, CPU and storage)";

fn row(hit: bool, size_kb: u32, uj_per_kb: [f64; 4]) -> EnergyRow {
    EnergyRow { hit, size_kb, uj_per_kb }
}

impl EnergyTable {
    /// The Windows RT tablet of Table 4.4.
    pub fn windows_rt() -> Self {
        let rows = vec![
            row(true, 8, [14.2, 22.4, 11.2, 19.0]),
            row(true, 32, [11.4, 18.2, 8.6, 18.2]),
            row(false, 8, [96.7, 110.4, 85.0, 117.5]),
            row(false, 32, [36.4, 116.8, 18.0, 118.2]),
        ];
        EnergyTable { platform: "windows-rt".into(), source: TABLE_4_4.into(), rows }
    }

    /// The Android phone of Table 4.4.
    pub fn android() -> Self {
        let rows = vec![
            row(true, 4, [10.3, 252.9, 9.1, 52.6]),
            row(true, 8, [6.0, 167.2, 5.8, 51.0]),
            row(true, 16, [4.0, 240.7, 4.0, 64.4]),
            row(true, 32, [3.3, 169.7, 3.3, 88.5]),
            row(false, 4, [441.9, 2402.7, 62.5, 451.8]),
            row(false, 8, [214.4, 2176.7, 58.5, 403.5]),
            row(false, 16, [187.6, 1720.9, 51.3, 254.9]),
            row(false, 32, [141.0, 1776.0, 51.1, 138.8]),
        ];
        EnergyTable { platform: "android".into(), source: TABLE_4_4.into(), rows }
    }

    /// A built-in platform (`windows-rt`, `android`) or a table in a JSON file of this form.
    pub fn load(name_or_file: &str) -> Result<Self, String> {
        match name_or_file {
            "windows-rt" => Ok(Self::windows_rt()),
            "android" => Ok(Self::android()),
            path => {
                let text = std::fs::read_to_string(path).map_err(|e| format!("platform '{path}' is neither windows-rt, android nor a readable file: {e}"))?;
                let table: EnergyTable = serde_json::from_str(&text).map_err(|e| format!("{path}: not an energy table: {e}"))?;
                table.validate().map_err(|e| format!("{path}: {e}"))?;
                Ok(table)
            }
        }
    }

    /// Every request type needs at least one positive measurement, hit and miss.
    fn validate(&self) -> Result<(), String> {
        for hit in [true, false] {
            for access in Access::ALL {
                if self.points(access, hit).is_empty() {
                    return Err(format!("no measurement for {access:?} {}", if hit { "hits" } else { "misses" }));
                }
            }
        }
        match self.rows.iter().find(|r| r.size_kb == 0 || r.uj_per_kb.iter().any(|&e| !(e > 0.0 && e.is_finite()))) {
            Some(bad) => Err(format!("a row of size {} KB has a size or an energy that is not positive", bad.size_kb)),
            None => Ok(()),
        }
    }

    /// (size KB, uJ/KB) of one column, hit or miss, by size.
    fn points(&self, access: Access, hit: bool) -> Vec<(f64, f64)> {
        let mut points: Vec<(f64, f64)> = self.rows.iter().filter(|r| r.hit == hit).map(|r| (r.size_kb as f64, r.uj_per_kb[access.column()])).collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        points
    }

    /// The largest request size measured, bytes: larger requests are split into pieces of it.
    pub fn largest_request_bytes(&self) -> u64 {
        self.rows.iter().map(|r| r.size_kb as u64 * 1024).max().unwrap_or(PAGE_BYTES)
    }

    /// Microjoules per KB of a request of `bytes`: the measurement at that size, else the
    /// power-law regression over the column's sizes.
    pub fn uj_per_kb(&self, access: Access, hit: bool, bytes: u64) -> f64 {
        let points = self.points(access, hit);
        let size_kb = bytes as f64 / 1024.0;
        if let Some(&(_, energy)) = points.iter().find(|(s, _)| (*s - size_kb).abs() < 1e-9) {
            return energy;
        }
        if points.len() == 1 {
            return points[0].1;
        }
        // log e = a + b log s, least squares.
        let n = points.len() as f64;
        let (xs, ys): (Vec<f64>, Vec<f64>) = points.iter().map(|(s, e)| (s.ln(), e.ln())).unzip();
        let (mean_x, mean_y) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
        let sxx: f64 = xs.iter().map(|x| (x - mean_x).powi(2)).sum();
        let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mean_x) * (y - mean_y)).sum();
        let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
        (mean_y + slope * (size_kb.max(1e-3).ln() - mean_x)).exp()
    }
}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Seconds since the trace began.
    pub time_s: f64,
    /// A write (else a read).
    pub write: bool,
    /// The file (any name).
    pub file: String,
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes requested.
    pub bytes: u64,
}

/// Parses a trace: one request per line, `TIME_S R|W FILE OFFSET BYTES`, separated by spaces;
/// blank lines and lines starting with `#` are skipped. An error names the line.
pub fn parse_trace(text: &str) -> Result<Vec<Request>, String> {
    let mut requests = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |what: &str| format!("trace line {}: {what} (expected TIME_S R|W FILE OFFSET BYTES): '{line}'", index + 1);
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [time, op, file, offset, bytes] = fields[..] else { return Err(bad("not five fields")) };
        let time_s: f64 = time.parse().ok().filter(|t: &f64| t.is_finite() && *t >= 0.0).ok_or_else(|| bad("bad time"))?;
        let write = match op {
            "R" | "r" => false,
            "W" | "w" => true,
            _ => return Err(bad("the operation is not R or W")),
        };
        let offset = offset.parse().map_err(|_| bad("bad offset"))?;
        let bytes = bytes.parse().ok().filter(|&b: &u64| b > 0).ok_or_else(|| bad("bad size"))?;
        requests.push(Request { time_s, write, file: file.to_string(), offset, bytes });
    }
    Ok(requests)
}

/// The simulated cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Cache size, bytes (whole pages).
    pub bytes: u64,
    /// Pages read ahead after a read that missed.
    pub prefetch_pages: u64,
}

/// Energy of one request type and cache outcome over a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CategoryEnergy {
    /// Request type.
    pub access: Access,
    /// Served from the cache.
    pub hit: bool,
    /// Bytes charged to this category.
    pub bytes: u64,
    /// Microjoules.
    pub energy_uj: f64,
    /// Microjoules per KB.
    pub uj_per_kb: f64,
}

/// What a simulation found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The platform's name.
    pub platform: String,
    /// Requests simulated.
    pub requests: u64,
    /// Reads among them.
    pub reads: u64,
    /// Bytes read and written.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Bytes found in the cache.
    pub hit_bytes: u64,
    /// Bytes not found in the cache.
    pub miss_bytes: u64,
    /// Pages read ahead (not cached before).
    pub prefetched_pages: u64,
    /// Total energy, joules.
    pub energy_j: f64,
    /// Seconds from the first request to the last.
    pub duration_s: f64,
    /// Energy by request type and cache outcome (categories with bytes only).
    pub by_category: Vec<CategoryEnergy>,
}

/// An LRU set of pages.
struct Lru {
    capacity: usize,
    clock: u64,
    last_use: HashMap<(usize, u64), u64>,
    by_age: BTreeMap<u64, (usize, u64)>,
}

impl Lru {
    fn new(capacity: usize) -> Self {
        Lru { capacity, clock: 0, last_use: HashMap::new(), by_age: BTreeMap::new() }
    }

    /// Uses a page: whether it was cached. It is cached afterwards (if the cache holds any).
    fn touch(&mut self, page: (usize, u64)) -> bool {
        self.clock += 1;
        let hit = match self.last_use.insert(page, self.clock) {
            Some(previous) => {
                self.by_age.remove(&previous);
                true
            }
            None => false,
        };
        self.by_age.insert(self.clock, page);
        while self.last_use.len() > self.capacity {
            let (_, oldest) = self.by_age.pop_first().expect("a page to evict");
            self.last_use.remove(&oldest);
        }
        hit
    }

    fn contains(&self, page: &(usize, u64)) -> bool {
        self.last_use.contains_key(page)
    }
}

/// Runs `trace` through the cache and charges each request by `table`.
pub fn simulate(table: &EnergyTable, trace: &[Request], cache: CacheConfig) -> Summary {
    let mut lru = Lru::new((cache.bytes / PAGE_BYTES) as usize);
    let mut files: HashMap<&str, usize> = HashMap::new();
    let mut last_end: HashMap<usize, u64> = HashMap::new();
    let mut categories: BTreeMap<(Access, bool), (u64, f64)> = BTreeMap::new();
    let mut summary = Summary {
        platform: table.platform.clone(),
        requests: 0,
        reads: 0,
        bytes_read: 0,
        bytes_written: 0,
        hit_bytes: 0,
        miss_bytes: 0,
        prefetched_pages: 0,
        energy_j: 0.0,
        duration_s: 0.0,
        by_category: Vec::new(),
    };
    let mut charge = |access: Access, hit: bool, bytes: u64, request_bytes: u64| {
        let entry = categories.entry((access, hit)).or_insert((0, 0.0));
        entry.0 += bytes;
        entry.1 += bytes as f64 / 1024.0 * table.uj_per_kb(access, hit, request_bytes);
    };
    let piece_bytes = table.largest_request_bytes();
    for request in trace {
        let next_id = files.len();
        let file = *files.entry(request.file.as_str()).or_insert(next_id);
        let sequential = last_end.insert(file, request.offset + request.bytes) == Some(request.offset);
        let (mut hit_bytes, mut miss_bytes) = (0, 0);
        let mut start = request.offset;
        let last_page = (request.offset + request.bytes - 1) / PAGE_BYTES;
        while start < request.offset + request.bytes {
            // A primitive operation: the first of the request's type, the rest sequential.
            let bytes = piece_bytes.min(request.offset + request.bytes - start);
            let access = Access::of(request.write, sequential || start > request.offset);
            let (first, last) = (start / PAGE_BYTES, (start + bytes - 1) / PAGE_BYTES);
            let pages = last - first + 1;
            let hit_pages = (first..=last).filter(|&p| lru.touch((file, p))).count() as u64;
            // The piece's bytes are shared between hit and miss in proportion to its pages.
            let hit = bytes * hit_pages / pages;
            if hit > 0 {
                charge(access, true, hit, bytes);
            }
            if bytes > hit {
                charge(access, false, bytes - hit, bytes);
            }
            (hit_bytes, miss_bytes) = (hit_bytes + hit, miss_bytes + bytes - hit);
            start += bytes;
        }
        if !request.write && miss_bytes > 0 && cache.prefetch_pages > 0 {
            let ahead: Vec<u64> = (last_page + 1..=last_page + cache.prefetch_pages).filter(|p| !lru.contains(&(file, *p))).collect();
            for &page in &ahead {
                lru.touch((file, page));
            }
            if !ahead.is_empty() {
                let read_ahead = cache.prefetch_pages * PAGE_BYTES;
                charge(Access::SequentialRead, false, ahead.len() as u64 * PAGE_BYTES, read_ahead);
                summary.prefetched_pages += ahead.len() as u64;
            }
        }
        summary.requests += 1;
        if request.write {
            summary.bytes_written += request.bytes;
        } else {
            summary.reads += 1;
            summary.bytes_read += request.bytes;
        }
        summary.hit_bytes += hit_bytes;
        summary.miss_bytes += miss_bytes;
    }
    if let (Some(first), Some(last)) = (trace.first(), trace.last()) {
        summary.duration_s = (last.time_s - first.time_s).max(0.0);
    }
    summary.by_category = categories
        .into_iter()
        .map(|((access, hit), (bytes, energy_uj))| CategoryEnergy { access, hit, bytes, energy_uj, uj_per_kb: energy_uj / (bytes as f64 / 1024.0) })
        .collect();
    summary.energy_j = summary.by_category.iter().map(|c| c.energy_uj).sum::<f64>() / 1e6;
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(write: bool, offset: u64, bytes: u64) -> Request {
        Request { time_s: 0.0, write, file: "f".into(), offset, bytes }
    }

    /// Requests of `size` bytes, one per slot: in order (each starts where the last ended) or,
    /// for random ones, every other slot in a scrambled order (none starts where another ends).
    fn pass(write: bool, sequential: bool, size: u64, count: u64) -> Vec<Request> {
        (0..count)
            .map(|i| if sequential { request(write, i * size, size) } else { request(write, ((i * 7) % count) * 2 * size, size) })
            .collect()
    }

    fn category(summary: &Summary, access: Access, hit: bool) -> &CategoryEnergy {
        summary.by_category.iter().find(|c| c.access == access && c.hit == hit).unwrap_or_else(|| panic!("no {access:?} hit={hit} in {summary:?}"))
    }

    #[test]
    fn every_row_of_table_4_4_is_reproduced_by_a_trace_of_only_that_request() {
        for table in [EnergyTable::windows_rt(), EnergyTable::android()] {
            for row in &table.rows {
                for access in Access::ALL {
                    let write = matches!(access, Access::RandomWrite | Access::SequentialWrite);
                    let sequential = matches!(access, Access::SequentialRead | Access::SequentialWrite);
                    let size = row.size_kb as u64 * 1024;
                    let expected = row.uj_per_kb[access.column()];
                    let one = pass(write, sequential, size, 64);
                    let summary = if row.hit {
                        // Warm a cache that holds everything, then the same requests again: hits.
                        let warm_then_again: Vec<Request> = one.iter().chain(&one).cloned().collect();
                        simulate(&table, &warm_then_again, CacheConfig { bytes: 1 << 30, prefetch_pages: 0 })
                    } else {
                        simulate(&table, &one, CacheConfig { bytes: 0, prefetch_pages: 0 })
                    };
                    let found = category(&summary, access, row.hit).uj_per_kb;
                    assert!((found - expected).abs() < 1e-9, "{} {access:?} hit={} {} KB: {found} uJ/KB, Table 4.4 says {expected}", table.platform, row.hit, row.size_kb);
                }
            }
        }
        // The trace of only 8 KB cached random reads on Windows RT, whole: 14.2 uJ/KB.
        let reads = pass(false, false, 8192, 100);
        let cached: Vec<Request> = reads.iter().chain(&reads).cloned().collect();
        let summary = simulate(&EnergyTable::windows_rt(), &cached, CacheConfig { bytes: 1 << 30, prefetch_pages: 0 });
        let hits = category(&summary, Access::RandomRead, true);
        assert_eq!(hits.bytes, 100 * 8192);
        assert!((hits.energy_uj - 14.2 * 800.0).abs() < 1e-6, "{summary:?}");
    }

    #[test]
    fn sizes_between_measurements_follow_the_power_law() {
        let windows = EnergyTable::windows_rt();
        // Two sizes: the line through both in log-log space (the geometric mean halfway).
        let e16 = windows.uj_per_kb(Access::RandomRead, true, 16 * 1024);
        assert!((e16 - (14.2f64 * 11.4).sqrt()).abs() < 1e-9, "{e16}");
        // Outside the range it extrapolates and stays positive.
        let e1m = windows.uj_per_kb(Access::RandomRead, false, 1 << 20);
        assert!(e1m > 0.0 && e1m < 36.4, "{e1m}");
        // Four sizes: a least-squares fit, between the neighbours for a size between them.
        let e12 = EnergyTable::android().uj_per_kb(Access::RandomRead, false, 12 * 1024);
        assert!(e12 < 441.9 && e12 > 141.0, "{e12}");
    }

    #[test]
    fn requests_larger_than_measured_are_split_into_measured_pieces() {
        let windows = EnergyTable::windows_rt();
        assert_eq!(windows.largest_request_bytes(), 32 * 1024);
        // 1 MB read, nothing cached: a 32 KB random read, then 31 sequential ones.
        let summary = simulate(&windows, &[request(false, 0, 1 << 20)], CacheConfig { bytes: 0, prefetch_pages: 0 });
        let expected_uj = 32.0 * 36.4 + 31.0 * 32.0 * 18.0;
        assert!((summary.energy_j * 1e6 - expected_uj).abs() < 1e-6, "{summary:?}");
        assert_eq!(category(&summary, Access::SequentialRead, false).bytes, 31 * 32 * 1024);
        // Cached, the same read costs less than missed (hits are cheaper at every measured size).
        let twice = [request(false, 0, 1 << 20), request(false, 0, 1 << 20)];
        let cached = simulate(&windows, &twice, CacheConfig { bytes: 1 << 30, prefetch_pages: 0 });
        assert!(cached.energy_j - summary.energy_j < summary.energy_j, "{cached:?}");
    }

    #[test]
    fn the_cache_is_lru() {
        let table = EnergyTable::windows_rt();
        let page = |p: u64| request(false, p * PAGE_BYTES * 3, PAGE_BYTES);
        // Two pages: A B A C B -> miss miss hit miss (evicts B, A was used later) miss.
        let trace = [page(0), page(1), page(0), page(2), page(1)];
        let summary = simulate(&table, &trace, CacheConfig { bytes: 2 * PAGE_BYTES, prefetch_pages: 0 });
        assert_eq!((summary.hit_bytes, summary.miss_bytes), (PAGE_BYTES, 4 * PAGE_BYTES));
        // With read-ahead of 3 pages, a read of page 0 then of page 2 hits.
        let ahead = [request(false, 0, PAGE_BYTES), request(false, 2 * PAGE_BYTES, PAGE_BYTES)];
        let summary = simulate(&table, &ahead, CacheConfig { bytes: 1 << 20, prefetch_pages: 3 });
        assert_eq!((summary.hit_bytes, summary.prefetched_pages), (PAGE_BYTES, 3));
        // A request over several pages, half cached, is charged half hit, half miss.
        let trace = [request(false, 0, 2 * PAGE_BYTES), request(false, PAGE_BYTES * 10, 10), request(false, PAGE_BYTES, 2 * PAGE_BYTES)];
        let summary = simulate(&table, &trace, CacheConfig { bytes: 1 << 20, prefetch_pages: 0 });
        assert_eq!((summary.hit_bytes, summary.miss_bytes), (PAGE_BYTES, 3 * PAGE_BYTES + 10));
    }

    #[test]
    fn traces_parse_and_bad_lines_are_named() {
        let trace = parse_trace("# time op file offset bytes\n0.5 R a.parquet 0 4096\n\n1.0 W b 8192 100\n").unwrap();
        assert_eq!(trace, vec![
            Request { time_s: 0.5, write: false, file: "a.parquet".into(), offset: 0, bytes: 4096 },
            Request { time_s: 1.0, write: true, file: "b".into(), offset: 8192, bytes: 100 },
        ]);
        for (text, what) in [("0 X f 0 1", "not R or W"), ("0 R f 0", "not five fields"), ("0 R f -1 1", "bad offset"), ("0 R f 0 0", "bad size")] {
            let error = parse_trace(&format!("0 R f 0 1\n{text}\n")).unwrap_err();
            assert!(error.starts_with("trace line 2: ") && error.contains(what), "{error}");
        }
        let bad = EnergyTable { platform: "x".into(), source: String::new(), rows: vec![row(true, 8, [1.0, 1.0, 1.0, 1.0])] };
        assert!(bad.validate().unwrap_err().contains("misses"));
    }
}
