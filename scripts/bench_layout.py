#!/usr/bin/env python3
"""Does a planned layout read fewer bytes, in less time, than the default one? (issue 15)

    python3 scripts/bench_layout.py --default DIR --planned DIR [--suite ssb] [--profile softflash] \
        [--threads 2] [--repeat 3] [--max-bytes-ratio 0.35] [--queries q1.1,q2.1] [--out DIR]

DIR are two warehouses holding the same tables: --default as generated or loaded, --planned after
``quarry layout plan`` and ``quarry layout apply`` (see the issue note for the commands). For every
query of queries/SUITE/ it runs Quarry in its default configuration under ``--profile`` on each
warehouse, each run its own process (``quarry --warehouse DIR --profile P --threads T sql -f FILE
--format parquet --output OUT --stats STATS``). The two are interleaved: a warm-up round, then
--repeat timed rounds, the order of the two warehouses swapped every round so neither always runs
first. Per query it reports the stored bytes each read (``bytes_read_storage`` of --stats: the
same every run) and the best ``wall_ms``, and checks the planned warehouse's result against the
default's by value (quarry_py.compare_query_results).

Failures, all listed and making the exit status 1: a run that errors, results that differ, total
bytes of the planned layout above --max-bytes-ratio times the default's, or total time (the sum of
the best times) not lower. --out DIR writes layout-SUITE.json (the command, git commit, binary,
every time) and layout-SUITE.md (the table). The binary is $QUARRY_BIN or target/release/quarry.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quarry_py as q  # noqa: E402

LAYOUTS = ("default", "planned")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--default", required=True, help="warehouse in the default layout")
    ap.add_argument("--planned", required=True, help="the same tables after `quarry layout apply`")
    ap.add_argument("--suite", default="ssb", choices=["ssb", "tpch"])
    ap.add_argument("--profile", default="softflash", help="device profile of the embedded node (default softflash)")
    ap.add_argument("--threads", type=int, default=2, help="host threads (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds after the warm-up round (default 3)")
    ap.add_argument("--max-bytes-ratio", type=float, default=0.35,
                    help="fail when the planned layout reads more than this times the default's bytes (default 0.35)")
    ap.add_argument("--queries", help="comma-separated query names (default: all of the suite)")
    ap.add_argument("--out", help="directory for layout-SUITE.json and layout-SUITE.md")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run (default 1800)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    return args


def measure_query(args, path: Path, tmp: Path) -> dict:
    """The warm-up and timed rounds of one query on both layouts, and the planned result
    against the default's."""
    runs = {name: {"times_ms": [], "bytes_read": None, "best_ms": None, "spread": None, "error": None} for name in LAYOUTS}
    outputs = {name: tmp / f"{name}.parquet" for name in LAYOUTS}
    warehouses = {"default": args.default, "planned": args.planned}
    for round_no in range(args.repeat + 1):
        order = LAYOUTS if round_no % 2 == 0 else LAYOUTS[::-1]
        for name in order:
            r = runs[name]
            if r["error"]:
                continue
            base = ["--warehouse", warehouses[name], "--profile", args.profile, "--threads", str(args.threads)]
            stats = tmp / "stats.json"
            run = q.timed_quarry_sql(base, path, outputs[name], stats, timeout=args.timeout)
            if run.error:
                r["error"] = run.error
                continue
            r["bytes_read"] = json.loads(stats.read_text())["bytes_read_storage"]
            if round_no > 0:
                r["times_ms"].append(run.wall_ms)
    for r in runs.values():
        if r["times_ms"]:
            r["best_ms"] = min(r["times_ms"])
            r["spread"] = q.relative_spread(r["times_ms"])
    entry = {"name": path.stem, "layouts": runs, "match": None, "mismatch": None}
    if not any(r["error"] for r in runs.values()):
        cmp = q.compare_query_results(path.read_text(encoding="utf-8"), q.read_parquet_result(outputs["planned"]),
                                      q.read_parquet_result(outputs["default"]))
        entry["match"] = bool(cmp)
        # compare_query_results names its sides quarry and duckdb.
        entry["mismatch"] = None if cmp else re.sub(r"\bduckdb\b", "default", re.sub(r"\bquarry\b", "planned", str(cmp)))
    return entry


def failures(entries: list[dict], totals: dict, max_bytes_ratio: float) -> list[str]:
    out = [f"{e['name']} {name}: {e['layouts'][name]['error']}" for e in entries for name in LAYOUTS if e["layouts"][name]["error"]]
    out += [f"{e['name']}: results differ: {e['mismatch']}" for e in entries if e["match"] is False]
    if totals["bytes_ratio"] is not None and totals["bytes_ratio"] > max_bytes_ratio:
        out.append(f"planned bytes {totals['bytes_ratio']:.3f}x the default's > {max_bytes_ratio}")
    if totals["time_ratio"] is not None and totals["time_ratio"] >= 1.0:
        out.append(f"planned time {totals['time_ratio']:.3f}x the default's, not lower")
    return out


def totals_of(entries: list[dict]) -> dict:
    """Bytes and best times summed over the queries both layouts ran."""
    ran = [e for e in entries if all(e["layouts"][n]["best_ms"] is not None for n in LAYOUTS)]
    total = {n: {"bytes_read": sum(e["layouts"][n]["bytes_read"] for e in ran),
                 "best_ms": sum(e["layouts"][n]["best_ms"] for e in ran)} for n in LAYOUTS}
    ratio = lambda key: total["planned"][key] / total["default"][key] if ran and total["default"][key] > 0 else None  # noqa: E731
    noise = {n: q.median_spread(e["layouts"][n]["times_ms"] for e in ran) for n in LAYOUTS}
    return {"queries": len(ran), **total, "bytes_ratio": ratio("bytes_read"), "time_ratio": ratio("best_ms"), "noise": noise}


def line(e: dict) -> str:
    d, p = e["layouts"]["default"], e["layouts"]["planned"]
    if d["best_ms"] is None or p["best_ms"] is None:
        return f"| {e['name']} | error | | | | | |"
    return (f"| {e['name']} | {d['bytes_read'] / 1e6:,.1f} | {p['bytes_read'] / 1e6:,.1f} | {p['bytes_read'] / d['bytes_read']:.3f} "
            f"| {d['best_ms']:,.0f} | {p['best_ms']:,.0f} | {p['best_ms'] / d['best_ms']:.2f} |")


def markdown(report: dict) -> str:
    t = report["totals"]
    rows = "\n".join(line(e) for e in report["queries"])
    noise = ", ".join(f"{n} {x * 100:.1f}%" for n, x in t["noise"].items() if x is not None)
    verdict = "; ".join(report["failures"]) or "none"
    return f"""# {report['suite'].upper()}: planned layout against the default (issue 15)

Command: `{report['command']}`
Commit: {report['git']['commit']}{' (dirty)' if report['git']['dirty'] else ''}; binary {report['binary'].get('path')}
Profile `{report['profile']}`, {report['threads']} threads, warm-up + best of {report['repeat']}, the layouts interleaved.
Default: `{report['default']}`; planned: `{report['planned']}`.

| query | default MB | planned MB | ratio | default ms | planned ms | ratio |
|---|---:|---:|---:|---:|---:|---:|
{rows}
| **total** | {t['default']['bytes_read'] / 1e6:,.1f} | {t['planned']['bytes_read'] / 1e6:,.1f} | {t['bytes_ratio']:.3f} | {t['default']['best_ms']:,.0f} | {t['planned']['best_ms']:,.0f} | {t['time_ratio']:.2f} |

Run-to-run noise (median over queries of (max-min)/min): {noise}.
Failures: {verdict}.
"""


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        files = q.select_query_files(args.suite, args.queries)
    except ValueError as e:
        sys.exit(str(e))
    entries = []
    with tempfile.TemporaryDirectory(prefix="bench-layout-") as tmp:
        for path in files:
            entry = measure_query(args, path, Path(tmp))
            entries.append(entry)
            print(line(entry), flush=True)
    totals = totals_of(entries)
    report = {
        "command": shlex.join(["python3", *sys.argv]),
        "git": q.git_state(),
        "binary": q.binary_info(),
        "suite": args.suite,
        "profile": args.profile,
        "threads": args.threads,
        "repeat": args.repeat,
        "default": args.default,
        "planned": args.planned,
        "queries": entries,
        "totals": totals,
        "failures": failures(entries, totals, args.max_bytes_ratio),
    }
    text = markdown(report)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"layout-{args.suite}.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / f"layout-{args.suite}.md").write_text(text)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
