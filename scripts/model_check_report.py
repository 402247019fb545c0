#!/usr/bin/env python3
"""The placement model against measurement: every query of a suite runs on an embedded node
bounded by each device profile (`quarry --profile P sql "Q; Q" --stats FILE`, default
settings otherwise), then `quarry model check` compares each fragment's predicted time with its
measured time (of its second run in one process: the first warms the process and the page
cache).

    python3 scripts/model_check_report.py --suite tpch --warehouse /work/data/tpch10 --out docs/benchmarks/model-check

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
import os
import shlex
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
              "git": q.git_state(), "quarry_bin": q.binary_info(), "warehouse": args.warehouse, "within": args.within,
              "rates": rates, "profiles": {}}
    text = [f"# placement model vs measured fragment time, {args.suite} queries, warehouse {args.warehouse}",
            f"# {record['command']}", f"# commit {record['git'].get('commit')} (dirty: {record['git'].get('dirty')})",
            f"# rates: {json.dumps(rates) if isinstance(rates, dict) else rates}"]
    failed = False
    evicted = evict_from_page_cache(Path(args.warehouse))
    text.append(f"# evicted from the page cache before the runs: {evicted} segment files")
    with tempfile.TemporaryDirectory() as scratch:
        for profile in args.profiles.split(","):
            stats_files, failures = [], []
            for path in files:
                stats = Path(scratch) / f"{profile}-{path.stem}.json"
                # The query twice in one process, the second run measured (`--stats` is the last
                # statement's): it reads the page cache, as the model's rates assume, not the disk
                # (q1.1, the first query, took 3x the others cold), in a process whose code has
                # run before, as `quarry calibrate` measures the rates (best of three in one
                # process; SSB's `date` fragment took 1.0 ms as a process's first and 0.5 ms after).
                lines = path.read_text(encoding="utf-8").splitlines()
                query = "\n".join(line for line in lines if not line.lstrip().startswith("--")).strip().rstrip(";")
                sql = ["--profile", profile, "sql", f"{query};\n{query};", "--format", "none"]
                run = q.run_quarry([*sql, "--stats", stats], args.warehouse, check=False)
                if run.returncode != 0:
                    failures.append(f"{path.stem}: {q.error_line(run.stderr, run.returncode)}")
                else:
                    stats_files.append(stats)
                print(f"{profile} {path.stem}: {'ok' if run.returncode == 0 else 'FAILED'}", flush=True)
            check = json.loads(q.run_quarry(["model", "check", *stats_files, "--within", str(args.within), "--json"]).stdout)
            for f in check["fragments"]:
                f["run"] = Path(f["run"]).stem.removeprefix(f"{profile}-")
            record["profiles"][profile] = {"failures": failures, **check}
            failed |= bool(failures)
            text += ["", f"## {profile}: {check['good']} of {len(check['fragments'])} fragments ({check['share_good']:.0%}) "
                         f"predicted within {args.within:.0%}; failures: {failures or 'none'}",
                     "# node columns: the fragment's device CPU, pauses for the profile's slower CPU, waits for a device",
                     "# thread and for the link, summed over its workers and partitions (ms)",
                     f"{'query':<6} {'table':<28} {'bound':<13} {'predicted ms':>12} {'measured ms':>12} {'error':>7}"
                     f" {'cpu':>8} {'pause':>8} {'thread':>8} {'link':>8}"]
            for f in check["fragments"]:
                counters = f.get("node_counters") or {}
                node = "".join(f" {counters.get(name, 0) / 1e6:>8.1f}" for name in ("device_cpu_ns", "device_pause_ns", "thread_wait_ns", "link_wait_ns"))
                text.append(f"{f['run']:<6} {f['table'][:28]:<28} {f['bound']:<13} {f['predicted_ms']:>12.1f} {f['measured_ms']:>12.1f} {f['error']:>7.0%}{node}")
    (out / f"{args.suite}.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    (out / f"{args.suite}.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    print("\n".join(text))
    return 1 if failed else 0


def evict_from_page_cache(warehouse: Path) -> int:
    """Drops the page-cache pages of every segment file under `warehouse`; how many files."""
    files = sorted(warehouse.glob("*/data/*.parquet"))
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return len(files)


if __name__ == "__main__":
    sys.exit(main())
