#!/usr/bin/env python3
"""A storage node behind a slow link: how many bytes cross it, and what it costs against embedded.

    python3 scripts/bench_link.py --suite ssb|tpch --warehouse DIR [--link-mbps 125] [--threads 2] \
        [--repeat 3] [--queries q1.1,q2.1] [--max-link-bytes 1000000] [--max-ratio 1.5] [--json FILE]

Two placements of the same warehouse DIR, both in the default configuration (no --pushdown flag):

    embedded  ``quarry --warehouse DIR ...``: the storage node inside the quarry process
    node      one ``quarry serve --warehouse DIR --link-mbps M`` in its own process on a loopback
              port (its link limited to M MB/s; 125 = 1 Gbit/s), queries with ``--nodes URL``

Each run is its own process, ``quarry ... --threads T sql -f FILE --format parquet --output OUT
--stats STATS``; a placement's time is the best ``wall_ms`` of --stats over R timed runs after
one warm-up run, the placements taking turns (embedded, node, embedded, node, ...). Link bytes
are the node's ``bytes_over_link`` summed over the query's fragments (the same in every run).

Per query it prints both times, node / embedded, and the link bytes. Failures, all listed and
making the exit status 1: a run that errors, node results whose values differ from embedded's
(quarry_py.compare_query_results), link bytes above --max-link-bytes, node / embedded above
--max-ratio. --json FILE records the command, git commit, binary, and every time.
The binary is $QUARRY_BIN or target/release/quarry.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quarry_py as q  # noqa: E402

PLACEMENTS = ("embedded", "node")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", required=True, choices=["ssb", "tpch"])
    ap.add_argument("--warehouse", required=True, help="warehouse holding the suite's tables")
    ap.add_argument("--link-mbps", type=float, default=125.0, help="the node's link bandwidth, MB/s (default 125)")
    ap.add_argument("--threads", type=int, default=2, help="threads of the host and of the node (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per placement after a warm-up (default 3)")
    ap.add_argument("--queries", help="comma-separated query names (default: all of the suite)")
    ap.add_argument("--max-link-bytes", type=float, default=1e6, help="bound on a query's link bytes (default 1e6)")
    ap.add_argument("--max-ratio", type=float, default=1.5, help="bound on node / embedded time (default 1.5)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run (default 1800)")
    ap.add_argument("--json", help="write the results here")
    return ap.parse_args(argv)


def link_bytes(stats_path: Path) -> int:
    stats = json.loads(stats_path.read_text(encoding="utf-8"))
    return sum(int(op.get("bytes_over_link", 0)) for op in stats["operators"] if op["operator"] == "FragmentExec")


def bench_query(path: Path, bases: dict, args, tmp: Path) -> dict:
    entry = {"query": q.normalize_query_name(path.stem), "times_ms": {p: [] for p in PLACEMENTS}, "problems": []}
    outputs, link = {}, None
    for round_ in range(args.repeat + 1):
        for placement in PLACEMENTS:
            out, stats = tmp / f"{placement}.parquet", tmp / f"{placement}.json"
            run = q.timed_quarry_sql(bases[placement], path, out, stats, timeout=args.timeout)
            if run.error:
                entry["problems"].append(f"{placement}: {run.error}")
                return entry
            if round_ > 0:
                entry["times_ms"][placement].append(run.wall_ms)
            if round_ == args.repeat:
                outputs[placement] = q.read_parquet_result(out)
                if placement == "node":
                    link = link_bytes(stats)
    cmp = q.compare_query_results(path.read_text(encoding="utf-8"), outputs["node"], outputs["embedded"])
    best = {p: min(t) for p, t in entry["times_ms"].items()}
    entry.update(best_ms=best, ratio=best["node"] / best["embedded"], link_bytes=link)
    entry["problems"] += verdict(best, link, cmp, args.max_link_bytes, args.max_ratio)
    return entry


def verdict(best_ms: dict, link: int, results_equal, max_link_bytes: float, max_ratio: float) -> list[str]:
    """The bounds a query misses: equal results, link bytes, node / embedded time."""
    problems = [] if results_equal else [f"node and embedded results differ: {results_equal}"]
    if link > max_link_bytes:
        problems.append(f"{link} link bytes > {max_link_bytes:g}")
    ratio = best_ms["node"] / best_ms["embedded"]
    if ratio > max_ratio:
        problems.append(f"node {ratio:.2f}x embedded > {max_ratio:g}")
    return problems


def main(argv=None) -> int:
    args = parse_args(argv)
    files = q.select_query_files(args.suite, args.queries)
    entries = []
    with q.StorageNodes([args.warehouse], ["--threads", str(args.threads), "--link-mbps", str(args.link_mbps)]) as node, \
            tempfile.TemporaryDirectory(prefix="bench-link-") as tmp:
        bases = {"embedded": ["--warehouse", args.warehouse, "--threads", str(args.threads)],
                 "node": ["--nodes", node.arg, "--threads", str(args.threads)]}
        print(f"{args.suite.upper()} in {args.warehouse}, {args.threads} threads, warm-up + best of {args.repeat}, "
              f"embedded vs one node on a {args.link_mbps:g} MB/s link, placements interleaved, {q.quarry_bin()}")
        for path in files:
            e = bench_query(path, bases, args, Path(tmp))
            entries.append(e)
            if "best_ms" in e:
                b = e["best_ms"]
                line = (f"{e['query']:<7} embedded {b['embedded']:8.1f}  node {b['node']:8.1f} ms  node/embedded {e['ratio']:5.2f}"
                        f"  link {e['link_bytes']:>12,} B")
            else:
                line = f"{e['query']:<7} failed"
            print(line + ("  FAIL: " + "; ".join(e["problems"]) if e["problems"] else ""), flush=True)
    timed = [e for e in entries if "ratio" in e]
    failures = [f"{e['query']}: {p}" for e in entries for p in e["problems"]]
    geomean = math.exp(sum(math.log(e["ratio"]) for e in timed) / len(timed)) if timed else None
    noise = {p: q.median_spread(e["times_ms"][p] for e in timed) for p in PLACEMENTS}
    summary = {"queries": len(entries), "timed": len(timed), "failed": len(failures), "geomean_node_over_embedded": geomean,
               "max_link_bytes": max((e["link_bytes"] for e in timed), default=None), "noise": noise, "failures": failures}
    pct = {p: "n/a" if v is None else f"{v:.1%}" for p, v in noise.items()}
    print(f"{args.suite}: {len(timed)} of {len(entries)} queries timed, geomean node/embedded "
          f"{geomean:.2f}, most link bytes {summary['max_link_bytes']:,}; {len(failures)} failures; "
          f"noise (median (max-min)/min) embedded {pct['embedded']}, node {pct['node']}" if timed else "no query timed")
    for f in failures:
        print(f"FAIL {f}")
    if args.json:
        record = {"command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]), "git": q.git_state(),
                  "quarry_bin": q.quarry_bin(), "suite": args.suite, "warehouse": args.warehouse, "link_mbps": args.link_mbps,
                  "threads": args.threads, "repeat": args.repeat, "max_link_bytes": args.max_link_bytes, "max_ratio": args.max_ratio,
                  "queries": entries, "summary": summary}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2), encoding="utf-8")
        print(f"wrote {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
