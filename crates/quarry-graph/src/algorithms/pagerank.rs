//! PageRank (sec. 9.7.1): all vertices active, a fixed number of iterations.

use crate::csr::Graph;
use crate::engine::{
    Edge, EngineConfig, Mode, RunStats, Start, StepContext, VertexProgram, VertexValues,
    run_program,
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
/// Every vertex is active in every iteration ([`Mode::Dense`]): this is the plain power
/// iteration, the variant the paper measures ("only the very first iteration ... when all
/// vertices are active"). The Bloom-filter active list of Algorithm 4 (recompute only vertices
/// near changed ones) is not implemented: its result depends on a threshold and it needs
/// per-vertex iteration stamps; with a fixed iteration count the plain form is exact.
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

/// PageRank settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PageRankOptions {
    /// Damping factor, in `[0, 1]`.
    pub damping: f64,
    /// Iterations (supersteps).
    pub iterations: u64,
}

impl Default for PageRankOptions {
    fn default() -> Self {
        PageRankOptions {
            damping: 0.85,
            iterations: 20,
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
    let out = run_program(graph, &program, config, options.iterations)?;
    Ok(PageRankResult {
        ranks: out.values,
        stats: out.stats,
    })
}
