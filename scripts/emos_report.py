#!/usr/bin/env python3
"""EMOS over a real query trace: a storage node records its reads (`quarry serve --io-trace`)
while the TPC-H queries run through it, then `quarry model emos` charges the trace on each
platform of Table 4.4 at several page-cache sizes, with and without read-ahead.

    python3 scripts/emos_report.py --warehouse /path/to/tpch-sf1 --out docs/benchmarks/emos

Writes OUT/tpch-trace.json (command, commit, binary, trace statistics, every simulation) and
OUT/tpch-trace.txt (the same as a table). The trace itself is kept beside them only with --keep-trace.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quarry_py as q  # noqa: E402

PLATFORMS = ["windows-rt", "android"]
CACHES = ["0", "64MB", "256MB", "1GB"]
PREFETCH = [0, 32]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warehouse", required=True, help="warehouse holding the TPC-H tables")
    parser.add_argument("--out", required=True, help="directory for the report")
    parser.add_argument("--queries", default=None, help="comma-separated query names (default: all 22)")
    parser.add_argument("--keep-trace", action="store_true", help="copy the trace into OUT")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = q.select_query_files("tpch", args.queries)
    with tempfile.TemporaryDirectory() as scratch:
        trace = Path(scratch) / "tpch.trace"
        failures = []
        with q.StorageNodes([args.warehouse], ["--io-trace", trace]) as node:
            for path in files:
                run = q.run_quarry(["sql", "-f", path, "--nodes", node.arg, "--format", "csv"], "/nonexistent-warehouse", check=False)
                if run.returncode != 0:
                    failures.append(f"{path.stem}: {q.error_line(run.stderr, run.returncode)}")
        lines = [line.split() for line in trace.read_text().splitlines() if line.strip()]
        stats = {"requests": len(lines), "bytes": sum(int(f[4]) for f in lines),
                 "files": len({f[2] for f in lines}), "seconds": max((float(f[0]) for f in lines), default=0.0)}
        runs = []
        for platform in PLATFORMS:
            for cache in CACHES:
                for prefetch in PREFETCH:
                    summary = json.loads(q.run_quarry(["model", "emos", trace, "--platform", platform, "--cache", cache,
                                                       "--prefetch", str(prefetch), "--json"]).stdout)
                    runs.append({"platform": platform, "cache": cache, "prefetch_pages": prefetch, "summary": summary})
        if args.keep_trace:
            shutil.copy(trace, out / "tpch.trace")
    record = {"command": shlex.join([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])]),
              "git": q.git_state(), "quarry_bin": q.binary_info(), "warehouse": args.warehouse,
              "queries": [p.stem for p in files], "failures": failures, "trace": stats, "simulations": runs}
    (out / "tpch-trace.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    text = [f"# EMOS over the reads of TPC-H queries {', '.join(record['queries'])} on one storage node",
            f"# {record['command']}", f"# commit {record['git'].get('commit')} (dirty: {record['git'].get('dirty')})",
            f"# trace: {stats['requests']} reads, {stats['bytes'] / 1e6:.1f} MB of {stats['files']} files over {stats['seconds']:.1f} s",
            f"# failures: {failures or 'none'}", "",
            f"{'platform':<11} {'cache':>6} {'ahead':>5} {'hit MB':>9} {'miss MB':>9} {'energy J':>9} {'uJ/KB':>7}"]
    for r in runs:
        s = r["summary"]
        kb = (s["bytes_read"] + s["bytes_written"]) / 1024
        text.append(f"{r['platform']:<11} {r['cache']:>6} {r['prefetch_pages']:>5} {s['hit_bytes'] / 1e6:>9.1f} "
                    f"{s['miss_bytes'] / 1e6:>9.1f} {s['energy_j']:>9.3f} {s['energy_j'] * 1e6 / kb if kb else 0:>7.1f}")
    (out / "tpch-trace.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    print("\n".join(text))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
