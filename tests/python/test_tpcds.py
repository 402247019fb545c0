"""Differential tests: the 99 TPC-DS queries, Quarry vs DuckDB on the same segments.

``scripts/gen_tpcds.py`` (DuckDB's dsdgen, in a virtualenv of its own) loads TPC-DS at SF 0.1
(or $QUARRY_TPCDS_TEST_SF) once per session with ``quarry load``; DuckDB reads exactly the
Parquet segments of each table's current manifest. Each query file runs through
``quarry sql -f FILE`` and through DuckDB, and the results must be equal
(``quarry_py.compare_query_results``: ordered under a top-level ORDER BY, ties in any order).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import quarry_py as q

TPCDS_FILES = q.query_files("tpcds")


@pytest.fixture(scope="session")
def tpcds_warehouse(tmp_path_factory, quarry_bin):
    sf = os.environ.get("QUARRY_TPCDS_TEST_SF", "0.1")
    wh = tmp_path_factory.mktemp("wh-tpcds")
    subprocess.run([sys.executable, str(q.REPO_ROOT / "scripts" / "gen_tpcds.py"), "--sf", sf, "--warehouse", str(wh)],
                   check=True, timeout=1800, env={**os.environ, "QUARRY_BIN": quarry_bin})
    return wh


@pytest.fixture(scope="module")
def tpcds_duck(tpcds_warehouse):
    con = q.duckdb_connect(tpcds_warehouse, threads=2)
    yield con
    con.close()


def test_query_files_present():
    assert [p.stem for p in TPCDS_FILES] == [f"q{i:02d}" for i in range(1, 100)]


def test_tables_hold_what_dsdgen_made(tpcds_warehouse, tpcds_duck, tmp_path):
    rows = json.loads((tpcds_warehouse / "tpcds.json").read_text())["rows"]
    assert len(rows) == 24
    assert sorted(q.list_tables(tpcds_warehouse)) == sorted(rows)
    counts = " union all ".join(f"select '{t}', count(*) from {t}" for t in sorted(rows))
    got = q.quarry_query(tpcds_warehouse, counts, out_dir=tmp_path)
    assert dict(got.rows) == rows
    assert rows["store_sales"] > 0 and rows["inventory"] > 0


@pytest.mark.parametrize("path", TPCDS_FILES, ids=[f"tpcds-{p.stem}" for p in TPCDS_FILES])
def test_tpcds_query(tpcds_warehouse, tpcds_duck, path, tmp_path):
    q.assert_file_query_equals_duckdb(tpcds_warehouse, tpcds_duck, path, tmp_path)


def test_bench_runs_the_suite_on_the_warehouse_it_finds(tpcds_warehouse, quarry_bin, tmp_path):
    """``quarry bench tpcds`` reads the scale factor gen_tpcds.py recorded and runs the queries."""
    out = tmp_path / "bench.json"
    sf = json.loads((tpcds_warehouse / "tpcds.json").read_text())["scale_factor"]
    q.run_quarry(["bench", "tpcds", "--repeat", "1", "--queries", "q03,q96", "--json", str(out)], tpcds_warehouse)
    report = json.loads(out.read_text())
    assert report["sf"] == sf
    assert [r["name"] for r in report["queries"]] == ["q03", "q96"]
    assert all(r["rows"] > 0 for r in report["queries"])
    wrong = subprocess.run([quarry_bin, "--warehouse", str(tpcds_warehouse), "bench", "tpcds", "--sf", "7"],
                           capture_output=True, text=True)
    assert wrong.returncode != 0
    assert f"holds TPC-DS SF {sf}, not SF 7" in wrong.stderr


def test_bench_names_what_is_missing(warehouse, quarry_bin):
    proc = subprocess.run([quarry_bin, "--warehouse", str(warehouse), "bench", "tpcds"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "no TPC-DS table 'call_center'" in proc.stderr
    assert "scripts/gen_tpcds.py" in proc.stderr


def test_operators_of_our_own_carry_row_estimates(tpcds_warehouse):
    """A star join reports its fallback aggregate's estimate and a key-set collector its
    input's: DataFusion's join selection reads them. With the star join's rows unknown, q14's
    INTERSECT built its hash table on 860K rows of catalog sales (SF 1) to probe 3.8K groups."""
    sql = q.strip_sql_comments((q.REPO_ROOT / "queries" / "tpcds" / "q14.sql").read_text(encoding="utf-8"))
    plan = q.run_quarry(["--threads", "2", "sql", "--format", "csv", f"EXPLAIN {sql}"], tpcds_warehouse,
                        env={"DATAFUSION_EXPLAIN_SHOW_STATISTICS": "true"}).stdout
    ours = [line for line in plan.splitlines() if "StarAggregateExec:" in line or "KeySetCollectExec:" in line]
    assert any("StarAggregateExec" in line for line in ours) and any("KeySetCollectExec" in line for line in ours), plan
    unknown = [line.strip()[:160] for line in ours if "statistics=[Rows=Absent" in line]
    assert not unknown, "\n".join(unknown)


def test_pushed_down_union_branch_on_a_node(tpcds_warehouse, tpcds_duck, tmp_path):
    """q05 with every operator that can run on a served node there (``--pushdown on``): each
    UNION ALL branch's projection casts a literal where the other branches have a column, and
    the node, planning the branch again from the wire, knows that column is never NULL where
    the host's plan says it may be. The host takes the batch under its own schema (RecordBatch
    validation still refuses a NULL where the host's schema has none); equal to DuckDB."""
    path = next(p for p in TPCDS_FILES if p.stem == "q05")
    out = tmp_path / "out.parquet"
    with q.StorageNodes([tpcds_warehouse]) as node:
        run = q.run_quarry(["sql", "-f", str(path), "--nodes", node.arg, "--pushdown", "on", "--format", "parquet", "--output", str(out)],
                           tmp_path / "host", check=False)
        assert run.returncode == 0, run.stderr
    sql = path.read_text(encoding="utf-8")
    cmp = q.compare_query_results(sql, q.read_parquet_result(out), q.duckdb_result(tpcds_duck, sql))
    assert cmp, cmp
