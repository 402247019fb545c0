"""Grouping sets over pre-aggregated rows (the `quarry_grouping_set_pre_aggregate` rule).

Method: a fact table of 3,000 rows with NULLs in a key and in the aggregated columns, integer,
decimal and double values and string keys. Where every aggregate merges (sum, count, min, max,
avg), EXPLAIN must show the grouping sets computed over a plain aggregation by all their keys
(`__quarry_partial_N`); where one does not (a DISTINCT count, a standard deviation), it must
not. Every query's result is checked against DuckDB on the same files: ROLLUP, CUBE and
GROUPING SETS, GROUPING(), an expression as a key, HAVING, a key that is NULL in the data, an
empty table.
"""

from __future__ import annotations

import random

import pytest

import quarry_py as q


def fact_csv(rows: int) -> str:
    rng = random.Random(11)
    lines = ["region,product,qty,price,weight"]
    for _ in range(rows):
        region = "" if rng.random() < 0.05 else rng.choice(["north", "south", "east", "west"])
        product = f"p{rng.randrange(40):02d}-{rng.choice(['red', 'blue'])}"
        qty = "" if rng.random() < 0.03 else str(rng.randrange(1, 100))
        price = f"{rng.randrange(1, 100000) / 100:.2f}"
        lines.append(f"{region},{product},{qty},{price},{rng.random() * 10:.6f}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def sets_warehouse(tmp_path_factory, quarry_bin):
    schema = "region VARCHAR, product VARCHAR, qty INT, price DECIMAL(8,2), weight DOUBLE"
    tables = {"fact": (fact_csv(3000), schema), "empty_fact": ("region,product,qty,price,weight\n", schema)}
    return q.load_csv_tables(tmp_path_factory.mktemp("wh-grouping-sets"), tables)


MERGING = "sum(qty) as q, count(*) as n, count(qty) as nq, min(product) as lo, max(price) as hi, avg(qty) as aq, avg(price) as ap, avg(weight) as aw"

# (query, whether the grouping sets run over a pre-aggregation)
QUERIES = [
    (f"select region, product, {MERGING} from fact group by rollup(region, product)", True),
    (f"select region, product, {MERGING} from fact group by cube(region, product)", True),
    ("select region, product, sum(price) as s, count(*) as n from fact "
     "group by grouping sets ((region), (product), (region, product), ())", True),
    # GROUPING() tells a rolled-up NULL from a NULL region in the data
    ("select region, product, grouping(region) as gr, grouping(product) as gp, sum(qty) as q from fact "
     "group by rollup(region, product)", True),
    # an expression as a key, and HAVING over a merged aggregate
    ("select substr(product, 1, 3) as family, region, avg(price) as ap, sum(weight) as w from fact "
     "group by rollup(substr(product, 1, 3), region) having count(*) > 20", True),
    (f"select region, {MERGING} from empty_fact group by rollup(region)", True),
    # aggregates that do not merge: computed over the rows, as written
    ("select region, count(distinct product) as d, sum(qty) as q from fact group by rollup(region)", False),
    ("select region, product, stddev(price) as sd from fact group by rollup(region, product)", False),
    # no grouping sets: nothing to do
    ("select region, sum(qty) as q from fact group by region", False),
]


@pytest.mark.parametrize("sql,pre_aggregated", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_grouping_sets_run_over_a_pre_aggregation(sets_warehouse, sql, pre_aggregated):
    plan = q.logical_plan(sets_warehouse, sql)
    assert ("__quarry_partial_" in plan) == pre_aggregated, f"{sql}\n{plan}"


@pytest.mark.parametrize("sql,pre_aggregated", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_grouping_sets_equal_duckdb(sets_warehouse, sql, pre_aggregated, tmp_path):
    cmp = q.compare_with_duckdb(sets_warehouse, sql, out_dir=tmp_path)
    assert cmp, f"{sql}\n{cmp}"
