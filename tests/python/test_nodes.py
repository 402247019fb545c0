"""Storage node processes (`quarry serve`): authentication, failures mid-query, metrics, and
Kim's in-storage join within a device memory budget.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest

import quarry_py as q
from conftest import assert_no_panic

# TPC-H Q14's join (Kim et al. 2015's scan+join workload): part joined with a month of lineitem.
Q14_JOIN = """
SELECT 100.00 * sum(CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END)
       / sum(l_extendedprice * (1 - l_discount)) AS promo_revenue,
       count(*) AS line_count
FROM lineitem JOIN part ON l_partkey = p_partkey
WHERE l_shipdate >= DATE '1995-09-01' AND l_shipdate < DATE '1995-10-01'
"""


def _sql(urls, sql, *extra, check=True, warehouse="/nonexistent-warehouse", timeout=120):
    return q.run_quarry(["sql", sql, "--nodes", urls, *extra], warehouse, check=check, timeout=timeout)


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret-token-for-tests\n")
    return path


def test_token_required(tpch_warehouse, token_file, tmp_path):
    with q.StorageNodes([tpch_warehouse], ["--token-file", token_file]) as node:
        sql = "SELECT count(*) FROM nation"
        missing = _sql(node.arg, sql, check=False)
        assert missing.returncode != 0
        assert "requires a token" in missing.stderr, missing.stderr
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-token\n")
        refused = _sql(node.arg, sql, "--token-file", wrong, check=False)
        assert refused.returncode != 0
        assert "wrong token" in refused.stderr, refused.stderr
        ok = _sql(node.arg, sql, "--token-file", token_file, "--format", "csv")
        assert ok.stdout.strip().splitlines()[-1] == "25"
        for proc in (missing, refused):
            assert_no_panic(proc.stdout, proc.stderr)


def test_refuses_non_loopback_without_token(tpch_warehouse):
    proc = q.run_quarry(["serve", "--listen", "0.0.0.0:0"], tpch_warehouse, check=False, timeout=60)
    assert proc.returncode != 0
    assert "refusing to listen on 0.0.0.0" in proc.stderr, proc.stderr


def test_node_killed_mid_query_is_an_error_within_5s(tpch_warehouse):
    # A slow link keeps the passthrough scan streaming for much longer than the test waits.
    node = q.start_node(tpch_warehouse, ["--link-mbps", "1"])
    try:
        url = q.read_node_url(node)
        query = subprocess.Popen(
            [q.quarry_bin(), "--warehouse", "/nonexistent-warehouse", "sql", "SELECT * FROM lineitem",
             "--nodes", url, "--pushdown", "off", "--format", "csv", "--output", "/dev/null"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(2.0)
        assert query.poll() is None, f"the query ended before the node was killed: {query.communicate()}"
        node.kill()
        killed_at = time.monotonic()
        _, stderr = query.communicate(timeout=30)
        elapsed = time.monotonic() - killed_at
    finally:
        node.kill()
        node.wait()
    assert query.returncode != 0, "a query whose node died reported success"
    assert elapsed < 5.0, f"the error took {elapsed:.1f} s"
    assert url in stderr, f"the error does not name the node {url}: {stderr}"
    assert_no_panic(stderr)


def test_metrics_endpoint(tpch_warehouse):
    with q.StorageNodes([tpch_warehouse], ["--metrics-listen", "127.0.0.1:0"]) as node:
        _sql(node.arg, "SELECT count(*) FROM orders WHERE o_totalprice > 1000", "--pushdown", "on")
        proc = node.procs[0]
        # The node names its metrics address on stderr once it listens.
        deadline = time.monotonic() + 10
        address = None
        while address is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if "metrics on " in line:
                address = line.split("metrics on ", 1)[1].strip()
        assert address, "the node did not report its metrics address"
        text = urllib.request.urlopen(address, timeout=5).read().decode()
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("#")
    }
    assert values["quarry_node_fragments_total"] >= 1, text
    assert values["quarry_node_bytes_read_total"] > 0, text
    assert values["quarry_node_rows_scanned_total"] > 0, text


def test_grace_join_in_storage_within_device_memory(tpch_warehouse, tmp_path):
    """Kim's join: part joined with lineitem inside one node by the Grace hash join, with a device
    memory budget smaller than either input, equal to DuckDB's result."""
    sizes = {t: sum(s["bytes"] for s in q.read_manifest(tpch_warehouse, t)["segments"]) for t in ("part", "lineitem")}
    memory = 256 << 10  # the join gets half of it
    assert memory < min(sizes.values()), sizes
    duck_con = q.duckdb_connect(tpch_warehouse, threads=2)
    duck = q.duckdb_result(duck_con, Q14_JOIN)
    duck_con.close()
    with q.StorageNodes([tpch_warehouse], ["--device-memory", f"{memory}B", "--device-threads", "1"]) as node:
        out, stats = tmp_path / "q14.parquet", tmp_path / "q14.json"
        _sql(node.arg, Q14_JOIN, "--pushdown", "on", "--format", "parquet", "--output", out, "--stats", stats)
        quarry = q.read_parquet_result(out)
    cmp = q.compare_query_results(Q14_JOIN, quarry, duck)
    assert cmp, f"Quarry and DuckDB disagree\n{cmp}"
    detail = json.loads(stats.read_text())
    storage_ops = [op["operator"] for op in detail["operators"] if op["side"] == "storage"]
    assert "GraceHashJoinExec" in storage_ops, storage_ops
    assert detail["device"]["spilled_bytes"] > 0, detail["device"]
    # Only the partial aggregate's row(s) cross the link.
    assert detail["bytes_over_link"] < 10_000, detail["bytes_over_link"]
