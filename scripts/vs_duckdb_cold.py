#!/usr/bin/env python3
"""Quarry against DuckDB on the same Parquet segments, cold: the files are not in memory.

usage: vs_duckdb_cold.py QUARRY WAREHOUSE SQLDIR [--threads 2] [--repeat 3] [--timeout S]
                         [--max-geomean R] [--max-each R] [--only q01,q02]

Before every run of either system the warehouse's segment files are dropped from the page cache
(`posix_fadvise(DONTNEED)`), and every run is a fresh process, so neither system finds a byte of
data in memory, its own or the kernel's. The two systems take turns on each query (Quarry, then
DuckDB, `--repeat` times); each one's best run counts.

Quarry runs `quarry sql -f` and its time is `wall_ms` of `--stats` (parse, plan, execute,
collect), the process time printed beside it. DuckDB runs in a fresh Python process that creates
views over exactly the segment files of each table's committed manifest, evicts the files again
(creating a view reads a footer), then times the query (execute and fetch as Arrow). The results
are compared by value as the reference harness compares them. The read columns are Quarry's
`--stats` of its best run: bytes read, of them from the device (not the page cache), read
requests, and the time the reads took. Exit 1 if a result differs, a query fails, or a bound is missed.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quarry_py import evict_from_page_cache, warehouse_segment_paths  # noqa: E402

# The DuckDB side, run as its own process per run: argv = warehouse, sql file, threads, output.
DUCKDB_RUN = r"""
import json, os, sys, time
import duckdb
warehouse, sql_file, threads, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
con = duckdb.connect()
con.execute(f"SET threads = {threads}")
files = []
for t in sorted(os.listdir(warehouse)):
    d = os.path.join(warehouse, t)
    if os.path.isfile(os.path.join(d, "CURRENT")):
        manifest = json.load(open(os.path.join(d, open(os.path.join(d, "CURRENT")).read().strip())))
        paths = [os.path.join(d, s["path"]) for s in manifest.get("segments") or []]
        files += paths
        if paths:
            con.execute(f'CREATE VIEW "{t}" AS SELECT * FROM read_parquet({paths!r})')
for path in files:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
sql = open(sql_file).read()
t0 = time.perf_counter()
res = con.sql(sql)
table = res.to_arrow_table() if hasattr(res, "to_arrow_table") else res.arrow()
ms = (time.perf_counter() - t0) * 1000
if out:
    import pyarrow.parquet as pq
    pq.write_table(table, out)
print(ms)
"""


def norm(v):
    if v is None:
        return None
    if isinstance(v, float):
        return round(v, 2) if abs(v) < 1e15 else float(f"{v:.12g}")
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, Decimal):
        return round(float(v), 2)
    return v


def rows_of(path: str) -> list[tuple]:
    table = pq.read_table(path)
    cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return [tuple(norm(c[i]) for c in cols) for i in range(table.num_rows)]


def close(a_rows, b_rows) -> bool:
    if len(a_rows) != len(b_rows):
        return False
    for x, y in zip(a_rows, b_rows):
        if len(x) != len(y):
            return False
        for u, v in zip(x, y):
            if isinstance(u, float) and isinstance(v, float):
                if abs(u - v) > max(0.011, 1e-9 * max(abs(u), abs(v))):
                    return False
            elif u != v:
                return False
    return True


def close_ordered(a_rows, b_rows, max_tie=128) -> bool:
    """Equal in order, except rows tied on the ORDER BY keys may swap within a short block."""
    if len(a_rows) != len(b_rows):
        return False
    i, n = 0, len(a_rows)
    while i < n:
        if close([a_rows[i]], [b_rows[i]]):
            i += 1
            continue
        for j in range(i + 2, min(n, i + max_tie) + 1):
            if close(sorted(a_rows[i:j], key=repr), sorted(b_rows[i:j], key=repr)):
                i = j
                break
        else:
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("quarry")
    ap.add_argument("warehouse", type=Path)
    ap.add_argument("sqldir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--max-geomean", type=float)
    ap.add_argument("--max-each", type=float)
    ap.add_argument("--only", default="", help="comma-separated query names")
    ap.add_argument("--pre", default="", help="extra Quarry args before `sql`")
    a = ap.parse_args()

    files = warehouse_segment_paths(a.warehouse)
    only = set(filter(None, a.only.split(",")))
    tmp = tempfile.mkdtemp(prefix="cold-")
    ratios, problems = [], []
    print(f"# cold: {len(files)} segment files evicted before every run; best of {a.repeat}, fresh processes, {a.threads} threads")
    for sql_file in sorted(glob.glob(os.path.join(a.sqldir, "*.sql"))):
        name = os.path.basename(sql_file)[:-4]
        if only and name not in only:
            continue
        q_out, d_out, stats_path = (os.path.join(tmp, x) for x in ("q.parquet", "d.parquet", "s.json"))
        best_q = best_p = best_d = None
        best_stats, error = {}, None
        for run in range(a.repeat):
            evict_from_page_cache(files)
            t0 = time.perf_counter()
            try:
                r = subprocess.run([a.quarry, "--warehouse", str(a.warehouse), "--threads", str(a.threads), *a.pre.split(), "sql", "-f", sql_file,
                                    "--format", "parquet", "--output", q_out, "--stats", stats_path], capture_output=True, text=True, timeout=a.timeout)
            except subprocess.TimeoutExpired:
                error = f"quarry: no answer in {a.timeout:.0f} s"
                break
            process_ms = (time.perf_counter() - t0) * 1000
            if r.returncode != 0:
                error = "quarry: " + (r.stderr.strip().splitlines()[-1][:150] if r.stderr.strip() else f"exit {r.returncode}")
                break
            stats = json.load(open(stats_path))
            if best_q is None or stats["wall_ms"] < best_q:
                best_q, best_stats = stats["wall_ms"], stats
            best_p = process_ms if best_p is None else min(best_p, process_ms)
            evict_from_page_cache(files)
            try:
                d = subprocess.run([sys.executable, "-c", DUCKDB_RUN, str(a.warehouse), sql_file, str(a.threads), d_out if run == 0 else ""],
                                   capture_output=True, text=True, timeout=a.timeout)
            except subprocess.TimeoutExpired:
                error = f"duckdb: no answer in {a.timeout:.0f} s"
                break
            if d.returncode != 0:
                error = "duckdb: " + d.stderr.strip().splitlines()[-1][:150]
                break
            ms = float(d.stdout.strip().splitlines()[-1])
            best_d = ms if best_d is None else min(best_d, ms)
        if error:
            problems.append(f"{name}: {error}")
            continue
        got, want = rows_of(q_out), rows_of(d_out)
        if "order by" in open(sql_file).read().lower():
            same = close_ordered(got, want)
        else:
            same = close(sorted(got, key=repr), sorted(want, key=repr))
        if not same:
            problems.append(f"{name}: result differs from DuckDB ({len(got)} vs {len(want)} rows)")
        ratio = best_q / best_d
        ratios.append(ratio)
        reads = best_stats.get("reads") or {}
        read_text = ""
        if reads:
            read_text = (f"  read {reads.get('bytes', 0) / 1e6:7.1f} MB, {reads.get('bytes_from_device', 0) / 1e6:7.1f} from the device,"
                         f" {reads.get('requests', 0):5} requests, wait {reads.get('wait_ms', 0):7.1f} ms")
        print(f"{name:8} quarry {best_q:9.1f} ms (process {best_p:9.1f})  duckdb {best_d:9.1f} ms  ratio {ratio:5.2f}{read_text}{'' if same else '  MISMATCH'}", flush=True)
        if a.max_each and ratio > a.max_each:
            problems.append(f"{name}: {ratio:.2f}x DuckDB > {a.max_each}")
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    if a.max_geomean and not geomean <= a.max_geomean:
        problems.append(f"geomean {geomean:.2f} > {a.max_geomean}")
    for p in problems:
        print(p)
    worst = max(ratios) if ratios else float("nan")
    print(f"{os.path.basename(a.sqldir.rstrip('/'))} cold: {len(ratios)} queries, geomean Quarry/DuckDB {geomean:.2f}, worst {worst:.2f}, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
