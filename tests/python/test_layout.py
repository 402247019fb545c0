"""`quarry layout plan`: a column layout for a table, chosen for a workload on a device profile
from candidates measured on a sample of the table. The columns each query reads come from its
plan; slow storage buys compression, a slow decoder buys cheap decoding."""

from __future__ import annotations

import json
import re

import quarry_py as q

SSB_QUERIES = q.REPO_ROOT / "queries" / "ssb"


def _plan(warehouse, tmp_path, name, **profile):
    """The plan for lineorder under softflash with `profile`'s fields changed."""
    figures = json.loads((q.REPO_ROOT / "profiles" / "softflash.json").read_text())
    figures.update(name=name, **profile)
    (tmp_path / f"{name}.json").write_text(json.dumps(figures))
    out = tmp_path / f"{name}-plan.json"
    run = q.run_quarry(["--profile", tmp_path / f"{name}.json", "layout", "plan", "lineorder", "--workload", SSB_QUERIES,
                        "--sample-rows", "50000", "--output", out], warehouse)
    return json.loads(out.read_text()), run.stdout


def _planned_ssb(tmp_path, sample_rows, segment_rows=20000):
    """SSB SF 0.1 in segments of about `segment_rows` rows, and lineorder's plan for the SSB
    workload under softflash (its file and its JSON)."""
    warehouse = tmp_path / "wh"
    q.run_quarry(["gen", "ssb", "--sf", "0.1", "--segment-rows", str(segment_rows)], warehouse)
    plan_file = tmp_path / "plan.json"
    q.run_quarry(["--profile", "softflash", "layout", "plan", "lineorder", "--workload", SSB_QUERIES, "--sample-rows", str(sample_rows),
                  "--output", plan_file], warehouse)
    return warehouse, plan_file, json.loads(plan_file.read_text())


def _query_stats(warehouse, tmp_path, name):
    """The `--stats` of SSB query `name` run over `warehouse`."""
    stats = tmp_path / f"{name}-stats.json"
    q.run_quarry(["sql", "-f", SSB_QUERIES / f"{name}.sql", "--format", "csv", "--output", tmp_path / f"{name}.csv", "--stats", stats], warehouse)
    return json.loads(stats.read_text())


def test_plan_reads_the_workload_and_trades_bytes_for_decode_time(ssb_warehouse, tmp_path):
    slow_read, text = _plan(ssb_warehouse, tmp_path, "slow-read", read_mbps=20)
    slow_cpu, _ = _plan(ssb_warehouse, tmp_path, "slow-cpu", read_mbps=100000, compute_slowdown=50, device_threads=1)
    queries = {p["name"]: set(p["columns"]) for p in slow_read["queries"]}
    assert len(queries) == 13, queries
    assert queries["q1.1"] == {"lo_orderdate", "lo_quantity", "lo_discount", "lo_extendedprice"}, queries["q1.1"]
    assert queries["q4.1"] == {"lo_custkey", "lo_suppkey", "lo_partkey", "lo_orderdate", "lo_revenue", "lo_supplycost"}, queries["q4.1"]
    for plan in (slow_read, slow_cpu):
        # Never worse than the table's own layout, which is among the candidates.
        assert plan["plan_seconds"] <= plan["default_seconds"] * (1 + 1e-9), plan["plan_seconds"]
        assert plan["default_layout"] == "compact"
        for column in plan["columns"]:
            assert {(c["encoding"], c["codec"]) for c in column["candidates"]} >= {("PLAIN", "UNCOMPRESSED"), ("RLE_DICTIONARY", "SNAPPY")}, column["name"]
    read = {c["name"] for c in slow_read["columns"] if any(c["name"] in cols for cols in queries.values())}
    by_name = lambda plan: {c["name"]: c for c in plan["columns"]}  # noqa: E731
    fast, slow = by_name(slow_cpu), by_name(slow_read)
    for name in read:
        # Reading at 20 MB/s, each column read takes (nearly) its smallest candidate; decoding
        # on one thread 50x slower, (nearly) its cheapest to decode.
        smallest = min(c["bytes"] for c in slow[name]["candidates"])
        cheapest = min(c["decode_s"] for c in fast[name]["candidates"])
        assert slow[name]["bytes"] <= smallest * 1.1, (name, slow[name]["encoding"], slow[name]["codec"])
        assert fast[name]["decode_s"] <= cheapest * 1.5, (name, fast[name]["encoding"], fast[name]["codec"])
    assert sum(slow[n]["bytes"] for n in read) < sum(fast[n]["bytes"] for n in read)
    assert all(p["plan"]["balanced"] for p in slow_read["queries"]) and not any(p["plan"]["balanced"] for p in slow_cpu["queries"])
    assert "workload:" in text and "lo_extendedprice" in text


def test_plan_needs_a_read_bandwidth_and_the_table(ssb_warehouse):
    run = q.run_quarry(["layout", "plan", "lineorder", "--workload", SSB_QUERIES], ssb_warehouse, check=False)
    assert run.returncode != 0 and "needs a device profile with a read bandwidth" in run.stderr, run.stderr
    run = q.run_quarry(["--profile", "softflash", "layout", "plan", "nope", "--workload", SSB_QUERIES], ssb_warehouse, check=False)
    assert run.returncode != 0 and "table 'nope' does not exist" in run.stderr, run.stderr


def test_sort_keys_and_versions_follow_the_workloads_restrictions(tmp_path):
    """SSB's flights 1, 3 and 4 restrict the order date (through the date dimension's filters),
    flight 1 the discount and quantity too: sorted by lo_orderdate, Q1.3 (one week) reads a
    sliver of the segments, Q2.1 (no date restriction) all of them. A second version is chosen
    only when it lowers the bytes read."""
    warehouse = tmp_path / "wh"
    q.run_quarry(["gen", "ssb", "--sf", "0.1", "--segment-rows", "20000"], warehouse)
    out = tmp_path / "plan.json"
    q.run_quarry(["--profile", "softflash", "layout", "plan", "lineorder", "--workload", SSB_QUERIES, "--sample-rows", "100000",
                  "--budget-space", "1", "--output", out], warehouse)
    plan = json.loads(out.read_text())
    names = [p["name"] for p in plan["queries"]]
    keys = {k["column"]: dict(zip(names, k["read_share"])) for k in plan["sort_keys"]}
    assert plan["sort_keys"][0]["column"] == "lo_orderdate", [k["column"] for k in plan["sort_keys"]]
    assert {"lo_orderdate", "lo_discount", "lo_quantity"} <= set(keys), set(keys)
    date = keys["lo_orderdate"]
    assert date["q1.3"] < 0.15 and date["q1.2"] < 0.15 and date["q1.1"] < 0.4, date
    assert date["q2.1"] == 1.0 and keys["lo_discount"]["q2.1"] == 1.0, date
    assert keys["lo_discount"]["q1.1"] < 1.0 and keys["lo_discount"]["q4.1"] == 1.0, keys["lo_discount"]
    assert plan["versions"][0] == "lo_orderdate" and len(plan["versions"]) <= 2, plan["versions"]
    by_query = {p["name"]: p for p in plan["queries"]}
    assert by_query["q1.3"]["version"] == "lo_orderdate" and by_query["q1.3"]["version_bytes"] < by_query["q1.3"]["plan"]["bytes"] * 0.15
    assert plan["versions_bytes"] < plan["plan_bytes"] < plan["default_bytes"], plan


def _chunk_layouts(path):
    """Per column of a Parquet file's first row group: (encodings, codec)."""
    import pyarrow.parquet as pq

    group = pq.ParquetFile(path).metadata.row_group(0)
    return {group.column(i).path_in_schema: (set(group.column(i).encodings), group.column(i).compression) for i in range(group.num_columns)}


def test_apply_rewrites_the_table_in_the_plan_sorted_and_appends_keep_it(tmp_path):
    """`layout apply` writes every column in its planned encoding and codec, the rows sorted by
    the first version's key, as one commit; SSB's 13 queries then equal DuckDB's on the new
    files; an append keeps the layout; a plan naming a column the table lacks changes nothing."""
    warehouse, plan_file, plan = _planned_ssb(tmp_path, sample_rows=100000)
    before = q.read_manifest(warehouse, "lineorder")
    rows = sum(s["rows"] for s in before["segments"])
    unsorted = _query_stats(warehouse, tmp_path, "q1.1")

    # A broken plan is refused before anything is written.
    bad = dict(plan, columns=plan["columns"] + [{"name": "nope", "encoding": "PLAIN", "codec": "SNAPPY"}])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    refused = q.run_quarry(["layout", "apply", "lineorder", tmp_path / "bad.json"], warehouse, check=False)
    assert refused.returncode != 0 and "column 'nope'" in refused.stderr, refused.stderr
    assert q.read_manifest(warehouse, "lineorder")["version"] == before["version"]

    applied = q.run_quarry(["layout", "apply", "lineorder", plan_file], warehouse)
    after = q.read_manifest(warehouse, "lineorder")
    assert after["version"] == before["version"] + 1 and sum(s["rows"] for s in after["segments"]) == rows, applied.stdout
    assert after["sort_key"] == plan["versions"][:1] == ["lo_orderdate"], after["sort_key"]
    planned = {c["name"]: (c["encoding"], c["codec"]) for c in plan["columns"]}
    assert {c["column"]: (c["encoding"], c["codec"]) for c in after["column_layouts"]} == planned
    codec_names = {"UNCOMPRESSED": "UNCOMPRESSED", "SNAPPY": "SNAPPY"}
    for column, (encodings, codec) in _chunk_layouts(q.segment_paths(warehouse, "lineorder")[0]).items():
        encoding, planned_codec = planned[column]
        assert codec == codec_names.get(planned_codec, "ZSTD"), (column, codec, planned_codec)
        assert encoding in encodings or (encoding == "RLE_DICTIONARY" and "PLAIN_DICTIONARY" in encodings), (column, encodings, encoding)
    # Sorted: each segment's dates start at or after the previous one's end.
    dates = [next(c for c in s["columns"] if c["name"] == "lo_orderdate") for s in after["segments"]]
    assert all(int(a["max"]) <= int(b["min"]) for a, b in zip(dates, dates[1:])), [(d["min"], d["max"]) for d in dates[:5]]
    # q1.1 keeps one year of dates through its join with `date`: the star join's key bounds
    # prune the sorted segments outside that year, so it reads a fraction of what it read before.
    sorted_run = _query_stats(warehouse, tmp_path, "q1.1")
    assert sorted_run["segments_pruned"] > len(after["segments"]) // 2, sorted_run
    assert sorted_run["bytes_read_storage"] < 0.35 * unsorted["bytes_read_storage"], (sorted_run, unsorted)

    for path in q.query_files("ssb"):
        sql = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("--"))
        cmp = q.compare_with_duckdb(warehouse, sql)
        assert cmp, f"{path.name}: {cmp.message}"

    # An append keeps the layout.
    extra = tmp_path / "extra.csv"
    q.run_quarry(["sql", "select * from lineorder order by lo_orderkey limit 500", "--format", "csv", "--output", extra], warehouse)
    q.run_quarry(["load", "lineorder", extra, "--append"], warehouse)
    appended = q.read_manifest(warehouse, "lineorder")
    assert appended["column_layouts"] == after["column_layouts"] and len(appended["segments"]) == len(after["segments"]) + 1
    newest = [p for p in q.segment_paths(warehouse, "lineorder") if appended["segments"][-1]["id"] in str(p)][0]
    for column, (encodings, codec) in _chunk_layouts(newest).items():
        assert codec == codec_names.get(planned[column][1], "ZSTD"), (column, codec)


def test_a_table_sorted_by_a_dimension_key_is_read_only_where_the_dimension_filter_keeps_keys(tmp_path):
    """Sorted by lo_orderdate with every column in dictionary pages (so the fact side is read
    page by page, StarScanExec), q1.1 and q4.2 (one year or two of dates, through `date`) skip
    the segments outside the dates the dimension keeps: results equal DuckDB's, most segments
    pruned, and q1.1 reads under a third of the bytes it read unsorted."""
    warehouse, plan_file, plan = _planned_ssb(tmp_path, sample_rows=20000)
    plan.update(versions=["lo_orderdate"], columns=[dict(c, encoding="RLE_DICTIONARY", codec="SNAPPY") for c in plan["columns"]])
    plan_file.write_text(json.dumps(plan))
    unsorted = _query_stats(warehouse, tmp_path, "q1.1")
    q.run_quarry(["layout", "apply", "lineorder", plan_file], warehouse)
    segments = len(q.read_manifest(warehouse, "lineorder")["segments"])
    for name, pruned_share in [("q1.1", 0.7), ("q4.2", 0.6)]:
        stats = _query_stats(warehouse, tmp_path, name)
        assert "StarScanExec" in {o["operator"] for o in stats["operators"]}, stats["operators"]
        assert stats["segments_pruned"] > pruned_share * segments, (name, stats["segments_pruned"], segments)
        sql = "\n".join(line for line in (SSB_QUERIES / f"{name}.sql").read_text().splitlines() if not line.startswith("--"))
        cmp = q.compare_with_duckdb(warehouse, sql)
        assert cmp, f"{name}: {cmp.message}"
        if name == "q1.1":
            assert stats["bytes_read_storage"] < unsorted["bytes_read_storage"] / 3, (stats, unsorted)


def _explain_analyze(warehouse, name):
    """EXPLAIN ANALYZE of SSB query `name` over `warehouse`, as text."""
    sql = "\n".join(line for line in (SSB_QUERIES / f"{name}.sql").read_text().splitlines() if not line.startswith("--"))
    return q.run_quarry(["sql", "EXPLAIN ANALYZE " + sql, "--format", "csv"], warehouse).stdout


def test_sorted_copies_are_kept_chosen_per_query_and_appended_to(tmp_path):
    """A plan with two versions keeps both: the table's own segments sorted by lo_orderdate and
    a copy sorted by lo_suppkey in small row groups with zone maps, in one commit. Each query
    reads the copy it reads the fewest bytes of: q3.2 (suppliers of one nation) the supplier
    copy, whose row groups without a kept supplier the node skips, chosen once the dimensions
    are built; q1.1 (one year) the table's own, date-sorted segments. Every SSB query equals DuckDB's on the
    table's own segments, before and after appends, each a segment range of its own that every
    copy gains in its own order; a scan reads each range from the copy it reads the fewest bytes
    of there."""
    # Segments of several row groups of a sorted copy (16,384 rows each).
    warehouse, plan_file, plan = _planned_ssb(tmp_path, sample_rows=20000, segment_rows=100000)
    plan.update(versions=["lo_orderdate"])
    plan_file.write_text(json.dumps(plan))
    q.run_quarry(["layout", "apply", "lineorder", plan_file], warehouse)
    one_copy = {name: _query_stats(warehouse, tmp_path, name)["bytes_read_storage"] for name in ("q1.1", "q3.2")}

    plan.update(versions=["lo_orderdate", "lo_suppkey"])
    plan_file.write_text(json.dumps(plan))
    applied = q.run_quarry(["layout", "apply", "lineorder", plan_file], warehouse)
    assert "a copy sorted by lo_suppkey" in applied.stdout, applied.stdout
    manifest = q.read_manifest(warehouse, "lineorder")
    rows = sum(s["rows"] for s in manifest["segments"])
    [copy] = manifest["versions"]
    assert copy["sort_key"] == ["lo_suppkey"] and sum(s["rows"] for s in copy["segments"]) == rows, copy["sort_key"]
    assert not {s["id"] for s in copy["segments"]} & {s["id"] for s in manifest["segments"]}
    for segment in copy["segments"]:
        zones = segment["zones"]
        assert zones["column"] == "lo_suppkey" and sum(zones["rows"]) == segment["rows"] and len(zones["rows"]) == segment["row_groups"] > 1
        assert all(int(a) <= int(b) for a, b in zip(zones["max"], zones["min"][1:])), zones
    assert all((warehouse / "lineorder" / s["path"]).is_file() for s in manifest["segments"] + copy["segments"])

    supplier_copy = _explain_analyze(warehouse, "q3.2")
    assert "reads the copy sorted by lo_suppkey (chosen when its dimensions were built)" in supplier_copy, supplier_copy
    assert "reads the copy sorted by lo_orderdate (chosen when its dimensions were built)" in _explain_analyze(warehouse, "q1.1")
    two_copies = {name: _query_stats(warehouse, tmp_path, name)["bytes_read_storage"] for name in ("q1.1", "q3.2")}
    assert two_copies["q3.2"] < 0.6 * one_copy["q3.2"], (two_copies, one_copy)
    assert two_copies["q1.1"] <= 1.05 * one_copy["q1.1"], (two_copies, one_copy)

    def all_equal_duckdb():
        for path in q.query_files("ssb"):
            sql = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("--"))
            cmp = q.compare_with_duckdb(warehouse, sql)
            assert cmp, f"{path.name}: {cmp.message}"

    all_equal_duckdb()
    # Rows q3.2 counts, appended: the copy q3.2 reads must hold them too.
    extra = tmp_path / "extra.csv"
    q.run_quarry(["sql", "select lineorder.* from lineorder join customer on lo_custkey = c_custkey join supplier on lo_suppkey = s_suppkey "
                  "where c_nation = 'UNITED STATES' and s_nation = 'UNITED STATES' order by lo_orderkey, lo_linenumber limit 300",
                  "--format", "csv", "--output", extra], warehouse)
    q.run_quarry(["load", "lineorder", extra, "--append"], warehouse)
    appended = q.read_manifest(warehouse, "lineorder")
    own, copied = appended["segments"][-1], appended["versions"][0]["segments"][-1]
    # The append is a segment range of its own: each copy holds its rows in its own order.
    assert copied["id"] != own["id"] and copied["rows"] == own["rows"] == 300, (own, copied)
    assert copied["range"] == own["range"] == appended["version"] and copied["zones"]["column"] == "lo_suppkey"
    assert len(appended["versions"][0]["segments"]) == len(copy["segments"]) + 1
    # q3.2 still reads the rows of the layout's commit from the supplier copy.
    assert re.search(rf"rows of version {manifest['version']}: the copy sorted by lo_suppkey[^;]*;", _explain_analyze(warehouse, "q3.2"))
    all_equal_duckdb()

    # Rows in three row groups of the copy sorted by lo_suppkey: a scan filtered by one month
    # and by the lowest suppliers reads the layout's rows from the date-sorted segments and the
    # appended rows from the supplier copy, which alone prunes them.
    more = tmp_path / "more.csv"
    q.run_quarry(["sql", "select * from lineorder where lo_orderkey % 13 = 0 order by lo_orderkey, lo_linenumber limit 40000",
                  "--format", "csv", "--output", more], warehouse)
    q.run_quarry(["load", "lineorder", more, "--append"], warehouse)
    last = q.read_manifest(warehouse, "lineorder")["version"]
    sql = "select count(*), sum(lo_revenue) from lineorder where lo_orderdate between 19940101 and 19940131 and lo_suppkey < 70"
    explained = q.run_quarry(["sql", "EXPLAIN " + sql, "--format", "csv"], warehouse).stdout
    assert "reads per segment range" in explained, explained
    assert re.search(rf"rows of version {manifest['version']}: the copy sorted by lo_orderdate[^;]*;", explained), explained
    assert re.search(rf"rows of version {last}: the copy sorted by lo_suppkey", explained), explained
    cmp = q.compare_with_duckdb(warehouse, sql)
    assert cmp, cmp.message
    all_equal_duckdb()


def test_tpch_on_a_planned_layout_with_a_sorted_copy_equals_duckdb(tmp_path):
    """TPC-H's lineitem planned for the TPC-H workload and applied with a sorted copy beside
    its own segments: all 22 queries, each reading whichever copy its filters favour, equal
    DuckDB's on the table's own segments."""
    warehouse = tmp_path / "wh"
    q.run_quarry(["gen", "tpch", "--sf", "0.05", "--segment-rows", "40000"], warehouse)
    plan_file = tmp_path / "plan.json"
    q.run_quarry(["--profile", "softflash", "layout", "plan", "lineitem", "--workload", q.REPO_ROOT / "queries" / "tpch", "--sample-rows", "20000",
                  "--budget-space", "1", "--output", plan_file], warehouse)
    plan = json.loads(plan_file.read_text())
    # Two versions whatever the planner found worth it: the test is of the copies' results.
    plan["versions"] = (plan["versions"] + [k for k in ("l_shipdate", "l_partkey") if k not in plan["versions"]])[:2]
    plan_file.write_text(json.dumps(plan))
    q.run_quarry(["layout", "apply", "lineitem", plan_file], warehouse)
    assert len(q.read_manifest(warehouse, "lineitem")["versions"]) == 1
    from_copy = []
    for path in q.query_files("tpch"):
        sql = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("--"))
        cmp = q.compare_with_duckdb(warehouse, sql)
        assert cmp, f"{path.name}: {cmp.message}"
        if f"reads the copy sorted by {plan['versions'][1]}" in q.run_quarry(["sql", "EXPLAIN " + sql, "--format", "csv"], warehouse).stdout:
            from_copy.append(path.stem)
    assert from_copy, "no query read the sorted copy"
