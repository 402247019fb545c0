//! Single-source shortest paths: Bellman-Ford relaxation, one superstep per round.

use std::cmp::Ordering;

use crate::csr::Graph;
use crate::engine::{
    Edge, EngineConfig, RunStats, Start, StepContext, VertexProgram, VertexValues, run_program,
};
use crate::error::{Error, Result};

/// `(distance, parent)`: `(f64::INFINITY, u64::MAX)` for unreachable vertices, `(0, root)` for
/// the root.
pub type SsspValue = (f64, u64);

/// Shortest paths from `root` over edge weights (1.0 on unweighted graphs). An active vertex
/// offers `(its distance + weight, itself)` to each out-neighbour; offers combine with the
/// lexicographic minimum, so among equally short paths the parent is the smallest id; a vertex
/// is active again when its distance dropped.
///
/// Distances are sums of the `f32` weights in `f64`, accumulated from the root along the path.
/// Negative weights work unless a negative cycle is reachable, which [`sssp`] reports as an
/// error after `V` rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sssp {
    /// The source vertex.
    pub root: u64,
}

fn lexicographic_min(a: SsspValue, b: SsspValue) -> SsspValue {
    match a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)) {
        Ordering::Greater => b,
        _ => a,
    }
}

impl VertexProgram for Sssp {
    type Value = SsspValue;
    type Update = SsspValue;

    fn initial_value(&self, vertex: u64) -> SsspValue {
        if vertex == self.root {
            (0.0, self.root)
        } else {
            (f64::INFINITY, u64::MAX)
        }
    }

    fn start(&self) -> Start {
        Start::Vertices(vec![self.root])
    }

    fn edge_program(&self, value: &SsspValue, edge: &Edge) -> Option<SsspValue> {
        Some((value.0 + edge.weight as f64, edge.src))
    }

    fn vertex_update(&self, a: SsspValue, b: SsspValue) -> SsspValue {
        lexicographic_min(a, b)
    }

    fn finalize(
        &self,
        _: &StepContext,
        v: u64,
        old: SsspValue,
        update: Option<SsspValue>,
    ) -> SsspValue {
        match update {
            // The root keeps itself as parent even if a zero-length cycle leads back to it.
            Some(u) if v != self.root || u.0 < old.0 => lexicographic_min(old, u),
            _ => old,
        }
    }

    fn is_active(&self, old: &SsspValue, new: &SsspValue) -> bool {
        new.0 < old.0
    }
}

/// The result of [`sssp`].
#[derive(Debug)]
pub struct SsspResult {
    /// `(distance, parent)` of every vertex; see [`SsspValue`].
    pub distances: VertexValues<SsspValue>,
    /// Engine counters (one superstep per relaxation round).
    pub stats: RunStats,
}

/// Single-source shortest paths from `root`; see [`Sssp`].
pub fn sssp(graph: &Graph, root: u64, config: &EngineConfig) -> Result<SsspResult> {
    super::check_root(graph, root)?;
    // Without negative cycles every shortest path has fewer than V edges, so round V + 1 finds
    // nothing to improve.
    let out = run_program(graph, &Sssp { root }, config, graph.vertices() + 1)?;
    if !out.converged {
        return Err(Error::invalid(format!(
            "shortest paths from {root} did not converge: a negative cycle is reachable"
        )));
    }
    Ok(SsspResult {
        distances: out.values,
        stats: out.stats,
    })
}
