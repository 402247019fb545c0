#!/usr/bin/env python3
"""Charts of the benchmark scripts' JSON results (matplotlib, as compare_duckdb.py draws its own):

    python3 scripts/charts.py selectivity docs/benchmarks/pushdown/selectivity-smartssd-2013.json out.png
    python3 scripts/charts.py graph docs/benchmarks/graph-1gb/kron-20-22-24.json out.png

bench_pushdown.py and bench_graph.py call these with `--chart FILE` after a run; the format is
the file's extension (png, svg, pdf).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MODES = {"on": "pushdown (on)", "off": "passthrough (off)", "auto": "cost model (auto)"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def selectivity(records: list[dict], path: str | Path, title: str = "Smart SSD selectivity sweep") -> None:
    """One panel per table (rows) and query (columns): wall time of each mode against
    selectivity (log-log)."""
    plt = _pyplot()
    tables = sorted({r["table"] for r in records})
    queries = sorted({r["query"] for r in records})
    fig, axes = plt.subplots(len(tables), len(queries), figsize=(4 * len(queries), 3.2 * len(tables)), squeeze=False)
    for ax, (table, query) in zip(axes.flat, [(t, qy) for t in tables for qy in queries]):
        rows = sorted((r for r in records if (r["table"], r["query"]) == (table, query)), key=lambda r: r["selectivity_pct"])
        xs = [r["selectivity_pct"] for r in rows]
        for mode, label in MODES.items():
            ax.plot(xs, [r[mode]["wall_ms"] / 1000 for r in rows], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{table}: {query}", fontsize=9)
        ax.set_xlabel("selectivity (%)")
        ax.set_ylabel("seconds")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def graph(records: list[dict], path: str | Path, title: str = "Graph analytics: Quarry (sort-reduce) vs scipy in memory") -> None:
    """Per Kronecker scale: BFS and PageRank seconds of Quarry and of the in-memory reference."""
    plt = _pyplot()
    scales = [r["scale"] for r in records]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, (algorithm, name) in zip(axes, [("bfs", "BFS"), ("pr", "PageRank")]):
        width = 0.38
        xs = range(len(scales))
        quarry = [r.get(f"{algorithm}_s") for r in records]
        reference = [r.get(f"scipy_{algorithm}_s") for r in records]
        ax.bar([x - width / 2 for x in xs], [v or 0 for v in quarry], width, label=f"Quarry ({records[0].get('memory', '')} budget)")
        ax.bar([x + width / 2 for x in xs], [v or 0 for v in reference], width, label="scipy (in memory)")
        ax.set_xticks(list(xs), [f"kron {s}" for s in scales])
        ax.set_ylabel("seconds")
        ax.set_yscale("log")
        ax.set_title(name)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("selectivity", "graph"):
        print(__doc__, file=sys.stderr)
        return 2
    kind, source, out = argv
    records = json.loads(Path(source).read_text())
    {"selectivity": selectivity, "graph": graph}[kind](records, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
