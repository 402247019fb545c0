"""Single-step aggregation over partitions with disjoint keys (the `quarry_keyed_aggregate`
rule) and streaming aggregation over segments stored in key order.

Method: tables of four segments each (one load and three appends), read by two partitions.
In `sorted_t` every segment holds its own range of `k`, in order, so a grouping by `k` must be
planned as one `SinglePartitioned` aggregate that streams (`ordering_mode=Sorted`) over a
fragment that declares its order; `shuffled_t` has the same disjoint ranges with the rows
of each segment out of order (one step, not streaming); `overlap_t`'s ranges overlap and
`nulls_t`'s key has NULLs (both keep DataFusion's two steps). Every result is checked against
DuckDB on the same files, embedded and through a storage node (whose table information carries
the segments' bounds and order): groups spanning segment boundaries within a partition,
several aggregates, a second grouping column, HAVING, filters before the aggregate, and an
empty input.
"""

from __future__ import annotations

import random

import pytest

import quarry_py as q

SCHEMA = "k BIGINT, g VARCHAR, v INT"


def segment_rows(keys: list[int | None], seed: int) -> list[str]:
    rng = random.Random(seed)
    rows = []
    for k in keys:
        for _ in range(rng.randint(1, 3)):
            rows.append(f"{'' if k is None else k},{rng.choice('abc')},{rng.randint(-50, 50)}")
    return rows


def table_segments(name: str) -> list[list[str]]:
    """Four segments' CSV rows for table `name`."""
    ranges = [range(1, 60), range(60, 130), range(130, 131), range(131, 200)]
    if name == "overlap_t":
        ranges = [range(1, 60), range(40, 130), range(120, 140), range(131, 200)]
    segments = [segment_rows(list(r), seed) for seed, r in enumerate(ranges)]
    if name == "shuffled_t":
        for seed, rows in enumerate(segments):
            random.Random(100 + seed).shuffle(rows)
    if name == "nulls_t":
        segments[1] += segment_rows([None, None], 7)
        segments[3] += segment_rows([None], 8)
    return segments


TABLES = ["sorted_t", "shuffled_t", "overlap_t", "nulls_t"]


def load(warehouse, nodes: str | None = None):
    for name in TABLES:
        for i, rows in enumerate(table_segments(name)):
            path = warehouse.parent / f"{name}-{i}.csv"
            path.write_text("k,g,v\n" + "\n".join(rows) + "\n", encoding="utf-8")
            args = ["load", name, str(path), "--schema", SCHEMA] + (["--append"] if i else [])
            q.run_quarry(args + (["--nodes", nodes] if nodes else []), warehouse)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, quarry_bin):
    wh = tmp_path_factory.mktemp("wh-keyed") / "wh"
    load(wh)
    return wh


def explain(warehouse, sql: str) -> str:
    return q.run_quarry(["--threads", "2", "sql", "--format", "csv", f"EXPLAIN {sql}"], warehouse).stdout


BY_K = "select k, sum(v) as s, count(*) as n, min(g) as lo, max(v) as hi from {t} group by k"

# (table, one step, streaming)
SHAPES = [("sorted_t", True, True), ("shuffled_t", True, False), ("overlap_t", False, False), ("nulls_t", False, False)]


@pytest.mark.parametrize("table,one_step,streams", SHAPES, ids=[s[0] for s in SHAPES])
def test_plan_follows_the_segments_bounds_and_order(warehouse, table, one_step, streams):
    plan = explain(warehouse, BY_K.format(t=table))
    assert ("mode=SinglePartitioned" in plan) == one_step, plan
    assert ("mode=FinalPartitioned" in plan) != one_step, plan
    assert ("ordering_mode=Sorted" in plan) == streams, plan
    assert ("partitions in order of k" in plan) == streams, plan


QUERIES = [
    BY_K,
    "select k, g, sum(v) as s, count(*) as n from {t} group by k, g",
    "select g, k, avg(v) as a from {t} where v > 0 group by g, k having count(*) > 1",
    "select k, sum(v) as s from {t} where k between 55 and 135 group by k",
    "select k, count(*) as n from {t} where k > 1000 group by k",
    "select k from {t} group by k",
]


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("sql", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_results_equal_duckdb(warehouse, table, sql, tmp_path):
    query = sql.format(t=table)
    cmp = q.compare_with_duckdb(warehouse, query, out_dir=tmp_path)
    assert cmp, f"{query}\n{cmp}"


def test_through_a_storage_node(tmp_path, quarry_bin):
    staging = tmp_path / "staging"
    with q.StorageNodes([tmp_path / "node0"]) as node:
        load(staging, node.arg)
        sql = BY_K.format(t="sorted_t")
        plan = q.run_quarry(["--threads", "2", "sql", "--format", "csv", f"EXPLAIN {sql}", "--nodes", node.arg], staging).stdout
        assert "mode=SinglePartitioned" in plan and "ordering_mode=Sorted" in plan, plan
        cmp = q.compare_on_nodes(sql, node.arg, staging, tmp_path / "node0", tmp_path)
        assert cmp, f"{sql}\n{cmp}"
