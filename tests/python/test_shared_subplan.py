"""Common subplan reuse (the `quarry_shared_subplan` physical rule and `SharedExec`).

Method: a CTE holding a grouped aggregate, named twice. When both occurrences end up as the
same plan, EXPLAIN must show it computed once (an owning `SharedExec` and a reading one) and
EXPLAIN ANALYZE must show the fact table scanned once; when they differ (a filter on a group key
pushed into one of them), or the aggregate is not grouped, nothing is shared. A CTE that joins
the fact to a dimension is shared too (its join's dynamic filter is filled inside it), and so is
one whose occurrence reads a dynamic filter from a join above it (the shared instance goes
without it). Every result is
checked against DuckDB on the same files: NULL and duplicated group keys, an empty input,
occurrences read by a scalar subquery, a join and a UNION ALL.
"""

from __future__ import annotations

import re

import pytest

import quarry_py as q

TABLES = {
    "fact": ("k,g,v\n1,a,5\n1,a,7\n2,b,1\n,b,3\n3,c,8\n2,,2\n4,a,9\n1,c,4\n,a,6\n5,b,9\n",
             "k INT, g VARCHAR, v INT"),
    "empty_fact": ("k,g,v\n", "k INT, g VARCHAR, v INT"),
    "dim": ("k,name\n1,one\n2,two\n3,odd\n4,odd\n", "k INT, name VARCHAR"),
}

PER_K = "with s as (select k, sum(v) as total, count(*) as n from fact group by k) "
PER_G = "with s as (select g, sum(v) as total from fact group by g) "

# (query, whether the aggregate is computed once)
QUERIES = [
    (PER_K + "select k, total from s where total = (select max(total) from s)", True),
    (PER_G + "select * from s where total > 10 union all select * from s where total <= 10", True),
    (PER_K + "select a.k, a.total, a.n, b.k, b.n from s a, s b where a.total = b.total + 1", True),
    ("with s as (select k, sum(v) as total from empty_fact group by k) "
     "select * from s union all select * from s", True),
    # a filter on the group key is pushed into one occurrence: two different plans
    (PER_G + "select * from s where g = 'a' union all select * from s where g <> 'a'", False),
    # one occurrence needs only `sum`: its aggregate computes less, another plan
    (PER_K + "select a.k, a.total, b.n from s a, s b where a.total = b.total + 1", False),
    # not grouped
    ("with s as (select sum(v) as t from fact) select t from s union all select t + 1 from s", False),
    # a join above one occurrence pushes its dynamic filter into that occurrence's scan: shared
    # without it (the join still joins)
    (PER_K + "select a.k, a.total, a.n from s a join dim d on a.k = d.k where d.name = 'odd' "
     "union all select k, total, n from s where n > 1", True),
    # a join inside the CTE: the key set its join pushes into the fact's scan is the CTE's own
    ("with s as (select d.name, sum(f.v) as total from fact f join dim d on f.k = d.k group by d.name) "
     "select * from s where total > 10 union all select * from s where total <= 10", True),
]

OWNER = re.compile(r"SharedExec: subplan 1 computed once for its 2 occurrences")
READER = re.compile(r"SharedExec: reads subplan 1")


@pytest.fixture(scope="module")
def shared_warehouse(tmp_path_factory, quarry_bin):
    return q.load_csv_tables(tmp_path_factory.mktemp("wh-shared-subplan"), TABLES)


def explain(warehouse, sql: str, analyze: bool = False) -> str:
    out = q.run_quarry(["sql", "--format", "csv", f"EXPLAIN {'ANALYZE ' if analyze else ''}{sql}"], warehouse).stdout
    return out


@pytest.mark.parametrize("sql,shared", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_repeated_aggregate_is_computed_once(shared_warehouse, sql, shared):
    plan = explain(shared_warehouse, sql)
    assert "physical_plan" in plan, plan
    assert (bool(OWNER.search(plan)) and bool(READER.search(plan))) == shared, f"{sql}\n{plan}"
    assert bool(re.search("SharedExec", plan)) == shared, f"{sql}\n{plan}"


@pytest.mark.parametrize("index", [0, len(QUERIES) - 1], ids=["aggregate", "join"])
def test_shared_aggregate_scans_its_table_once(shared_warehouse, index):
    sql, _ = QUERIES[index]
    analyzed = explain(shared_warehouse, sql, analyze=True)
    scans = re.findall(r"FragmentExec[^\n]*table=fact", analyzed)
    assert len(scans) == 1, analyzed
    assert READER.search(analyzed), analyzed


@pytest.mark.parametrize("sql,shared", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_shared_subplans_keep_results(shared_warehouse, sql, shared, tmp_path):
    cmp = q.compare_with_duckdb(shared_warehouse, sql, out_dir=tmp_path)
    assert cmp, f"{sql}\n{cmp}"
