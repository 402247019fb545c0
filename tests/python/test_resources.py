"""Bounded resources: generators claim bounded memory at any scale factor; a query stays within
the host's memory budget (`--memory`).

Generators. Method: run `quarry gen ssb` at two scale factors five times apart; each reports its own peak
resident set size (`VmHWM`, with QUARRY_REPORT_PEAK_RSS set). The
generator keeps at most one chunk per thread in flight, so the peak must not grow with the data:
the larger run may use at most 25% more (allocator noise) than the smaller one, while its data is
5x larger.

Queries. Method: a sort of `lineitem` by its comment text needs more than a 12 MB budget, so
under `--memory 12MB` it spills (EXPLAIN ANALYZE: `spill_count` above 0, and 0 under the default
budget) and its result still equals DuckDB's; a hash join whose build side cannot fit in 1 MB
(and cannot spill) fails with an error that names the budget, and a malformed budget is
refused with one that names the flag.
"""

from __future__ import annotations


import re

import quarry_py


def peak_rss_mib(args: list[str]) -> float:
    return quarry_py.run_quarry_measured(args, timeout=600)[1]


def test_ssb_generation_memory_does_not_grow_with_scale(quarry_bin, tmp_path):
    small = peak_rss_mib([quarry_bin, "--warehouse", str(tmp_path / "small"), "--threads", "2", "gen", "ssb", "--sf", "0.4"])
    large = peak_rss_mib([quarry_bin, "--warehouse", str(tmp_path / "large"), "--threads", "2", "gen", "ssb", "--sf", "2"])
    assert large <= small * 1.25 + 16, f"peak RSS {large:.0f} MiB at SF 2 vs {small:.0f} MiB at SF 0.4"


SORT_SQL = "select l_orderkey, l_linenumber, l_comment from lineitem order by l_comment, l_orderkey, l_linenumber"


def spill_counts(warehouse, extra: list[str]) -> list[int]:
    out = quarry_py.run_quarry([*extra, "sql", "--format", "csv", f"EXPLAIN ANALYZE {SORT_SQL}"], warehouse).stdout
    return [int(n) for n in re.findall(r"SortExec[^\n]*?spill_count=(\d+)", out)]


def test_sort_spills_within_the_host_budget(tpch_warehouse, tmp_path):
    assert spill_counts(tpch_warehouse, []) and max(spill_counts(tpch_warehouse, [])) == 0
    assert max(spill_counts(tpch_warehouse, ["--memory", "12MB"])) > 0
    out = tmp_path / "sorted.parquet"
    quarry_py.run_quarry(["--memory", "12MB", "sql", SORT_SQL, "--format", "parquet", "--output", out], tpch_warehouse)
    con = quarry_py.duckdb_connect(tpch_warehouse, threads=2)
    try:
        duck = quarry_py.duckdb_result(con, SORT_SQL)
    finally:
        con.close()
    cmp = quarry_py.compare_query_results(SORT_SQL, quarry_py.read_parquet_result(out), duck)
    assert cmp, cmp


def test_a_join_beyond_the_host_budget_fails_clearly(tpch_warehouse):
    sql = "select o_orderpriority, count(*) from orders join lineitem on o_orderkey = l_orderkey group by o_orderpriority"
    proc = quarry_py.run_quarry(["--memory", "1MB", "--star-join", "off", "sql", sql], tpch_warehouse, check=False)
    assert proc.returncode != 0
    assert "needs more memory than the host's budget (--memory)" in proc.stderr, proc.stderr
    proc = quarry_py.run_quarry(["--memory", "lots", "sql", "select 1"], tpch_warehouse, check=False)
    assert proc.returncode != 0 and "--memory" in proc.stderr and "lots" in proc.stderr, proc.stderr


def test_bench_memory_runs_each_engine_once_over_the_whole_suite(ssb_warehouse, tmp_path):
    """scripts/bench_memory.py: both engines run every SSB query in one process and report a
    peak; a Quarry run that fails (a warehouse without the tables) is a failure, not a figure."""
    import json
    import subprocess
    import sys

    script = quarry_py.REPO_ROOT / "scripts" / "bench_memory.py"
    report = tmp_path / "memory.json"
    proc = subprocess.run([sys.executable, str(script), "--suite", "ssb", "--warehouse", str(ssb_warehouse),
                           "--repeat", "1", "--json", str(report)], capture_output=True, text=True, timeout=600)
    record = json.loads(report.read_text())
    summary = record["summary"]
    assert summary["failures"] == [] or summary["failures"][0].startswith("quarry's peak"), proc.stdout
    assert len(record["queries"]) == 13
    assert 0 < summary["python_interpreter_mib"] < summary["duckdb_process_peak_mib"]
    assert summary["quarry_peak_mib"] > 0 and summary["ratio"] == summary["quarry_peak_mib"] / summary["duckdb_peak_mib"]

    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, str(script), "--suite", "ssb", "--warehouse", str(empty), "--repeat", "1",
                           "--json", str(report)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    failures = json.loads(report.read_text())["summary"]["failures"]
    assert any(f.startswith("quarry:") and "lineorder" in f for f in failures), failures
