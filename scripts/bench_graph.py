#!/usr/bin/env python3
"""Graph benchmark: Quarry's external-memory BFS and PageRank vs an in-memory scipy.sparse
reference on the same Kronecker graphs, in one run.

For each scale: `quarry graph gen kron` (skipped if the graph exists), then BFS from the
highest-out-degree vertex among ids 0..999 and one PageRank iteration, each under `--memory`,
with wall time and the peak RSS the quarry process reports. The reference loads the very same
CSR files (out.index / out.edges, little-endian) with numpy and runs
scipy.sparse.csgraph.breadth_first_order and one PageRank power-iteration step (damping 0.85,
dangling mass spread uniformly, as Quarry does); it checks that both reach the same vertices and
compute the same ranks (1e-9 relative), and prints the time ratio quarry/scipy. The reference is
skipped at scales whose CSR would not fit in --reference-max-gb.

  python3 scripts/bench_graph.py --scales 20,22,24 --memory 1GB --warehouse /tmp/wh-graph
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order

sys.path.insert(0, str(Path(__file__).resolve().parent))
import charts  # noqa: E402
import quarry_py  # noqa: E402


def load_csr(graph_dir: Path):
    meta = dict(line.split(maxsplit=1) for line in (graph_dir / "meta").read_text().splitlines()[1:])
    vertices, width = int(meta["vertices"]), int(meta["id_width"])
    index = np.fromfile(graph_dir / "out.index", dtype="<u8")
    edges = np.fromfile(graph_dir / "out.edges", dtype="<u4" if width == 4 else "<u8")
    matrix = sp.csr_matrix((np.ones(len(edges), dtype=np.float64), edges.astype(np.int64), index.astype(np.int64)), shape=(vertices, vertices))
    return vertices, index, matrix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", default="20,22")
    parser.add_argument("--memory", default="1GB")
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reference-max-gb", type=float, default=6.0)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--chart", help="also draw the results into this file (png, svg or pdf)")
    args = parser.parse_args()
    quarry = quarry_py.quarry_bin()
    base = [quarry, "--warehouse", args.warehouse, "--threads", str(args.threads), "graph"]
    results = []
    for scale in [int(s) for s in args.scales.split(",")]:
        name = f"kron{scale}"
        graph_dir = Path(args.warehouse) / ".graphs" / name
        row: dict = {"scale": scale, "memory": args.memory}
        if not (graph_dir / "meta").exists():
            row["gen_s"], row["gen_rss_mib"], _ = quarry_py.run_quarry_measured(base + ["gen", "kron", name, "--scale", str(scale), "--memory", args.memory])
        index = np.fromfile(graph_dir / "out.index", dtype="<u8", count=1001)
        root = int(np.argmax(np.diff(index)))
        row["root"] = root
        row["bfs_s"], row["bfs_rss_mib"], bfs_out = quarry_py.run_quarry_measured(base + ["bfs", name, "--root", str(root), "--memory", args.memory])
        row["pr_s"], row["pr_rss_mib"], pr_out = quarry_py.run_quarry_measured(base + ["pagerank", name, "--iterations", "1", "--memory", args.memory])
        for key, text in (("bfs", bfs_out), ("pr", pr_out)):
            match = re.search(r"reduction before the first write ([\d.]+)%", text)
            row[f"{key}_reduced_before_first_write_pct"] = float(match.group(1)) if match else None
            match = re.search(r"sort-reduce spills ([\d.]+) MB", text)
            row[f"{key}_spilled_mb"] = float(match.group(1)) if match else None
        con = quarry_py.duckdb_connect(args.warehouse, tables=[f"{name}_bfs", f"{name}_pagerank"])
        reached = con.execute(f"select count(*) from {name}_bfs where parent is not null").fetchone()[0]
        row["reached"] = reached
        edges_bytes = graph_dir.joinpath("out.edges").stat().st_size
        if edges_bytes * 3 / 2**30 <= args.reference_max_gb:
            vertices, full_index, matrix = load_csr(graph_dir)
            started = time.perf_counter()
            order = breadth_first_order(matrix, root, directed=True, return_predecessors=False)
            row["scipy_bfs_s"] = time.perf_counter() - started
            assert len(order) == reached, f"scipy reached {len(order)}, quarry {reached}"
            started = time.perf_counter()
            degree = np.diff(full_index).astype(np.float64)
            rank = np.full(vertices, 1.0 / vertices)
            share = np.divide(rank, degree, out=np.zeros(vertices), where=degree > 0)
            dangling = rank[degree == 0].sum()
            new_rank = (1 - 0.85) / vertices + 0.85 * (matrix.T @ share + dangling / vertices)
            row["scipy_pr_s"] = time.perf_counter() - started
            quarry_rank = np.array([r for (r,) in con.execute(f"select rank from {name}_pagerank order by vertex").fetchall()])
            assert np.allclose(quarry_rank, new_rank, rtol=1e-9, atol=0), "PageRank differs from scipy"
            row["bfs_ratio"] = row["bfs_s"] / row["scipy_bfs_s"]
            row["pr_ratio"] = row["pr_s"] / row["scipy_pr_s"]
            del matrix
        results.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'scale':>5} {'gen s':>7} {'BFS s':>7} {'RSS MiB':>8} {'PR s':>7} {'RSS MiB':>8} {'scipy BFS':>9} {'scipy PR':>9} {'BFS x':>6} {'PR x':>6} {'reduced%':>8}")
    for r in results:
        fmt = lambda k, f="{:.2f}": f.format(r[k]) if r.get(k) is not None else "-"  # noqa: E731
        print(f"{r['scale']:>5} {fmt('gen_s'):>7} {fmt('bfs_s'):>7} {fmt('bfs_rss_mib', '{:.0f}'):>8} {fmt('pr_s'):>7} {fmt('pr_rss_mib', '{:.0f}'):>8} "
              f"{fmt('scipy_bfs_s'):>9} {fmt('scipy_pr_s'):>9} {fmt('bfs_ratio'):>6} {fmt('pr_ratio'):>6} {fmt('pr_reduced_before_first_write_pct', '{:.1f}'):>8}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if args.chart:
        charts.graph(results, args.chart)


if __name__ == "__main__":
    main()
