//! Breadth-first search (sec. 9.7.1): the paper's BFS program with a deterministic reduce.

use crate::csr::Graph;
use crate::engine::run_program;
use crate::engine::{
    Edge, EngineConfig, RunStats, Start, StepContext, VertexProgram, VertexValues,
};
use crate::error::Result;

/// Parent of a vertex the search did not reach.
pub const UNREACHED: u64 = u64::MAX;

/// BFS from `root` along out-edges. A vertex's value is its BFS-tree parent: the root's parent
/// is the root itself, unreached vertices hold [`UNREACHED`].
///
/// The paper's `vertex_update` keeps an arbitrary one of the offered parents; this one keeps the
/// smallest id, so the tree is the same for every memory budget and thread count: each vertex at
/// depth `d` gets the smallest-id vertex at depth `d - 1` with an edge to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bfs {
    /// The start vertex.
    pub root: u64,
}

impl VertexProgram for Bfs {
    type Value = u64;
    type Update = u64;

    fn initial_value(&self, vertex: u64) -> u64 {
        if vertex == self.root {
            self.root
        } else {
            UNREACHED
        }
    }

    fn start(&self) -> Start {
        Start::Vertices(vec![self.root])
    }

    fn edge_program(&self, _parent: &u64, edge: &Edge) -> Option<u64> {
        Some(edge.src)
    }

    fn vertex_update(&self, a: u64, b: u64) -> u64 {
        a.min(b)
    }

    fn finalize(&self, _: &StepContext, _: u64, old: u64, update: Option<u64>) -> u64 {
        // A vertex keeps the parent from the level it was first reached on.
        if old == UNREACHED {
            update.unwrap_or(UNREACHED)
        } else {
            old
        }
    }

    fn is_active(&self, old: &u64, new: &u64) -> bool {
        *old == UNREACHED && *new != UNREACHED
    }
}

/// The result of [`bfs`].
#[derive(Debug)]
pub struct BfsResult {
    /// Parent of every vertex ([`UNREACHED`] when not reached; the root's is the root).
    pub parents: VertexValues<u64>,
    /// Vertices reached, the root included.
    pub reached: u64,
    /// Depth of the deepest vertex (levels below the root).
    pub depth: u64,
    /// Engine counters (one superstep per level, plus the last one that finds nothing new).
    pub stats: RunStats,
}

/// Breadth-first search from `root`; see [`Bfs`].
pub fn bfs(graph: &Graph, root: u64, config: &EngineConfig) -> Result<BfsResult> {
    super::check_root(graph, root)?;
    let out = run_program(graph, &Bfs { root }, config, u64::MAX)?;
    let reached = 1 + out
        .stats
        .supersteps
        .iter()
        .map(|s| s.next_active)
        .sum::<u64>();
    let depth = out
        .stats
        .supersteps
        .iter()
        .filter(|s| s.next_active > 0)
        .count() as u64;
    Ok(BfsResult {
        parents: out.values,
        reached,
        depth,
        stats: out.stats,
    })
}
