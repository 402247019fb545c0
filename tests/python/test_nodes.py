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


def _node_metrics(node) -> tuple[dict[str, float], str]:
    """The metrics of the first node of `node` (started with --metrics-listen), by name, and
    their text."""
    proc = node.procs[0]
    address = getattr(node, "metrics_address", None)
    # The node names its metrics address on stderr once it listens.
    deadline = time.monotonic() + 10
    while address is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "metrics on " in line:
            address = line.split("metrics on ", 1)[1].strip()
    assert address, "the node did not report its metrics address"
    node.metrics_address = address
    text = urllib.request.urlopen(address, timeout=5).read().decode()
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("#")}
    return values, text


def test_metrics_endpoint(tpch_warehouse, tmp_path):
    stats_file = tmp_path / "stats.json"
    with q.StorageNodes([tpch_warehouse], ["--metrics-listen", "127.0.0.1:0"]) as node:
        _sql(node.arg, "SELECT count(*) FROM orders WHERE o_totalprice > 1000", "--pushdown", "on", "--stats", stats_file)
        values, text = _node_metrics(node)
    assert values["quarry_node_fragments_total"] >= 1, text
    assert values["quarry_node_bytes_read_total"] > 0, text
    assert values["quarry_node_rows_scanned_total"] > 0, text
    # The node's totals are its fragments' counters, the ones the host's --stats adds up.
    stats = json.loads(stats_file.read_text())
    assert values["quarry_node_rows_scanned_total"] == stats["rows_scanned"], (text, stats)
    assert values["quarry_node_bytes_read_storage_total"] == stats["bytes_read_storage"] > 0, (text, stats)
    assert values["quarry_node_segments_requested_total"] == stats["segments_requested"] > 0, (text, stats)
    assert values["quarry_node_device_cpu_seconds_total"] > 0, text


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


# What a node process holds outside its device memory: code, runtime and thread stacks (about
# 35 MB at rest here), and the buffers operators use without reserving them (Parquet pages being
# decoded, IPC messages in flight, the allocator's caches).
NODE_FIXED_OVERHEAD = 128 << 20


def _peak_rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status", encoding="ascii"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def test_concurrent_joins_and_graph_jobs_share_one_device_memory(tpch_warehouse, tmp_path):
    """Eight clients at once, each a join pushed into the node and a graph job asking for half
    the device's memory: none fails, every join is right, and the node's peak RSS stays within
    its device memory plus a fixed overhead (the jobs wait for memory instead of piling up)."""
    import shutil
    import threading

    device = 256 << 20
    warehouse = tmp_path / "node"
    shutil.copytree(tpch_warehouse, warehouse)
    duck_con = q.duckdb_connect(tpch_warehouse, threads=2)
    duck = q.duckdb_result(duck_con, Q14_JOIN)
    duck_con.close()
    clients = 8
    with q.StorageNodes([warehouse], ["--device-memory", f"{device}B"]) as node:
        on_node = ["--nodes", node.arg]
        for i in range(clients):
            q.run_quarry([*on_node, "graph", "gen", "kron", f"k{i}", "--scale", "17", "--memory", "16MB"], tmp_path / "host")
        failures, results = [], {}

        def client(i: int) -> None:
            out, stats = tmp_path / f"q14-{i}.parquet", tmp_path / f"q14-{i}.json"
            joined = q.run_quarry([*on_node, "sql", Q14_JOIN, "--pushdown", "on", "--format", "parquet", "--output", out, "--stats", stats], tmp_path / "host", check=False)
            graph = q.run_quarry([*on_node, "graph", "pagerank", f"k{i}", "--iterations", "3", "--memory", f"{device // 2}B"], tmp_path / "host", check=False)
            for proc in (joined, graph):
                if proc.returncode != 0:
                    failures.append(proc.stderr)
            results[i] = (out, stats)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        peak = _peak_rss(node.procs[0].pid)
    assert not failures, failures
    for out, stats in results.values():
        cmp = q.compare_query_results(Q14_JOIN, q.read_parquet_result(out), duck)
        assert cmp, f"Quarry and DuckDB disagree\n{cmp}"
        storage_ops = [op["operator"] for op in json.loads(stats.read_text())["operators"] if op["side"] == "storage"]
        assert "GraceHashJoinExec" in storage_ops, storage_ops
    assert peak <= device + NODE_FIXED_OVERHEAD, f"peak RSS {peak >> 20} MB over {device >> 20} MB + {NODE_FIXED_OVERHEAD >> 20} MB"


def test_fragments_wait_until_their_memory_demand_fits(tpch_warehouse, tmp_path):
    """Hetero-DB's admission: each pushed-down fragment carries its weighted memory demand
    (EXPLAIN shows it); on a node whose device memory holds one such fragment at a time, the
    others wait for it (the node's queued time grows) and every answer is still right. A slow
    link makes each fragment last about a second."""
    sql = "SELECT l_orderkey, sum(l_quantity) AS qty FROM lineitem GROUP BY l_orderkey ORDER BY l_orderkey LIMIT 20"
    explain, values, text = _concurrent_clients_on_a_small_node(tpch_warehouse, tmp_path, sql, "1MB")
    demands = _memory_demands(explain)
    assert demands and max(demands) >= 1.0, explain
    # Measured: 0.69 s; admitted at once (no demand), 0.002 s (64 session slots).
    assert values["quarry_node_queued_seconds_total"] > 0.2, text


def _concurrent_clients_on_a_small_node(tpch_warehouse, tmp_path, sql, device_memory, clients=3):
    """Runs `sql` pushed down from `clients` concurrent clients on one node of `device_memory`
    behind a 1 MB/s link, checks every answer against DuckDB's, then reads the node's Prometheus
    metrics: the query's EXPLAIN, the metrics' values by name, and their text."""
    import threading

    duck_con = q.duckdb_connect(tpch_warehouse, threads=2)
    duck = q.duckdb_result(duck_con, sql)
    duck_con.close()
    outputs, failures = [], []

    def client(i: int) -> None:
        out = tmp_path / f"client-{i}.parquet"
        proc = _sql(node.arg, sql, "--pushdown", "on", "--format", "parquet", "--output", out, check=False)
        (outputs if proc.returncode == 0 else failures).append(out if proc.returncode == 0 else proc.stderr)

    with q.StorageNodes([tpch_warehouse], ["--device-memory", device_memory, "--link-mbps", "1", "--metrics-listen", "127.0.0.1:0"]) as node:
        explain = _sql(node.arg, "EXPLAIN " + sql, "--pushdown", "on").stdout
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        values, text = _node_metrics(node)
    assert not failures, failures
    for out in outputs:
        cmp = q.compare_query_results(sql, q.read_parquet_result(out), duck)
        assert cmp, f"Quarry and DuckDB disagree\n{cmp}"
    return explain, values, text


def _memory_demands(explain):
    """Each fragment's memory demand in an EXPLAIN, MB."""
    return [float(part.split(" MB")[0]) for part in explain.split("memory demand=")[1:]]


def test_fragments_wait_until_their_scans_fit(tpch_warehouse, tmp_path):
    """A pushed-down filter holds little operator memory (the host's estimate lets all three
    clients' fragments in at once) but its scan decodes row groups outside the memory pool: the
    node adds their size (the manifest's, as decompressed: about 4 MB at SF 0.05) to the
    fragment's demand, so on a 3 MB node the clients' fragments wait for each other, and every
    answer is still right."""
    sql = "SELECT l_orderkey, l_partkey FROM lineitem WHERE l_quantity < 10"
    explain, values, text = _concurrent_clients_on_a_small_node(tpch_warehouse, tmp_path, sql, "3MB")
    assert "FilterExec on storage" in explain and 3 * sum(_memory_demands(explain)) < 3.0, explain
    assert values["quarry_node_queued_seconds_total"] > 0.2, text


def test_disconnected_client_frees_its_session(tpch_warehouse):
    """With one session slot, a client killed mid-query must give its grant back: the next query
    runs instead of queueing forever."""
    with q.StorageNodes([tpch_warehouse], ["--max-sessions", "1", "--link-mbps", "1"]) as node:
        slow = subprocess.Popen(
            [q.quarry_bin(), "--warehouse", "/nonexistent-warehouse", "sql", "SELECT * FROM lineitem",
             "--nodes", node.arg, "--pushdown", "off", "--threads", "1", "--format", "none"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(1.5)
        assert slow.poll() is None, "the slow query ended early"
        slow.kill()
        slow.wait()
        started = time.monotonic()
        proc = _sql(node.arg, "SELECT count(*) FROM region", "--format", "csv", "--threads", "1", timeout=60)
        assert proc.stdout.strip().splitlines()[-1] == "5"
        assert time.monotonic() - started < 20


def test_top_k_and_partial_aggregate_run_on_the_nodes(tmp_path, quarry_bin, test_sf):
    """A single-table top-k and a grouped aggregate over a table spread on two nodes: each node
    returns its own top k / partial groups, the host merges them; equal to DuckDB."""
    root = tmp_path / "nodes"
    warehouses = [root / "a", root / "b"]
    with q.StorageNodes(warehouses) as nodes:
        q.run_quarry(["gen", "tpch", "--sf", str(test_sf), "--segment-rows", "40000", "--nodes", nodes.arg], root / "staging")
        con = q.duckdb_connect(warehouses, threads=2)
        cases = {
            "SELECT l_orderkey, l_linenumber, l_extendedprice FROM lineitem ORDER BY l_extendedprice DESC, l_orderkey, l_linenumber LIMIT 7": "SortExec",
            "SELECT l_returnflag, l_linestatus, count(*), sum(l_quantity) FROM lineitem GROUP BY 1, 2 ORDER BY 1, 2": "AggregateExec",
        }
        for sql, operator in cases.items():
            out, stats = tmp_path / "out.parquet", tmp_path / "stats.json"
            _sql(nodes.arg, sql, "--pushdown", "on", "--format", "parquet", "--output", out, "--stats", stats)
            cmp = q.compare_query_results(sql, q.read_parquet_result(out), q.duckdb_result(con, sql))
            assert cmp, f"{sql}\n{cmp}"
            detail = json.loads(stats.read_text())
            # Each node sent only its top k rows or its partial groups.
            fragments = [op for op in detail["operators"] if op["operator"] == "FragmentExec"]
            assert sum(op["rows_out"] for op in fragments) < 100, fragments
            explain = _sql(nodes.arg, "EXPLAIN " + sql, "--pushdown", "on").stdout
            storage_side = [line.split("storage side:", 1)[1] for line in explain.splitlines() if "storage side:" in line]
            assert any(operator in side for side in storage_side), explain
        con.close()


def test_load_to_nodes_and_a_failed_load_changes_nothing(tmp_path):
    good = tmp_path / "good.csv"
    good.write_text("id,amount\n" + "".join(f"{i},{i * 1.5}\n" for i in range(1000)))
    bad = tmp_path / "bad.csv"
    bad.write_text("id,amount\n1,2.5\n2,oops\n")
    with q.StorageNodes([tmp_path / "a", tmp_path / "b"]) as nodes:
        q.run_quarry(["load", "t", good, "--nodes", nodes.arg], tmp_path / "staging")
        count = "SELECT count(*), sum(id) FROM t"
        assert _sql(nodes.arg, count, "--format", "csv").stdout.strip().splitlines()[-1] == "1000,499500"
        failed = q.run_quarry(["load", "t", bad, "--append", "--nodes", nodes.arg], tmp_path / "staging", check=False)
        assert failed.returncode != 0
        assert "bad.csv:3" in failed.stderr, failed.stderr
        assert_no_panic(failed.stderr)
        assert _sql(nodes.arg, count, "--format", "csv").stdout.strip().splitlines()[-1] == "1000,499500"


# Many rows of lineitem through a filter on the node: the batches the link carries dominate.
WIDE_RESULT = ("SELECT l_orderkey, l_extendedprice, l_discount, l_shipdate, l_returnflag FROM lineitem "
               "WHERE l_shipdate >= DATE '1994-01-01'")


def test_slow_link_compresses_pushed_down_batches(tpch_warehouse, tmp_path):
    """On a slow link the cost model compresses what a pushed-down fragment sends (EXPLAIN names
    the codec): the link carries well under the bytes the same fragment sends uncompressed over
    an unlimited link (where nothing is compressed), and the rows are DuckDB's either way."""
    con = q.duckdb_connect(tpch_warehouse, threads=2)
    try:
        duck = q.duckdb_result(con, WIDE_RESULT)
    finally:
        con.close()
    link_bytes = {}
    for link_args, compressed in ((["--link-mbps", "20"], True), ([], False)):
        with q.StorageNodes([tpch_warehouse], link_args + ["--metrics-listen", "127.0.0.1:0"]) as node:
            plan = _sql(node.arg, "EXPLAIN " + WIDE_RESULT, "--pushdown", "on", "--format", "csv").stdout
            assert ("link codec=" in plan) == compressed, plan
            out, stats = tmp_path / "wide.parquet", tmp_path / "wide.json"
            _sql(node.arg, WIDE_RESULT, "--pushdown", "on", "--format", "parquet", "--output", str(out), "--stats", str(stats))
            metrics, text = _node_metrics(node)
        cmp = q.compare_query_results(WIDE_RESULT, q.read_parquet_result(out), duck)
        assert cmp, cmp
        link_bytes[compressed] = json.loads(stats.read_text())["bytes_over_link"]
        # The node's total counts the bytes that crossed its link: compressed, when they were.
        assert metrics["quarry_node_bytes_over_link_total"] == link_bytes[compressed], (text, link_bytes)
    assert link_bytes[False] > 1_000_000, link_bytes
    assert link_bytes[True] < 0.6 * link_bytes[False], link_bytes

def test_a_host_killed_mid_load_leaves_the_table_unlocked_and_unchanged_within_the_lease(tmp_path):
    """The host aborts right after the nodes began their write transactions: the table stays
    locked (a second load is refused), until the lease runs out; then it is unlocked, and holds
    exactly what it held before."""
    data = tmp_path / "rows.csv"
    data.write_text("id,amount\n" + "".join(f"{i},{i * 1.5}\n" for i in range(1000)))
    lease = 2.0
    count = "SELECT count(*), sum(id) FROM t"
    with q.StorageNodes([tmp_path / "a", tmp_path / "b"], ["--write-lease", lease]) as nodes:
        q.run_quarry(["load", "t", data, "--nodes", nodes.arg], tmp_path / "staging")
        killed = q.run_quarry(["load", "t", data, "--append", "--nodes", nodes.arg], tmp_path / "staging", check=False,
                              env={"QUARRY_FAIL_POINT": "upload-after-begin"})
        assert killed.returncode != 0
        killed_at = time.monotonic()
        locked = q.run_quarry(["load", "t", data, "--append", "--nodes", nodes.arg], tmp_path / "staging", check=False)
        assert locked.returncode != 0 and "is being written by another process" in locked.stderr, locked.stderr
        assert "Execution error" not in locked.stderr, locked.stderr
        assert_no_panic(locked.stderr)
        assert _sql(nodes.arg, count, "--format", "csv").stdout.strip().splitlines()[-1] == "1000,499500"
        deadline = killed_at + lease + 10
        while True:
            again = q.run_quarry(["load", "t", data, "--append", "--nodes", nodes.arg], tmp_path / "staging", check=False)
            if again.returncode == 0:
                break
            assert time.monotonic() < deadline, f"still locked {lease + 10} s after the host died: {again.stderr}"
            time.sleep(0.5)
        assert time.monotonic() - killed_at >= lease * 0.9, "unlocked before the lease ran out"
        assert _sql(nodes.arg, count, "--format", "csv").stdout.strip().splitlines()[-1] == "2000,999000"
