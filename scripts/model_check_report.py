#!/usr/bin/env python3
"""The placement model against measurement: every query of a suite runs on an embedded node
bounded by each device profile (`quarry --profile P sql "Q; Q" --stats FILE`, default
settings otherwise), then `quarry model check` compares each fragment's predicted time with its
measured time (of its second run in one process: the first warms the process and the page
cache).

    python3 scripts/model_check_report.py --suite tpch --warehouse /work/data/tpch10 --out docs/benchmarks/model-check

With --repeat N each query runs in N processes and a fragment's measured time is the median of
the N (each run's is kept in `measured_runs_ms`); the report states the run-to-run spread.

Writes OUT/SUITE.json (command, commit, binary, the rates used, every fragment) and OUT/SUITE.txt
(per profile: the share of fragments within 25%, and each fragment's numbers). A query that fails
is listed as a failure, never skipped silently.

With --calibrate, `quarry calibrate` measures this machine's rates into the warehouse first (on
its own synthetic table, not the suite's data) and the warehouse's calibration is put back as it
was afterwards; the rates used are recorded either way.

Before the runs, the warehouse's segment files are evicted from the page cache, so that the
warm-up reads them in through the node, as a served warehouse is read (`quarry calibrate` does
the same to its own tables: a file just written is cached in large folios, which the node maps
at about half the CPU of the pages it faults in itself, docs/benchmarks/pushdown).
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

PROFILES = ["kim-isp-2015", "smartssd-2013"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=["tpch", "ssb"], required=True)
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--queries", default=None, help="comma-separated query names (default: all)")
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--within", type=float, default=0.25)
    parser.add_argument("--calibrate", action="store_true", help="measure the rates first (restored afterwards)")
    parser.add_argument("--stats-dir", default=None,
                        help="keep each run's --stats file here (default: a temporary directory, removed)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each query, each in a process of its own; a fragment's measured time is the median")
    args = parser.parse_args(argv)
    calibration = Path(args.warehouse) / ".calibration.json"
    before = calibration.read_bytes() if calibration.exists() else None
    try:
        if args.calibrate:
            q.run_quarry(["calibrate"], args.warehouse)
        rates = json.loads(calibration.read_text()) if calibration.exists() else "defaults (no quarry calibrate)"
        return report(args, argv, rates)
    finally:
        if before is None:
            calibration.unlink(missing_ok=True)
        else:
            calibration.write_bytes(before)


def report(args, argv, rates) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = q.select_query_files(args.suite, args.queries)
    record = {"command": shlex.join([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])]),
              "git": q.git_state(), "quarry_bin": q.binary_info(), "machine": q.machine_info(), "warehouse": args.warehouse, "within": args.within,
              "rates": rates, "profiles": {}}
    text = [f"# placement model vs measured fragment time, {args.suite} queries, warehouse {args.warehouse}",
            f"# {record['command']}", f"# commit {record['git'].get('commit')} (dirty: {record['git'].get('dirty')})",
            f"# machine: {json.dumps(record['machine'])}",
            f"# rates: {json.dumps(rates) if isinstance(rates, dict) else rates}"]
    failed = False
    segments = q.warehouse_segment_paths(args.warehouse)
    q.evict_from_page_cache(segments)
    evicted = len(segments)
    text.append(f"# evicted from the page cache before the runs: {evicted} segment files")
    with tempfile.TemporaryDirectory() as temporary:
        scratch = args.stats_dir or temporary
        Path(scratch).mkdir(parents=True, exist_ok=True)
        for profile in args.profiles.split(","):
            stats_files, failures = [], []
            for path in files:
                # The query twice in one process, the second run measured (`--stats` is the last
                # statement's): it reads the page cache, as the model's rates assume, not the disk
                # (q1.1, the first query, took 3x the others cold), in a process whose code has
                # run before, as `quarry calibrate` measures the rates (best of three in one
                # process; SSB's `date` fragment took 1.0 ms as a process's first and 0.5 ms after).
                lines = path.read_text(encoding="utf-8").splitlines()
                query = "\n".join(line for line in lines if not line.lstrip().startswith("--")).strip().rstrip(";")
                sql = ["--profile", profile, "sql", f"{query};\n{query};", "--format", "none"]
                runs, error = [], None
                for r in range(args.repeat):
                    stats = Path(scratch) / f"{profile}-{path.stem}.{r}.json"
                    run = q.run_quarry([*sql, "--stats", stats], args.warehouse, check=False)
                    if run.returncode != 0:
                        error = q.error_line(run.stderr, run.returncode)
                        break
                    runs.append(json.loads(stats.read_text(encoding="utf-8")))
                if error is None:
                    merged, error = median_of_runs(runs)
                if error is not None:
                    failures.append(f"{path.stem}: {error}")
                else:
                    stats = Path(scratch) / f"{profile}-{path.stem}.json"
                    stats.write_text(json.dumps(merged), encoding="utf-8")
                    stats_files.append(stats)
                print(f"{profile} {path.stem}: {'ok' if error is None else 'FAILED'}", flush=True)
            check = json.loads(q.run_quarry(["model", "check", *stats_files, "--within", str(args.within), "--json"]).stdout)
            # Each run's measured times, in the order `quarry model check` lists the fragments.
            measured_runs = [op.get("measured_runs_ms") for stats in stats_files
                             for op in json.loads(stats.read_text(encoding="utf-8"))["operators"]
                             if op.get("predicted_ms") is not None and op.get("measured_ms") is not None]
            assert len(measured_runs) == len(check["fragments"]), (len(measured_runs), len(check["fragments"]))
            for f, runs in zip(check["fragments"], measured_runs):
                f["run"] = Path(f["run"]).stem.removeprefix(f"{profile}-")
                f["measured_runs_ms"] = runs
            spreads = sorted((max(f["measured_runs_ms"]) - min(f["measured_runs_ms"])) / f["measured_ms"]
                             for f in check["fragments"] if f["measured_ms"] > 0)
            record["profiles"][profile] = {"failures": failures, **check}
            failed |= bool(failures)
            text += ["", f"## {profile}: {check['good']} of {len(check['fragments'])} fragments ({check['share_good']:.0%}) "
                         f"predicted within {args.within:.0%}; failures: {failures or 'none'}",
                     f"# in the run's schedule: {check['good_in_run']} of {len(check['fragments'])} ({check['share_good_in_run']:.0%}) within "
                     f"{args.within:.0%}: each fragment's time alone stretched by the fragments running beside it (sharing the link",
                     "# and the host's threads), from when each started in the run (`in run` column; its own measured time is not an input)",
                     f"# measured: the median of {args.repeat} run(s), each in a process of its own; run-to-run spread "
                     f"(max - min over the median), median over fragments {statistics.median(spreads) if spreads else 0:.0%}, "
                     f"90th percentile {spreads[int(0.9 * (len(spreads) - 1))] if spreads else 0:.0%}",
                     "# node columns: the fragment's device CPU, pauses for the profile's slower CPU, waits for a device",
                     "# thread and for the link, summed over its workers and partitions (ms); from-to: when it ran,",
                     "# from the query's first fragment's start; shared: how much of that time other fragments ran too",
                     f"{'query':<6} {'table':<28} {'bound':<13} {'predicted ms':>12} {'measured ms':>12} {'error':>7}"
                     f" {'in run ms':>10} {'error':>7} {'cpu':>8} {'pause':>8} {'thread':>8} {'link':>8} {'from':>8} {'to':>8} {'shared':>8}"]
            for f in check["fragments"]:
                counters = f.get("node_counters") or {}
                node = "".join(f" {counters.get(name, 0) / 1e6:>8.1f}" for name in ("device_cpu_ns", "device_pause_ns", "thread_wait_ns", "link_wait_ns"))
                span = f.get("span_ms") or [0.0, 0.0]
                others = [g["span_ms"] for g in check["fragments"] if g["run"] == f["run"] and g is not f and g.get("span_ms")]
                timing = f" {span[0]:>8.1f} {span[1]:>8.1f} {shared_ms(span, others):>8.1f}"
                in_run = f.get("predicted_in_run_ms")
                in_run = f" {in_run:>10.1f} {f['error_in_run']:>7.0%}" if in_run is not None else f" {'-':>10} {'-':>7}"
                text.append(f"{f['run']:<6} {f['table'][:28]:<28} {f['bound']:<13} {f['predicted_ms']:>12.1f} {f['measured_ms']:>12.1f} {f['error']:>7.0%}{in_run}{node}{timing}")
    (out / f"{args.suite}.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    (out / f"{args.suite}.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    print("\n".join(text))
    return 1 if failed else 0


def median_of_runs(runs):
    """The first run's stats with each fragment's measured time the median of all runs' (and
    every run's in `measured_runs_ms`); an error if the runs' plans differ."""
    merged = json.loads(json.dumps(runs[0]))
    for i, op in enumerate(merged["operators"]):
        if op.get("measured_ms") is None:
            continue
        same = [run["operators"][i] for run in runs if i < len(run["operators"])]
        if len(same) != len(runs) or any((o.get("operator"), o.get("table")) != (op.get("operator"), op.get("table")) for o in same):
            return None, f"the runs' plans differ at operator {i}"
        measured = sorted(o["measured_ms"] for o in same if o.get("measured_ms") is not None)
        if len(measured) != len(runs):
            return None, f"a run measured no time for operator {i}"
        op["measured_runs_ms"] = [o["measured_ms"] for o in same]
        op["measured_ms"] = statistics.median(measured)
    return merged, None


def shared_ms(span, others) -> float:
    """How much of `span` (from, to) some span of `others` covers, ms."""
    cuts = sorted((max(a, span[0]), min(b, span[1])) for a, b in others if b > span[0] and a < span[1])
    total, end = 0.0, span[0]
    for a, b in cuts:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


if __name__ == "__main__":
    sys.exit(main())
