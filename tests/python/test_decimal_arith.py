"""Decimal arithmetic in 64 bits (the `quarry_decimal_arith` physical rule, `NarrowDecimalExpr`).

Method: a table of DECIMAL columns as SQL declares money (15,2), a rate with another scale
(10,4), and DECIMAL(38,0) values whose products leave 64 bits, with NULLs. EXPLAIN must show the
host's arithmetic as `narrow(...)` in projections and filters; every result
(sums of products as in TPC-H Q01, row-level +, -, * across scales, products past 64 bits that
take arrow's i128 path, a filter on a product) must equal DuckDB's by value.
"""

from __future__ import annotations

import pytest

import quarry_py as q


def row(i: int) -> str:
    price = f"{(i * 7919) % 1_000_000 / 100:.2f}" if i % 11 else ""
    disc = f"0.{i % 11:02d}"
    tax = f"0.0{i % 9}"
    rate = f"{(i % 200 - 100) / 7:.4f}"
    big = str((i % 13 + 1) * 10**15 * (-1 if i % 2 else 1)) if i % 17 else ""
    return f"{i},{i % 3},{price},{disc},{tax},{rate},{big}"


TABLES = {
    "money": (
        "k,g,price,disc,tax,rate,big\n" + "\n".join(row(i) for i in range(3000)) + "\n",
        "k INT, g INT, price DECIMAL(15,2), disc DECIMAL(15,2), tax DECIMAL(15,2), rate DECIMAL(10,4), big DECIMAL(38,0)",
    )
}

QUERIES = [
    # TPC-H Q01's shape: sums of products, grouped
    "select g, sum(price * (1 - disc)) as a, sum(price * (1 - disc) * (1 + tax)) as b, avg(price * disc) as c "
    "from money group by g order by g",
    # row level, mixed scales, NULLs
    "select k, price + rate as s, price - rate as d, price * rate as p, rate - 1 as r from money order by k",
    # products past 64 bits (DECIMAL(38,0) squared, about 10^31): arrow's i128 path
    "select k, big * big as sq, big + price as m from money order by k",
    "select sum(big * 3) as s from money",
    # a filter on a product
    "select count(*) as n, sum(price) as s from money where price * disc > 100",
]


@pytest.fixture(scope="module")
def money_warehouse(tmp_path_factory, quarry_bin):
    return q.load_csv_tables(tmp_path_factory.mktemp("wh-decimal"), TABLES)


def test_host_arithmetic_is_narrowed(money_warehouse):
    # (An aggregate's arguments are narrowed too, but EXPLAIN shows an aggregate by its name:
    # the Rust test of the rule checks them.)
    for sql, operator in [(QUERIES[0], "ProjectionExec"), (QUERIES[1], "ProjectionExec"), (QUERIES[4], "FilterExec")]:
        plan = q.run_quarry(["--pushdown", "off", "sql", "--format", "csv", f"EXPLAIN {sql}"], money_warehouse).stdout
        lines = [line for line in plan.splitlines() if operator in line and "narrow(" in line]
        assert lines, f"no narrowed arithmetic in a {operator}:\n{plan}"


@pytest.mark.parametrize("sql", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_narrow_arithmetic_matches_duckdb(money_warehouse, sql, tmp_path):
    cmp = q.compare_with_duckdb(money_warehouse, sql, out_dir=tmp_path)
    assert cmp, f"{sql}\n{cmp}"
