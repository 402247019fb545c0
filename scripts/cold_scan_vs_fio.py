#!/usr/bin/env python3
"""The read bandwidth one large cold scan reaches, against what `fio` measures on the same files.

usage: cold_scan_vs_fio.py QUARRY WAREHOUSE [--table lineorder] [--repeat 3] [--threads 2]

The scan reads every column of TABLE whose type is fixed-width (integers, decimals, dates):
`SELECT count(*), max(c1), max(c2), ... FROM TABLE`, as `quarry sql` in a fresh process, the
warehouse's segment files evicted from the page cache before each run. Its bandwidth is the
bytes `--stats` says came from the device (`reads.bytes_from_device`) over its `wall_ms` (parse,
plan, every read, decoding: what a user waits for).

fio reads the same segment files whole, one after another, in the block size Quarry asks the
kernel for at a time (`WILLNEED_STEP` in `local_files.rs`, 512 KiB), at queue depths 1, 4 and 16,
both through the page cache (`psync`, the kernel's own readahead, as a plain reader gets) and
directly (`libaio`, `O_DIRECT`: the device alone). Files are evicted before each run; Quarry and
the fio modes take turns, `--repeat` rounds; each one's best run counts, the range of its runs
beside it. Prints each figure and Quarry's fraction of the best fio figure.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quarry_py import evict_from_page_cache, segment_paths  # noqa: E402

BLOCK = "512k"


def fixed_width_columns(quarry: str, warehouse: Path, table: str) -> list[str]:
    listing = subprocess.run([quarry, "--warehouse", str(warehouse), "tables", "--json"], capture_output=True, text=True, check=True)
    tables = json.loads(listing.stdout)
    entry = next(t for t in tables if t["name"] == table)
    wanted = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "DECIMAL", "DATE", "FLOAT", "DOUBLE", "REAL")
    return [c["name"] for c in entry["columns"] if str(c["type"]).upper().startswith(wanted)]


def fio_mb_per_s(files: list[Path], engine: str, depth: int, direct: bool) -> float:
    evict_from_page_cache(files)
    command = ["fio", "--name=scan", "--filename=" + ":".join(str(f) for f in files), "--file_service_type=sequential", "--rw=read",
               f"--bs={BLOCK}", f"--iodepth={depth}", f"--ioengine={engine}", f"--direct={int(direct)}", "--readonly", "--output-format=json"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    read = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return read["bw_bytes"] / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("quarry")
    ap.add_argument("warehouse", type=Path)
    ap.add_argument("--table", default="lineorder")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    files = [Path(p) for p in segment_paths(a.warehouse, a.table)]
    total = sum(f.stat().st_size for f in files)
    columns = fixed_width_columns(a.quarry, a.warehouse, a.table)
    sql = f"SELECT count(*), {', '.join(f'max({c})' for c in columns)} FROM {a.table}"
    here = Path(__file__).resolve().parent
    commit = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", "../crates", "../Cargo.toml", "../Cargo.lock"], capture_output=True, text=True).stdout.strip()
    print(f"# $ python3 {' '.join(sys.argv)}")
    print(f"# commit {commit}{' (code changed since: dirty)' if dirty else ''}, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}; "
          f"{subprocess.run(['fio', '--version'], capture_output=True, text=True).stdout.strip()}")
    print(f"# {a.table}: {len(files)} segment files, {total / 1e6:.0f} MB; block {BLOCK}; {a.repeat} rounds of Quarry and each fio mode in turn, best of each, files evicted before every run")
    print(f"# quarry: {sql}")
    modes = ["quarry"] + [f"fio {engine}{' O_DIRECT' if direct else ' buffered'} qd {depth}"
                          for engine, direct in (("psync", False), ("libaio", True)) for depth in ((1,) if engine == "psync" else (1, 4, 16))]
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    quarry_best = None
    with tempfile.TemporaryDirectory() as tmp:
        stats_path = Path(tmp) / "stats.json"
        # Rounds: in each, Quarry and every fio mode once, in turn, so that a device whose speed
        # drifts (a cloud disk's does) weighs on all of them alike.
        for _ in range(a.repeat):
            evict_from_page_cache(files)
            subprocess.run([a.quarry, "--warehouse", str(a.warehouse), "--threads", str(a.threads), "sql", sql, "--stats", str(stats_path)],
                           capture_output=True, text=True, check=True)
            stats = json.loads(stats_path.read_text())
            reads = stats["reads"]
            rate = reads["bytes_from_device"] / 1e6 / (stats["wall_ms"] / 1e3)
            rates["quarry"].append(rate)
            if quarry_best is None or rate > quarry_best[0]:
                quarry_best = (rate, stats["wall_ms"], reads)
            for mode in modes[1:]:
                _, engine, kind, _, depth = mode.split()
                rates[mode].append(fio_mb_per_s(files, engine, int(depth), kind == "O_DIRECT"))
    rate, wall_ms, reads = quarry_best
    spread = lambda mode: f"(runs {min(rates[mode]):.0f}-{max(rates[mode]):.0f})"
    print(f"{'quarry':30} {rate:8.0f} MB/s {spread('quarry')}: {reads['bytes_from_device'] / 1e6:.0f} MB from the device of "
          f"{reads['bytes'] / 1e6:.0f} MB read, {reads['requests']} requests, in {wall_ms:.0f} ms")
    for mode in modes[1:]:
        print(f"{mode:30} {max(rates[mode]):8.0f} MB/s {spread(mode)}")
    best_mode = max(modes[1:], key=lambda m: max(rates[m]))
    print(f"quarry reaches {rate / max(rates[best_mode]):.2f} of the best fio figure ({best_mode}: {max(rates[best_mode]):.0f} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
