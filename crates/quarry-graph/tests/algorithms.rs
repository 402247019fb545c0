//! End-to-end tests: import, Kronecker generation and every algorithm against plain in-memory
//! reference implementations (Vec-based BFS, PageRank, union-find, Dijkstra, Brandes).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::fs;
use std::path::Path;

use quarry_graph::algorithms::{
    PageRankOptions, UNREACHED, betweenness, bfs, connected_components, pagerank, sample_sources,
    sssp,
};
use quarry_graph::{
    Direction, EngineConfig, Graph, GraphBuilder, GraphWriter, IdWidth, ImportOptions,
    KroneckerParams, RunStats, generate_kronecker,
};

/// Seeded random numbers for test graphs (ChaCha8, already a dependency of the crate).
struct Rng(rand_chacha::ChaCha8Rng);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(<rand_chacha::ChaCha8Rng as rand_chacha::rand_core::SeedableRng>::seed_from_u64(seed))
    }
    fn next(&mut self) -> u64 {
        rand_chacha::rand_core::RngCore::next_u64(&mut self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The graph as the references see it: sorted unique edges with the smallest weight, no
/// self-loops, plus the vertex count.
#[derive(Debug, Clone)]
struct RefGraph {
    n: usize,
    out: Vec<Vec<(usize, f64)>>,
    inn: Vec<Vec<(usize, f64)>>,
}

impl RefGraph {
    fn new(n: usize, raw: &[(u64, u64, f32)]) -> Self {
        let mut unique = BTreeMap::new();
        for &(s, d, w) in raw {
            if s != d {
                let e = unique.entry((s as usize, d as usize)).or_insert(w);
                *e = e.min(w);
            }
        }
        let mut out = vec![Vec::new(); n];
        let mut inn = vec![Vec::new(); n];
        for (&(s, d), &w) in &unique {
            out[s].push((d, w as f64));
            inn[d].push((s, w as f64));
        }
        RefGraph { n, out, inn }
    }

    fn from_graph(g: &Graph) -> Self {
        let edges: Vec<_> = g
            .edges(Direction::Out)
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        RefGraph::new(g.vertices() as usize, &edges)
    }

    /// Parent = smallest-id vertex on the previous level with an edge to it.
    fn bfs(&self, root: usize) -> Vec<u64> {
        let mut dist = vec![usize::MAX; self.n];
        dist[root] = 0;
        let mut queue = VecDeque::from([root]);
        while let Some(u) = queue.pop_front() {
            for &(v, _) in &self.out[u] {
                if dist[v] == usize::MAX {
                    dist[v] = dist[u] + 1;
                    queue.push_back(v);
                }
            }
        }
        (0..self.n)
            .map(|v| {
                if v == root {
                    root as u64
                } else if dist[v] == usize::MAX {
                    UNREACHED
                } else {
                    self.inn[v]
                        .iter()
                        .filter(|&&(u, _)| dist[u] != usize::MAX && dist[u] + 1 == dist[v])
                        .map(|&(u, _)| u as u64)
                        .min()
                        .unwrap()
                }
            })
            .collect()
    }

    fn pagerank(&self, damping: f64, iterations: usize) -> Vec<f64> {
        let n = self.n as f64;
        let mut rank = vec![1.0 / n; self.n];
        for _ in 0..iterations {
            let dangling: f64 = (0..self.n)
                .filter(|&u| self.out[u].is_empty())
                .map(|u| rank[u])
                .sum();
            let mut next = vec![0.0; self.n];
            for (u, out) in self.out.iter().enumerate() {
                for &(v, _) in out {
                    next[v] += rank[u] / out.len() as f64;
                }
            }
            for x in &mut next {
                *x = (1.0 - damping) / n + damping * (*x + dangling / n);
            }
            rank = next;
        }
        rank
    }

    /// Union-find; label = smallest id in the component.
    fn components(&self) -> Vec<u64> {
        fn find(p: &mut [usize], mut x: usize) -> usize {
            while p[x] != x {
                p[x] = p[p[x]];
                x = p[x];
            }
            x
        }
        let mut parent: Vec<usize> = (0..self.n).collect();
        for u in 0..self.n {
            for &(v, _) in &self.out[u] {
                let (a, b) = (find(&mut parent, u), find(&mut parent, v));
                // Union towards the smaller root keeps the root the minimum.
                if a < b {
                    parent[b] = a;
                } else if b < a {
                    parent[a] = b;
                }
            }
        }
        (0..self.n).map(|v| find(&mut parent, v) as u64).collect()
    }

    /// Dijkstra; parent = smallest in-neighbour on a shortest path.
    fn sssp(&self, root: usize) -> Vec<(f64, u64)> {
        let mut dist = vec![f64::INFINITY; self.n];
        dist[root] = 0.0;
        // f64 ordered by bits: distances are non-negative, so bit order is numeric order.
        let mut heap = BinaryHeap::from([Reverse((0f64.to_bits(), root))]);
        while let Some(Reverse((bits, u))) = heap.pop() {
            let d = f64::from_bits(bits);
            if d > dist[u] {
                continue;
            }
            for &(v, w) in &self.out[u] {
                let nd = d + w;
                if nd < dist[v] {
                    dist[v] = nd;
                    heap.push(Reverse((nd.to_bits(), v)));
                }
            }
        }
        (0..self.n)
            .map(|v| {
                if v == root {
                    (0.0, root as u64)
                } else if dist[v].is_infinite() {
                    (f64::INFINITY, u64::MAX)
                } else {
                    let parent = self.inn[v]
                        .iter()
                        .filter(|&&(u, w)| dist[u] + w == dist[v])
                        .map(|&(u, _)| u as u64)
                        .min()
                        .unwrap();
                    (dist[v], parent)
                }
            })
            .collect()
    }

    /// Brandes on the directed, unweighted graph, summed over `sources`.
    fn betweenness(&self, sources: &[u64]) -> Vec<f64> {
        let mut score = vec![0.0; self.n];
        for &s in sources {
            let s = s as usize;
            let mut sigma = vec![0.0f64; self.n];
            let mut dist = vec![usize::MAX; self.n];
            let mut order = Vec::new();
            sigma[s] = 1.0;
            dist[s] = 0;
            let mut queue = VecDeque::from([s]);
            while let Some(u) = queue.pop_front() {
                order.push(u);
                for &(v, _) in &self.out[u] {
                    if dist[v] == usize::MAX {
                        dist[v] = dist[u] + 1;
                        queue.push_back(v);
                    }
                    if dist[v] == dist[u] + 1 {
                        sigma[v] += sigma[u];
                    }
                }
            }
            let mut delta = vec![0.0f64; self.n];
            for &w in order.iter().rev() {
                for &(v, _) in &self.inn[w] {
                    if dist[v] != usize::MAX && dist[v] + 1 == dist[w] {
                        delta[v] += sigma[v] / sigma[w] * (1.0 + delta[w]);
                    }
                }
                if w != s {
                    score[w] += delta[w];
                }
            }
        }
        score
    }
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    a == b || (a - b).abs() <= rel * a.abs().max(b.abs()) + 1e-300
}

/// A small budget: the sort-reducer gets ~192 KiB, so supersteps of a few thousand updates
/// spill several runs and merge them.
const SMALL: usize = 256 << 10;

fn config(temp: &Path) -> EngineConfig {
    EngineConfig::new(SMALL).with_threads(2).with_temp_dir(temp)
}

fn import(
    dir: &Path,
    name: &str,
    edges: &[(u64, u64, f32)],
    vertices: Option<u64>,
    weighted: bool,
) -> Graph {
    let mut options = ImportOptions::default()
        .with_memory_bytes(SMALL)
        .with_threads(2)
        .with_weighted(weighted)
        .with_reverse(true)
        .with_temp_dir(dir.join("tmp"));
    options.vertices = vertices;
    let mut builder = GraphBuilder::new(dir.join(name), options).unwrap();
    for &(s, d, w) in edges {
        builder.add_edge(s, d, Some(w)).unwrap();
    }
    builder.finish().unwrap().0
}

/// Random graph with duplicates (different weights), self-loops and isolated vertices; weights
/// are multiples of 1/8 (ties in path lengths are common and sums are exact).
fn random_edges(seed: u64, n: u64, m: usize) -> Vec<(u64, u64, f32)> {
    let mut rng = Rng::new(seed);
    let mut edges = Vec::with_capacity(m);
    for i in 0..m {
        // Leave the top 5% of ids isolated.
        let s = rng.below(n * 95 / 100);
        let d = if i % 50 == 0 {
            s
        } else {
            rng.below(n * 95 / 100)
        };
        let w = (1 + rng.below(16)) as f32 / 8.0;
        edges.push((s, d, w));
        if i % 7 == 0 {
            edges.push((s, d, w + 1.0)); // a heavier duplicate: the lighter weight must win
        }
    }
    edges
}

/// Two components, a vertex without out-edges (4), a sink reached by two paths, self-loops,
/// duplicates, and isolated vertices 8 and 9 (beyond the largest id).
fn small_edges() -> Vec<(u64, u64, f32)> {
    vec![
        (0, 1, 1.0),
        (0, 2, 4.0),
        (1, 2, 1.0),
        (1, 2, 7.0),
        (2, 3, 1.0),
        (1, 3, 3.0),
        (3, 4, 0.5),
        (2, 2, 1.0),
        (5, 6, 2.0),
        (6, 7, 2.0),
        (7, 5, 2.0),
        (0, 1, 3.0),
    ]
}

fn check_stats(stats: &RunStats) {
    assert!(stats.peak_sort_reduce_bytes() <= stats.sort_reduce_budget_bytes);
    assert!(stats.sort_reduce_budget_bytes + stats.buffer_bytes <= stats.memory_bytes);
    for s in &stats.supersteps {
        assert!(s.sort_reduce.peak_reserved <= s.sort_reduce.memory_budget_bytes);
        assert!(s.records_after_reduce <= s.updates_emitted);
        assert_eq!(s.sort_reduce.updates_in, s.updates_emitted);
    }
}

fn assert_empty(dir: &Path) {
    let left: Vec<_> =
        fs::read_dir(dir).map_or(Vec::new(), |d| d.map(|e| e.unwrap().file_name()).collect());
    assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
}

/// Runs every algorithm on `g` and compares with the references.
fn check_all(g: &Graph, roots: &[u64], temp: &Path, bc_sources: &[u64]) {
    let r = RefGraph::from_graph(g);
    let cfg = config(temp);
    for &root in roots {
        let out = bfs(g, root, &cfg).unwrap();
        let expected = r.bfs(root as usize);
        assert_eq!(out.parents.to_vec().unwrap(), expected, "bfs from {root}");
        let reached = expected.iter().filter(|&&p| p != UNREACHED).count() as u64;
        assert_eq!(out.reached, reached);
        check_stats(&out.stats);

        let out = sssp(g, root, &cfg).unwrap();
        assert_eq!(
            out.distances.to_vec().unwrap(),
            r.sssp(root as usize),
            "sssp from {root}"
        );
        check_stats(&out.stats);
    }

    let options = PageRankOptions {
        damping: 0.85,
        iterations: 10,
        tolerance: None,
    };
    let out = pagerank(g, &options, &cfg).unwrap();
    let got = out.ranks.to_vec().unwrap();
    let expected = r.pagerank(0.85, 10);
    for (v, (a, b)) in got.iter().zip(&expected).enumerate() {
        assert!(close(*a, *b, 1e-9), "pagerank of {v}: {a} vs {b}");
    }
    assert!((got.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    assert_eq!(out.stats.supersteps.len(), 10);
    check_stats(&out.stats);

    let out = connected_components(g, &cfg).unwrap();
    let expected = r.components();
    assert_eq!(out.labels.to_vec().unwrap(), expected);
    let count = expected
        .iter()
        .enumerate()
        .filter(|&(v, &l)| v as u64 == l)
        .count();
    assert_eq!(out.components, count as u64);
    check_stats(&out.stats);

    if !bc_sources.is_empty() {
        let out = betweenness(g, bc_sources, &cfg).unwrap();
        let got = out.scores.to_vec().unwrap();
        let expected = r.betweenness(bc_sources);
        for (v, (a, b)) in got.iter().zip(&expected).enumerate() {
            assert!(close(*a, *b, 1e-9), "bc of {v}: {a} vs {b}");
        }
        out.stats.iter().for_each(check_stats);
    }
}

#[test]
fn import_matches_normalized_edges() {
    let dir = tempfile::tempdir().unwrap();
    let raw = random_edges(1, 3000, 20_000);
    let g = import(dir.path(), "g", &raw, None, true);
    let r = RefGraph::new(g.vertices() as usize, &raw);
    assert_eq!(
        g.vertices(),
        raw.iter().map(|e| e.0.max(e.1)).max().unwrap() + 1
    );
    assert_eq!(g.meta().id_width, IdWidth::U32);
    let out: Vec<_> = g
        .edges(Direction::Out)
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    let expected: Vec<_> = (0..r.n)
        .flat_map(|s| {
            r.out[s]
                .iter()
                .map(move |&(d, w)| (s as u64, d as u64, w as f32))
        })
        .collect();
    assert_eq!(out, expected);
    let inn: Vec<_> = g
        .edges(Direction::In)
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    let expected: Vec<_> = (0..r.n)
        .flat_map(|d| {
            r.inn[d]
                .iter()
                .map(move |&(s, w)| (d as u64, s as u64, w as f32))
        })
        .collect();
    assert_eq!(inn, expected);
    let adj = g.adjacency(Direction::Out).unwrap();
    for v in [0u64, 17, g.vertices() - 1] {
        let expected: Vec<_> = r.out[v as usize]
            .iter()
            .map(|&(d, w)| (d as u64, w as f32))
            .collect();
        assert_eq!(adj.weighted_neighbours(v).unwrap(), expected);
    }
    assert_empty(&dir.path().join("tmp"));
}

#[test]
fn small_graph_all_algorithms() {
    let dir = tempfile::tempdir().unwrap();
    let temp = dir.path().join("tmp");
    let g = import(dir.path(), "small", &small_edges(), Some(10), true);
    assert_eq!((g.vertices(), g.edges_count()), (10, 9));
    check_all(&g, &[0, 4, 5, 9], &temp, &[0, 1, 5]);
    // Hand-checked values.
    let cfg = config(&temp);
    let parents = bfs(&g, 0, &cfg).unwrap().parents.to_vec().unwrap();
    assert_eq!(&parents[..5], &[0, 0, 0, 1, 3]);
    assert!(parents[5..].iter().all(|&p| p == UNREACHED));
    let dist = sssp(&g, 0, &cfg).unwrap().distances.to_vec().unwrap();
    assert_eq!(
        &dist[..5],
        &[(0.0, 0), (1.0, 0), (2.0, 1), (3.0, 2), (3.5, 3)]
    );
    let labels = connected_components(&g, &cfg).unwrap();
    assert_eq!(labels.components, 4); // {0..4}, {5,6,7}, {8}, {9}
    drop(labels);
    assert_empty(&temp);
}

#[test]
fn random_graphs_all_algorithms_with_spills() {
    let dir = tempfile::tempdir().unwrap();
    let temp = dir.path().join("tmp");
    for (seed, weighted) in [(2u64, true), (3, false)] {
        let raw = random_edges(seed, 2000, 12_000);
        let g = import(dir.path(), &format!("r{seed}"), &raw, None, weighted);
        check_all(&g, &[0, 1234], &temp, &[7]);
        // The small budget really spilled: PageRank's first superstep wrote a run.
        let pr = pagerank(&g, &PageRankOptions::default(), &config(&temp)).unwrap();
        assert!(pr.stats.supersteps[0].sort_reduce.runs_written >= 1);
    }
    assert_empty(&temp);
}

#[test]
fn kronecker_graphs_all_algorithms() {
    let dir = tempfile::tempdir().unwrap();
    let temp = dir.path().join("tmp");
    let options = ImportOptions::default()
        .with_memory_bytes(1 << 20)
        .with_threads(2)
        .with_reverse(true)
        .with_temp_dir(&temp);
    let (g10, s10) = generate_kronecker(
        &KroneckerParams::graph500(10).with_weights(true),
        dir.path().join("k10"),
        options.clone(),
    )
    .unwrap();
    assert_eq!(s10.edges_generated, 16 << 10);
    assert!(g10.is_weighted());
    let roots = sample_sources(g10.vertices(), 2, 9);
    check_all(&g10, &roots, &temp, &sample_sources(g10.vertices(), 3, 4));
    let (g12, s12) = generate_kronecker(
        &KroneckerParams::graph500(12),
        dir.path().join("k12"),
        options,
    )
    .unwrap();
    assert_eq!(s12.edges_kept, g12.edges_count());
    // Start from the vertex with the most out-edges so the search covers most of the graph.
    let adj = g12.adjacency(Direction::Out).unwrap();
    let hub = (0..g12.vertices())
        .max_by_key(|&v| adj.degree(v).unwrap())
        .unwrap();
    check_all(&g12, &[hub], &temp, &[]);
    let tree = bfs(&g12, hub, &config(&temp)).unwrap();
    assert!(tree.reached > g12.vertices() / 2, "{}", tree.reached);
    assert!(tree.depth >= 2);
    drop(tree);
    // 65K updates in 6K-record chunks with a fan-in of 2: intermediate merges happen.
    let pr = pagerank(
        &g12,
        &PageRankOptions {
            damping: 0.85,
            iterations: 1,
            tolerance: None,
        },
        &config(&temp),
    )
    .unwrap();
    let step = &pr.stats.supersteps[0];
    assert!(
        step.sort_reduce.intermediate_merges > 0,
        "{:?}",
        step.sort_reduce
    );
    drop(pr);
    assert_empty(&temp);
}

#[test]
fn kronecker_is_deterministic_and_sane() {
    let dir = tempfile::tempdir().unwrap();
    let generate = |name: &str, seed: u64, threads: usize, memory: usize| {
        let options = ImportOptions::default()
            .with_memory_bytes(memory)
            .with_threads(threads);
        let params = KroneckerParams::graph500(11)
            .with_seed(seed)
            .with_weights(true);
        generate_kronecker(&params, dir.path().join(name), options).unwrap()
    };
    let (a, sa) = generate("a", 5, 1, 16 << 20);
    let (b, sb) = generate("b", 5, 3, 2 << 20);
    let (c, _) = generate("c", 6, 2, 4 << 20);
    for file in ["meta", "out.index", "out.edges", "out.weights"] {
        let read = |g: &Graph| fs::read(g.path().join(file)).unwrap();
        assert_eq!(
            read(&a),
            read(&b),
            "{file} differs between thread counts/budgets"
        );
        if file != "meta" {
            assert_ne!(read(&a), read(&c), "{file} equal for different seeds");
        }
    }
    assert_eq!(sa.edges_kept, sb.edges_kept);
    let generated = 16u64 << 11;
    assert_eq!(sa.edges_generated, generated);
    assert_eq!(
        sa.edges_kept + sa.duplicates_removed + sa.self_loops_dropped,
        generated
    );
    // Graph500 graphs keep most edges at this scale but lose some to duplicates.
    assert!(
        sa.edges_kept > generated / 2 && sa.edges_kept < generated,
        "{sa:?}"
    );
    assert!(sa.duplicates_removed > 0 && sa.self_loops_dropped > 0);
    // Spills happened with the smaller budget, all within it.
    assert!(sb.import.sort_reduce.runs_written > 0);
    assert!(sb.import.sort_reduce.peak_reserved <= sb.import.sort_reduce.memory_budget_bytes);
}

#[test]
fn wide_ids_and_edge_cases() {
    let dir = tempfile::tempdir().unwrap();
    let temp = dir.path().join("tmp");
    // A graph with 8-byte ids runs the engine with u64 keys; results must not change.
    let raw = random_edges(4, 500, 3000);
    let r = RefGraph::new(500, &raw);
    let mut writer =
        GraphWriter::create(dir.path().join("wide"), 500, IdWidth::U64, true, false).unwrap();
    for s in 0..500 {
        for &(d, w) in &r.out[s] {
            writer.push(s as u64, d as u64, w as f32).unwrap();
        }
    }
    let mut wide = writer.finish().unwrap();
    wide.build_reverse(&ImportOptions::default().with_memory_bytes(SMALL))
        .unwrap();
    assert_eq!(wide.meta().id_width, IdWidth::U64);
    check_all(&wide, &[3], &temp, &[3]);

    let cfg = config(&temp);
    assert!(
        bfs(&wide, 500, &cfg)
            .unwrap_err()
            .to_string()
            .contains("root 500")
    );
    // Components and betweenness need the reverse graph.
    let mut writer =
        GraphWriter::create(dir.path().join("norev"), 3, IdWidth::U32, false, false).unwrap();
    writer.push(0, 1, 1.0).unwrap();
    let no_rev = writer.finish().unwrap();
    assert!(!no_rev.has_reverse());
    let err = connected_components(&no_rev, &cfg).unwrap_err().to_string();
    assert!(err.contains("reverse"), "{err}");
    assert!(betweenness(&no_rev, &[0], &cfg).is_err());
    // A budget too small for the buffers is refused with a clear message.
    let err = bfs(&no_rev, 0, &EngineConfig::new(40_000).with_temp_dir(&temp)).unwrap_err();
    assert!(err.to_string().contains("too small"), "{err}");
    // Empty graph: PageRank and components do nothing.
    let empty = GraphWriter::create(dir.path().join("empty"), 0, IdWidth::U32, false, false)
        .unwrap()
        .finish()
        .unwrap();
    let pr = pagerank(&empty, &PageRankOptions::default(), &cfg).unwrap();
    assert!(pr.ranks.is_empty());
    drop(pr);
    // Results can be persisted outside the scratch directory.
    let out = bfs(&wide, 3, &cfg).unwrap();
    let expected = out.parents.to_vec().unwrap();
    let kept = out.parents.persist(dir.path().join("parents.bin")).unwrap();
    assert_eq!(kept.to_vec().unwrap(), expected);
    assert_eq!(kept.get(3).unwrap(), 3);
    assert_empty(&temp);
}

/// Kronecker scale 20 with a 256 MiB budget: generation + import, BFS, one PageRank iteration.
/// Run with `cargo test --release -p quarry-graph -- --ignored --nocapture measure`
/// (`QUARRY_GRAPH_MEASURE_MIB` changes the budget, `QUARRY_GRAPH_MEASURE_DIR` the directory).
#[test]
#[ignore]
fn measure_scale20() {
    let dir = tempfile::tempdir_in(
        std::env::var("QUARRY_GRAPH_MEASURE_DIR").unwrap_or_else(|_| ".".into()),
    )
    .unwrap();
    let mib: usize = std::env::var("QUARRY_GRAPH_MEASURE_MIB").map_or(256, |v| v.parse().unwrap());
    let budget = mib << 20;
    println!("budget {mib} MiB");
    let options = ImportOptions::default().with_memory_bytes(budget);
    let (g, kron) = generate_kronecker(
        &KroneckerParams::graph500(20),
        dir.path().join("k20"),
        options,
    )
    .unwrap();
    println!(
        "kron20: {} vertices, {} generated, {} kept ({} duplicates, {} self-loops), \
         generate+import {:.2?} (sort-reduce runs {}, peak {} MiB)",
        g.vertices(),
        kron.edges_generated,
        kron.edges_kept,
        kron.duplicates_removed,
        kron.self_loops_dropped,
        kron.elapsed,
        kron.import.sort_reduce.runs_written,
        kron.import.sort_reduce.peak_reserved >> 20
    );
    let cfg = EngineConfig::new(budget).with_temp_dir(dir.path());
    let adj = g.adjacency(Direction::Out).unwrap();
    let root = (0..1000).max_by_key(|&v| adj.degree(v).unwrap()).unwrap();
    let t = std::time::Instant::now();
    let tree = bfs(&g, root, &cfg).unwrap();
    let bfs_time = t.elapsed();
    println!(
        "bfs from {root}: {:.2?}, reached {}, depth {}, {} supersteps, {} edges traversed ({:.1} MTEPS)",
        bfs_time,
        tree.reached,
        tree.depth,
        tree.stats.supersteps.len(),
        tree.stats.edges_traversed(),
        tree.stats.edges_traversed() as f64 / bfs_time.as_secs_f64() / 1e6
    );
    for s in &tree.stats.supersteps {
        println!(
            "  step {}: active {}, updates {}, after reduce {}, next {}, read {} MiB, written {} MiB, runs {}, {:.2?}",
            s.superstep,
            s.active_vertices,
            s.updates_emitted,
            s.records_after_reduce,
            s.next_active,
            s.bytes_read() >> 20,
            s.bytes_written() >> 20,
            s.sort_reduce.runs_written,
            s.elapsed
        );
    }
    let t = std::time::Instant::now();
    let pr = pagerank(
        &g,
        &PageRankOptions {
            damping: 0.85,
            iterations: 1,
            tolerance: None,
        },
        &cfg,
    )
    .unwrap();
    let pr_time = t.elapsed();
    let s = &pr.stats.supersteps[0];
    println!(
        "pagerank 1 iteration: {:.2?} total ({:.2?} init, {:.2?} superstep), updates {}, runs {}, peak {} MiB",
        pr_time,
        pr.stats.init_elapsed,
        s.elapsed,
        s.updates_emitted,
        s.sort_reduce.runs_written,
        s.sort_reduce.peak_reserved >> 20
    );
}

/// Algorithm 4 (tolerance set): converges to the same ranks as the plain power iteration,
/// and its later iterations scatter from fewer vertices than the graph has.
#[test]
fn pagerank_with_bloom_active_list_converges_to_pagerank() {
    let temp = tempfile::tempdir().unwrap();
    let (graph, _) = generate_kronecker(&KroneckerParams::graph500(10), temp.path().join("g"), ImportOptions::default().with_memory_bytes(8 << 20).with_reverse(true)).unwrap();
    let cfg = EngineConfig::new(8 << 20).with_temp_dir(temp.path());
    let plain = pagerank(&graph, &PageRankOptions { damping: 0.85, iterations: 200, tolerance: None }, &cfg).unwrap();
    let bloom = pagerank(&graph, &PageRankOptions { damping: 0.85, iterations: 200, tolerance: Some(1e-9) }, &cfg).unwrap();
    let (plain_ranks, bloom_ranks) = (plain.ranks.to_vec().unwrap(), bloom.ranks.to_vec().unwrap());
    for (v, (a, b)) in plain_ranks.iter().zip(&bloom_ranks).enumerate() {
        // Stopped vertices may lag by a few tolerances.
        assert!((a - b).abs() <= 1e-10, "vertex {v}: {a} vs {b}");
    }
    let steps = &bloom.stats.supersteps;
    assert!(steps.len() < 200, "stopped when no rank moved: {} iterations", steps.len());
    assert_eq!(steps[0].active_vertices, graph.vertices());
    // Once the dangling rank settles, iterations scatter only from the in-neighbours of the
    // vertices still moving: fewer edges than the graph has.
    let last = steps.last().unwrap();
    assert!(last.edges_traversed < graph.edges_count(), "last iteration traversed {} of {} edges", last.edges_traversed, graph.edges_count());
    let total: u64 = steps.iter().map(|s| s.edges_traversed).sum();
    assert!(total < steps.len() as u64 * graph.edges_count(), "{total} edges in {} iterations", steps.len());
}
