"""Filter propagation into grouped subqueries (the `quarry_magic_set` rule).

Method: a fact table of 4,000 rows grouped by a key into a dimension of 400 rows, of which a
filter keeps a few. Where the aggregate's groups meet the dimension through a join that drops
unmatched groups (inner, the filtered side of a semi or left join, a decorrelated scalar
subquery), EXPLAIN must show the aggregate's input semi-joined with the filtered dimension's keys
(`__magic_N`); where every group counts (the aggregate on the preserved side of an outer join,
`NOT IN`, no selective filter), it must not. Every query's result is checked against DuckDB on
the same files: NULL keys on both sides, duplicated dimension keys, a filter that keeps nothing,
an empty fact table, a two-column group key.
"""

from __future__ import annotations

import random
import re

import pytest

import quarry_py as q

MAGIC = re.compile(r"LeftSemi Join: \S+\.dim_id = __magic_\d+\.id")


def fact_csv(rows: int) -> str:
    rng = random.Random(7)
    lines = ["dim_id,grp,amount"]
    for _ in range(rows):
        dim_id = "" if rng.random() < 0.02 else str(rng.randrange(400))
        lines.append(f"{dim_id},{rng.randrange(3)},{rng.randrange(1, 100)}")
    return "\n".join(lines) + "\n"


def dim_csv() -> str:
    lines = ["id,tag,name"]
    for i in range(400):
        # 50 tags; ids 0..7 are 'rare' and 'odd'; id 3 appears twice
        tag = "rare" if i < 8 else f"t{i % 49}"
        lines.append(f"{i},{tag},n{i}")
    lines += ["3,rare,three-again", ",rare,no-id"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def magic_warehouse(tmp_path_factory, quarry_bin):
    tables = {
        "fact": (fact_csv(4000), "dim_id INT, grp INT, amount INT"),
        "empty_fact": ("dim_id,grp,amount\n", "dim_id INT, grp INT, amount INT"),
        "dim": (dim_csv(), "id INT, tag VARCHAR, name VARCHAR"),
    }
    return q.load_csv_tables(tmp_path_factory.mktemp("wh-magic-set"), tables)


AGG = "(select dim_id, sum(amount) as total, count(*) as n from fact group by dim_id)"

# (query, whether the rule restricts the aggregate)
QUERIES = [
    # TPC-H Q17's shape: a correlated average per key, decorrelated into a grouped join
    ("select sum(f.amount) from fact f, dim d where d.id = f.dim_id and d.tag = 'rare' "
     "and f.amount < (select 0.9 * avg(f2.amount) from fact f2 where f2.dim_id = d.id)", True),
    # ... with a filter that keeps no key
    ("select count(*), sum(f.amount) from fact f, dim d where d.id = f.dim_id and d.tag = 'none' "
     "and f.amount < (select avg(f2.amount) from fact f2 where f2.dim_id = d.id)", True),
    (f"select d.id, d.name, s.total, s.n from dim d join {AGG} s on s.dim_id = d.id where d.tag = 'rare'", True),
    (f"select d.id, s.total from dim d left join {AGG} s on s.dim_id = d.id where d.tag = 'rare'", True),
    ("select d.id, d.name from dim d where d.tag = 'rare' "
     "and d.id in (select dim_id from fact group by dim_id having count(*) > 9)", True),
    ("select d.id, s.dim_id, s.grp, s.total from dim d join "
     "(select dim_id, grp, sum(amount) as total from fact group by dim_id, grp) s on s.dim_id = d.id "
     "where d.tag = 'rare'", True),
    # every group counts: the aggregate is the preserved side, or NOT IN (a NULL key decides it)
    (f"select s.dim_id, s.total, d.name from dim d right join {AGG} s on s.dim_id = d.id and d.tag = 'rare'", False),
    ("select d.id from dim d where d.tag = 'rare' "
     "and d.id not in (select dim_id from fact group by dim_id having sum(amount) > 400)", False),
    # no selective filter: the semi join would keep every group
    (f"select count(*), sum(s.total) from dim d join {AGG} s on s.dim_id = d.id", False),
    # an empty input
    ("select d.id, s.total from dim d join "
     "(select dim_id, sum(amount) as total from empty_fact group by dim_id) s on s.dim_id = d.id "
     "where d.tag = 'rare'", False),
]


@pytest.mark.parametrize("sql,restricted", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_grouped_subquery_is_restricted_to_the_outer_keys(magic_warehouse, sql, restricted):
    plan = q.logical_plan(magic_warehouse, sql)
    assert bool(MAGIC.search(plan)) == restricted, f"{sql}\n{plan}"


@pytest.mark.parametrize("sql,restricted", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_restricted_aggregates_keep_results(magic_warehouse, sql, restricted, tmp_path):
    cmp = q.compare_with_duckdb(magic_warehouse, sql, out_dir=tmp_path)
    assert cmp, f"{sql}\n{cmp}"
