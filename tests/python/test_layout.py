"""`quarry layout plan`: a column layout for a table, chosen for a workload on a device profile
from candidates measured on a sample of the table. The columns each query reads come from its
plan; slow storage buys compression, a slow decoder buys cheap decoding."""

from __future__ import annotations

import json

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
        assert plan["default_layout"] == "RLE_DICTIONARY SNAPPY"
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
