//! External-memory graph analytics in the style of GraFBoost / GraFSoft (Jun 2018, ch. 9).
//!
//! Graphs far larger than memory are stored as compressed sparse rows on disk and analysed by
//! push-style vertex programs whose random updates are sequentialized by sort-reduce
//! ([`quarry_sortreduce`]). Nothing here holds per-vertex or per-edge state in memory: vertex
//! values live in a dense file, active lists in sorted files, updates in the sort-reducer's
//! bounded chunk and runs, and every phase takes a single memory budget.
//!
//! # Modules
//!
//! - [`csr`]: the on-disk graph (index, edges, weights, reverse graph, header), its readers and
//!   the atomic publish protocol.
//! - [`import`]: edge streams and text/CSV edge files to a graph with bounded memory (sort-reduce
//!   by `(src, dst)` removes duplicates; self-loops dropped by default).
//! - [`kronecker`]: Graph500 Kronecker graphs, generated in parallel and deterministically.
//! - [`engine`]: the [`VertexProgram`] trait and the superstep engine (Algorithms 1 and 3).
//! - [`algorithms`]: BFS, PageRank, weakly connected components, SSSP, betweenness centrality.
//!
//! # Example
//!
//! ```
//! use quarry_graph::algorithms::{PageRankOptions, bfs, pagerank};
//! use quarry_graph::{EngineConfig, ImportOptions, KroneckerParams, generate_kronecker};
//!
//! # fn main() -> quarry_graph::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let options = ImportOptions::default().with_memory_bytes(8 << 20);
//! let (graph, kron) = generate_kronecker(&KroneckerParams::graph500(8), dir.path().join("kron8"), options)?;
//! assert_eq!(kron.edges_generated, 16 * 256);
//! let config = EngineConfig::new(8 << 20).with_temp_dir(dir.path());
//! let tree = bfs(&graph, 0, &config)?;
//! assert_eq!(tree.parents.get(0)?, 0);
//! let ranks = pagerank(&graph, &PageRankOptions { iterations: 5, ..Default::default() }, &config)?;
//! let total: f64 = ranks.ranks.to_vec()?.iter().sum();
//! assert!((total - 1.0).abs() < 1e-9);
//! # Ok(())
//! # }
//! ```
//!
//! # Errata of the paper
//!
//! See [`engine`] (Algorithms 1, 3 and 4 store the update rather than the finalized value;
//! `vertex_update` must be commutative too) and [`algorithms`] (BFS's arbitrary parent is made
//! the smallest-id parent; PageRank's Algorithm 4 active list is not implemented).

#![warn(missing_docs)]

pub mod algorithms;
mod bloom;
pub mod csr;
pub mod engine;
mod error;
pub mod import;
mod io;
pub mod kronecker;

pub use csr::{Adjacency, Direction, EdgeIter, Graph, GraphMeta, GraphScrub, GraphWriter, IdWidth, scrub};
pub use engine::{
    Cancel, Edge, Engine, EngineConfig, Frontier, Mode, Progress, ProgressEvent, RunStats, Start, StepContext,
    SuperstepStats, VertexProgram, VertexValues,
};
pub use error::{Error, Result};
pub use import::{
    EdgeFileReader, EdgeFormat, GraphBuilder, ImportOptions, ImportStats, import_edge_files,
};
pub use io::{TEMP_DIR_PREFIX, clean_stale_temp_dirs};
pub use kronecker::{KroneckerParams, KroneckerStats, generate_kronecker};
