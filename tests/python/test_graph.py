"""Graph analytics (`quarry graph`) against networkx on small graphs.

Method: write edge lists with the awkward cases (duplicate edges, self-loops, vertices without
out-edges, isolated vertices, disconnected parts, weights), import them with `quarry graph import`,
run each algorithm with a small memory budget, read the result table the run commits to the
warehouse through DuckDB (the same files SQL reads), and compare with networkx on the graph as
Quarry defines it: duplicate edges collapsed (the smallest weight kept), self-loops dropped, vertex
ids 0..max id. BFS parents are checked structurally (networkx may pick another parent of equal
depth); PageRank runs enough iterations to converge and is compared with networkx's fixed point.
"""

from __future__ import annotations

import subprocess

import networkx as nx
import pytest

import quarry_py

EDGES = [
    # two components, a sink (4), a duplicate edge, a self-loop, and an isolated vertex (7)
    (0, 1, 2.0), (0, 2, 0.5), (2, 1, 0.5), (1, 3, 1.0), (3, 4, 4.0), (2, 4, 8.0),
    (0, 1, 1.0),  # duplicate: the smaller weight wins
    (3, 3, 1.0),  # self-loop: dropped
    (5, 6, 1.0), (6, 5, 2.0), (8, 6, 0.25),
]


def run(quarry_bin, warehouse, *args):
    proc = subprocess.run([quarry_bin, "--warehouse", str(warehouse), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def reference_graph(edges, weighted=True):
    graph = nx.DiGraph()
    vertices = max(max(s, d) for s, d, _ in edges) + 1
    graph.add_nodes_from(range(vertices))
    for s, d, w in edges:
        if s == d:
            continue
        if graph.has_edge(s, d):
            graph[s][d]["weight"] = min(graph[s][d]["weight"], w)
        else:
            graph.add_edge(s, d, weight=w if weighted else 1.0)
    return graph


def result(warehouse, table):
    con = quarry_py.duckdb_connect(warehouse, tables=[table])
    rows = con.execute(f"select * from {table} order by vertex").fetchall()
    return {row[0]: row[1:] for row in rows}


@pytest.fixture
def imported(quarry_bin, tmp_path):
    path = tmp_path / "edges.csv"
    path.write_text("src,dst,weight\n" + "".join(f"{s},{d},{w}\n" for s, d, w in EDGES))
    warehouse = tmp_path / "wh"
    run(quarry_bin, warehouse, "graph", "import", "g", "--from", str(path), "--memory", "4MB")
    return warehouse, reference_graph(EDGES)


def test_bfs_parents_form_a_shortest_path_tree(quarry_bin, imported):
    warehouse, graph = imported
    run(quarry_bin, warehouse, "graph", "bfs", "g", "--root", "0", "--memory", "4MB")
    parents = result(warehouse, "g_bfs")
    depth = nx.single_source_shortest_path_length(graph, 0)
    assert set(parents) == set(graph.nodes)
    for vertex, (parent,) in parents.items():
        if vertex not in depth:
            assert parent is None, f"{vertex} is unreachable"
        elif vertex == 0:
            assert parent == 0
        else:
            assert graph.has_edge(parent, vertex) and depth[parent] == depth[vertex] - 1, (vertex, parent)


def test_pagerank_matches_networkx(quarry_bin, imported):
    warehouse, graph = imported
    run(quarry_bin, warehouse, "graph", "pagerank", "g", "--iterations", "200", "--memory", "4MB")
    ranks = result(warehouse, "g_pagerank")
    expected = nx.pagerank(graph, alpha=0.85, weight=None, tol=1e-14, max_iter=10_000)
    for vertex, value in expected.items():
        assert ranks[vertex][0] == pytest.approx(value, rel=1e-6), vertex


def test_pagerank_with_bloom_filter_active_list_matches_networkx(quarry_bin, imported):
    """--tolerance runs Algorithm 4 (recompute only the vertices still moving) to the same ranks."""
    warehouse, graph = imported
    out = run(quarry_bin, warehouse, "graph", "pagerank", "g", "--tolerance", "1e-12", "--iterations", "500", "--memory", "4MB", "--table", "g_pr_bloom")
    assert "Bloom-filter active list" in out, out
    ranks = result(warehouse, "g_pr_bloom")
    expected = nx.pagerank(graph, alpha=0.85, weight=None, tol=1e-14, max_iter=10_000)
    for vertex, value in expected.items():
        assert ranks[vertex][0] == pytest.approx(value, rel=1e-6), vertex


def test_connected_components_match_networkx(quarry_bin, imported):
    warehouse, graph = imported
    run(quarry_bin, warehouse, "graph", "cc", "g", "--memory", "4MB")
    labels = result(warehouse, "g_cc")
    for component in nx.weakly_connected_components(graph):
        for vertex in component:
            assert labels[vertex][0] == min(component)


def test_sssp_matches_dijkstra(quarry_bin, imported):
    warehouse, graph = imported
    run(quarry_bin, warehouse, "graph", "sssp", "g", "--root", "0", "--memory", "4MB")
    distances = result(warehouse, "g_sssp")
    expected = nx.single_source_dijkstra_path_length(graph, 0, weight="weight")
    for vertex in graph.nodes:
        distance, parent = distances[vertex]
        if vertex in expected:
            assert distance == pytest.approx(expected[vertex], rel=1e-6), vertex
            if vertex != 0:
                assert distances[parent][0] + graph[parent][vertex]["weight"] == pytest.approx(distance, rel=1e-6)
        else:
            assert distance is None and parent is None


def test_betweenness_from_one_source_matches_networkx(quarry_bin, imported):
    warehouse, graph = imported
    run(quarry_bin, warehouse, "graph", "bc", "g", "--root", "0", "--memory", "4MB")
    scores = result(warehouse, "g_bc")
    unweighted = nx.DiGraph(graph.edges())
    unweighted.add_nodes_from(graph.nodes)
    expected = nx.betweenness_centrality_subset(unweighted, sources=[0], targets=list(graph.nodes), normalized=False)
    for vertex in graph.nodes:
        if vertex != 0:
            assert scores[vertex][0] == pytest.approx(expected[vertex], abs=1e-9), vertex


def test_random_graph_with_spills_matches_networkx(quarry_bin, tmp_path):
    """A larger random graph under a 256 kB budget, so every step's sort-reduce spills runs."""
    graph = nx.gnm_random_graph(600, 6000, seed=7, directed=True)
    path = tmp_path / "edges.txt"
    path.write_text("# src dst\n" + "".join(f"{s} {d}\n" for s, d in graph.edges()))
    warehouse = tmp_path / "wh"
    run(quarry_bin, warehouse, "graph", "import", "r", "--from", str(path), "--memory", "256KB")
    run(quarry_bin, warehouse, "graph", "pagerank", "r", "--iterations", "150", "--memory", "256KB")
    run(quarry_bin, warehouse, "graph", "bfs", "r", "--root", "0", "--memory", "256KB")
    ranks = result(warehouse, "r_pagerank")
    expected = nx.pagerank(graph, alpha=0.85, tol=1e-14, max_iter=10_000)
    for vertex, value in expected.items():
        assert ranks[vertex][0] == pytest.approx(value, rel=1e-6), vertex
    depth = nx.single_source_shortest_path_length(graph, 0)
    parents = result(warehouse, "r_bfs")
    assert {v for v, (p,) in parents.items() if p is not None} == set(depth)


def peak_rss_mib(args: list[str]) -> float:
    return quarry_py.run_quarry_measured(args, timeout=600)[1]


def test_memory_budget_holds_when_the_data_is_several_times_larger(quarry_bin, tmp_path):
    """Scale 17: 2M generated edges (16 MB of edge pairs, ~24 MB of PageRank updates per step)
    under an 8 MB budget; the process's peak RSS may exceed its idle size by the budget plus
    allocator slack, never by the data's size."""
    warehouse = str(tmp_path / "wh")
    idle = peak_rss_mib([quarry_bin, "--warehouse", warehouse, "graph", "list"])
    gen = peak_rss_mib([quarry_bin, "--warehouse", warehouse, "--threads", "2", "graph", "gen", "kron", "big", "--scale", "17", "--memory", "8MB"])
    rank = peak_rss_mib([quarry_bin, "--warehouse", warehouse, "--threads", "2", "graph", "pagerank", "big", "--iterations", "2", "--memory", "8MB"])
    assert gen <= idle + 8 + 12, f"gen: {gen:.0f} MiB peak vs {idle:.0f} MiB idle"
    assert rank <= idle + 8 + 12, f"pagerank: {rank:.0f} MiB peak vs {idle:.0f} MiB idle"


def test_killed_run_leaves_no_scratch_files_and_no_partial_table(quarry_bin, tmp_path):
    """kill -9 during a spilling PageRank: its scratch files stay until the next graph command,
    which removes them; no result table appears; the next run completes."""
    import os
    import signal
    import time

    warehouse = tmp_path / "wh"
    base = [quarry_bin, "--warehouse", str(warehouse), "--threads", "2", "graph"]
    subprocess.run(base + ["gen", "kron", "big", "--scale", "16", "--memory", "4MB"], check=True, capture_output=True, timeout=300)
    scratch = warehouse / ".graphs" / ".tmp"
    run = subprocess.Popen(base + ["pagerank", "big", "--iterations", "1000", "--memory", "4MB"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (scratch.is_dir() and any(p.is_file() for p in scratch.rglob("*"))):
            assert run.poll() is None, "the run ended before it wrote scratch files"
            time.sleep(0.05)
        assert any(p.is_file() for p in scratch.rglob("*")), "no scratch files seen"
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
    assert any(scratch.rglob("*")), "a killed run's scratch files vanished by themselves"
    subprocess.run(base + ["list"], check=True, capture_output=True, timeout=60)
    assert not any(scratch.rglob("*")), f"leftovers after the next command: {list(scratch.rglob('*'))}"
    assert not (warehouse / "big_pagerank").exists(), "a killed run left a result table"
    subprocess.run(base + ["pagerank", "big", "--iterations", "2", "--memory", "4MB"], check=True, capture_output=True, timeout=300)
    assert (warehouse / "big_pagerank" / "CURRENT").is_file()
    assert not any(scratch.rglob("*"))


def test_graph_job_runs_inside_a_storage_node(quarry_bin, tmp_path):
    """`quarry --nodes URL graph ...` runs the job on the node holding the graph: the summary
    comes back, the result is a table of the node (SQL reads it through the node), and the
    host's own warehouse gets nothing."""
    node_warehouse, host = tmp_path / "node", tmp_path / "host"
    path = tmp_path / "edges.csv"
    path.write_text("src,dst,weight\n" + "".join(f"{s},{d},{w}\n" for s, d, w in EDGES))
    run(quarry_bin, node_warehouse, "graph", "import", "g", "--from", str(path), "--memory", "4MB")
    graph = reference_graph(EDGES)
    with quarry_py.StorageNodes([node_warehouse]) as nodes:
        listing = run(quarry_bin, host, "--nodes", nodes.arg, "graph", "list")
        assert listing.startswith(f"g\t{graph.number_of_nodes()} vertices\t{graph.number_of_edges()} edges"), listing
        out = run(quarry_bin, host, "--nodes", nodes.arg, "graph", "pagerank", "g", "--iterations", "200", "--memory", "4MB")
        assert f"ran on node {nodes.urls[0]}" in out and "reduction before the first write" in out, out
        csv = run(quarry_bin, host, "--nodes", nodes.arg, "sql", "--format", "csv", "SELECT vertex, rank FROM g_pagerank ORDER BY vertex")
        ranks = {int(v): float(r) for v, r in (line.split(",") for line in csv.splitlines()[1:])}
        expected = nx.pagerank(graph, alpha=0.85, weight=None, tol=1e-14, max_iter=10_000)
        assert ranks == pytest.approx(expected, rel=1e-6)
        assert not (host / "g_pagerank").exists()
        assert (node_warehouse / "g_pagerank").is_dir()

        # A generated graph is made on the node; a job for a graph no node holds names it.
        run(quarry_bin, host, "--nodes", nodes.arg, "graph", "gen", "kron", "k", "--scale", "6", "--memory", "4MB")
        out = run(quarry_bin, host, "--nodes", nodes.arg, "graph", "bfs", "k", "--root", "0", "--memory", "4MB")
        assert "vertices reached" in out, out
        missing = subprocess.run([quarry_bin, "--warehouse", str(host), "--nodes", nodes.arg, "graph", "cc", "nope"], capture_output=True, text=True, timeout=60)
        assert missing.returncode != 0 and "no node holds graph 'nope'" in missing.stderr, missing.stderr


def test_graph_job_on_a_node_stays_within_its_device_memory(quarry_bin, tmp_path):
    """A node bounded by a device profile refuses a job asking for more memory than it has."""
    node_warehouse = tmp_path / "node"
    path = tmp_path / "edges.csv"
    path.write_text("src,dst\n0,1\n1,2\n")
    run(quarry_bin, node_warehouse, "graph", "import", "g", "--from", str(path), "--memory", "4MB")
    with quarry_py.StorageNodes([node_warehouse], ["--device-memory", "8MB"]) as nodes:
        proc = subprocess.run([quarry_bin, "--warehouse", str(tmp_path / "host"), "--nodes", nodes.arg, "graph", "cc", "g", "--memory", "64MB"], capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "device has" in proc.stderr, proc.stderr
        out = run(quarry_bin, tmp_path / "host", "--nodes", nodes.arg, "graph", "cc", "g", "--memory", "4MB")
        assert "1 components" in out, out


def test_graph_job_on_a_node_is_cancelled_when_the_host_goes_away(quarry_bin, tmp_path):
    """A host killed while its job runs on a node cancels the job: the node's one session slot
    is free again within seconds (a second job runs), and the job leaves no scratch files."""
    import time

    node_warehouse, host = tmp_path / "node", tmp_path / "host"
    path = tmp_path / "edges.csv"
    path.write_text("src,dst\n0,1\n1,2\n")
    run(quarry_bin, node_warehouse, "graph", "import", "small", "--from", str(path), "--memory", "4MB")
    run(quarry_bin, node_warehouse, "--threads", "2", "graph", "gen", "kron", "big", "--scale", "16", "--memory", "64MB")
    with quarry_py.StorageNodes([node_warehouse], ["--max-sessions", "1"]) as nodes:
        # Thousands of PageRank iterations over 1M edges: minutes, unless cancelled.
        long_job = subprocess.Popen(
            [quarry_bin, "--warehouse", str(host), "--nodes", nodes.arg, "graph", "pagerank", "big", "--iterations", "100000", "--memory", "64MB"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        scratch = node_warehouse / ".graphs" / ".tmp"
        deadline = time.monotonic() + 30
        while not any(scratch.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(scratch.iterdir()), "the job never started on the node"
        long_job.kill()
        long_job.wait()
        started = time.monotonic()
        out = subprocess.run([quarry_bin, "--warehouse", str(host), "--nodes", nodes.arg, "graph", "cc", "small", "--memory", "4MB"], capture_output=True, text=True, timeout=20)
        assert out.returncode == 0 and "1 components" in out.stdout, out.stderr
        assert time.monotonic() - started < 10
        deadline = time.monotonic() + 10
        while any(scratch.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(scratch.iterdir()), list(scratch.iterdir())
        assert not (node_warehouse / "big_pagerank").exists()


def test_graphs_are_listed_while_a_node_is_busy(quarry_bin, tmp_path):
    """Listing needs no session slot: with the node's one slot taken by a long job, `graph list`
    (which also finds the node for every job) still answers at once."""
    import time

    node_warehouse, host = tmp_path / "node", tmp_path / "host"
    run(quarry_bin, node_warehouse, "--threads", "2", "graph", "gen", "kron", "big", "--scale", "16", "--memory", "64MB")
    with quarry_py.StorageNodes([node_warehouse], ["--max-sessions", "1"]) as nodes:
        long_job = subprocess.Popen(
            [quarry_bin, "--warehouse", str(host), "--nodes", nodes.arg, "graph", "pagerank", "big", "--iterations", "100000", "--memory", "64MB"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            scratch = node_warehouse / ".graphs" / ".tmp"
            deadline = time.monotonic() + 30
            while not any(scratch.iterdir()) and time.monotonic() < deadline:
                time.sleep(0.05)
            listing = subprocess.run([quarry_bin, "--warehouse", str(host), "--nodes", nodes.arg, "graph", "list"], capture_output=True, text=True, timeout=10)
            assert listing.returncode == 0 and listing.stdout.startswith("big\t"), listing.stderr
        finally:
            long_job.kill()
            long_job.wait()
