#!/usr/bin/env python3
"""Is Quarry's default placement (``--pushdown auto``) as fast as the better of always and never?

    python3 scripts/bench_modes.py --suite ssb|tpch|tpcds --warehouse DIR [--embedded | --node | --both] \
        [--threads 2] [--repeat 3] [--max-ratio 1.10] [--queries q1.1,q2.1] [--link-mbps N] \
        [--profile NAME] [--json FILE]

For every query file of queries/SUITE/ it runs Quarry in three modes:

    auto   the default configuration (no --pushdown flag: the cost model places each operator)
    on     --pushdown on   (every operator that can run on the storage node does)
    off    --pushdown off  (passthrough: the node only reads the projected columns)

Each run is its own process, ``quarry ... --threads T [--pushdown MODE] sql -f FILE --format
parquet --output OUT --stats STATS``; a mode's time is the median (--statistic best: the least)
``wall_ms`` of --stats over its timed runs. The median is the default because one run's luck
decides a best-of-N: on 2026-11-29 (SSB SF 10, 5 rounds) a mode's fastest run was up to 16%
below its next fastest, and a query whose auto and on ran the same plan measured auto/on 1.17 by
best and 0.98 by median. Both are printed and recorded. The modes are interleaved: one warm-up
round (auto, on, off; not timed), then --repeat rounds, each starting one mode later than the
last (on, off, auto; off, auto, on; ...), so drift in the machine's speed reaches all three alike
and no mode always follows the same one (in a fixed order auto always ran right after off, a
multi-second run moving GBs through the same node process).

Placements (the same warehouse DIR):
    --embedded  (default) ``quarry --warehouse DIR ...``: the storage node runs inside the process
    --node      one ``quarry serve --warehouse DIR`` in its own process on a loopback port (as
                quarry_py.StorageNodes starts it), queries run with ``--nodes URL``; with
                --link-mbps N the node paces its link to N MB/s (``quarry serve --link-mbps``);
                the host gets DIR's calibration (``quarry calibrate``) if it has one: host and
                node share this machine
    --both      both, embedded first
--profile NAME gives the storage node (embedded or served) that device profile (`quarry sql
--profile`, `quarry serve --profile`); --link-mbps overrides the profile's link.

Per query it prints the three modes' times, which of on/off is faster, and auto / best(on, off)
by the statistic (and by the other one, in brackets).
Failures, all listed and making the exit status 1: a query whose auto time is more than
--max-ratio (default 1.10) times the better of on and off; a mode that errors; a mode whose
result values differ from auto's (quarry_py.compare_query_results, ordered when the query has a
top-level ORDER BY). A line ends "same plan as on|off" when auto ran the operators the better
mode ran, each on the same side (--stats `operators`): a ratio between them is the runs' noise.
--json FILE records the command, git commit, binary, and every time.
The binary is $QUARRY_BIN or target/release/quarry.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quarry_py as q  # noqa: E402

MODES = ("auto", "on", "off")

# A mode's time over its timed runs, by --statistic.
STATISTICS = {"median": statistics.median, "best": min}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", required=True, choices=["ssb", "tpch", "tpcds"])
    ap.add_argument("--warehouse", required=True, help="warehouse holding the suite's tables")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--embedded", action="store_const", dest="placement", const="embedded",
                       help="storage node inside the quarry process (default)")
    where.add_argument("--node", action="store_const", dest="placement", const="node",
                       help="one storage node in its own process (quarry serve), queries with --nodes")
    where.add_argument("--both", action="store_const", dest="placement", const="both", help="embedded, then node")
    ap.add_argument("--threads", type=int, default=2, help="threads of the host (and of the node) (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds after the warm-up round (default 3)")
    ap.add_argument("--max-ratio", type=float, default=1.10,
                    help="fail when auto's time is above this times the better of on/off (default 1.10)")
    ap.add_argument("--statistic", choices=sorted(STATISTICS), default="median",
                    help="a mode's time over its timed runs: their median (default) or the least")
    ap.add_argument("--queries", help="comma-separated query names (default: all of the suite)")
    ap.add_argument("--link-mbps", type=float, help="the node's link bandwidth in MB/s (node placement; default unlimited)")
    ap.add_argument("--profile", help="device profile of the storage node (built-in name or JSON file; default: none)")
    ap.add_argument("--json", help="write the report to this file")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run (default 1800)")
    args = ap.parse_args(argv)
    args.placement = args.placement or "embedded"
    if args.link_mbps is not None and args.placement == "embedded":
        ap.error("--link-mbps paces a node's link: use it with --node or --both")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    return args


def select_queries(args) -> list[Path]:
    try:
        return q.select_query_files(args.suite, args.queries)
    except ValueError as e:
        sys.exit(str(e))


def mode_args(mode: str) -> list[str]:
    """The flag of a mode: none for the default."""
    return [] if mode == "auto" else ["--pushdown", mode]


# ------------------------------------------------------------------------------------ measuring


def measure_query(path: Path, base_args: list[str], repeat: int, tmp: Path, timeout: float) -> dict:
    """One warm-up round and ``repeat`` timed rounds of auto, on, off; then each mode's result
    (last run) against auto's. A mode that errors is not run again for this query."""
    runs = {m: {"times_ms": [], "process_ms": [], "best_ms": None, "median_ms": None, "spread": None, "error": None,
                "match": None, "mismatch": None, "plan": None} for m in MODES}
    outputs = {m: tmp / f"{m}.parquet" for m in MODES}
    for round_no in range(repeat + 1):
        for mode in round_order(round_no):
            r = runs[mode]
            if r["error"]:
                continue
            run = q.timed_quarry_sql([*base_args, *mode_args(mode)], path, outputs[mode], tmp / "stats.json",
                                     timeout=timeout)
            if run.error:
                r["error"] = run.error
                continue
            r["plan"] = plan_shape(run.stats)
            if round_no > 0:
                r["times_ms"].append(run.wall_ms)
                r["process_ms"].append(run.process_ms)
    for r in runs.values():
        if r["error"] is None:
            r["best_ms"] = min(r["times_ms"])
            r["median_ms"] = statistics.median(r["times_ms"])
            r["spread"] = q.relative_spread(r["times_ms"])
    compare_with_auto(path.read_text(encoding="utf-8"), runs, outputs)
    for p in outputs.values():
        p.unlink(missing_ok=True)
    return runs


def round_order(round_no: int) -> tuple[str, ...]:
    """The modes in the order round ``round_no`` runs them: each round starts one mode later."""
    return q.round_order(MODES, round_no)


def plan_shape(stats: dict) -> list[str]:
    """The operators a run executed, in plan order, each with the side it ran on (host or
    storage), from its --stats: two runs of one query with equal shapes ran the same plan. An
    operator that saw no rows, made none and took no time did not run (a star join's fallback
    to hash joins, planned in case a dimension key repeats, runs only then)."""
    return [f"{op['operator']}@{op['side']}" for op in stats["operators"] if op["rows_in"] or op["rows_out"] or op["compute_ms"]]


def relabel(message: str, mode: str) -> str:
    """compare_query_results calls its sides quarry and duckdb; here they are MODE and auto."""
    return re.sub(r"\bduckdb\b", "auto", re.sub(r"\bquarry\b", mode, message))


def compare_with_auto(sql: str, runs: dict, outputs: dict) -> None:
    """Set ``match``/``mismatch`` of on and off (auto is the reference, matching itself)."""
    if runs["auto"]["error"]:
        return
    want = q.read_parquet_result(outputs["auto"])
    runs["auto"]["match"] = True
    for mode in MODES[1:]:
        if runs[mode]["error"]:
            continue
        cmp = q.compare_query_results(sql, q.read_parquet_result(outputs[mode]), want)
        runs[mode]["match"] = bool(cmp)
        runs[mode]["mismatch"] = None if cmp else relabel(str(cmp), mode)


def auto_over_better(runs: dict, statistic: str) -> tuple[str | None, float | None]:
    """The faster of on/off by ``statistic`` and auto's time over its time (None where a mode has none)."""
    key = f"{statistic}_ms"
    timed = {m: runs[m][key] for m in MODES[1:] if runs[m][key] is not None}
    better = min(timed, key=timed.get) if timed else None
    if better and runs["auto"][key] is not None and timed[better] > 0:
        return better, runs["auto"][key] / timed[better]
    return better, None


def verdict(runs: dict, max_ratio: float, statistic: str = "median") -> dict:
    """Which of on/off is faster, auto / best(on, off) by ``statistic`` (and by the other), and
    the query's failures (a mode's error, a result differing from auto's, auto above
    ``max_ratio`` times the better of on/off)."""
    failures = [f"{m} error: {runs[m]['error']}" for m in MODES if runs[m]["error"]]
    failures += [f"{m} result differs from auto" for m in MODES[1:] if runs[m]["match"] is False]
    better, ratio = auto_over_better(runs, statistic)
    other = next(name for name in STATISTICS if name != statistic)
    if ratio is not None and ratio > max_ratio:
        failures.append(f"auto {ratio:.2f}x {better} > --max-ratio {max_ratio}")
    same = better is not None and runs["auto"]["plan"] is not None and runs["auto"]["plan"] == runs[better]["plan"]
    return {"better": better, "statistic": statistic, "auto_over_best": ratio, f"auto_over_best_by_{other}": auto_over_better(runs, other)[1],
            "same_plan_as_better": same, "failures": failures}


def bench_placement(args, placement: str, files: list[Path], tmp: Path) -> list[dict]:
    """All queries in one placement; prints a line per query as it finishes."""
    profile = [] if args.profile is None else ["--profile", args.profile]
    if placement == "embedded":
        return [bench_one(args, placement, ["--warehouse", str(args.warehouse), *profile], path, tmp) for path in files]
    link = [] if args.link_mbps is None else ["--link-mbps", str(args.link_mbps)]
    with q.StorageNodes([args.warehouse], ["--threads", str(args.threads), *profile, *link]) as node:
        print(f"storage node {node.arg} over {args.warehouse}" + (f", profile {args.profile}" if profile else "")
              + (f", link {args.link_mbps:g} MB/s" if link else ""), flush=True)
        host_dir = tmp / "host-warehouse"  # the host reads nothing locally
        host_dir.mkdir(exist_ok=True)
        # The host runs on this machine, where the node's rates were measured (quarry calibrate).
        rates = Path(args.warehouse) / ".calibration.json"
        if rates.exists():
            shutil.copy(rates, host_dir / rates.name)
        base = ["--warehouse", str(host_dir), "--nodes", node.arg]
        return [bench_one(args, placement, base, path, tmp) for path in files]


def bench_one(args, placement: str, base: list[str], path: Path, tmp: Path) -> dict:
    runs = measure_query(path, [*base, "--threads", str(args.threads)], args.repeat, tmp, args.timeout)
    entry = {"name": path.stem, "placement": placement, "modes": runs, **verdict(runs, args.max_ratio, args.statistic)}
    print(query_line(entry), flush=True)
    return entry


# ------------------------------------------------------------------------------------ output


def query_line(e: dict) -> str:
    statistic = e["statistic"]

    def ms(m):
        b = e["modes"][m][f"{statistic}_ms"]
        return f"{b:9.1f}" if b is not None else f"{'ERROR':>9}"

    def ratio(value):
        return f"{value:5.2f}" if value is not None else f"{'-':>5}"

    other = next(name for name in STATISTICS if name != statistic)
    flag = "  FAIL: " + "; ".join(e["failures"]) if e["failures"] else ""
    same = f"  same plan as {e['better']}" if e.get("same_plan_as_better") else ""
    return (f"{e['name']:6} {e['placement']:8} auto {ms('auto')}  on {ms('on')}  off {ms('off')} ms  "
            f"better {e['better'] or '-':3}  auto/best {ratio(e['auto_over_best'])} ({other} {ratio(e[f'auto_over_best_by_{other}'])}){same}{flag}")


def summarize(entries: list[dict]) -> dict:
    """Per placement: the geomean of auto / best(on, off), the failures, each mode's noise."""
    out = {}
    for placement in dict.fromkeys(e["placement"] for e in entries):
        es = [e for e in entries if e["placement"] == placement]
        out[placement] = {
            "queries": len(es),
            "geomean_auto_over_best": q.geomean(e["auto_over_best"] for e in es),
            "on_better": sum(1 for e in es if e["better"] == "on"),
            "off_better": sum(1 for e in es if e["better"] == "off"),
            "failed": sum(1 for e in es if e["failures"]),
            "noise": {m: q.median_spread(e["modes"][m]["times_ms"] for e in es if not e["modes"][m]["error"])
                      for m in MODES},
        }
    return out


def print_summary(entries: list[dict], summary: dict, max_ratio: float) -> None:
    for e in entries:
        for m in MODES:
            if e["modes"][m]["mismatch"]:
                print(f"--- {e['name']} ({e['placement']}): {m} differs from auto\n{e['modes'][m]['mismatch']}")
    for placement, s in summary.items():
        g = s["geomean_auto_over_best"]
        noise = ", ".join(f"{m} {100 * v:.1f}%" if v is not None else f"{m} n/a" for m, v in s["noise"].items())
        print(f"{placement}: {s['queries']} queries, geomean auto/best(on,off) "
              f"{f'{g:.2f}' if g is not None else 'n/a'}, on faster in {s['on_better']}, off in {s['off_better']}; "
              f"{s['failed']} failed (bound {max_ratio}); noise (median (max-min)/min) {noise}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if not q.list_tables(args.warehouse):
        sys.exit(f"{args.warehouse} holds no tables: run `quarry --warehouse {args.warehouse} gen {args.suite} --sf SF`")
    files = select_queries(args)
    placements = ["embedded", "node"] if args.placement == "both" else [args.placement]
    print(f"{args.suite.upper()} in {args.warehouse}, {args.threads} threads, warm-up + {args.statistic} of {args.repeat}, "
          f"modes interleaved, {q.quarry_bin()}", flush=True)
    entries = []
    with tempfile.TemporaryDirectory(prefix="bench-modes-") as tmp:
        for placement in placements:
            entries += bench_placement(args, placement, files, Path(tmp))
    summary = summarize(entries)
    print_summary(entries, summary, args.max_ratio)
    failures = [{"query": e["name"], "placement": e["placement"], "problem": f} for e in entries for f in e["failures"]]
    if args.json:
        report = {
            "command": shlex.join([sys.executable, sys.argv[0] if argv is None else __file__,
                                   *(sys.argv[1:] if argv is None else argv)]),
            "git": q.git_state(),
            "quarry_bin": q.binary_info(),
            "suite": args.suite,
            "warehouse": str(Path(args.warehouse).resolve()),
            "threads": args.threads,
            "link_mbps": args.link_mbps,
            "profile": args.profile,
            "repeat": args.repeat,
            "max_ratio": args.max_ratio,
            "statistic": f"{args.statistic} --stats wall_ms of the timed rounds after one warm-up round; modes interleaved",
            "queries": entries,
            "summary": summary,
            "failures": failures,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    for f in failures:
        print(f"FAIL {f['query']} ({f['placement']}): {f['problem']}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
