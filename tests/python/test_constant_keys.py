"""Aggregates grouped by a key their input holds constant (the `quarry_constant_keys` rule,
`HideConstantsExec`).

Method: `sales` (two segments, 40,000 rows) joined to a `days` dimension filtered to one year,
grouped by that year and the item: DataFusion sees the year as constant, hence as an order
(`ordering_mode=PartiallySorted`), and would run its ordered aggregate; the rule must hide the
constant so that the plan shows no ordered aggregate (a `HideConstantsExec`, or the few-groups
operator, which an ordered partial aggregate never becomes). A constant from a
filter on the fact table itself, a year fixed by a range that leaves one value, and few groups
(where the few-groups operator then takes the partial aggregate) are planned the same way. An
order-sensitive aggregate (`array_agg(.. ORDER BY ..)`) keeps DataFusion's plan. Every result
equals DuckDB's by value, including ORDER BY over the constant key with LIMIT, HAVING, and a
year no row has.
"""

from __future__ import annotations

import random

import pytest

import quarry_py as q


def sales_rows(seed: int, count: int) -> str:
    rng = random.Random(seed)
    out = ["day,item,store,qty,price"]
    for _ in range(count):
        qty = "" if rng.random() < 0.02 else str(rng.randint(1, 40))
        out.append(f"{rng.randint(1, 730)},{rng.randint(1, 3000)},{rng.randint(1, 6)},{qty},{rng.randint(0, 100_000) / 100:.2f}")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, quarry_bin):
    wh = tmp_path_factory.mktemp("wh-constant-keys") / "wh"
    wh.parent.mkdir(parents=True, exist_ok=True)
    schema = "day INT, item INT, store INT, qty INT, price DECIMAL(7,2)"
    for i in range(2):
        path = wh.parent / f"sales-{i}.csv"
        path.write_text(sales_rows(i, 20_000), encoding="utf-8")
        q.run_quarry(["load", "sales", str(path), "--schema", schema] + (["--append"] if i else []), wh)
    days = "day,year,month\n" + "".join(f"{d},{2000 + (d - 1) // 365},{(d - 1) % 365 // 31 + 1}\n" for d in range(1, 731))
    q.load_csv_tables(wh, {"days": (days, "day INT, year INT, month INT")})
    return wh


def explain(warehouse, sql: str) -> str:
    return q.run_quarry(["--threads", "2", "sql", "--format", "csv", f"EXPLAIN {sql}"], warehouse).stdout


JOINED = "select year, item, sum(qty) as q, sum(price) as p, count(*) as n from sales join days on sales.day = days.day where {where} group by year, item"

# (name, query, constants hidden)
QUERIES = [
    ("join", JOINED.format(where="year = 2000"), True),
    ("join_range", JOINED.format(where="year >= 2001 and year < 2002"), True),
    ("fact_filter", "select store, item, sum(qty) as q from sales where store = 3 group by store, item", True),
    ("few_groups", "select year, month, store, sum(qty) as q, avg(price) as a from sales join days on sales.day = days.day where year = 2001 group by year, month, store", True),
    ("ordered_limit", JOINED.format(where="year = 2000") + " order by year, n desc, q, item limit 20", True),
    ("having", JOINED.format(where="year = 2001") + " having count(*) > 7", True),
    ("no_rows", JOINED.format(where="year = 1990"), True),
    ("order_sensitive", "select year, item, array_agg(qty order by qty, price) as qs from sales join days on sales.day = days.day where year = 2000 and item < 50 group by year, item", False),
]


@pytest.mark.parametrize("name,sql,hidden", QUERIES, ids=[x[0] for x in QUERIES])
def test_plan_hides_constant_keys(warehouse, name, sql, hidden):
    plan = explain(warehouse, sql)
    if hidden:
        # Below the constants hidden, or taken by the few-groups operator (which looks through).
        assert "HideConstantsExec" in plan or "SmallGroupAggregateExec" in plan, plan
        assert "ordering_mode=" not in plan, plan
    else:
        assert "HideConstantsExec" not in plan and "ordering_mode=PartiallySorted" in plan, plan


@pytest.mark.parametrize("name,sql,hidden", QUERIES, ids=[x[0] for x in QUERIES])
def test_results_equal_duckdb(warehouse, name, sql, hidden, tmp_path):
    cmp = q.compare_with_duckdb(warehouse, sql, out_dir=tmp_path)
    assert cmp, f"{sql}\n{cmp}"
