#!/usr/bin/env python3
"""Two builds of Quarry on the same queries, taking turns: did a change make them faster?

    python3 scripts/compare_builds.py --before BIN --after BIN --suite ssb|tpch|tpcds --warehouse DIR \
        [--queries q1.1,q4.1] [--repeat 3] [--json FILE] -- [QUARRY GLOBAL ARGS...]

Every run is its own process, ``BIN --warehouse DIR ARGS... sql -f FILE --format parquet
--output OUT --stats STATS`` (ARGS after ``--``: ``--profile kim-isp-2015 --pushdown off``, say);
a time is ``wall_ms`` of --stats. Per query: one warm-up run of each build (not timed), then
--repeat rounds, the builds alternating which goes first, so drift in the machine's speed
reaches both alike. It prints each build's median, their ratio after/before, and the run-to-run
noise ((max - min) / min of a build's runs, the median over queries). The builds' result values
must agree (``quarry_py.compare_query_results``); a disagreement or a failed run is listed and
makes the exit status 1. --json FILE records the command, commit, binaries and every time.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quarry_py as q  # noqa: E402

BUILDS = ("before", "after")


def run(binary: str, args: list[str], sql_file: Path, scratch: Path, tag: str) -> q.SqlRun:
    return q.timed_quarry_sql(args, sql_file, scratch / f"{tag}.parquet", scratch / f"{tag}.json", binary=binary)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the build without the change")
    ap.add_argument("--after", required=True, help="the build with it")
    ap.add_argument("--suite", required=True, choices=["ssb", "tpch", "tpcds"])
    ap.add_argument("--warehouse", required=True)
    ap.add_argument("--queries", help="comma-separated query names (default: all of the suite)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per query and build (default 3)")
    ap.add_argument("--json", help="write every time here")
    ap.add_argument("quarry_args", nargs="*", help="global quarry arguments after --")
    args = ap.parse_args()
    binaries = {"before": args.before, "after": args.after}
    global_args = ["--warehouse", args.warehouse, *args.quarry_args]
    print(f"# {shlex.join([sys.executable, *sys.argv])}")
    print(f"# commit {q.git_state()['commit']}; before {args.before}, after {args.after}")
    record = {"command": sys.argv, "git": q.git_state(), "binaries": binaries, "queries": {}}
    failures = []
    times_by_build = {b: [] for b in BUILDS}
    print(f"{'query':8} {'before ms':>10} {'after ms':>10} {'after/before':>13}")
    with tempfile.TemporaryDirectory(prefix="quarry-builds-") as scratch:
        scratch = Path(scratch)
        for sql_file in q.select_query_files(args.suite, args.queries):
            name = sql_file.stem
            results = {}
            for build in BUILDS:
                warm = run(binaries[build], global_args, sql_file, scratch, build)
                if warm.error:
                    failures.append(f"{name} {build}: {warm.error}")
                results[build] = q.read_parquet_result(scratch / f"{build}.parquet") if not warm.error else None
            if results["before"] and results["after"]:
                same = q.compare_query_results(sql_file.read_text(), results["after"], results["before"])
                if not same.ok:
                    failures.append(f"{name}: the builds' results differ: {same.message}")
            times = {b: [] for b in BUILDS}
            for round_no in range(args.repeat):
                for build in q.round_order(BUILDS, round_no):
                    timed = run(binaries[build], global_args, sql_file, scratch, build)
                    if timed.error:
                        failures.append(f"{name} {build}: {timed.error}")
                    else:
                        times[build].append(timed.wall_ms)
            medians = {b: statistics.median(t) if t else None for b, t in times.items()}
            ratio = medians["after"] / medians["before"] if all(medians.values()) else None
            for build in BUILDS:
                times_by_build[build].append(times[build])
            record["queries"][name] = {"times_ms": times, "median_ms": medians, "ratio": ratio}
            fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
            print(f"{name:8} {fmt(medians['before'], '10.1f')} {fmt(medians['after'], '10.1f')} {fmt(ratio, '13.2f')}", flush=True)
    ratios = [v["ratio"] for v in record["queries"].values()]
    record["geomean_ratio"] = q.geomean(ratios)
    record["noise"] = {b: q.median_spread(times_by_build[b]) for b in BUILDS}
    record["failures"] = failures
    geo = record["geomean_ratio"]
    print(f"geomean after/before {geo:.2f}" if geo else "geomean after/before -")
    print("noise (median (max-min)/min): " + ", ".join(f"{b} {v:.0%}" if v is not None else f"{b} -" for b, v in record["noise"].items()))
    for failure in failures:
        print(f"FAILED {failure}")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
