//! PageRank (sec. 9.7.1): all vertices active, a fixed number of iterations.

use crate::csr::Graph;
use crate::engine::{
    Edge, Engine, EngineConfig, Frontier, Mode, RunStats, Start, StepContext, VertexProgram,
    VertexValues, run_program,
};
use crate::error::{Error, Result};

/// PageRank with damping `d` on `V` vertices. Ranks start at `1/V`; each iteration computes
///
/// ```text
/// r'(v) = (1 - d) / V + d * ( sum over edges u -> v of r(u) / outdeg(u)  +  D / V )
/// ```
///
/// where `D` is the total rank of *dangling* vertices (no out-edges): their rank is
/// redistributed uniformly over all vertices (as if they linked to every vertex), so the ranks
/// always sum to 1. `D` is gathered during the scatter with [`VertexProgram::aggregate`].
///
/// Without a tolerance every vertex is active in every iteration ([`Mode::Dense`]): the plain
/// power iteration, the variant the paper measures ("only the very first iteration ... when all
/// vertices are active"). With [`PageRankOptions::tolerance`] `t`, iterations follow Algorithm
/// 4 ([`Engine::superstep_bloom`]): after the first, only the vertices whose rank moved by more
/// than `t / V` (`t` times the average rank) in the previous iteration are recomputed; the
/// sources of their in-edges are marked in a Bloom filter and only those scatter. A vertex that
/// stopped moving keeps its rank even if an in-neighbour moves later, so the result is PageRank
/// to within a few `t / V` per vertex. The dangling rank `D` is summed over all vertices every
/// iteration; when it moves by more than `t / damping` (every rank then moves by more than
/// `t / V`), the next iteration recomputes every vertex. The run stops early once no vertex
/// moves by more than `t / V`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PageRank {
    /// Damping factor (0.85 by default in [`PageRankOptions`]).
    pub damping: f64,
    /// Vertices in the graph.
    pub vertices: u64,
}

impl VertexProgram for PageRank {
    type Value = f64;
    type Update = f64;

    fn initial_value(&self, _: u64) -> f64 {
        1.0 / self.vertices as f64
    }

    fn start(&self) -> Start {
        Start::All
    }

    fn mode(&self) -> Mode {
        Mode::Dense
    }

    fn edge_program(&self, rank: &f64, edge: &Edge) -> Option<f64> {
        Some(rank / edge.degree as f64)
    }

    fn vertex_update(&self, a: f64, b: f64) -> f64 {
        a + b
    }

    fn aggregate(&self, _: u64, rank: &f64, degree: u64) -> f64 {
        if degree == 0 { *rank } else { 0.0 }
    }

    fn finalize(&self, step: &StepContext, _: u64, _: f64, update: Option<f64>) -> f64 {
        let n = self.vertices as f64;
        (1.0 - self.damping) / n + self.damping * (update.unwrap_or(0.0) + step.aggregate / n)
    }

    fn is_active(&self, _: &f64, _: &f64) -> bool {
        true
    }
}

/// PageRank whose vertices stay active while their rank moves by more than `tolerance` (an
/// absolute rank: the option's relative tolerance over `V`).
struct TolerantPageRank {
    rank: PageRank,
    tolerance: f64,
}

impl VertexProgram for TolerantPageRank {
    type Value = f64;
    type Update = f64;

    fn initial_value(&self, v: u64) -> f64 {
        self.rank.initial_value(v)
    }

    fn start(&self) -> Start {
        Start::All
    }

    fn mode(&self) -> Mode {
        Mode::Dense
    }

    fn edge_program(&self, rank: &f64, edge: &Edge) -> Option<f64> {
        self.rank.edge_program(rank, edge)
    }

    fn vertex_update(&self, a: f64, b: f64) -> f64 {
        a + b
    }

    fn aggregate(&self, v: u64, rank: &f64, degree: u64) -> f64 {
        self.rank.aggregate(v, rank, degree)
    }

    fn finalize(&self, step: &StepContext, v: u64, old: f64, update: Option<f64>) -> f64 {
        self.rank.finalize(step, v, old, update)
    }

    fn is_active(&self, old: &f64, new: &f64) -> bool {
        (new - old).abs() > self.tolerance
    }
}

/// PageRank settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PageRankOptions {
    /// Damping factor, in `[0, 1]`.
    pub damping: f64,
    /// Iterations (supersteps); with a tolerance, the most.
    pub iterations: u64,
    /// Recompute only vertices whose rank moved by more than this share of the average rank
    /// `1/V` (Algorithm 4's Bloom-filter active list); `None` recomputes every vertex every
    /// iteration.
    pub tolerance: Option<f64>,
}

impl Default for PageRankOptions {
    fn default() -> Self {
        PageRankOptions {
            damping: 0.85,
            iterations: 20,
            tolerance: None,
        }
    }
}

/// The result of [`pagerank`].
#[derive(Debug)]
pub struct PageRankResult {
    /// Rank of every vertex (they sum to 1 up to rounding).
    pub ranks: VertexValues<f64>,
    /// Engine counters, one superstep per iteration.
    pub stats: RunStats,
}

/// Runs `options.iterations` PageRank iterations; see [`PageRank`].
pub fn pagerank(
    graph: &Graph,
    options: &PageRankOptions,
    config: &EngineConfig,
) -> Result<PageRankResult> {
    if !(0.0..=1.0).contains(&options.damping) {
        return Err(Error::invalid(format!(
            "damping {} is outside [0, 1]",
            options.damping
        )));
    }
    let program = PageRank {
        damping: options.damping,
        vertices: graph.vertices(),
    };
    if let Some(tolerance) = options.tolerance {
        if !(tolerance >= 0.0) {
            return Err(Error::invalid(format!("tolerance {tolerance} is not a non-negative number")));
        }
        let tolerance = tolerance / graph.vertices().max(1) as f64;
        return pagerank_bloom(graph, TolerantPageRank { rank: program, tolerance }, options.iterations, config);
    }
    let out = run_program(graph, &program, config, options.iterations)?;
    Ok(PageRankResult {
        ranks: out.values,
        stats: out.stats,
    })
}

/// Bloom-filter bytes per vertex asked of the budget (10 bits a vertex; capped by the engine).
const BLOOM_BYTES_PER_VERTEX: usize = 2;

/// Algorithm 4: every vertex in the first iteration, then only those still moving.
fn pagerank_bloom(graph: &Graph, program: TolerantPageRank, iterations: u64, config: &EngineConfig) -> Result<PageRankResult> {
    let mut engine = Engine::new(graph, config.clone(), |v| program.initial_value(v))?;
    let bloom_bytes = (graph.vertices() as usize).saturating_mul(BLOOM_BYTES_PER_VERTEX);
    let mut recompute = Frontier::All;
    let mut dangling: Option<f64> = None;
    // Every rank moves by damping * dD / V when the dangling rank D moves by dD.
    let dangling_tolerance = program.tolerance * graph.vertices() as f64 / program.rank.damping.max(f64::MIN_POSITIVE);
    for _ in 0..iterations {
        if recompute.is_empty() {
            break;
        }
        let next = engine.superstep_bloom(&program, &recompute, bloom_bytes)?;
        let step_dangling = engine.stats().supersteps.last().map_or(0.0, |s| s.aggregate);
        let moved = dangling.is_some_and(|d| (step_dangling - d).abs() > dangling_tolerance);
        dangling = Some(step_dangling);
        recompute = if moved { Frontier::All } else { next };
    }
    drop(recompute);
    let stats = engine.stats().clone();
    Ok(PageRankResult { ranks: engine.into_values()?, stats })
}
