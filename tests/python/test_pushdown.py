"""Storage nodes in their own processes: every SSB and TPC-H query with pushdown on and off,
with one node and with three, against DuckDB on the same segment files.

One node serves the warehouse the differential tests generate (one segment per table at the
test SF). Three nodes get their tables from ``quarry gen --nodes`` with small segments, so a
table is spread over the nodes and the host scatters fragments and merges partial aggregates;
DuckDB reads the union of the three nodes' segments.
"""

from __future__ import annotations

import json
import re

import duckdb

import pytest

import quarry_py as q

SSB_FILES = q.query_files("ssb")
TPCH_FILES = q.query_files("tpch")
QUERIES = [("ssb", p) for p in SSB_FILES] + [("tpch", p) for p in TPCH_FILES]
IDS = [f"{suite}-{p.stem}" for suite, p in QUERIES]

# Segments of this many rows (about) spread lineorder/lineitem over all three nodes at SF 0.05.
SEGMENT_ROWS = 40_000

# Operators that run on a node only when pushed down (passthrough only scans).
PUSHDOWN_OPERATORS = {"FilterExec", "AggregateExec", "HashJoinExec", "GraceHashJoinExec", "SortExec", "SortExec(TopK)"}


@pytest.fixture(scope="module")
def one_node(ssb_warehouse, tpch_warehouse):
    """Per suite: a node process serving that suite's warehouse, and DuckDB over it."""
    with q.StorageNodes([ssb_warehouse, tpch_warehouse]) as nodes:
        ducks = {suite: q.duckdb_connect(wh, threads=2) for suite, wh in (("ssb", ssb_warehouse), ("tpch", tpch_warehouse))}
        yield {"ssb": (nodes.urls[0], ducks["ssb"]), "tpch": (nodes.urls[1], ducks["tpch"])}
        for con in ducks.values():
            con.close()


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory, quarry_bin, test_sf):
    """Per suite: three node processes holding the suite's tables spread over them, and DuckDB
    over the union of their segments."""
    clusters, ducks = [], {}
    out = {}
    try:
        for suite in ("ssb", "tpch"):
            root = tmp_path_factory.mktemp(f"nodes-{suite}")
            warehouses = [root / f"node{i}" for i in range(3)]
            nodes = q.StorageNodes(warehouses).__enter__()
            clusters.append(nodes)
            sf = str(int(test_sf)) if float(test_sf).is_integer() else str(test_sf)
            q.run_quarry(["gen", suite, "--sf", sf, "--segment-rows", SEGMENT_ROWS, "--nodes", nodes.arg], root / "staging")
            ducks[suite] = q.duckdb_connect(warehouses, threads=2)
            out[suite] = (nodes.arg, ducks[suite], warehouses)
        yield out
    finally:
        for con in ducks.values():
            con.close()
        for nodes in clusters:
            nodes.stop()


def _run(urls, path, pushdown, tmp_path, stats=None):
    out = tmp_path / f"result-{pushdown}.parquet"
    args = ["sql", "-f", path, "--nodes", urls, "--pushdown", pushdown, "--format", "parquet", "--output", out]
    if stats:
        args += ["--stats", stats]
    q.run_quarry(args, tmp_path / "unused-warehouse")
    return q.read_parquet_result(out)


def _check(urls, con, label, path, tmp_path):
    """Runs the query in `path` with pushdown on and off, checks both against DuckDB, and returns
    each mode's --stats detail."""
    sql = path.read_text(encoding="utf-8")
    duck = q.duckdb_result(con, sql)
    details = {}
    for pushdown in ("on", "off"):
        stats = tmp_path / f"stats-{pushdown}.json"
        quarry = _run(urls, path, pushdown, tmp_path, stats)
        cmp = q.compare_query_results(sql, quarry, duck)
        assert cmp, f"{label} with --pushdown {pushdown}: Quarry and DuckDB disagree\n{cmp}"
        details[pushdown] = json.loads(stats.read_text())
    storage_ops = _storage_operators(details["off"])
    assert not storage_ops & PUSHDOWN_OPERATORS, f"--pushdown off ran {storage_ops} on storage"
    return details


def _storage_operators(detail):
    return {op["operator"] for op in detail["operators"] if op["side"] == "storage"}


@pytest.mark.parametrize("suite,path", QUERIES, ids=IDS)
def test_one_node(one_node, suite, path, tmp_path):
    urls, con = one_node[suite]
    _check(urls, con, f"{suite}/{path.name}", path, tmp_path)


@pytest.mark.parametrize("suite,path", QUERIES, ids=IDS)
def test_three_nodes(three_nodes, suite, path, tmp_path):
    urls, con, _ = three_nodes[suite]
    _check(urls, con, f"{suite}/{path.name}", path, tmp_path)


def test_tables_spread_over_three_nodes(three_nodes):
    """The big tables really are split: every node holds some of lineorder and of lineitem."""
    for suite, table in (("ssb", "lineorder"), ("tpch", "lineitem")):
        _, _, warehouses = three_nodes[suite]
        counts = [len(q.segment_paths(wh, table)) for wh in warehouses]
        assert all(c > 0 for c in counts), f"{table} segments per node: {counts}"


def test_pushdown_cuts_link_bytes(three_nodes, tmp_path):
    """TPC-H Q6 with pushdown returns partial aggregates: far fewer bytes than passthrough, which
    ships the stored column chunks of the four columns it reads (a plain storage device), not
    decoded Arrow: at most 5% more than they take on disk (footers and page indexes)."""
    urls, con, warehouses = three_nodes["tpch"]
    path = next(p for p in TPCH_FILES if p.stem == "q06")
    link = {}
    for pushdown in ("on", "off"):
        stats = tmp_path / f"q6-{pushdown}.json"
        _run(urls, path, pushdown, tmp_path, stats)
        detail = json.loads(stats.read_text())
        link[pushdown] = detail["bytes_over_link"]
        for op in detail["operators"]:
            assert {"side", "rows_in", "rows_out", "bytes_out", "compute_ms"} <= op.keys(), op
        # With pushdown the nodes report their operators: a scan that read rows their own
        # filter then reduced. Passthrough runs nothing on them.
        scan_rows = sum(op["rows_out"] for op in detail["operators"] if op["side"] == "storage" and op["operator"] in ("DataSourceExec", "PageSelectExec"))
        assert (scan_rows > 0) == (pushdown == "on"), detail["operators"]
    segments = [p for wh in warehouses for p in q.segment_paths(wh, "lineitem")]
    columns = ("l_shipdate", "l_discount", "l_quantity", "l_extendedprice")
    stored = con.execute(f"SELECT sum(total_compressed_size) FROM parquet_metadata({segments!r}) WHERE path_in_schema IN {columns!r}").fetchone()[0]
    assert stored <= link["off"] <= 1.05 * stored, (link, stored)
    assert link["on"] * 100 <= link["off"], link


# A table with PLAIN, uncompressed pages (`--page-encoding plain`), over two row groups in two
# segments: a filter over its scan runs on the node as PlainSelectExec, which copies selected
# values out of the pages by offset.
PLAIN_ROWS = 1_300_000
PLAIN_QUERIES = [
    # col1 is uniform over 0..100M: these keep 0.01%, 1%, 30% and 100% of the rows.
    "SELECT * FROM p WHERE col1 < 10000",
    "SELECT * FROM p WHERE col1 < 1000000",
    "SELECT col2, col5 FROM p WHERE col1 < 30000000 AND col3 > 50000000",
    "SELECT COUNT(*), SUM(col2), MIN(col4), MAX(col6) FROM p WHERE col1 >= 0",
    "SELECT AVG(col2) FROM p WHERE col1 < 1000000",
    "SELECT col1, col2 FROM p WHERE col1 < 0",
    "SELECT col3 FROM p WHERE col1 < 5000000 ORDER BY col3 DESC LIMIT 7",
    # A predicate without a column (volatile, so not folded away): the Parquet scan runs it.
    "SELECT COUNT(*) >= 0 FROM p WHERE random() < 2",
]


@pytest.fixture(scope="module")
def plain_node(tmp_path_factory):
    warehouse = tmp_path_factory.mktemp("plain")
    q.run_quarry(["gen", "--page-encoding", "plain", "synthetic", "--columns", "6", "--rows", PLAIN_ROWS, "--name", "p"], warehouse)
    with q.StorageNodes([warehouse]) as nodes:
        con = q.duckdb_connect(warehouse, threads=2)
        yield nodes.urls[0], con, warehouse
        con.close()


def test_plain_pages_are_plain(plain_node):
    """The table really has PLAIN, uncompressed pages, over more than one row group."""
    _, con, warehouse = plain_node
    paths = q.segment_paths(warehouse, "p")
    meta = con.execute(f"SELECT DISTINCT compression, encodings FROM parquet_metadata({paths!r})").fetchall()
    # RLE is listed for the (empty) definition levels; no page is dictionary-encoded.
    assert {compression for compression, _ in meta} == {"UNCOMPRESSED"}, meta
    assert all("PLAIN" in encodings and "DICTIONARY" not in encodings for _, encodings in meta), meta
    groups = con.execute(f"SELECT COUNT(DISTINCT (file_name, row_group_id)) FROM parquet_metadata({paths!r})").fetchone()[0]
    assert groups >= 2, groups


@pytest.mark.parametrize("sql", PLAIN_QUERIES)
def test_plain_pages_select_on_node(plain_node, sql, tmp_path):
    """Every query equals DuckDB with pushdown on and off; with pushdown on, the node's
    PlainSelectExec ran the filter."""
    url, con, _ = plain_node
    path = tmp_path / "query.sql"
    path.write_text(sql)
    details = _check(url, con, sql, path, tmp_path)
    for pushdown, detail in details.items():
        # (col1 < 0 prunes every segment by its statistics: nothing is left to select from.)
        all_pruned = detail["segments_pruned"] == detail["segments_requested"]
        plain = pushdown == "on" and not all_pruned and "random()" not in sql
        assert ("PlainSelectExec" in _storage_operators(detail)) == plain, _storage_operators(detail)


def test_plain_pages_travel_to_nodes(tmp_path):
    """`quarry gen --page-encoding plain --nodes` makes the nodes write plain pages too."""
    node_warehouse = tmp_path / "node"
    with q.StorageNodes([node_warehouse]) as nodes:
        args = ["gen", "--page-encoding", "plain", "synthetic", "--columns", "3", "--rows", "5000", "--name", "p", "--nodes", nodes.arg]
        q.run_quarry(args, tmp_path / "staging")
        assert q.read_manifest(node_warehouse, "p")["page_encoding"] == "plain"
        con = q.duckdb_connect(node_warehouse)
        meta = con.execute(f"SELECT DISTINCT compression FROM parquet_metadata({q.segment_paths(node_warehouse, 'p')!r})").fetchall()
        con.close()
        assert meta == [("UNCOMPRESSED",)], meta


# A table with dictionary-encoded and PLAIN pages (integers, decimals, dates, strings), several
# pages per column, in five segments (so a partition of the node reads more than one: its
# buffers carry over), and one column with NULLs in the last segment only: a
# filter over its scan runs on the node as PageSelectExec, which evaluates the comparisons on
# the stored values and gathers the other columns for the rows that pass; a segment with NULLs
# in a scanned column makes the node scan the ordinary way.
PAGE_ROWS = 50_000
PAGE_SEGMENTS = 5
PAGED = {"PageSelectExec"}
PAGE_QUERIES = [
    # (query, the scans the node runs with pushdown on)
    ("SELECT id, name FROM t WHERE grp = 7", PAGED),
    ("SELECT COUNT(*) FROM t WHERE day >= DATE '2020-03-01' AND day < DATE '2020-06-01'", PAGED),
    ("SELECT SUM(amount), MIN(note), MAX(note) FROM t WHERE amount > 1000.50 AND name <> 'n3'", PAGED),
    # Short IN lists (the planner writes them as ORs) on integers and strings, and a rest
    # evaluated over the survivors' values.
    ("SELECT id, note FROM t WHERE grp IN (1, 2, 3) AND id % 3 = 0", PAGED),
    ("SELECT id, grp FROM t WHERE name IN ('n1', 'n2', 'größe') AND id % 7 = grp % 7", PAGED),
    ("SELECT COUNT(*) FROM t WHERE grp IN (1, 2, 3, 5, 8, 13, 21, 34) AND name IN ('n1', 'n2', 'n3', 'n4', 'n5', 'n6')", PAGED),
    # Longer integer IN lists (a join's key set looks like them): dense in a bitmap over their
    # range, with values below and above it; sparse, searched in order.
    ("SELECT id, grp FROM t WHERE id IN (" + ", ".join(str(v) for v in [-5, *range(1000, 1040), 10**12]) + ")", PAGED),
    ("SELECT id, name FROM t WHERE id IN (" + ", ".join(str(v) for v in [-10**12, *(v * 49_999 + 7 for v in range(40)), 10**12]) + ")", PAGED),
    # Every row passes; then none (a value inside the column's min/max, so nothing is pruned).
    ("SELECT COUNT(*), SUM(id), MIN(name), MAX(amount) FROM t WHERE id >= 0", PAGED),
    ("SELECT id, amount, day, note FROM t WHERE name = 'n5x'", PAGED),
    # Strings outside ASCII, compared and gathered.
    ("SELECT id, note FROM t WHERE note = 'größe-77'", PAGED),
    # `half` has NULLs in the last segment: pages hold only the valid rows' values, so page
    # selection runs there too, comparing and gathering through the pages' validity.
    ("SELECT id, half FROM t WHERE grp = 3 AND half > 10", PAGED),
    ("SELECT * FROM t WHERE name = 'n5'", PAGED),
    ("SELECT id, half FROM t WHERE half IS NULL AND grp = 5", PAGED),
]


@pytest.fixture(scope="module")
def page_node(tmp_path_factory):
    warehouse = tmp_path_factory.mktemp("pages")
    con = duckdb.connect()
    for part in range(PAGE_SEGMENTS):
        nulls = "case when i % 5 = 0 then null else i end" if part == PAGE_SEGMENTS - 1 else "i"
        src = warehouse / f"part{part}.parquet"
        con.execute(
            f"copy (select (i + {part * PAGE_ROWS})::bigint as id, (i % 50)::int as grp, (i * 0.37)::decimal(12,2) as amount, "
            "(date '2020-01-01' + (i % 400)::int) as day, 'n' || (i % 97) as name, "
            f"(case when i % 2 = 0 then 'größe-' else 'note-' end) || i as note, ({nulls})::int as half "
            f"from range({PAGE_ROWS}) r(i)) to '{src}' (format parquet)"
        )
        q.run_quarry(["load", "t", str(src), "--format", "parquet"] + (["--append"] if part else []), warehouse)
        src.unlink()
    con.close()
    with q.StorageNodes([warehouse]) as nodes:
        duck = q.duckdb_connect(warehouse, threads=2)
        yield nodes.urls[0], duck, warehouse
        duck.close()


def test_page_table_has_its_segments(page_node):
    _, _, warehouse = page_node
    assert len(q.segment_paths(warehouse, "t")) == PAGE_SEGMENTS


@pytest.mark.parametrize("sql,scans", PAGE_QUERIES, ids=[f"page{i}" for i in range(len(PAGE_QUERIES))])
def test_page_select_on_node(page_node, sql, scans, tmp_path):
    """Every query equals DuckDB with pushdown on and off; with pushdown on, the node ran the
    filter as a PageSelectExec wherever a fragment's segments allow it; with it off, the node
    ran nothing (it served stored bytes)."""
    url, con, _ = page_node
    path = tmp_path / "query.sql"
    path.write_text(sql)
    details = _check(url, con, sql, path, tmp_path)
    used = {mode: _storage_operators(detail) & {"PageSelectExec", "DataSourceExec"} for mode, detail in details.items()}
    assert used == {"on": scans, "off": set()}, used


JOIN_KEY_SET_SQL = (
    "select l_orderkey, l_linenumber, l_quantity, p_name from lineitem, part where l_partkey = p_partkey "
    "and p_brand = 'Brand#23' and p_container = 'MED BOX'"
)


def _lineitem_rows_shipped(urls, con, sql, tmp_path):
    """Runs `sql` with --pushdown auto and off, checks both against DuckDB, and returns per mode
    the rows the node holding `lineitem` scanned and sent."""
    path = tmp_path / "query.sql"
    path.write_text(sql)
    duck = q.duckdb_result(con, sql)
    shipped = {}
    for pushdown in ("auto", "off"):
        stats = tmp_path / f"stats-{pushdown}.json"
        cmp = q.compare_query_results(sql, _run(urls, path, pushdown, tmp_path, stats), duck)
        assert cmp, f"--pushdown {pushdown}: {cmp}"
        detail = json.loads(stats.read_text())
        scans = [op for op in detail["operators"] if op["operator"] == "FragmentExec" and op.get("table") == "lineitem"]
        assert len(scans) == 1, detail["operators"]
        shipped[pushdown] = (scans[0]["rows_in"], scans[0]["rows_out"])
    return shipped


def test_join_key_set_filters_the_probe_side_on_the_node(one_node, tmp_path):
    """A hash join's key set (the ~1/1000 of parts that pass) reaches the node holding
    `lineitem` as an IN list, which sends only the rows with a partner; with --pushdown off the
    fragment ships every row. Results equal DuckDB's either way."""
    urls, con = one_node["tpch"]
    shipped = _lineitem_rows_shipped(urls, con, JOIN_KEY_SET_SQL, tmp_path)
    scanned, sent = shipped["auto"]
    assert 0 < sent and sent * 50 < scanned, shipped
    assert shipped["off"][0] == shipped["off"][1], shipped


LARGE_KEY_SET_SQL = (
    "select l_orderkey, l_linenumber, l_quantity, o_orderpriority from orders, lineitem "
    "where o_orderkey = l_orderkey and o_orderdate < date '1994-01-01'"
)


def test_large_join_key_set_travels_to_the_node(one_node, tmp_path):
    """A build side beyond DataFusion's IN list (about 30% of orders: over 16K keys at the test
    SF) reaches the node holding `lineitem` as a key set, collected as the join builds, which
    sends only the lines of those orders; with --pushdown off every line crosses. Results equal
    DuckDB's either way."""
    urls, con = one_node["tpch"]
    keys = con.execute("select count(*) from orders where o_orderdate < date '1994-01-01'").fetchone()[0]
    assert keys > 16 * 1024, f"only {keys} keys: DataFusion would send them as an IN list"
    plan = q.run_quarry(["sql", f"EXPLAIN {LARGE_KEY_SET_SQL}", "--nodes", urls, "--format", "csv"], tmp_path / "unused-warehouse").stdout
    assert "KeySetCollectExec" in plan and "key sets=1" in plan, plan
    shipped = _lineitem_rows_shipped(urls, con, LARGE_KEY_SET_SQL, tmp_path)
    scanned, sent = shipped["auto"]
    assert 0 < sent and sent * 2 < scanned, shipped
    assert shipped["off"][0] == shipped["off"][1], shipped


def _embedded_scan(warehouse, sql, tmp_path, *args, table="lineitem"):
    """Runs `sql` embedded (with `args`), checks it against DuckDB, and returns the statistics
    of the `table` (`lineitem`) fragment: `rows_in` (scanned), `rows_out` (passed on),
    `bytes_read_storage` and `bytes_over_link`."""
    stats = tmp_path / "stats.json"
    out = tmp_path / "result.parquet"
    q.run_quarry(["sql", sql, *args, "--format", "parquet", "--output", out, "--stats", stats], warehouse)
    con = q.duckdb_connect(warehouse, threads=2)
    try:
        cmp = q.compare_query_results(sql, q.read_parquet_result(out), q.duckdb_result(con, sql))
    finally:
        con.close()
    assert cmp, cmp
    # Fragments that scanned nothing are a star join's fallback plan, which did not run.
    ran = [op for op in json.loads(stats.read_text())["operators"] if op["operator"] == "FragmentExec" and op["rows_in"] > 0]
    scans = [op for op in ran if op.get("table") == table]
    assert len(scans) == 1, scans
    return scans[0]


def _embedded_scan_rows(warehouse, sql, tmp_path, *args, table="lineitem"):
    """The rows the `table` fragment of `sql`, run embedded, scanned and passed on."""
    scan = _embedded_scan(warehouse, sql, tmp_path, *args, table=table)
    return scan["rows_in"], scan["rows_out"]


# Every order's key: a set that keeps every line.
ALL_ORDERS_KEY_SET_SQL = "select l_orderkey, l_linenumber, o_orderpriority from orders, lineitem where o_orderkey = l_orderkey"


def test_embedded_key_set_runs_on_the_node_only_when_it_drops_most_rows(tpch_warehouse, tmp_path):
    """Embedded, the key set of about 30% of orders is tested by the node as it decodes
    `lineitem` (the fragment ships decoded rows, not the stored bytes), which passes on only
    the lines of those orders; with --pushdown off (no join filters) every line. A set of every
    order's key would drop nothing: it stays with the host, and the node ships the stored bytes.
    Results equal DuckDB's in each case."""
    plan = q.run_quarry(["sql", f"EXPLAIN {LARGE_KEY_SET_SQL}", "--format", "csv"], tpch_warehouse).stdout
    assert "KeySetCollectExec" in plan and "key sets=1" in plan, plan
    scan = _embedded_scan(tpch_warehouse, LARGE_KEY_SET_SQL, tmp_path)
    assert 0 < scan["rows_out"] and scan["rows_out"] * 2 < scan["rows_in"], scan
    assert scan["bytes_over_link"] != scan["bytes_read_storage"], scan
    scanned, sent = _embedded_scan_rows(tpch_warehouse, LARGE_KEY_SET_SQL, tmp_path, "--pushdown", "off")
    assert sent == scanned, (scanned, sent)
    plan = q.run_quarry(["sql", f"EXPLAIN {ALL_ORDERS_KEY_SET_SQL}", "--format", "csv"], tpch_warehouse).stdout
    assert "key sets=1" in plan, plan
    scan = _embedded_scan(tpch_warehouse, ALL_ORDERS_KEY_SET_SQL, tmp_path)
    assert scan["rows_out"] == scan["rows_in"] and scan["bytes_over_link"] == scan["bytes_read_storage"], scan


# A join on two columns whose build side (parts supplied in small numbers) is small: its
# dynamic filter lists key pairs.
TWO_COLUMN_JOIN_SQL = ("select count(*) as n, sum(l_quantity) as q from partsupp, lineitem "
                       "where ps_partkey = l_partkey and ps_suppkey = l_suppkey and ps_availqty < 100")


def test_a_two_column_joins_filter_runs_on_the_stored_pages(tpch_warehouse, tmp_path):
    """Embedded, a join on two columns sends `lineitem`'s node its build side's keys as one
    list per column, which the node tests on the stored pages (a page selection), not as a
    list of key pairs over decoded rows (a filter over a Parquet scan). The lists pass a few
    lines whose pair joins nothing (which the join drops) and few of the rest. Results equal
    DuckDB's."""
    scan = _embedded_scan(tpch_warehouse, TWO_COLUMN_JOIN_SQL, tmp_path)
    assert 0 < scan["rows_out"] and 20 * scan["rows_out"] < scan["rows_in"], scan
    operators = json.loads((tmp_path / "stats.json").read_text())["operators"]
    assert _storage_operators({"operators": operators}) - {"FragmentExec"} == {"PageSelectExec"}, operators
    joined = q.duckdb_connect(tpch_warehouse, threads=2)
    try:
        pairs = joined.sql(TWO_COLUMN_JOIN_SQL).fetchall()[0][0]
    finally:
        joined.close()
    assert scan["rows_out"] >= pairs, (scan, pairs)


def test_a_slow_device_leaves_a_join_filter_to_the_host(tpch_warehouse, tmp_path):
    """The same key set (about 30% of orders) on a device 50 times slower than this CPU with one
    thread: the placement model, asked as the fragment starts, prices the node's filter above
    reading the stored bytes, so the node ships the stored bytes of `lineitem` (and computes
    nothing) and the host filters, where on this machine's own CPU the node filters. Results
    equal DuckDB's either way."""
    profile = tmp_path / "slow.json"
    profile.write_text(json.dumps({"name": "slow", "device_threads": 1, "compute_slowdown": 50}))
    native = _embedded_scan(tpch_warehouse, LARGE_KEY_SET_SQL, tmp_path)
    assert native["bytes_over_link"] != native["bytes_read_storage"] and native["node_counters"]["device_cpu_ns"] > 0, native
    slow = _embedded_scan(tpch_warehouse, LARGE_KEY_SET_SQL, tmp_path, "--profile", profile)
    assert slow["bytes_over_link"] == slow["bytes_read_storage"] and slow["node_counters"]["device_cpu_ns"] == 0, slow
    # Two filters forced onto the device at once take turns on its one thread: each fragment's
    # counters show its pauses for the slower CPU, and one of them waited for the thread.
    sql = ("select count(*) as n from (select l_orderkey as k from lineitem where l_quantity < 10 "
           "union all select o_orderkey as k from orders where o_totalprice > 1000)")
    stats = tmp_path / "union-stats.json"
    q.run_quarry(["--profile", profile, "--pushdown", "on", "sql", sql, "--format", "none", "--stats", stats], tpch_warehouse)
    fragments = [op["node_counters"] for op in json.loads(stats.read_text())["operators"] if op["operator"] == "FragmentExec"]
    assert len(fragments) == 2 and all(c["device_pause_ns"] > 10 * c["device_cpu_ns"] > 0 for c in fragments), fragments
    assert sum(c["thread_wait_ns"] for c in fragments) > 0, fragments


def test_a_devices_compute_is_paced_in_every_task_of_a_pushed_join(tpch_warehouse, tmp_path):
    """A join pushed onto a device with two threads: the node plans it with a repartition,
    whose input runs in tasks of its own. Their work is the device's too, so it is counted as
    device CPU and paid for at the profile's slowdown, as on a device with one thread (where
    no repartition is planned). Each task's polls were left unpaced: the two-thread device
    counted 0.5% of the one-thread device's CPU for TPC-DS q15."""
    sql = ("select o_orderpriority, count(*) as n from orders, lineitem where o_orderkey = l_orderkey "
           "and l_quantity < 20 group by o_orderpriority order by o_orderpriority")
    device = {}
    for threads in (1, 2):
        profile = tmp_path / f"slow-{threads}.json"
        profile.write_text(json.dumps({"name": f"slow-{threads}", "device_threads": threads, "compute_slowdown": 4}))
        stats = tmp_path / f"stats-{threads}.json"
        q.run_quarry(["--profile", profile, "--pushdown", "on", "sql", sql, "--format", "none", "--stats", stats], tpch_warehouse)
        device[threads] = json.loads(stats.read_text())["device"]
    one, two = device[1], device[2]
    assert two["cpu_ms"] > 0.5 * one["cpu_ms"] > 0, device
    # 3 times the CPU in pauses (a slowdown of 4), give or take the sleeps' precision
    assert 2.5 * two["cpu_ms"] < two["pause_ms"] < 4 * two["cpu_ms"], device


def test_filters_above_a_scan_go_with_its_key_set(tpch_warehouse, tmp_path):
    """Embedded, the filters above a passthrough `lineitem` scan that compare a column with a
    constant go to the node with the join's key set, so it passes on only the lines that pass
    both (each joins one order: as many as the result has rows); a comparison of two columns
    stays on the host, and the node passes on the lines it would drop. Results equal DuckDB's."""
    con = q.duckdb_connect(tpch_warehouse, threads=2)
    try:
        for extra, on_node in (("l_shipdate > date '1993-06-01'", True), ("l_receiptdate > l_commitdate", False)):
            sql = f"{LARGE_KEY_SET_SQL} and {extra}"
            result_rows = len(q.duckdb_result(con, sql).rows)
            scan = _embedded_scan(tpch_warehouse, sql, tmp_path)
            assert 0 < result_rows < scan["rows_in"], (extra, result_rows, scan)
            assert (scan["rows_out"] == result_rows) == on_node, (extra, result_rows, scan)
    finally:
        con.close()


# Orders' keys reach `lineitem` through the probe side of the supplier join below them.
STACKED_KEY_SETS_SQL = (
    "select n_name, sum(l_extendedprice) as revenue, count(*) as n from orders, lineitem, supplier, nation "
    "where o_orderkey = l_orderkey and l_suppkey = s_suppkey and s_nationkey = n_nationkey "
    "and o_orderdate < date '1994-01-01' and n_regionkey = 2 group by n_name"
)


def test_key_sets_pass_through_the_probe_side_of_a_join(tpch_warehouse, tmp_path):
    """Two joins stacked on `lineitem`'s side: each build side's key set reaches the scan, so
    the fragment passes on only lines of a kept order from a kept supplier (ordinary joins: the
    star join would take this aggregate)."""
    plan = q.run_quarry(["--threads", "2", "sql", f"EXPLAIN {STACKED_KEY_SETS_SQL}", "--star-join", "off", "--format", "csv"], tpch_warehouse).stdout
    lineitem = [line for line in plan.splitlines() if "FragmentExec" in line and "table=lineitem" in line]
    assert len(lineitem) == 1 and "key sets=2" in lineitem[0], plan
    scanned, sent = _embedded_scan_rows(tpch_warehouse, STACKED_KEY_SETS_SQL, tmp_path, "--threads", "2", "--star-join", "off")
    assert 0 < sent and sent * 5 < scanned, (scanned, sent)


def test_key_sets_reach_the_scans_of_a_star_dimension(test_sf, tmp_path):
    """TPC-H Q10's star join has one dimension, orders joined to customer and nation: the key
    set of the orders in the quarter reaches the customer scan inside the dimension's plan
    (planned whole, a scan of several segments under one of DataFusion's cooperative
    wrappers), so customers without such an order are dropped before the joins. Results equal
    DuckDB's."""
    warehouse = tmp_path / "wh"
    q.run_quarry(["gen", "tpch", "--sf", str(test_sf), "--segment-rows", "4000"], warehouse)
    text = next(p for p in TPCH_FILES if p.stem == "q10").read_text()
    sql = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    plan = q.run_quarry(["--threads", "2", "sql", f"EXPLAIN {sql}", "--format", "csv"], warehouse).stdout
    assert "StarAggregateExec" in plan, plan
    customer = [line for line in plan.splitlines() if "FragmentExec" in line and "table=customer" in line]
    assert customer and all("segments=1," not in line and "key sets=" in line for line in customer), plan
    scanned, sent = _embedded_scan_rows(warehouse, sql, tmp_path, table="customer")
    assert 0 < sent and sent * 2 < scanned, (scanned, sent)


def test_auto_counts_the_pages_a_sparse_gather_touches(tmp_path):
    """A whole-row selection of 0.1% from a 64-column table with compressed pages, on a node with
    the Smart SSD's slow CPU (compute slowdown 12): 20 rows of each 20K-row page pass, so every
    page of every column is decompressed to gather them, as costly as decoding it all; auto must
    keep the filter on the host (passthrough), as the measured sweep says (on 2x slower than off
    at 8M rows). A filter at one row in 1M touches few pages, and still goes to the node."""
    q.run_quarry(["gen", "synthetic", "--columns", "64", "--rows", "400000", "--name", "w"], tmp_path)
    with q.StorageNodes([tmp_path], ["--profile", "smartssd-2013"]) as node:
        def placed(sql: str) -> str:
            plan = q.run_quarry(["--nodes", node.arg, "sql", "--format", "csv", "EXPLAIN " + sql], tmp_path).stdout
            found = re.search(r"placement: FilterExec on (host|storage)", plan)
            assert found, plan
            return found.group(1)

        assert placed("SELECT * FROM w WHERE col1 < 100000") == "host"
        assert placed("SELECT * FROM w WHERE col1 < 100") == "storage"


def test_string_filters_are_estimated_from_column_statistics(tmp_path):
    """SSB q2.2's and q2.3's part filters (8 brands of 1000; one brand) behind a 125 MB/s link:
    the cost model places the brand range between the column's min and max and an equality by
    the column's distinct count, so EXPLAIN predicts the node sends a
    fraction of a MB (DataFusion assumes 20% of rows pass a string range), the filter runs on the
    node and the link carries the few rows that pass; the rows are DuckDB's."""
    src = tmp_path / "part.parquet"
    con = duckdb.connect()
    con.execute(
        "copy (select i::int as p_partkey, 'MFGR#' || (1 + i % 5) || (1 + (i // 5) % 5) || (1 + (i // 25) % 40) as p_brand1 "
        f"from range(400000) r(i)) to '{src}' (format parquet)"
    )
    con.close()
    warehouse = tmp_path / "wh"
    q.run_quarry(["load", "part", str(src), "--format", "parquet"], warehouse)
    queries = [
        "SELECT p_partkey, p_brand1 FROM part WHERE p_brand1 >= 'MFGR#2221' AND p_brand1 <= 'MFGR#2228'",
        # one brand of the column's 1000 distinct values (its distinct count, from the sketch)
        "SELECT p_partkey, p_brand1 FROM part WHERE p_brand1 = 'MFGR#2221'",
    ]
    duck = q.duckdb_connect(warehouse, threads=2)
    try:
        with q.StorageNodes([warehouse], ["--link-mbps", "125"]) as node:
            for i, sql in enumerate(queries):
                plan = q.run_quarry(["--nodes", node.arg, "sql", "--format", "csv", "EXPLAIN " + sql], warehouse).stdout
                placed = re.search(r"placement: FilterExec on (\w+) \(cost\), predicted on storage ([\d.]+) MB over link", plan)
                assert placed, plan
                # 0.8% of 400K rows of (int, string): about 0.1 MB; DataFusion's 20% would be 2.6 MB.
                assert placed.group(1) == "storage" and float(placed.group(2)) < 0.3, plan
                out, stats = tmp_path / f"brands{i}.parquet", tmp_path / f"brands{i}.json"
                q.run_quarry(["--nodes", node.arg, "sql", "--format", "parquet", "--output", str(out), "--stats", str(stats), sql], warehouse)
                cmp = q.compare_query_results(sql, q.read_parquet_result(out), q.duckdb_result(duck, sql))
                assert cmp, cmp
                detail = json.loads(stats.read_text())
                assert detail["bytes_over_link"] < detail["bytes_read_storage"] / 4, detail
    finally:
        duck.close()


def test_a_dictionary_string_filter_costs_its_indices(tmp_path):
    """A node's page reader compares a dictionary-encoded string once per dictionary entry and
    reads each row's index, as it does an integer's: a filter on a 50-value string column is
    predicted to cost on the node what the same filter on a 50-value integer column costs (it was
    priced at a decoded string's 24 bytes a row, which kept SSB q4.2's part filter on the host)."""
    src = tmp_path / "t.parquet"
    con = duckdb.connect()
    con.execute(f"copy (select (i % 50)::int as k, 'value ' || (i % 50) as s, i as payload from range(400000) r(i)) to '{src}' (format parquet)")
    con.close()
    warehouse = tmp_path / "wh"
    q.run_quarry(["load", "t", str(src), "--format", "parquet"], warehouse)

    def on_storage_ms(sql: str) -> float:
        plan = q.run_quarry(["sql", "--format", "csv", "EXPLAIN " + sql], warehouse).stdout
        found = re.search(r"placement: FilterExec on \w+ \(cost\), predicted on storage [\d.]+ MB over link / ([\d.]+) ms", plan)
        assert found, plan
        return float(found.group(1))

    by_int = on_storage_ms("SELECT payload FROM t WHERE k = 7")
    by_string = on_storage_ms("SELECT payload FROM t WHERE s = 'value 7'")
    assert abs(by_string - by_int) <= 0.1 * by_int, (by_string, by_int)
