//! Graph500 Kronecker (R-MAT) graphs, generated in parallel straight into the import.
//!
//! # Model
//!
//! A scale-`N` graph has `2^N` vertices and `edge_factor * 2^N` generated edges (Graph500:
//! edge factor 16; GraFBoost's kron28/kron30 use 16, kron32 uses 8, Table 9.1). Each edge picks
//! its source and destination bit by bit, most significant first: with probability `A = 0.57`
//! both bits are 0, `B = 0.19` the destination bit is 1, `C = 0.19` the source bit is 1, and
//! `D = 1 - A - B - C = 0.05` both are 1. This concentrates edges on low ids, so the ids are then
//! scrambled by a seeded pseudo-random permutation of `[0, 2^N)`: a 4-round Feistel network on
//! `2 * ceil(N/2)` bits, cycle-walking values that fall outside the range (the permutation needs
//! no memory and is a bijection). Optional weights are uniform in `(0, 1]`, as Graph500's SSSP
//! kernel uses.
//!
//! # Determinism and parallelism
//!
//! The edge sequence is cut into chunks of [`CHUNK_EDGES`] edges; chunk `i` draws from ChaCha8
//! seeded with the seed and set to stream `i`, so every chunk is independent of every other and
//! of the thread that generates it. Threads take chunks round-robin and pass them through a
//! bounded channel to the [`GraphBuilder`], whose sort-reduce removes self-loops and duplicate
//! edges. The arrival order varies between runs, the sorted, reduced result does not: the same
//! parameters give byte-identical graph files for any thread count and memory budget.
//!
//! The generated graph is directed (`src -> dst` as drawn). Graph500 treats it as undirected;
//! set [`ImportOptions::symmetrize`] for that.

use std::path::Path;
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use crate::csr::Graph;
use crate::engine::{Progress, ProgressEvent};
use crate::error::{Error, Result};
use crate::import::{GraphBuilder, ImportOptions, ImportStats};

/// Edges per independently seeded chunk. Fixed: changing it changes every generated graph.
pub const CHUNK_EDGES: u64 = 8192;

/// One generated edge in a chunk (ids fit 32 bits since the scale is at most 32).
type ChunkEdge = (u32, u32, f32);

/// Parameters of a Kronecker graph.
#[derive(Debug, Clone, PartialEq)]
pub struct KroneckerParams {
    /// `log2` of the vertex count, 1 to 32.
    pub scale: u32,
    /// Generated edges per vertex (before duplicates and self-loops are removed).
    pub edge_factor: u64,
    /// Probability of the top-left quadrant.
    pub a: f64,
    /// Probability of the top-right quadrant (destination bit set).
    pub b: f64,
    /// Probability of the bottom-left quadrant (source bit set).
    pub c: f64,
    /// Seed of the edge streams and of the vertex permutation.
    pub seed: u64,
    /// Whether edges get uniform `(0, 1]` weights.
    pub weighted: bool,
    /// Whether vertex ids are scrambled (Graph500 does; off leaves the skew on low ids).
    pub permute: bool,
    /// Told how many edges are generated so far (a CLI draws a bar from it).
    pub progress: Progress,
}

impl KroneckerParams {
    /// Graph500 parameters: A = 0.57, B = C = 0.19, edge factor 16, seed 1, unweighted, permuted.
    pub fn graph500(scale: u32) -> Self {
        KroneckerParams {
            scale,
            edge_factor: 16,
            a: 0.57,
            b: 0.19,
            c: 0.19,
            seed: 1,
            weighted: false,
            permute: true,
            progress: Progress::default(),
        }
    }

    /// Sets [`Self::progress`].
    pub fn with_progress(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Sets [`Self::edge_factor`].
    pub fn with_edge_factor(mut self, edge_factor: u64) -> Self {
        self.edge_factor = edge_factor;
        self
    }

    /// Sets [`Self::seed`].
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets [`Self::weighted`].
    pub fn with_weights(mut self, weighted: bool) -> Self {
        self.weighted = weighted;
        self
    }

    /// `2^scale`.
    pub fn vertices(&self) -> u64 {
        1 << self.scale
    }

    /// Edges generated: `edge_factor * 2^scale`.
    pub fn edges(&self) -> u64 {
        self.edge_factor << self.scale
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u64 {
        self.edges().div_ceil(CHUNK_EDGES)
    }

    fn validate(&self) -> Result<()> {
        if !(1..=32).contains(&self.scale) {
            return Err(Error::invalid(format!(
                "Kronecker scale {} is outside 1..=32",
                self.scale
            )));
        }
        if self.edge_factor == 0 || self.edge_factor.leading_zeros() < self.scale + 1 {
            return Err(Error::invalid(format!(
                "Kronecker edge factor {} is 0 or too large for scale {}",
                self.edge_factor, self.scale
            )));
        }
        let ok = |p: f64| (0.0..=1.0).contains(&p);
        if !ok(self.a) || !ok(self.b) || !ok(self.c) || self.a + self.b + self.c > 1.0 + 1e-12 {
            return Err(Error::invalid(format!(
                "Kronecker probabilities A={} B={} C={} must be in [0, 1] with A+B+C <= 1",
                self.a, self.b, self.c
            )));
        }
        Ok(())
    }

    /// The edges of chunk `chunk` (`0..chunks()`), as drawn: self-loops and duplicates
    /// included. Chunks are independent; this is what each generator thread computes.
    pub fn chunk_edges(&self, chunk: u64) -> Result<Vec<(u64, u64, f32)>> {
        self.validate()?;
        let generator = Generator::new(self);
        let mut out = Vec::new();
        generator.chunk(chunk, &mut out);
        Ok(out
            .into_iter()
            .map(|(s, d, w)| (s as u64, d as u64, w))
            .collect())
    }
}

/// Per-run constants: quadrant thresholds on a 32-bit draw and the permutation.
struct Generator<'a> {
    params: &'a KroneckerParams,
    /// Draws below `t[0]` land in A, below `t[1]` in B, below `t[2]` in C, else D.
    t: [u64; 3],
    permutation: VertexPermutation,
}

impl<'a> Generator<'a> {
    fn new(params: &'a KroneckerParams) -> Self {
        let scale = |p: f64| ((p * 4_294_967_296.0) as u64).min(1 << 32);
        Generator {
            params,
            t: [
                scale(params.a),
                scale(params.a + params.b),
                scale(params.a + params.b + params.c),
            ],
            permutation: VertexPermutation::new(params.scale, params.seed),
        }
    }

    fn chunk(&self, chunk: u64, out: &mut Vec<ChunkEdge>) {
        let p = self.params;
        let first = chunk * CHUNK_EDGES;
        let n = CHUNK_EDGES.min(p.edges().saturating_sub(first));
        let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
        rng.set_stream(chunk);
        out.clear();
        out.reserve(n as usize);
        for _ in 0..n {
            let (mut src, mut dst) = (0u64, 0u64);
            // Two 32-bit draws per u64.
            let mut bits = 0u64;
            let mut left = 0;
            for _ in 0..p.scale {
                if left == 0 {
                    bits = rng.next_u64();
                    left = 2;
                }
                let r = bits & 0xffff_ffff;
                bits >>= 32;
                left -= 1;
                src <<= 1;
                dst <<= 1;
                if r < self.t[0] {
                } else if r < self.t[1] {
                    dst |= 1;
                } else if r < self.t[2] {
                    src |= 1;
                } else {
                    src |= 1;
                    dst |= 1;
                }
            }
            let weight = if p.weighted {
                // 24 random bits -> (0, 1], exact in f32.
                ((rng.next_u32() >> 8) + 1) as f32 / 16_777_216.0
            } else {
                1.0
            };
            if p.permute {
                src = self.permutation.apply(src);
                dst = self.permutation.apply(dst);
            }
            out.push((src as u32, dst as u32, weight));
        }
    }
}

/// A seeded bijection of `[0, 2^bits)` without memory: a Feistel network on `2 * ceil(bits/2)`
/// bits with cycle walking (re-applying it until the value lands in range, which terminates
/// because the walk stays on the cycle of the starting value, which is in range).
#[derive(Debug, Clone)]
pub struct VertexPermutation {
    bits: u32,
    half: u32,
    keys: [u64; 4],
}

/// SplitMix64 finalizer: a fast, well-mixed round function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl VertexPermutation {
    /// A permutation of `[0, 2^bits)` (`bits` at most 64) chosen by `seed`.
    pub fn new(bits: u32, seed: u64) -> Self {
        assert!(bits <= 64, "at most 64 bits");
        let mut state = seed ^ 0x5851_f42d_4c95_7f2d;
        let mut keys = [0u64; 4];
        for k in &mut keys {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            *k = mix(state);
        }
        VertexPermutation {
            bits,
            half: bits.div_ceil(2),
            keys,
        }
    }

    fn feistel(&self, x: u64) -> u64 {
        let h = self.half;
        let mask = if h == 0 { 0 } else { u64::MAX >> (64 - h) };
        let (mut l, mut r) = (x >> h, x & mask);
        for &k in &self.keys {
            let f = mix(r ^ k) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << h) | r
    }

    /// The image of `x` (`x < 2^bits`).
    pub fn apply(&self, x: u64) -> u64 {
        if self.bits == 0 {
            return 0;
        }
        let limit_bits = self.bits;
        let in_range = |y: u64| limit_bits == 64 || y >> limit_bits == 0;
        debug_assert!(in_range(x));
        let mut y = self.feistel(x);
        while !in_range(y) {
            y = self.feistel(y);
        }
        y
    }
}

/// What a Kronecker generation did.
#[derive(Debug, Clone, PartialEq)]
pub struct KroneckerStats {
    /// Vertices (`2^scale`).
    pub vertices: u64,
    /// Edges generated (`edge_factor * 2^scale`).
    pub edges_generated: u64,
    /// Generated self-loops, dropped.
    pub self_loops_dropped: u64,
    /// Duplicate edges removed.
    pub duplicates_removed: u64,
    /// Edges in the graph.
    pub edges_kept: u64,
    /// Wall time of generation and import together (they overlap).
    pub elapsed: Duration,
    /// The import's own statistics.
    pub import: ImportStats,
}

/// Generates a Kronecker graph into `dest` through a [`GraphBuilder`] with `options` (its
/// `vertices` and `weighted` are set from `params`). Uses `options.threads` generator threads;
/// chunks in flight (`3 * threads + 1` of [`CHUNK_EDGES`] edges) are charged to the budget.
pub fn generate_kronecker(
    params: &KroneckerParams,
    dest: impl AsRef<Path>,
    options: ImportOptions,
) -> Result<(Graph, KroneckerStats)> {
    params.validate()?;
    let started = Instant::now();
    let threads = options.threads.max(1);
    let in_flight = 3 * threads + 1;
    let reserved = in_flight * CHUNK_EDGES as usize * std::mem::size_of::<ChunkEdge>();
    let options = ImportOptions {
        vertices: Some(params.vertices()),
        weighted: Some(params.weighted),
        ..options
    };
    let mut builder = GraphBuilder::with_reserved(dest.as_ref(), options, reserved)?;
    let generator = Generator::new(params);
    let chunks = params.chunks();
    std::thread::scope(|s| -> Result<()> {
        // Two queued chunks per thread keep the consumer busy without unbounded memory.
        let (tx, rx) = sync_channel::<Vec<ChunkEdge>>(2 * threads);
        for t in 0..threads as u64 {
            let tx = tx.clone();
            let generator = &generator;
            s.spawn(move || {
                let mut chunk = t;
                while chunk < chunks {
                    let mut edges = Vec::new();
                    generator.chunk(chunk, &mut edges);
                    if tx.send(edges).is_err() {
                        // The consumer stopped (an import error): stop too.
                        return;
                    }
                    chunk += threads as u64;
                }
            });
        }
        drop(tx);
        let (total, mut generated) = (params.vertices() * params.edge_factor, 0u64);
        for edges in rx {
            generated += edges.len() as u64;
            for (src, dst, weight) in edges {
                builder.add_edge(src as u64, dst as u64, Some(weight))?;
            }
            params.progress.report(ProgressEvent::Generated { edges: generated, total });
        }
        Ok(())
    })?;
    let (graph, import) = builder.finish()?;
    let stats = KroneckerStats {
        vertices: params.vertices(),
        edges_generated: import.edges_read,
        self_loops_dropped: import.self_loops_dropped,
        duplicates_removed: import.duplicates_removed,
        edges_kept: import.edges_kept,
        elapsed: started.elapsed(),
        import,
    };
    Ok((graph, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_bijection() {
        for bits in [0u32, 1, 2, 3, 7, 10, 11] {
            let p = VertexPermutation::new(bits, 42);
            let n = 1u64 << bits;
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = p.apply(x);
                assert!(y < n);
                assert!(!seen[y as usize], "bits {bits}: {y} hit twice");
                seen[y as usize] = true;
            }
        }
        // Different seeds, different permutations.
        let (a, b) = (VertexPermutation::new(16, 1), VertexPermutation::new(16, 2));
        assert!((0..100).any(|x| a.apply(x) != b.apply(x)));
    }

    #[test]
    fn chunks_are_deterministic_and_skewed() {
        let p = KroneckerParams::graph500(12).with_weights(true);
        assert_eq!(p.chunks(), (16 << 12) / CHUNK_EDGES);
        let c0 = p.chunk_edges(0).unwrap();
        assert_eq!(c0.len() as u64, CHUNK_EDGES);
        assert_eq!(c0, p.chunk_edges(0).unwrap());
        assert_ne!(c0, p.chunk_edges(1).unwrap());
        assert!(
            c0.iter()
                .all(|&(s, d, w)| s < 4096 && d < 4096 && w > 0.0 && w <= 1.0)
        );
        // Unpermuted, vertex 0 is the hub: A^12 of the edges would be (0, 0); far more than
        // uniform touch vertex 0 as a source.
        let mut q = p.clone();
        q.permute = false;
        let zero = q
            .chunk_edges(0)
            .unwrap()
            .iter()
            .filter(|e| e.0 == 0)
            .count();
        assert!(zero > 100, "{zero}");
        assert!(KroneckerParams::graph500(33).chunk_edges(0).is_err());
        assert!(
            KroneckerParams::graph500(4)
                .with_edge_factor(0)
                .chunk_edges(0)
                .is_err()
        );
    }
}
