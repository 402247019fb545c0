"""Conjunct ordering (the `quarry_conjunct_order` physical rule).

Method: filters whose conjuncts are written dearest first (string tests, LIKE) over a table of
strings, dates and integers. EXPLAIN (with --pushdown off, so the filter stays a host
`FilterExec`) must show the integer and date comparisons first and the string tests last, in
the written order among equals; a conjunct the rule does not understand (arithmetic, which may
fail) must keep its place with nothing moved across it. Every result is checked against DuckDB.
"""

from __future__ import annotations

import re

import pytest

import quarry_py as q

ROWS = "\n".join(
    f"{i},{['MAIL', 'SHIP', 'AIR', 'RAIL', None][i % 5] or ''},{1990 + i % 9}-0{1 + i % 9}-1{i % 10},{i % 7}"
    for i in range(200)
)
TABLES = {"t": ("k,mode,day,x\n" + ROWS + "\n", "k INT, mode VARCHAR, day DATE, x INT")}

# (query, conjuncts in the order the host filter must evaluate them)
QUERIES = [
    ("select k from t where mode in ('MAIL', 'SHIP') and day >= date '1993-01-01' and x < 4",
     ["day@", "x@", "mode@"]),
    ("select k, mode from t where mode like '%AI%' and mode <> 'RAIL' and k > 20",
     ["k@", "mode@1 !=", "mode@1 LIKE"]),
    # arithmetic may fail: the string test before it stays before it
    ("select k from t where mode = 'AIR' and 100 / (x + 1) > 20 and k < 150",
     ["mode@", "100 /", "k@"]),
]


@pytest.fixture(scope="module")
def order_warehouse(tmp_path_factory, quarry_bin):
    return q.load_csv_tables(tmp_path_factory.mktemp("wh-conjunct-order"), TABLES)


def host_filter(warehouse, sql: str) -> str:
    plan = q.run_quarry(["--pushdown", "off", "sql", "--format", "csv", f"EXPLAIN {sql}"], warehouse).stdout
    found = re.search(r"FilterExec: ([^\n]*)", plan)
    assert found, plan
    return found.group(1)


@pytest.mark.parametrize("sql,order", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_cheap_conjuncts_run_first(order_warehouse, sql, order):
    predicate = host_filter(order_warehouse, sql)
    positions = [predicate.find(part) for part in order]
    assert all(p >= 0 for p in positions), f"{predicate} lacks one of {order}"
    assert positions == sorted(positions), f"expected the order {order}: {predicate}"


@pytest.mark.parametrize("sql,order", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_reordered_filters_keep_results(order_warehouse, sql, order, tmp_path):
    cmp = q.compare_with_duckdb(order_warehouse, sql, out_dir=tmp_path)
    assert cmp, f"{sql}\n{cmp}"
