"""How much of each query's time is planning: parse, logical and physical optimization, placement.

usage: plan_share.py QUARRY WAREHOUSE SQLDIR [--threads 2] [--repeat 3] [--out FILE]

Each file runs R+1 times as its own `quarry sql -f` (first run discarded), as the reference
harness runs it; of the run with the best `wall_ms` (from --stats) it prints `plan_ms` beside it
and their ratio, then the suite's totals and the median share. Planning is a fixed cost per query
that DuckDB's few-millisecond planner mostly does not pay: this says where it weighs.
"""
import argparse, glob, json, os, statistics, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("quarry"); ap.add_argument("warehouse"); ap.add_argument("sqldir")
ap.add_argument("--threads", type=int, default=2); ap.add_argument("--repeat", type=int, default=3)
ap.add_argument("--out", help="also write the table to this file, headed by the command")
a = ap.parse_args()

tmp = tempfile.mkdtemp(prefix="plan-share-")
lines, plan_total, wall_total, shares, failed = [], 0.0, 0.0, [], []
for f in sorted(glob.glob(os.path.join(a.sqldir, "*.sql"))):
    name = os.path.basename(f)[:-4]
    best = None
    for i in range(a.repeat + 1):
        st = os.path.join(tmp, "s.json")
        r = subprocess.run([a.quarry, "--warehouse", a.warehouse, "--threads", str(a.threads), "sql", "-f", f,
                            "--format", "csv", "--output", os.path.join(tmp, "out.csv"), "--stats", st],
                           capture_output=True, text=True)
        if r.returncode != 0:
            best = None; failed.append(f"{name}: {(r.stderr.strip().splitlines() or ['exit %d' % r.returncode])[-1][:150]}"); break
        if i == 0: continue
        s = json.load(open(st))
        if best is None or s["wall_ms"] < best["wall_ms"]: best = s
    if best is None: continue
    plan, wall = best["plan_ms"], best["wall_ms"]
    plan_total += plan; wall_total += wall; shares.append(plan / wall)
    line = f"{name:8s} plan {plan:8.1f} ms  wall {wall:8.1f} ms  share {plan / wall:5.2f}"
    print(line, flush=True); lines.append(line)
summary = [f"{len(shares)} queries: planning {plan_total:.0f} ms of {wall_total:.0f} ms ({plan_total / max(wall_total, 1e-9):.2f}); "
           f"median share {statistics.median(shares) if shares else 0:.2f}"] + [f"FAILED {x}" for x in failed]
for line in summary: print(line)
if a.out:
    with open(a.out, "w") as out:
        commit = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        out.write(f"# $ python3 scripts/plan_share.py {' '.join(sys.argv[1:])}\n")
        out.write(f"# commit {commit}, binary {a.quarry}, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}\n")
        out.write("\n".join(lines + summary) + "\n")
sys.exit(1 if failed else 0)
