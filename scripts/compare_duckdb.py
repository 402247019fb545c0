#!/usr/bin/env python3
"""Quarry against DuckDB on the same Parquet segments: time per query, and equal result values.

    python3 scripts/compare_duckdb.py --suite ssb|tpch --sf SF --warehouse DIR \
        [--threads 2] [--repeat 3] [--out bench-results] [--queries q1.1,q2.1] \
        [--max-geomean R] [--max-each R] [--timeout S]

It measures the way /work/shared/bench/vs_duckdb.py (the reference harness) does:

* Data: when DIR holds no tables, ``quarry --warehouse DIR gen SUITE --sf SF`` writes them;
  otherwise DIR is used as it is (``--sf`` then only labels the report).
* Quarry: every run of a query is its own process,
  ``quarry --warehouse DIR --threads T sql -f FILE --format parquet --output OUT --stats STATS``,
  in the default configuration (no --pushdown flag). Its time is the best ``wall_ms`` of --stats
  (parse, plan, execute, collect: what DuckDB's execute + fetch covers); the best whole-process
  time (start-up, catalog, writing the Parquet output) is recorded beside it.
* DuckDB: one in-memory connection (``SET threads = T``) with a view per table over exactly the
  segments of the table's current manifest; a run is execute + fetch of the whole result as Arrow.
* Each query: one warm-up run of each engine, then R timed runs, the engines taking turns
  (Quarry, DuckDB, Quarry, DuckDB, ...) so that drift in the machine's speed reaches both alike.
  A time is the best of the R timed runs; the ratio is Quarry / DuckDB.
* Results: the values of Quarry's Parquet output (last run) are compared with DuckDB's result
  (one more, untimed, run fetched as Python values) by ``quarry_py.compare_query_results``:
  ordered when the query has a top-level ORDER BY (ties in any order), otherwise as multisets.
* Failures: a value mismatch, a Quarry error, a DuckDB error, or a bound missed (--max-each per
  query, --max-geomean overall). All are listed in the report and the JSON and make the exit
  status 1 (after everything is written). The geomean is over the queries both engines ran; the
  report says how many queries failed, so an erroring query never silently leaves it.
* Noise: per engine, the median over queries of (max - min) / min of its timed runs (needs
  --repeat 2 or more).

Writes OUT/compare-SUITE.json (command, git commit, binary, DuckDB version, every time) and
OUT/compare-SUITE.png (per-query bars of both engines, log scale, ratio above each pair, failures
in red). The binary is $QUARRY_BIN or target/release/quarry.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quarry_py as q  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", required=True, choices=["ssb", "tpch"])
    ap.add_argument("--sf", required=True, type=float, help="scale factor (used when generating)")
    ap.add_argument("--warehouse", required=True, help="warehouse directory (generated when it has no tables)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both engines (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per query and engine (default 3)")
    ap.add_argument("--out", default="bench-results", help="output directory (default bench-results)")
    ap.add_argument("--queries", help="comma-separated query names (default: all of the suite)")
    ap.add_argument("--max-geomean", type=float, help="fail when the geomean Quarry/DuckDB is above this")
    ap.add_argument("--max-each", type=float, help="fail when a query's Quarry/DuckDB ratio is above this")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per Quarry run (default 1800)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    return args


def fmt_sf(sf: float) -> str:
    return str(int(sf)) if float(sf).is_integer() else str(sf)


def select_queries(args) -> list[Path]:
    try:
        return q.select_query_files(args.suite, args.queries)
    except ValueError as e:
        sys.exit(str(e))


# ------------------------------------------------------------------------------------ setup


def ensure_data(args) -> bool:
    """Generate the suite into the warehouse when it has no tables; True when it did."""
    if q.list_tables(args.warehouse):
        return False
    cmd = ["gen", args.suite, "--sf", fmt_sf(args.sf)]
    print(f"$ {q.quarry_bin()} --warehouse {args.warehouse} {' '.join(cmd)}", flush=True)
    q.run_quarry(cmd, args.warehouse, timeout=None)
    return True


# ------------------------------------------------------------------------------------ measuring


def duckdb_arrow_run(con, sql: str) -> float:
    """One timed DuckDB run: execute and fetch the whole result as an Arrow table; ms."""
    t0 = time.perf_counter()
    rel = con.sql(sql)
    if hasattr(rel, "to_arrow_table"):
        rel.to_arrow_table()
    else:
        rel.arrow()
    return (time.perf_counter() - t0) * 1000.0


def engine_entry(**extra) -> dict:
    return {"warmup_ms": None, "times_ms": [], "best_ms": None, "spread": None, "error": None, **extra}


def quarry_turn(qe: dict, args, path: Path, out: Path, stats: Path, timed: bool) -> None:
    """One Quarry process run; its times (or its error) go into ``qe``."""
    run = q.timed_quarry_sql(["--warehouse", str(args.warehouse), "--threads", str(args.threads)],
                             path, out, stats, timeout=args.timeout)
    if run.error:
        qe["error"], qe["stderr"] = run.error, run.stderr
    elif timed:
        qe["times_ms"].append(run.wall_ms)
        qe["process_ms"].append(run.process_ms)
    else:
        qe["warmup_ms"], qe["warmup_process_ms"] = run.wall_ms, run.process_ms


def duckdb_turn(de: dict, con, sql: str, timed: bool) -> None:
    """One DuckDB run (execute + fetch as Arrow); its time (or its error) goes into ``de``. The
    warm-up run also takes DuckDB's one-time import of pyarrow."""
    try:
        ms = duckdb_arrow_run(con, sql)
    except Exception as e:  # noqa: BLE001 - any DuckDB failure is reported, not fatal
        de["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        return
    if timed:
        de["times_ms"].append(ms)
    else:
        de["warmup_ms"] = ms


def finish(e: dict) -> None:
    """Best time and spread of an engine's timed runs (none for a failed engine)."""
    ok = e["error"] is None and e["times_ms"]
    e["best_ms"] = min(e["times_ms"]) if ok else None
    e["spread"] = q.relative_spread(e["times_ms"]) if ok else None
    if "process_ms" in e:
        e["best_process_ms"] = min(e["process_ms"]) if ok else None


def measure_query(args, con, path: Path, tmp: Path) -> dict:
    """Warm-up + R timed runs of one query file in both engines, taking turns (an engine that
    failed is not run again); then the result comparison. Returns the query's JSON entry
    (failures are added by :func:`summarize`)."""
    sql = path.read_text(encoding="utf-8")
    out, stats = tmp / f"{path.stem}.parquet", tmp / "stats.json"
    qe = engine_entry(warmup_process_ms=None, process_ms=[], best_process_ms=None, stderr=None)
    de = engine_entry()
    for i in range(args.repeat + 1):
        if qe["error"] is None:
            quarry_turn(qe, args, path, out, stats, timed=i > 0)
        if de["error"] is None:
            duckdb_turn(de, con, sql, timed=i > 0)
    finish(qe)
    finish(de)
    entry = {"name": path.stem, "file": str(path), "quarry": qe, "duckdb": de, "ratio": None,
             "match": None, "mismatch": None, "rows": {"quarry": None, "duckdb": None}}
    if qe["best_ms"] is not None and de["best_ms"]:
        entry["ratio"] = qe["best_ms"] / de["best_ms"]
    if qe["error"] is None and de["error"] is None:
        compare(entry, sql, out, con)
    out.unlink(missing_ok=True)
    return entry


def compare(entry: dict, sql: str, quarry_output: Path, con) -> None:
    """Fill ``match``, ``mismatch`` (the differences) and ``rows`` of a query entry: Quarry's
    Parquet output against one more (untimed) DuckDB run fetched as Python values."""
    try:
        got = q.read_parquet_result(quarry_output)
    except Exception as e:  # noqa: BLE001 - an unreadable output is Quarry's failure
        entry["quarry"]["error"] = f"cannot read the Parquet output: {type(e).__name__}: {e}"[:300]
        return
    try:
        duck_result = q.duckdb_result(con, sql)
    except Exception as e:  # noqa: BLE001
        entry["duckdb"]["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        return
    entry["rows"] = {"quarry": len(got.rows), "duckdb": len(duck_result.rows)}
    cmp = q.compare_query_results(sql, got, duck_result)
    entry["match"] = bool(cmp)
    entry["mismatch"] = None if cmp else str(cmp)


# ------------------------------------------------------------------------------------ accounting


def query_failures(entry: dict, max_each: float | None = None) -> list[str]:
    """Why a query entry fails (empty when it passes): errors of either engine, different result
    values, a ratio above ``max_each``."""
    problems = []
    if entry["quarry"]["error"]:
        problems.append(f"quarry error: {entry['quarry']['error']}")
    if entry["duckdb"]["error"]:
        problems.append(f"duckdb error: {entry['duckdb']['error']}")
    if entry["match"] is False:
        detail = [ln for ln in (entry["mismatch"] or "").splitlines() if ln and not ln.startswith("columns:")]
        problems.append("result differs from DuckDB" + (f": {detail[0]}" if detail else ""))
    if max_each is not None and entry["ratio"] is not None and entry["ratio"] > max_each:
        problems.append(f"{entry['ratio']:.2f}x DuckDB > --max-each {max_each}")
    return problems


def summarize(entries: list[dict], max_geomean: float | None = None, max_each: float | None = None) -> dict:
    """Failure accounting and the overall figures of a run.

    ``geomean`` is over the queries with a ratio (both engines ran); ``timed`` counts them,
    ``failed`` counts queries with any failure, ``failures`` lists ``{"query", "problem"}``
    (plus a ``"*"`` entry for a missed --max-geomean; a run where no query could be timed misses
    any --max-geomean). ``noise`` is each engine's :func:`quarry_py.median_spread`."""
    failures = []
    for e in entries:
        e["failures"] = query_failures(e, max_each)
        failures += [{"query": e["name"], "problem": p} for p in e["failures"]]
    ratios = [e["ratio"] for e in entries if e["ratio"] is not None]
    g = q.geomean(ratios)
    if max_geomean is not None and (g is None or g > max_geomean):
        shown = "none (no query was timed)" if g is None else f"{g:.2f}"
        failures.append({"query": "*", "problem": f"geomean {shown} > --max-geomean {max_geomean}"})
    return {
        "queries": len(entries),
        "timed": len(ratios),
        "failed": sum(1 for e in entries if e["failures"]),
        "geomean": g,
        "failures": failures,
        "noise": {
            "quarry": q.median_spread(e["quarry"]["times_ms"] for e in entries if not e["quarry"]["error"]),
            "duckdb": q.median_spread(e["duckdb"]["times_ms"] for e in entries if not e["duckdb"]["error"]),
        },
    }


# ------------------------------------------------------------------------------------ output


def fmt_ms(x) -> str:
    return f"{x:9.1f}" if x is not None else f"{'-':>9}"


def table_line(e: dict) -> str:
    """One line of the table, as vs_duckdb.py prints it."""
    qe, de = e["quarry"], e["duckdb"]
    ratio = f"{e['ratio']:5.2f}" if e["ratio"] is not None else f"{'-':>5}"
    flags = []
    if e["match"] is False:
        flags.append("MISMATCH")
    if qe["error"]:
        flags.append("QUARRY ERROR")
    if de["error"]:
        flags.append("DUCKDB ERROR")
    return (f"{e['name']:8} quarry {fmt_ms(qe['best_ms'])} ms (process {fmt_ms(qe['best_process_ms'])})  "
            f"duckdb {fmt_ms(de['best_ms'])} ms  ratio {ratio}" + ("  " + ", ".join(flags) if flags else ""))


def fmt_noise(x) -> str:
    return f"{100 * x:.1f}%" if x is not None else "n/a (needs --repeat 2+)"


def summary_line(suite: str, s: dict) -> str:
    g = f"{s['geomean']:.2f}" if s["geomean"] is not None else "n/a"
    return (f"{suite}: {s['queries']} queries, geomean Quarry/DuckDB {g} over the {s['timed']} that both "
            f"engines ran; {s['failed']} queries failed, {len(s['failures'])} problems")


def print_report(report: dict) -> None:
    s = report["summary"]
    for f in s["failures"]:
        print(f"{f['query']}: {f['problem']}")
    for e in report["queries"]:
        if e["mismatch"]:
            print(f"--- {e['name']}: result differs (quarry = Quarry, duckdb = DuckDB)\n{e['mismatch']}")
    print(f"run-to-run noise (median over queries of (max-min)/min): quarry {fmt_noise(s['noise']['quarry'])}, "
          f"duckdb {fmt_noise(s['noise']['duckdb'])}")
    print(summary_line(report["suite"], s))


def plot(report: dict, path: Path) -> None:
    """Per-query bars of both engines' best times (log scale), the ratio above each pair; a
    failing query's label and note are red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["queries"]
    x = range(len(rows))
    w = 0.4
    nan = float("nan")
    qv = [e["quarry"]["best_ms"] or nan for e in rows]
    dv = [e["duckdb"]["best_ms"] or nan for e in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.65 * len(rows) + 2), 5.5))
    ax.bar([i - w / 2 for i in x], qv, w, label="Quarry (best wall_ms)", color="#1f77b4")
    ax.bar([i + w / 2 for i in x], dv, w, label="DuckDB (best execute + fetch)", color="#ff7f0e")
    ax.set_yscale("log")
    finite = [v for v in qv + dv if v == v] or [1.0]
    floor = min(finite) / 2
    ax.set_ylim(floor, max(finite) * 4)
    for i, e in enumerate(rows):
        top = max([v for v in (qv[i], dv[i]) if v == v] or [floor])
        ratio = f"{e['ratio']:.2f}x" if e["ratio"] is not None else ""
        if e["failures"]:
            note = "\n".join([k + " error" for k in ("quarry", "duckdb") if e[k]["error"]]
                              + (["mismatch"] if e["match"] is False else []) or ["slow"])
            ax.annotate(f"{ratio}\n{note}".strip(), (i, top), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", color="red", fontsize=8, fontweight="bold")
        else:
            ax.annotate(ratio, (i, top), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                        fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels([e["name"] for e in rows], rotation=45, ha="right")
    for label, e in zip(ax.get_xticklabels(), rows):
        if e["failures"]:
            label.set_color("red")
    ax.set_ylabel(f"best of {report['repeat']} runs, ms (log scale)")
    s = report["summary"]
    g = f"{s['geomean']:.2f}" if s["geomean"] is not None else "n/a"
    ax.set_title(f"{report['suite'].upper()} SF {fmt_sf(report['sf'])}, {report['threads']} threads: Quarry / DuckDB "
                 f"geomean {g} over {s['timed']} queries; {s['failed']} failed")
    ax.legend(loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------ main


def main(argv=None) -> int:
    args = parse_args(argv)
    import duckdb

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = select_queries(args)  # before generating: a typo fails at once
    generated = ensure_data(args)
    con = q.duckdb_connect(args.warehouse, threads=args.threads)
    print(f"{args.suite.upper()} SF {fmt_sf(args.sf)}, {args.threads} threads, warm-up + best of {args.repeat}, "
          f"{q.quarry_bin()} vs DuckDB {duckdb.__version__}", flush=True)
    entries = []
    with tempfile.TemporaryDirectory(prefix="compare-duckdb-") as tmp:
        for path in files:
            entries.append(measure_query(args, con, path, Path(tmp)))
            print(table_line(entries[-1]), flush=True)
    con.close()
    report = {
        "command": shlex.join([sys.executable, sys.argv[0] if argv is None else __file__,
                               *(sys.argv[1:] if argv is None else argv)]),
        "git": q.git_state(),
        "quarry_bin": q.binary_info(),
        "duckdb_version": duckdb.__version__,
        "suite": args.suite,
        "sf": args.sf,
        "warehouse": str(Path(args.warehouse).resolve()),
        "generated": generated,
        "threads": args.threads,
        "repeat": args.repeat,
        "max_geomean": args.max_geomean,
        "max_each": args.max_each,
        "statistic": ("Quarry: best --stats wall_ms of R process runs after one warm-up run; DuckDB: best "
                      "execute + fetch as Arrow of R runs after one warm-up run; engines interleaved per run"),
        "queries": entries,
    }
    report["summary"] = summarize(entries, args.max_geomean, args.max_each)
    print_report(report)
    json_path, png_path = out_dir / f"compare-{args.suite}.json", out_dir / f"compare-{args.suite}.png"
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    plot(report, png_path)
    print(f"wrote {json_path} and {png_path}")
    return 1 if report["summary"]["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
