"""Aggregation over few groups with a mostly-passing filter folded in (the
`quarry_small_group_aggregate` rule, `SmallGroupAggregateExec`).

Method: `facts` is loaded as two segments and `single` as one (which DataFusion splits into two
partitions): a partial aggregate either way. Their group keys have few distinct values: short strings, strings
longer than a string view holds inline, integers, dates, booleans, each with NULLs. EXPLAIN must
show the operator, with the filter folded in when it passes most rows (`n > 50`, about 95%) and
left as a filter when it passes few (`n <= 100`); a key with thousands of values, and a one-step
aggregate (one thread), keep DataFusion's aggregate. Every result must equal DuckDB's by value: sums, averages and counts
over decimals, integers and floats with NULLs, a group whose values are all NULL, a filter that passes nothing, and a filter
guarding a division by zero (`d <> 0`: the operator computes its aggregate arguments over all
rows of a batch, and must not fail on a row the filter drops), and sums and averages of decimal
arithmetic (added as the 64-bit values narrow decimal arithmetic computes).
"""

from __future__ import annotations

import random

import pytest

import quarry_py as q

SCHEMA = "g VARCHAR, lg VARCHAR, k INT, day DATE, flag BOOLEAN, n INT, d INT, qty INT, price DECIMAL(15,2), rate DOUBLE, id INT"
LONG = ["a-long-group-name-alpha", "a-long-group-name-beta", "short"]


def rows(seed: int, count: int, start: int) -> str:
    rng = random.Random(seed)
    out = ["g,lg,k,day,flag,n,d,qty,price,rate,id"]
    for i in range(start, start + count):
        g = "" if rng.random() < 0.02 else rng.choice(["A", "N", "R"])
        lg = "" if rng.random() < 0.02 else rng.choice(LONG)
        k = "" if rng.random() < 0.02 else str(rng.randint(1, 5))
        day = f"1998-0{rng.randint(1, 3)}-0{rng.randint(1, 2)}"
        flag = "" if rng.random() < 0.02 else rng.choice(["true", "false"])
        n = rng.randint(1, 1000)
        d = 0 if rng.random() < 0.03 else rng.randint(-5, 5) or 1
        qty = "" if rng.random() < 0.05 else str(rng.randint(1, 50))
        price = f"{rng.randint(0, 10_000_000) / 100:.2f}"
        rate = f"{rng.random():.6f}"
        out.append(f"{g},{lg},{k},{day},{flag},{n},{d},{qty},{price},{rate},{i}")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, quarry_bin):
    wh = tmp_path_factory.mktemp("wh-small-group") / "wh"
    for i, (name, start) in enumerate([("facts", 0), ("facts", 30_000), ("single", 0)]):
        path = wh.parent / f"{name}-{i}.csv"
        path.write_text(rows(i, 30_000, start), encoding="utf-8")
        append = ["--append"] if name == "facts" and start else []
        q.run_quarry(["load", name, str(path), "--schema", SCHEMA] + append, wh)
    return wh


def explain(warehouse, sql: str, threads: int = 2) -> str:
    return q.run_quarry(["--threads", str(threads), "sql", "--format", "csv", f"EXPLAIN {sql}"] + host_only(threads), warehouse).stdout


def host_only(threads: int) -> list[str]:
    """On one thread placement moves these aggregates into the embedded node's fragment;
    passthrough keeps them on the host, as one-step aggregates."""
    return ["--pushdown", "off"] if threads == 1 else []


def has_operator(plan: str, name: str) -> bool:
    """Whether an operator of the physical plan is `name` (not a mention in another's text)."""
    return any(line.removeprefix("physical_plan,").strip().lstrip('"').startswith(f"{name}:") for line in plan.splitlines())


AGGREGATES = "count(*) as c, sum(qty) as sq, sum(price * (1 - rate)) as sp, avg(price) as ap, avg(qty) as aq, count(qty) as cq, min(price) as lo, max(rate) as hi"


def test_plan_folds_a_filter_that_passes_most_rows(warehouse):
    plan = explain(warehouse, f"select g, k, {AGGREGATES} from facts where n > 50 group by g, k")
    lines = [line for line in plan.splitlines() if "SmallGroupAggregateExec:" in line]
    assert lines and "folded filter=n@" in lines[0], plan
    assert not has_operator(plan, "FilterExec"), plan


def test_plan_keeps_a_selective_filter_and_leaves_one_step_aggregates(warehouse):
    plan = explain(warehouse, f"select g, {AGGREGATES} from facts where n <= 100 group by g")
    assert has_operator(plan, "SmallGroupAggregateExec") and "folded filter" not in plan and has_operator(plan, "FilterExec"), plan
    # One thread: a one-step aggregate, left to DataFusion (and to the rules that recognize it).
    plan = explain(warehouse, f"select lg, {AGGREGATES} from single where n > 50 group by lg", threads=1)
    assert not has_operator(plan, "SmallGroupAggregateExec") and "mode=Single" in plan, plan


def test_plan_leaves_many_groups_to_datafusion(warehouse):
    plan = explain(warehouse, "select id, count(*) as c from facts where n > 50 group by id")
    assert not has_operator(plan, "SmallGroupAggregateExec") and has_operator(plan, "AggregateExec"), plan


QUERIES = [
    f"select g, k, {AGGREGATES} from {{t}} where n > 50 group by g, k",
    f"select lg, flag, {AGGREGATES} from {{t}} where n > 20 group by lg, flag",
    f"select day, g, lg, k, {AGGREGATES} from {{t}} group by day, g, lg, k",
    f"select g, {AGGREGATES} from {{t}} where n <= 100 group by g",
    "select g, k, sum(100 % d) as s, count(*) as c from {t} where d <> 0 group by g, k",
    # decimal arithmetic, summed as its 64-bit results, NULLs among them
    "select g, k, sum(price * (1 - cast(qty as decimal(15,2)))) as s, avg(price * (1 + cast(qty as decimal(15,2)))) as a, "
    "sum(price * price) as pp, count(*) as c from {t} where n > 50 group by g, k",
    "select g, count(*) as c, sum(qty) as s from {t} where n > 5000 group by g",
    "select flag, g from {t} where n > 10 group by flag, g",
    "select g, sum(qty) as s from {t} where n > 50 group by g having sum(qty) > 1000",
    # a group whose values are all NULL: its sum and average are NULL, its count 0
    "select g, sum(case when g = 'A' then null else qty end) as s, avg(case when g = 'A' then null else price end) as a, "
    "count(case when g = 'A' then null else qty end) as c, count(*) as n from {t} where n > 50 group by g",
]


@pytest.mark.parametrize("table", ["facts", "single"])
@pytest.mark.parametrize("sql", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_results_equal_duckdb(warehouse, table, sql, tmp_path):
    query = sql.format(t=table)
    assert has_operator(explain(warehouse, query), "SmallGroupAggregateExec"), query
    con = q.duckdb_connect(warehouse, threads=2)
    try:
        want = q.duckdb_result(con, query)
    finally:
        con.close()
    out = tmp_path / "out.parquet"
    q.run_quarry(["--threads", "2", "sql", query, "--format", "parquet", "--output", str(out)], warehouse)
    cmp = q.compare_query_results(query, q.read_parquet_result(out), want)
    assert cmp, f"{query}\n{cmp}"
