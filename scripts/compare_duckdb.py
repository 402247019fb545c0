#!/usr/bin/env python3
"""Benchmark Quarry against DuckDB on the same Parquet segments.

    python3 scripts/compare_duckdb.py --suite ssb --sf 10 --warehouse DIR \
        [--threads 2] [--repeat 3] [--out bench-results]

1. ``quarry --warehouse DIR bench SUITE --sf SF --repeat R --threads T --json OUT/quarry-SUITE.json``
   (generates the data into the warehouse when it is missing, runs every query R times).
2. DuckDB (in-memory, ``SET threads = T``) runs the same query files of ``queries/SUITE/`` over
   views of exactly the segments of each table's current manifest: one warm-up run, then R timed
   runs (execute + fetch of the whole result).
3. Both sides report the best of the R runs. Prints query, quarry ms, duckdb ms, the ratio
   quarry/duckdb and the geometric mean of the ratios; writes OUT/compare-SUITE.json and a bar
   chart OUT/compare-SUITE.png (log-scale y axis).

Result row counts of the two engines are compared; a mismatch is flagged in the table and the
JSON, and makes the script exit with status 2 (after writing everything). ``--quarry-json FILE``
reuses an existing quarry bench JSON instead of running quarry.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quarry_py as q  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", required=True, choices=["ssb", "tpch"])
    ap.add_argument("--sf", required=True, type=float, help="scale factor")
    ap.add_argument("--warehouse", required=True, help="warehouse directory (generated when missing)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both engines (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per query (default 3)")
    ap.add_argument("--out", default="bench-results", help="output directory (default bench-results)")
    ap.add_argument("--quarry-json", help="use this quarry bench JSON instead of running quarry")
    ap.add_argument("--queries", help="comma-separated query names to run on DuckDB (default: all)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    return args


def fmt_sf(sf: float) -> str:
    return str(int(sf)) if float(sf).is_integer() else str(sf)


def run_quarry_bench(args, out_dir: Path) -> Path:
    json_path = out_dir / f"quarry-{args.suite}.json"
    cmd = [
        q.quarry_bin(), "--warehouse", str(args.warehouse), "bench", args.suite,
        "--sf", fmt_sf(args.sf), "--repeat", str(args.repeat), "--threads", str(args.threads),
        "--json", str(json_path),
    ]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        sys.exit(f"quarry bench failed with status {proc.returncode}")
    if not json_path.exists():
        sys.exit(f"quarry bench exited 0 but wrote no {json_path}")
    return json_path


def load_quarry_json(path: Path) -> dict[str, dict]:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    out = {}
    for entry in doc.get("queries", []):
        times = [float(t) for t in entry.get("times_ms") or []]
        best = entry.get("best_ms")
        best = float(best) if best is not None else (min(times) if times else None)
        out[q.normalize_query_name(entry["name"])] = {
            "name": entry["name"],
            "best_ms": best,
            "times_ms": times,
            "rows": entry.get("rows"),
            "error": entry.get("error"),
        }
    return out


def run_duckdb(args) -> list[dict]:
    con = q.duckdb_connect(args.warehouse, threads=args.threads)
    wanted = None
    if args.queries:
        wanted = {q.normalize_query_name(n) for n in args.queries.split(",") if n.strip()}
    results = []
    for path in q.query_files(args.suite):
        name = q.normalize_query_name(path.stem)
        if wanted is not None and name not in wanted:
            continue
        sql = path.read_text(encoding="utf-8")
        entry = {"name": path.stem, "key": name, "times_ms": [], "best_ms": None, "rows": None, "error": None}
        try:
            con.execute(sql).fetchall()  # warm-up: file metadata, OS page cache
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                rows = con.execute(sql).fetchall()
                entry["times_ms"].append((time.perf_counter() - t0) * 1000.0)
            entry["rows"] = len(rows)
            entry["best_ms"] = min(entry["times_ms"])
        except Exception as e:  # keep going: one failing query should not hide the others
            entry["error"] = f"{type(e).__name__}: {e}"
        shown = f"{entry['best_ms']:.1f} ms" if entry["best_ms"] is not None else "ERROR " + entry["error"][:200]
        print(f"duckdb {path.stem:>6}: {shown}", flush=True)
        results.append(entry)
    con.close()
    return results


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def build_report(args, quarry: dict[str, dict], duck: list[dict]) -> dict:
    rows = []
    seen = set()
    for d in duck:
        qe = quarry.get(d["key"])
        seen.add(d["key"])
        q_ms = qe["best_ms"] if qe else None
        d_ms = d["best_ms"]
        ratio = q_ms / d_ms if q_ms is not None and d_ms not in (None, 0) else None
        q_rows = qe["rows"] if qe else None
        rows_match = None
        if q_rows is not None and d["rows"] is not None:
            rows_match = int(q_rows) == int(d["rows"])
        rows.append({
            "name": d["name"],
            "quarry_ms": q_ms,
            "duckdb_ms": d_ms,
            "ratio": ratio,
            "quarry_rows": q_rows,
            "duckdb_rows": d["rows"],
            "rows_match": rows_match,
            "quarry_times_ms": qe["times_ms"] if qe else [],
            "duckdb_times_ms": d["times_ms"],
            "quarry_error": (qe or {}).get("error") if qe else "missing from quarry bench output",
            "duckdb_error": d["error"],
        })
    for key, qe in sorted(quarry.items(), key=lambda kv: q.query_sort_key(kv[0])):
        if key not in seen and not args.queries:
            rows.append({
                "name": qe["name"], "quarry_ms": qe["best_ms"], "duckdb_ms": None, "ratio": None,
                "quarry_rows": qe["rows"], "duckdb_rows": None, "rows_match": None,
                "quarry_times_ms": qe["times_ms"], "duckdb_times_ms": [],
                "quarry_error": qe.get("error"), "duckdb_error": "no query file",
            })
    import duckdb

    return {
        "suite": args.suite,
        "sf": args.sf,
        "threads": args.threads,
        "repeat": args.repeat,
        "statistic": f"best of {args.repeat} timed runs after one warm-up run (both engines), milliseconds",
        "duckdb_version": duckdb.__version__,
        "quarry_bin": q.quarry_bin(),
        "queries": rows,
        "geomean_ratio": geomean([r["ratio"] for r in rows]),
        "row_count_mismatches": [r["name"] for r in rows if r["rows_match"] is False],
    }


def print_table(report: dict) -> None:
    def f(x, spec):
        if x is not None:
            return format(x, spec)
        width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
        return format("-", ">" + width) if width else "-"

    print()
    print(f"{report['suite'].upper()} SF {fmt_sf(report['sf'])}, {report['threads']} threads, "
          f"best of {report['repeat']}")
    print(f"{'query':<8} {'quarry ms':>12} {'duckdb ms':>12} {'ratio':>8} {'rows q/d':>15}  note")
    for r in report["queries"]:
        note = []
        if r["rows_match"] is False:
            note.append("ROW COUNT MISMATCH")
        if r["quarry_error"]:
            note.append(f"quarry: {r['quarry_error']}"[:80])
        if r["duckdb_error"]:
            note.append(f"duckdb: {r['duckdb_error']}"[:80])
        rows = f"{f(r['quarry_rows'], 'd')}/{f(r['duckdb_rows'], 'd')}"
        print(f"{r['name']:<8} {f(r['quarry_ms'], '12.1f')} {f(r['duckdb_ms'], '12.1f')} "
              f"{f(r['ratio'], '8.2f')} {rows:>15}  {'; '.join(note)}")
    print(f"geometric mean of ratios (quarry/duckdb): {f(report['geomean_ratio'], '.3f')}")
    if report["row_count_mismatches"]:
        print(f"ROW COUNT MISMATCHES: {', '.join(report['row_count_mismatches'])}")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["queries"]
    names = [r["name"] for r in rows]
    x = list(range(len(rows)))
    w = 0.4
    qv = [r["quarry_ms"] if r["quarry_ms"] else float("nan") for r in rows]
    dv = [r["duckdb_ms"] if r["duckdb_ms"] else float("nan") for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(rows) + 2), 5))
    ax.bar([i - w / 2 for i in x], qv, w, label="Quarry", color="#1f77b4")
    ax.bar([i + w / 2 for i in x], dv, w, label="DuckDB", color="#ff7f0e")
    for i, r in enumerate(rows):
        if r["rows_match"] is False:
            top = max([v for v in (qv[i], dv[i]) if v == v] or [1.0])
            ax.annotate("rows differ", (i, top), ha="center", va="bottom", color="red", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_ylabel(f"best of {report['repeat']} runs (ms, log scale)")
    gm = report["geomean_ratio"]
    ax.set_title(
        f"{report['suite'].upper()} SF {fmt_sf(report['sf'])}, {report['threads']} threads: Quarry vs DuckDB "
        f"(geomean quarry/duckdb = {gm:.2f})" if gm is not None else
        f"{report['suite'].upper()} SF {fmt_sf(report['sf'])}, {report['threads']} threads: Quarry vs DuckDB"
    )
    ax.legend()
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    qjson = Path(args.quarry_json) if args.quarry_json else run_quarry_bench(args, out_dir)
    quarry = load_quarry_json(qjson)
    duck = run_duckdb(args)
    report = build_report(args, quarry, duck)
    print_table(report)
    json_path = out_dir / f"compare-{args.suite}.json"
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    png_path = out_dir / f"compare-{args.suite}.png"
    plot(report, png_path)
    print(f"wrote {json_path} and {png_path}")
    return 2 if report["row_count_mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
