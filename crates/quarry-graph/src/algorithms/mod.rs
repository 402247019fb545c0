//! Graph algorithms as vertex programs on the [engine](crate::engine).
//!
//! | algorithm | program(s) | value | update, reduce | notes |
//! |---|---|---|---|---|
//! | [`bfs()`] | [`Bfs`] | parent id | sender id, `min` | parent = smallest-id parent on the previous level |
//! | [`pagerank()`] | [`PageRank`] | rank `f64` | `rank / outdeg`, `+` | dense, fixed iterations, dangling mass spread uniformly |
//! | [`connected_components()`] | [`ConnectedComponents`] | label | label, `min` | weakly connected, needs the reverse graph |
//! | [`sssp()`] | [`Sssp`] | `(distance, parent)` | `(d + w, sender)`, lexicographic `min` | Bellman-Ford by supersteps |
//! | [`betweenness()`] | [`BcForward`], [`BcBackward`] | `((depth, sigma), delta)` | see [`bc`] | Brandes, forward BFS + backtrace on the reverse graph |
//!
//! Every function takes an [`EngineConfig`](crate::engine::EngineConfig) (memory budget,
//! threads, scratch directory) and returns the result as [`VertexValues`](crate::VertexValues)
//! plus the engine's [`RunStats`](crate::engine::RunStats).

pub mod bc;
pub mod bfs;
pub mod cc;
pub mod pagerank;
pub mod sssp;

pub use bc::{
    BcBackward, BcForward, BcResult, BcValue, UNVISITED_DEPTH, betweenness, sample_sources,
};
pub use bfs::{Bfs, BfsResult, UNREACHED, bfs};
pub use cc::{ComponentsResult, ConnectedComponents, connected_components};
pub use pagerank::{PageRank, PageRankOptions, PageRankResult, pagerank};
pub use sssp::{Sssp, SsspResult, SsspValue, sssp};

use crate::csr::Graph;
use crate::error::{Error, Result};

/// Fails unless `vertex` is a vertex of `graph`.
fn check_root(graph: &Graph, vertex: u64) -> Result<()> {
    if vertex >= graph.vertices() {
        return Err(Error::invalid(format!(
            "root {vertex} is not a vertex of the graph ({} vertices)",
            graph.vertices()
        )));
    }
    Ok(())
}
