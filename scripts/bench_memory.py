#!/usr/bin/env python3
"""Peak memory of a whole suite in one process: Quarry against DuckDB on the same segments.

    python3 scripts/bench_memory.py --suite ssb|tpch --warehouse DIR [--threads 2] [--repeat 2] \
        [--queries q1.1,q2.1] [--json FILE]

* Quarry: one process, ``quarry --warehouse DIR --threads T sql -f ALL.sql`` where ALL.sql holds
  every query of the suite, one statement after another, in the default configuration. Its peak
  is the VmHWM the process reports itself (QUARRY_REPORT_PEAK_RSS): resident memory, so mapped
  segment pages count too.
* DuckDB: one Python process (``--duckdb-child``) with an in-memory connection and a view per
  table over the same segments (quarry_py.duckdb_connect, ``SET threads = T``), running the same
  queries in the same order, each fetched whole as Arrow. Its peak is the process's VmHWM. The
  process also holds the Python interpreter, which a DuckDB user would not need, so the
  interpreter's resident size before ``import duckdb`` is subtracted: DuckDB is credited with
  the smaller figure.
* The engines take turns R times; each engine's figure is the highest peak of its R runs.
  A query that errors in either engine is a failure. Exit status 1 when a run fails or Quarry's
  peak is above DuckDB's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quarry_py as q  # noqa: E402


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` figure (VmRSS, VmHWM) in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def duckdb_child(warehouse: str, threads: int, files: list[str]) -> None:
    """Runs in its own process: the queries through DuckDB; prints its memory as JSON."""
    interpreter_kib = status_kib("VmRSS")
    con = q.duckdb_connect(warehouse, threads=threads)
    for f in files:
        con.sql(Path(f).read_text(encoding="utf-8")).to_arrow_table()
    print(json.dumps({"interpreter_mib": interpreter_kib / 1024, "peak_mib": status_kib("VmHWM") / 1024}))


def run_duckdb(args, files: list[Path]) -> dict:
    cmd = [sys.executable, __file__, "--duckdb-child", str(args.warehouse), str(args.threads), *map(str, files)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"error": q.error_line(proc.stderr, proc.returncode)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_quarry(args, script: Path) -> dict:
    cmd = [q.quarry_bin(), "--warehouse", str(args.warehouse), "--threads", str(args.threads), "sql", "-f", str(script)]
    try:
        wall, peak_mib, _ = q.run_quarry_measured(cmd, timeout=args.timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return {"error": str(e).strip().splitlines()[-1][:300]}
    return {"peak_mib": peak_mib, "wall_s": wall}


def verdict(quarry_runs: list[dict], duckdb_runs: list[dict]) -> dict:
    """Each engine's highest peak over its runs, DuckDB's less the Python interpreter, their
    ratio, and the failures: a run that errored, or Quarry's peak above DuckDB's."""
    failures = [f"quarry: {r['error']}" for r in quarry_runs if "error" in r]
    failures += [f"duckdb: {r['error']}" for r in duckdb_runs if "error" in r]
    summary: dict = {"failures": failures}
    if failures:
        return summary
    quarry_peak = max(r["peak_mib"] for r in quarry_runs)
    duckdb_peak = max(r["peak_mib"] for r in duckdb_runs)
    interpreter = min(r["interpreter_mib"] for r in duckdb_runs)
    duckdb_credited = duckdb_peak - interpreter
    summary.update(quarry_peak_mib=quarry_peak, duckdb_process_peak_mib=duckdb_peak, python_interpreter_mib=interpreter,
                   duckdb_peak_mib=duckdb_credited, ratio=quarry_peak / duckdb_credited)
    if quarry_peak > duckdb_credited:
        failures.append(f"quarry's peak {quarry_peak:.0f} MiB is above duckdb's {duckdb_credited:.0f} MiB")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", required=True, choices=["ssb", "tpch"])
    ap.add_argument("--warehouse", required=True, help="warehouse holding the suite's tables")
    ap.add_argument("--threads", type=int, default=2, help="threads of both engines (default 2)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per engine, taking turns (default 2)")
    ap.add_argument("--queries", help="comma-separated query names (default: all of the suite)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds allowed per run (default 3600)")
    ap.add_argument("--json", help="write the report to this file")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    try:
        files = q.select_query_files(args.suite, args.queries)
    except ValueError as e:
        ap.error(str(e))

    print(f"{args.suite} in {args.warehouse}: {len(files)} queries in one process per engine, {args.threads} threads, "
          f"{args.repeat} runs each, {q.quarry_bin()}", flush=True)
    quarry_runs, duckdb_runs = [], []
    with tempfile.TemporaryDirectory(prefix="quarry-memory-") as tmp:
        script = Path(tmp) / "all.sql"
        script.write_text("".join(q.strip_sql_comments(f.read_text(encoding="utf-8")).strip().rstrip(";") + ";\n" for f in files),
                          encoding="utf-8")
        for i in range(args.repeat):
            quarry_runs.append(run_quarry(args, script))
            duckdb_runs.append(run_duckdb(args, files))
            print(f"run {i + 1}: quarry {quarry_runs[-1]}  duckdb {duckdb_runs[-1]}", flush=True)

    summary = verdict(quarry_runs, duckdb_runs)
    failures = summary["failures"]
    if "ratio" in summary:
        print(f"peak RSS: quarry {summary['quarry_peak_mib']:.0f} MiB, duckdb {summary['duckdb_peak_mib']:.0f} MiB "
              f"({summary['duckdb_process_peak_mib']:.0f} MiB process less {summary['python_interpreter_mib']:.0f} MiB "
              f"Python interpreter); quarry/duckdb {summary['ratio']:.2f}")
    for f in failures:
        print(f"FAIL {f}")
    if args.json:
        record = {"command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]), "git": q.git_state(),
                  "quarry_bin": q.binary_info(), "suite": args.suite, "warehouse": str(args.warehouse),
                  "threads": args.threads, "repeat": args.repeat, "queries": [f.stem for f in files],
                  "quarry_runs": quarry_runs, "duckdb_runs": duckdb_runs, "summary": summary}
        Path(args.json).write_text(json.dumps(record, indent=2), encoding="utf-8")
        print(f"wrote {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--duckdb-child":
        duckdb_child(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    else:
        sys.exit(main())
