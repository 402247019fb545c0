"""Segments a hash join's key bounds rule out (`join_bounds.rs`): the host leaves them out of
the fragment before it starts.

Method: `facts` is six segments (one load, five appends), each holding its own range of `k`
(0-999, 1000-1999, ...); `dims` keys cover all of them, and a filter on `dims` keeps keys in
one or two of those ranges. Joined with `facts` (the larger side, probed), EXPLAIN ANALYZE must
show the other segments left out (`join_pruned_segments`), embedded and through a storage node;
a filter that keeps keys across all ranges leaves out none. Every result equals DuckDB's on the
same segments.
"""

from __future__ import annotations

import random
import re

import pytest

import quarry_py as q

SEGMENTS = 6


def load(warehouse, nodes: str | None = None):
    rng = random.Random(7)
    for i in range(SEGMENTS):
        path = warehouse.parent / f"facts-{i}.csv"
        rows = [f"{k},{rng.randint(1, 100)}" for k in range(i * 1000, (i + 1) * 1000) for _ in range(3)]
        path.write_text("k,v\n" + "\n".join(rows) + "\n", encoding="utf-8")
        args = ["load", "facts", str(path), "--schema", "k INT, v INT"] + (["--append"] if i else [])
        q.run_quarry(args + (["--nodes", nodes] if nodes else []), warehouse)
    path = warehouse.parent / "dims.csv"
    path.write_text("k,g\n" + "\n".join(f"{k},{k % 7}" for k in range(SEGMENTS * 1000)) + "\n", encoding="utf-8")
    q.run_quarry(["load", "dims", str(path), "--schema", "k INT, g INT"] + (["--nodes", nodes] if nodes else []), warehouse)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, quarry_bin):
    wh = tmp_path_factory.mktemp("wh-join-bounds") / "wh"
    wh.parent.mkdir(parents=True, exist_ok=True)
    load(wh)
    return wh


def pruned(plan: str) -> int:
    counts = [int(n) for n in re.findall(r"join_pruned_segments=(\d+)", plan)]
    assert counts, plan
    return sum(counts)


JOIN = "select g, count(*) as n, sum(v) as s from facts join dims on facts.k = dims.k where {where} group by g"

# (dimension filter, segments left out)
CASES = [
    ("dims.k between 2100 and 2800", 5),
    ("dims.k between 1500 and 2500", 4),
    ("dims.k % 1000 = 5", 0),
]


@pytest.mark.parametrize("where,left_out", CASES, ids=["one_range", "two_ranges", "all_ranges"])
def test_segments_outside_the_join_bounds_are_not_read(warehouse, where, left_out, tmp_path):
    sql = JOIN.format(where=where)
    plan = q.run_quarry(["--threads", "2", "sql", "--format", "csv", f"EXPLAIN ANALYZE {sql}"], warehouse).stdout
    assert pruned(plan) == left_out, plan
    cmp = q.compare_with_duckdb(warehouse, sql, out_dir=tmp_path)
    assert cmp, f"{sql}\n{cmp}"


def test_through_a_storage_node(tmp_path, quarry_bin):
    staging = tmp_path / "staging"
    with q.StorageNodes([tmp_path / "node0"]) as node:
        load(staging, node.arg)
        sql = JOIN.format(where=CASES[0][0])
        plan = q.run_quarry(["--threads", "2", "sql", "--format", "csv", f"EXPLAIN ANALYZE {sql}", "--nodes", node.arg], staging).stdout
        assert pruned(plan) == 5, plan
        cmp = q.compare_on_nodes(sql, node.arg, staging, tmp_path / "node0", tmp_path)
        assert cmp, f"{sql}\n{cmp}"
