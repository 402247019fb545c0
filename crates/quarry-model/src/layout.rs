//! The layout planner's model (HippogriffDB, Li 2018 ch. 2.2): which encoding and codec each
//! column of a table is stored with, chosen for a workload on a device.
//!
//! Each column has candidate layouts, each with its stored bytes and the device's seconds to
//! decode them (measured on a sample, scaled to the table). A query reads some columns; on the
//! device its time is the slower of reading their stored bytes and decoding them:
//! `max(Σ bytes / read bandwidth, Σ decode seconds)`. The paper calls a plan *balanced* when
//! the read is the slower of the two (the decoder keeps up with the storage), and asks for the
//! smallest balanced plan; we minimize the workload's time, the sum over its queries, which
//! prefers the smallest balanced plan where one exists and otherwise the fastest unbalanced one.
//!
//! Choosing one candidate per column is a multiple-choice knapsack (NP-hard, as the paper
//! notes). [`greedy`] is a 2-approximation: for each query `max(io, cpu) ≥ (io + cpu) / 2`, and
//! the sum `io + cpu` over the workload separates by column, so choosing for every column the
//! candidate with the least `reads × (bytes / bandwidth + decode seconds)` gives a plan at most
//! twice the optimum's time; single-column changes that lower the time are then applied while
//! any does (it can only improve). The paper's own greedy (columns in order of decode time,
//! compressed while the plan stays balanced) omits its proof; this one carries it in two lines.
//! [`exhaustive`] enumerates every plan of a small instance, for the test that checks the bound.

use serde::{Deserialize, Serialize};

/// One way to store a column: an encoding and a codec, with what they cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnLayout {
    /// Parquet encoding, e.g. `PLAIN`, `RLE_DICTIONARY`, `DELTA_BINARY_PACKED`.
    pub encoding: String,
    /// Page codec, e.g. `UNCOMPRESSED`, `SNAPPY`, `ZSTD(3)`.
    pub codec: String,
    /// Stored bytes of the whole column.
    pub bytes: f64,
    /// Seconds the device takes to decode the whole column (decompress and decode to Arrow).
    pub decode_s: f64,
}

/// A table's columns with their candidates, and the workload's queries over them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutProblem {
    /// Column names.
    pub columns: Vec<String>,
    /// Per column, its candidate layouts (at least one each).
    pub candidates: Vec<Vec<ColumnLayout>>,
    /// Per query, the columns it reads (indexes into `columns`) and the share of each column's
    /// bytes it reads (1.0 unless segments are pruned).
    pub queries: Vec<Vec<(usize, f64)>>,
    /// The device's read bandwidth, bytes per second.
    pub read_bytes_per_s: f64,
}

/// A plan's predicted figures for one query.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QueryCost {
    /// Stored bytes read.
    pub bytes: f64,
    /// Seconds reading them.
    pub read_s: f64,
    /// Seconds decoding them.
    pub decode_s: f64,
}

impl QueryCost {
    /// The query's predicted time: the slower of reading and decoding.
    pub fn seconds(&self) -> f64 {
        self.read_s.max(self.decode_s)
    }

    /// Whether the decoder keeps up with the storage (the paper's balanced plan).
    pub fn balanced(&self) -> bool {
        self.decode_s <= self.read_s
    }
}

impl LayoutProblem {
    /// Checks the instance: a candidate for every column, queries naming existing columns,
    /// finite non-negative figures, a positive bandwidth.
    pub fn validate(&self) -> Result<(), String> {
        if self.candidates.len() != self.columns.len() {
            return Err(format!("{} columns but candidates for {}", self.columns.len(), self.candidates.len()));
        }
        if let Some(i) = self.candidates.iter().position(|c| c.is_empty()) {
            return Err(format!("column '{}' has no candidate layout", self.columns[i]));
        }
        if let Some(bad) = self.candidates.iter().flatten().find(|c| !(c.bytes >= 0.0 && c.decode_s >= 0.0 && c.bytes.is_finite() && c.decode_s.is_finite())) {
            return Err(format!("candidate {} {} has bytes {} and decode seconds {}", bad.encoding, bad.codec, bad.bytes, bad.decode_s));
        }
        if let Some((_, _)) = self.queries.iter().flatten().find(|(c, share)| *c >= self.columns.len() || !(0.0..=1.0).contains(share)) {
            return Err("a query reads a column that does not exist or a share outside 0..1".into());
        }
        if !(self.read_bytes_per_s > 0.0 && self.read_bytes_per_s.is_finite()) {
            return Err(format!("read bandwidth must be positive, not {}", self.read_bytes_per_s));
        }
        Ok(())
    }

    /// Each query's figures under `plan` (a candidate index per column).
    pub fn query_costs(&self, plan: &[usize]) -> Vec<QueryCost> {
        self.queries
            .iter()
            .map(|reads| {
                let (mut bytes, mut decode_s) = (0.0, 0.0);
                for &(column, share) in reads {
                    let layout = &self.candidates[column][plan[column]];
                    bytes += layout.bytes * share;
                    decode_s += layout.decode_s * share;
                }
                QueryCost { bytes, read_s: bytes / self.read_bytes_per_s, decode_s }
            })
            .collect()
    }

    /// The workload's predicted time under `plan`: the sum of its queries'.
    pub fn seconds(&self, plan: &[usize]) -> f64 {
        self.query_costs(plan).iter().map(QueryCost::seconds).sum()
    }
}

/// The greedy plan (a candidate index per column), within twice the optimum's time.
pub fn greedy(problem: &LayoutProblem) -> Vec<usize> {
    // Per column, the candidate with the least read plus decode time over the queries reading it.
    let mut weight = vec![0.0; problem.columns.len()];
    for &(column, share) in problem.queries.iter().flatten() {
        weight[column] += share;
    }
    let mut plan: Vec<usize> = problem
        .candidates
        .iter()
        .zip(&weight)
        .map(|(candidates, w)| {
            let cost = |c: &ColumnLayout| w * (c.bytes / problem.read_bytes_per_s + c.decode_s);
            // Ties (a column no query reads) go to the smallest.
            (0..candidates.len())
                .min_by(|&a, &b| cost(&candidates[a]).total_cmp(&cost(&candidates[b])).then(candidates[a].bytes.total_cmp(&candidates[b].bytes)))
                .expect("every column has a candidate")
        })
        .collect();
    // Then the single-column change that lowers the workload's time most, while one does.
    let mut best = problem.seconds(&plan);
    loop {
        let mut step: Option<(usize, usize, f64)> = None;
        for column in 0..plan.len() {
            let kept = plan[column];
            for candidate in 0..problem.candidates[column].len() {
                if candidate == kept {
                    continue;
                }
                plan[column] = candidate;
                let seconds = problem.seconds(&plan);
                if seconds < step.map_or(best, |s| s.2) * (1.0 - 1e-12) {
                    step = Some((column, candidate, seconds));
                }
            }
            plan[column] = kept;
        }
        match step {
            Some((column, candidate, seconds)) => {
                plan[column] = candidate;
                best = seconds;
            }
            None => return plan,
        }
    }
}

/// The optimal plan, by enumerating every one: for small instances only (at most `limit`
/// plans, else `None`).
pub fn exhaustive(problem: &LayoutProblem, limit: u64) -> Option<Vec<usize>> {
    let count = problem.candidates.iter().try_fold(1u64, |n, c| n.checked_mul(c.len() as u64))?;
    if count > limit {
        return None;
    }
    let mut plan = vec![0; problem.columns.len()];
    let (mut best, mut best_plan) = (f64::INFINITY, plan.clone());
    for _ in 0..count {
        let seconds = problem.seconds(&plan);
        if seconds < best {
            (best, best_plan) = (seconds, plan.clone());
        }
        // The next plan, counting in mixed radix.
        for (column, choice) in plan.iter_mut().enumerate() {
            *choice += 1;
            if *choice < problem.candidates[column].len() {
                break;
            }
            *choice = 0;
        }
    }
    Some(best_plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(bytes: f64, decode_s: f64) -> ColumnLayout {
        ColumnLayout { encoding: "E".into(), codec: "C".into(), bytes, decode_s }
    }

    /// A deterministic generator (xorshift), so a failing instance replays.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn random_problem(rng: &mut Rng) -> LayoutProblem {
        let columns = 2 + (rng.next() * 4.0) as usize;
        let candidates = (0..columns)
            .map(|_| {
                let raw = 1e6 + rng.next() * 1e8;
                (0..1 + (rng.next() * 4.0) as usize).map(|_| layout(raw * (0.05 + rng.next()), raw / 1e9 * rng.next() * 20.0)).collect()
            })
            .collect();
        let mut queries = Vec::new();
        for _ in 0..1 + (rng.next() * 5.0) as usize {
            let mut reads = Vec::new();
            for column in 0..columns {
                if rng.next() < 0.6 {
                    reads.push((column, if rng.next() < 0.3 { rng.next() } else { 1.0 }));
                }
            }
            queries.push(reads);
        }
        LayoutProblem { columns: (0..columns).map(|c| format!("c{c}")).collect(), candidates, queries, read_bytes_per_s: 1e7 + rng.next() * 3e9 }
    }

    #[test]
    fn greedy_is_within_twice_the_optimum_on_small_instances() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut worst: f64 = 1.0;
        for instance in 0..2000 {
            let problem = random_problem(&mut rng);
            problem.validate().unwrap();
            let optimum = problem.seconds(&exhaustive(&problem, 1 << 16).expect("small"));
            let greedy = problem.seconds(&greedy(&problem));
            assert!(greedy <= 2.0 * optimum * (1.0 + 1e-9), "instance {instance}: greedy {greedy} vs optimum {optimum}: {problem:?}");
            assert!(greedy >= optimum * (1.0 - 1e-9), "instance {instance}: greedy below the optimum?");
            worst = worst.max(greedy / optimum.max(1e-300));
        }
        // The local search usually reaches the optimum; the bound is what is guaranteed.
        assert!(worst < 2.0, "worst ratio {worst}");
    }

    #[test]
    fn slow_storage_compresses_and_a_slow_decoder_does_not() {
        // Plain: 100 MB, decodes in 0.01 s; compressed: 20 MB, decodes in 0.2 s.
        let problem = |bandwidth| LayoutProblem {
            columns: vec!["a".into()],
            candidates: vec![vec![layout(100e6, 0.01), layout(20e6, 0.2)]],
            queries: vec![vec![(0, 1.0)]],
            read_bytes_per_s: bandwidth,
        };
        // At 100 MB/s: plain reads in 1 s, compressed in 0.2 s (decode 0.2 s): compressed.
        assert_eq!(greedy(&problem(100e6)), vec![1]);
        let costs = problem(100e6).query_costs(&[1]);
        assert!(costs[0].balanced() && (costs[0].seconds() - 0.2).abs() < 1e-9, "{costs:?}");
        // At 10 GB/s: plain in 0.01 s, compressed is decode-bound at 0.2 s: plain.
        assert_eq!(greedy(&problem(10e9)), vec![0]);
        assert!(!problem(10e9).query_costs(&[1])[0].balanced());
    }

    #[test]
    fn columns_no_query_reads_take_their_smallest_layout() {
        let problem = LayoutProblem {
            columns: vec!["read".into(), "unread".into()],
            candidates: vec![vec![layout(10.0, 0.0)], vec![layout(50.0, 0.0), layout(5.0, 9.0)]],
            queries: vec![vec![(0, 1.0)]],
            read_bytes_per_s: 1.0,
        };
        assert_eq!(greedy(&problem), vec![0, 1]);
    }

    #[test]
    fn invalid_instances_are_refused_by_name() {
        let mut problem = LayoutProblem { columns: vec!["a".into()], candidates: vec![vec![]], queries: vec![], read_bytes_per_s: 1.0 };
        assert!(problem.validate().unwrap_err().contains("column 'a' has no candidate"));
        problem.candidates = vec![vec![layout(1.0, 0.0)]];
        problem.read_bytes_per_s = 0.0;
        assert!(problem.validate().unwrap_err().contains("read bandwidth"));
    }
}
