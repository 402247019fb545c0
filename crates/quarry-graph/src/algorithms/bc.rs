//! Betweenness centrality (sec. 9.7.1): Brandes' algorithm as two vertex programs.
//!
//! For each source `s`:
//!
//! 1. **Forward** ([`BcForward`]): a level-synchronous BFS along out-edges that also counts
//!    shortest paths. Level `L`'s vertices send `(L + 1, sigma)`; a newly reached vertex takes
//!    the depth and the sum of the path counts `sigma` offered to it. Each superstep's active
//!    list (the vertices of one level) is kept: these are the paper's "generated vertex lists".
//! 2. **Backward** ([`BcBackward`]): the lists are replayed from the deepest level up on the
//!    reverse graph. A vertex `w` on level `L` sends `(L, (1 + delta(w)) / sigma(w))` along its
//!    in-edges; a receiver `v` on level `L - 1` adds `sigma(v) * sum` to its `delta`. This is
//!    Brandes' dependency `delta(v) = sum over v -> w with depth(w) = depth(v) + 1 of
//!    sigma(v) / sigma(w) * (1 + delta(w))`, with the sum formed by sort-reduce.
//! 3. Every vertex other than `s` adds its `delta` to its score (one sequential pass merging
//!    the value file into the score file).
//!
//! The paper's backtrace sort-reduces the parent lists into counts and joins them with set
//! unions; replaying the level lists through the engine computes the same dependencies with the
//! same machinery (and also weights by path counts, which plain parent counts cannot).
//!
//! Scores are the raw sums over the given sources, on the directed graph, without the
//! factor 1/2 used for undirected graphs. For an estimate from a sample of `k` of `V` sources,
//! scale by `V / k`.

use crate::csr::{Direction, Graph};
use crate::engine::ENGINE_BUFFERS;
use crate::engine::{
    Edge, Engine, EngineConfig, Frontier, RunStats, Start, StepContext, VertexProgram, VertexValues,
};
use crate::error::{Error, Result};
use crate::io::{TempDir, ValueStore, plan_memory};
use crate::kronecker::VertexPermutation;

/// Depth of a vertex the forward search has not reached.
pub const UNVISITED_DEPTH: u32 = u32::MAX;

/// `((depth, sigma), delta)`: BFS depth, number of shortest paths from the source, dependency.
pub type BcValue = ((u32, f64), f64);

/// Combines `(depth, amount)` offers: the smallest depth wins and amounts at that depth add up.
/// (Within one superstep all offers carry the same depth; the rule keeps the function
/// associative and commutative regardless.)
fn combine(a: (u32, f64), b: (u32, f64)) -> (u32, f64) {
    match a.0.cmp(&b.0) {
        std::cmp::Ordering::Less => a,
        std::cmp::Ordering::Greater => b,
        std::cmp::Ordering::Equal => (a.0, a.1 + b.1),
    }
}

/// The forward pass: BFS with shortest-path counting from `root`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BcForward {
    /// The source.
    pub root: u64,
}

impl VertexProgram for BcForward {
    type Value = BcValue;
    type Update = (u32, f64);

    fn initial_value(&self, vertex: u64) -> BcValue {
        if vertex == self.root {
            ((0, 1.0), 0.0)
        } else {
            ((UNVISITED_DEPTH, 0.0), 0.0)
        }
    }

    fn start(&self) -> Start {
        Start::Vertices(vec![self.root])
    }

    fn edge_program(&self, value: &BcValue, _: &Edge) -> Option<(u32, f64)> {
        let ((depth, sigma), _) = *value;
        Some((depth + 1, sigma))
    }

    fn vertex_update(&self, a: (u32, f64), b: (u32, f64)) -> (u32, f64) {
        combine(a, b)
    }

    fn finalize(
        &self,
        _: &StepContext,
        _: u64,
        old: BcValue,
        update: Option<(u32, f64)>,
    ) -> BcValue {
        match update {
            Some((depth, sigma)) if old.0.0 == UNVISITED_DEPTH => ((depth, sigma), 0.0),
            _ => old,
        }
    }

    fn is_active(&self, old: &BcValue, new: &BcValue) -> bool {
        old.0.0 == UNVISITED_DEPTH && new.0.0 != UNVISITED_DEPTH
    }
}

/// The backward pass: dependency accumulation along in-edges, one level per superstep, driven
/// by [`betweenness`] with the forward pass's level lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BcBackward;

impl VertexProgram for BcBackward {
    type Value = BcValue;
    type Update = (u32, f64);

    fn initial_value(&self, _: u64) -> BcValue {
        ((UNVISITED_DEPTH, 0.0), 0.0)
    }

    /// Unused: [`betweenness`] supplies the level lists.
    fn start(&self) -> Start {
        Start::Vertices(Vec::new())
    }

    fn directions(&self) -> &[Direction] {
        &[Direction::In]
    }

    fn edge_program(&self, value: &BcValue, _: &Edge) -> Option<(u32, f64)> {
        let ((depth, sigma), delta) = *value;
        Some((depth, (1.0 + delta) / sigma))
    }

    fn vertex_update(&self, a: (u32, f64), b: (u32, f64)) -> (u32, f64) {
        combine(a, b)
    }

    fn finalize(
        &self,
        _: &StepContext,
        _: u64,
        old: BcValue,
        update: Option<(u32, f64)>,
    ) -> BcValue {
        let ((depth, sigma), delta) = old;
        match update {
            // Only predecessors on the previous level (shortest-path DAG edges) take a share.
            Some((sender, share)) if depth != UNVISITED_DEPTH && depth + 1 == sender => {
                ((depth, sigma), delta + sigma * share)
            }
            _ => old,
        }
    }

    fn is_active(&self, _: &BcValue, _: &BcValue) -> bool {
        false
    }
}

/// The result of [`betweenness`].
#[derive(Debug)]
pub struct BcResult {
    /// Score of every vertex: the sum over the sources of its dependency.
    pub scores: VertexValues<f64>,
    /// Engine counters, one entry per source.
    pub stats: Vec<RunStats>,
}

/// Betweenness centrality from `sources` (one source, a sample from [`sample_sources`], or every
/// vertex); see the [module docs](self). Needs the reverse graph.
///
/// Memory: the engine gets `config.memory_bytes` minus one file buffer for the score file.
pub fn betweenness(graph: &Graph, sources: &[u64], config: &EngineConfig) -> Result<BcResult> {
    graph.require(Direction::In)?;
    for &s in sources {
        super::check_root(graph, s)?;
    }
    let vertices = graph.vertices();
    let score_block = plan_memory(config.memory_bytes, ENGINE_BUFFERS, 0)?.io_buffer;
    let engine_config = EngineConfig {
        memory_bytes: config.memory_bytes - score_block,
        ..config.clone()
    };
    let dir = TempDir::create(&config.temp_dir)?;
    let scores_path = dir.path().join("scores");
    let mut scores = ValueStore::<f64>::create(&scores_path, vertices, score_block, |_| 0.0)?;
    let mut stats = Vec::with_capacity(sources.len());
    for &source in sources {
        let forward = BcForward { root: source };
        let mut engine = Engine::new(graph, engine_config.clone(), |v| forward.initial_value(v))?;
        // Forward: keep each level's list.
        let mut levels = Vec::new();
        let mut frontier = engine.frontier([source])?;
        loop {
            let next = engine.superstep(&forward, &frontier)?;
            match frontier {
                Frontier::List(list) => levels.push(list),
                _ => return Err(Error::invalid("betweenness: unexpected frontier kind")),
            }
            if next.is_empty() {
                break;
            }
            frontier = next;
        }
        // Backward: deepest level first; the root's level sends nothing.
        while let Some(level) = levels.pop() {
            if levels.is_empty() {
                break;
            }
            engine.superstep(&BcBackward, &Frontier::Vertices(level))?;
        }
        stats.push(engine.stats().clone());
        let values = engine.into_values()?;
        for (v, value) in values.iter()?.enumerate() {
            let ((depth, _), delta) = value?;
            let v = v as u64;
            if v != source && depth != UNVISITED_DEPTH && delta != 0.0 {
                let old = scores.get(v)?;
                scores.set(v, old + delta)?;
            }
        }
    }
    scores.flush()?;
    drop(scores);
    Ok(BcResult {
        scores: VertexValues::open_in(&scores_path, vertices, Some(dir))?,
        stats,
    })
}

/// `count` distinct vertices of a graph of `vertices` vertices, chosen pseudo-randomly by
/// `seed` (a seeded permutation of the ids, cycle-walked into range; O(count) memory).
pub fn sample_sources(vertices: u64, count: u64, seed: u64) -> Vec<u64> {
    let count = count.min(vertices);
    if count == 0 {
        return Vec::new();
    }
    let bits = 64 - (vertices - 1).leading_zeros();
    let permutation = VertexPermutation::new(bits, seed);
    (0..count)
        .map(|i| {
            let mut x = permutation.apply(i);
            while x >= vertices {
                x = permutation.apply(x);
            }
            x
        })
        .collect()
}
