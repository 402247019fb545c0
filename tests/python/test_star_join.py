"""The fused star join (StarAggregateExec, StarProbeExec, StarScanExec) against DuckDB.

Method: (1) every SSB query at SF 1 with the star join on and off, embedded and on three
storage nodes, equals DuckDB on the same segments, and the plan uses the star join exactly
when it is on; (2) randomized star schemas (seeded, so a failure replays): one to four
dimensions with dense, sparse and string keys, NULL and dangling foreign keys, empty
dimensions and a dimension whose key repeats (the star join must fall back to ordinary joins,
which EXPLAIN ANALYZE shows), filters on fact and dimension columns, grouping by dimension and
by fact columns, several aggregates; each query's result equals DuckDB's.
"""

from __future__ import annotations

import decimal
import random
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import quarry_py as q

SSB_FILES = q.query_files("ssb")
STAR_SF = "1"


@pytest.fixture(scope="module")
def ssb1(tmp_path_factory, quarry_bin):
    wh = tmp_path_factory.mktemp("wh-ssb1")
    q.run_quarry(["gen", "ssb", "--sf", STAR_SF], wh, timeout=1800)
    con = q.duckdb_connect(wh, threads=2)
    yield wh, con
    con.close()


@pytest.fixture(scope="module")
def ssb1_nodes(tmp_path_factory, quarry_bin):
    root = tmp_path_factory.mktemp("nodes-ssb1")
    warehouses = [root / f"node{i}" for i in range(3)]
    with q.StorageNodes(warehouses) as nodes:
        q.run_quarry(["gen", "ssb", "--sf", STAR_SF, "--segment-rows", "500000", "--nodes", nodes.arg], root / "staging", timeout=1800)
        con = q.duckdb_connect(warehouses, threads=2)
        yield nodes.arg, con
        con.close()


def explain(args, warehouse, sql, analyze=False):
    keyword = "EXPLAIN ANALYZE" if analyze else "EXPLAIN"
    return q.run_quarry([*args, "sql", "--format", "csv", f"{keyword} {sql}"], warehouse).stdout


def check(args, warehouse, con, sql, tmp_path, label):
    out = tmp_path / "result.parquet"
    q.run_quarry([*args, "sql", sql, "--format", "parquet", "--output", out], warehouse)
    cmp = q.compare_query_results(sql, q.read_parquet_result(out), q.duckdb_result(con, sql))
    assert cmp, f"{label}: Quarry and DuckDB disagree\n{cmp}"


@pytest.mark.parametrize("star", ["on", "off"])
@pytest.mark.parametrize("path", SSB_FILES, ids=[p.stem for p in SSB_FILES])
def test_ssb_embedded(ssb1, path, star, tmp_path):
    wh, con = ssb1
    sql = q.strip_sql_comments(path.read_text(encoding="utf-8"))
    args = ["--star-join", star]
    check(args, wh, con, sql, tmp_path, f"{path.stem} --star-join {star}")
    uses_star = "StarAggregateExec" in explain(args, wh, sql)
    assert uses_star == (star == "on"), f"{path.stem} --star-join {star}: StarAggregateExec in the plan: {uses_star}"


@pytest.mark.parametrize("star", ["on", "off"])
@pytest.mark.parametrize("path", SSB_FILES, ids=[p.stem for p in SSB_FILES])
def test_ssb_three_nodes(ssb1_nodes, path, star, tmp_path):
    urls, con = ssb1_nodes
    sql = q.strip_sql_comments(path.read_text(encoding="utf-8"))
    args = ["--nodes", urls, "--star-join", star]
    check(args, tmp_path / "unused", con, sql, tmp_path, f"{path.stem} on three nodes, --star-join {star}")


def test_a_filtered_dimension_is_ranked(ssb1, tmp_path):
    """SSB q2.3 keeps one brand's parts (about 1 in 1,000 of the part keys' range): that
    dimension's keys are ranked in a bitmap rather than a table as large as the range, and so
    are the dates (yyyymmdd keys fill 4% of theirs); a fifth of the suppliers (one region)
    fill enough of theirs for a dense table. Results equal DuckDB's."""
    wh, con = ssb1
    sql = q.strip_sql_comments((q.REPO_ROOT / "queries" / "ssb" / "q2.3.sql").read_text(encoding="utf-8"))
    plan = explain([], wh, sql, analyze=True)
    dimensions = re.search(r"dimensions=\[([^\]]*)\]", plan)
    assert dimensions, plan
    # The dimensions in the plan's order: the dates are the one grouped by year (7 groups).
    kinds = sorted((int(groups), kind) for kind, groups in re.findall(r"\d+ (\w+) keys/(\d+) groups", dimensions.group(1)))
    assert kinds == [(1, "bitmap"), (1, "bitmap"), (7, "ranked")], dimensions.group(1)
    check([], wh, con, sql, tmp_path, "q2.3")


def test_star_probe_runs_on_the_nodes(ssb1_nodes, tmp_path):
    """With pushdown, each node probes its own segments and returns partial aggregates, and
    builds the dimensions it holds into keys and group codes (StarDimensionExec) instead of
    sending their rows; results equal DuckDB's."""
    urls, con = ssb1_nodes
    for query, dimensions in (("q2.1", 3), ("q4.2", 4)):
        sql = q.strip_sql_comments((q.REPO_ROOT / "queries" / "ssb" / f"{query}.sql").read_text(encoding="utf-8"))
        args = ["--nodes", urls, "--pushdown", "on"]
        plan = explain(args, None, sql, analyze=True)
        assert "storage side: [star probe: StarProbeExec" in plan, plan
        assert plan.count("StarProbeExec on storage") >= 1, plan
        assert plan.count("storage side: [star dimension: StarDimensionExec") == dimensions, plan
        check(args, tmp_path / "unused", con, sql, tmp_path, f"{query} with the dimensions built on the nodes")


def test_a_dimension_named_by_several_star_joins_is_built_once(ssb1, tmp_path):
    """Two star joins (the branches of a UNION ALL) over the same filtered `customer`: the
    dimension is built by one of them and used by both (EXPLAIN says so on each, and only one
    of the two dimension plans runs); a third branch filtering `customer` differently builds
    its own. Results equal DuckDB's."""
    wh, con = ssb1
    branch = "select '{tag}' as half, c_nation, sum(lo_revenue) as rev, count(*) as n from lineorder, customer where lo_custkey = c_custkey and c_region = '{region}' and lo_discount {cond} group by c_nation"
    sql = " union all ".join(branch.format(tag=t, region=r, cond=c) for t, r, c in (("a", "ASIA", "< 5"), ("b", "ASIA", ">= 5"), ("c", "EUROPE", "< 5")))
    plan = explain([], wh, sql, analyze=True)
    assert plan.count("built once for the query's star joins: [c_custkey@0]") == 2, plan
    ran = [m for m in re.findall(r"StarDimensionExec: key=c_custkey@0, groups=\[[^\]]*\], metrics=\[([^\]]*)\]", plan)]
    assert len(ran) == 3 and sum(1 for metrics in ran if "output_rows=" in metrics) == 2, ran
    check([], wh, con, sql, tmp_path, "shared dimension")


@pytest.mark.parametrize("fact", [
    "(select lo_orderdate, lo_revenue, p_brand1 from lineorder left join part on lo_partkey = p_partkey and p_size < 5) f",
    "(select lo_orderdate, lo_revenue from lineorder where lo_discount < 2 union all select lo_orderdate, lo_revenue from lineorder where lo_discount > 9) f",
], ids=["left_join", "union"])
def test_a_fact_side_that_is_not_a_scan_joins_by_hash(ssb1, fact, tmp_path):
    """A star join probes at the fact's scan; a fact side that is a join or a union would be
    probed above it, so the aggregate is planned with hash joins (whose key filters reach the
    scan). The same aggregate over the table itself is a star join. Results equal DuckDB's."""
    wh, con = ssb1
    sql = f"select d_year, sum(lo_revenue) as rev, count(*) as n from {fact}, date where lo_orderdate = d_datekey and d_yearmonthnum = 199401 group by d_year"
    assert "StarAggregateExec" not in explain([], wh, sql), sql
    scan = "select d_year, sum(lo_revenue) as rev, count(*) as n from lineorder, date where lo_orderdate = d_datekey and d_yearmonthnum = 199401 group by d_year"
    assert "StarAggregateExec" in explain([], wh, scan)
    check([], wh, con, sql, tmp_path, "fact side not a scan")


# ---------------------------------------------------------------------------------------------
# Randomized star schemas
# ---------------------------------------------------------------------------------------------

SCHEMAS = 8
QUERIES_PER_SCHEMA = 5


def star_schema(seed):
    """Tables (name -> pyarrow Table) and the dimensions' descriptions."""
    rng = random.Random(seed)
    dims = []
    tables = {}
    for d in range(rng.randint(1, 4)):
        kind = rng.choice(["dense", "sparse", "string"])
        size = 0 if rng.random() < 0.1 else rng.randint(1, 120)
        if kind == "dense":
            keys = list(range(1, size + 1))
        elif kind == "sparse":
            keys = rng.sample(range(-10**9, 10**9), size)
        else:
            keys = [f"key-{d}-{i}" for i in range(size)]
        duplicated = size > 0 and rng.random() < 0.2
        if duplicated:
            keys.append(rng.choice(keys))
        rng.shuffle(keys)
        n = len(keys)
        table = pa.table({
            f"k{d}": pa.array(keys, pa.string() if kind == "string" else pa.int64()),
            f"cat{d}": pa.array([rng.choice(["red", "green", "blue", None]) for _ in range(n)], pa.string()),
            f"num{d}": pa.array([rng.randint(0, 9) for _ in range(n)], pa.int32()),
        })
        tables[f"dim{d}"] = table
        dims.append({"name": f"dim{d}", "keys": keys, "kind": kind, "duplicated": duplicated})
    rows = 0 if rng.random() < 0.1 else rng.randint(600, 4000)
    fact = {}
    for d, dim in enumerate(dims):
        values = []
        for _ in range(rows):
            r = rng.random()
            if r < 0.1:
                values.append(None)
            elif r < 0.2 or not dim["keys"]:
                values.append(f"missing-{rng.randint(0, 5)}" if dim["kind"] == "string" else rng.randint(10**9 + 1, 10**9 + 5))
            else:
                values.append(rng.choice(dim["keys"]))
        fact[f"fk{d}"] = pa.array(values, pa.string() if dim["kind"] == "string" else pa.int64())
    fact["qty"] = pa.array([rng.randint(1, 50) for _ in range(rows)], pa.int32())
    fact["price"] = pa.array([None if rng.random() < 0.05 else decimal.Decimal(rng.randint(100, 99999)) / 100 for _ in range(rows)], pa.decimal128(12, 2))
    fact["flag"] = pa.array([rng.choice(["A", "B", "C"]) for _ in range(rows)], pa.string())
    tables["fact"] = pa.table(fact)
    return tables, dims


def star_query(rng, dims):
    used = rng.sample(range(len(dims)), rng.randint(1, len(dims)))
    joins = " and ".join(f"f.fk{d} = d{d}.k{d}" for d in used)
    filters = []
    unfiltered = []
    for d in used:
        r = rng.random()
        if r < 0.3:
            filters.append(f"d{d}.num{d} < {rng.randint(2, 9)}")
        elif r < 0.5:
            filters.append(f"d{d}.cat{d} in ('red', 'blue')")
        else:
            unfiltered.append(d)
    if rng.random() < 0.5:
        filters.append(f"f.qty between {rng.randint(1, 20)} and {rng.randint(20, 50)}")
    if rng.random() < 0.2:
        filters.append("f.flag <> 'B'")
    groups = [f"d{d}.{rng.choice(['cat', 'num'])}{d}" for d in used if rng.random() < 0.6]
    if rng.random() < 0.15:
        groups.append("f.flag")  # a fact column: not a star join, still a correct answer
    aggregates = rng.sample(["sum(f.price)", "count(*)", "min(f.qty)", "max(f.price)", "sum(f.qty * 2)", "count(f.price)", "avg(f.qty)"], 3)
    where = " and ".join([joins] + filters)
    relations = ", ".join(["fact f"] + [dims[d]["name"] + f" d{d}" for d in used])
    sql = f"select {', '.join(groups + aggregates)} from {relations} where {where}"
    if groups:
        sql += f" group by {', '.join(groups)}"
    return sql, unfiltered


@pytest.mark.parametrize("seed", range(SCHEMAS))
def test_random_star_schemas(seed, tmp_path, quarry_bin):
    tables, dims = star_schema(seed)
    wh = tmp_path / "wh"
    for name, table in tables.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path)
        q.run_quarry(["load", name, path], wh)
    con = q.duckdb_connect(wh, threads=2)
    rng = random.Random(1000 + seed)
    starred = fell_back = 0
    try:
        for i in range(QUERIES_PER_SCHEMA):
            sql, unfiltered = star_query(rng, dims)
            check([], wh, con, sql, tmp_path, f"seed {seed} query {i}: {sql}")
            plan = explain([], wh, sql, analyze=True)
            if "StarAggregateExec" in plan:
                starred += 1
                fell_back += "fallbacks=1" in plan
                # A repeated key whose rows no filter removes must make the star join fall back.
                if any(dims[d]["duplicated"] for d in unfiltered):
                    assert "fallbacks=1" in plan, f"seed {seed}: a repeated key must make the star join fall back\n{sql}\n{plan}"
    finally:
        con.close()
    record(seed, starred, fell_back)


COVERAGE = {}


def record(seed, starred, fell_back):
    COVERAGE[seed] = (starred, fell_back)


def test_random_star_schemas_exercised_the_star_join():
    """Runs after the seeds above: the random queries must have used the star join, or the
    tests above proved nothing about it."""
    if len(COVERAGE) < SCHEMAS:
        pytest.skip("run together with test_random_star_schemas")
    assert sum(s for s, _ in COVERAGE.values()) >= SCHEMAS, COVERAGE


def test_a_repeated_dimension_key_falls_back_to_hash_joins(tmp_path, quarry_bin):
    """Key 2 of `dim` appears twice: the star join would count each fact row with key 2 once,
    the join counts it twice. The star join must notice while building and run the query's
    ordinary plan instead."""
    wh = tmp_path / "wh"
    fact = pa.table({"fk": pa.array([1, 2, 2, 3, None, 9] * 50, pa.int64()), "v": pa.array(list(range(300)), pa.int64())})
    dim = pa.table({"k": pa.array([1, 2, 3, 2, 4], pa.int64()), "g": pa.array(["a", "b", "c", "d", "e"])})
    for name, table in (("fact", fact), ("dim", dim)):
        pq.write_table(table, tmp_path / f"{name}.parquet")
        q.run_quarry(["load", name, tmp_path / f"{name}.parquet"], wh)
    sql = "select g, sum(v), count(*) from fact, dim where fk = k group by g"
    plan = explain([], wh, sql, analyze=True)
    assert "StarAggregateExec" in plan and "fallbacks=1" in plan, plan
    # Two star joins sharing the dimension both fall back.
    shared = f"{sql} union all select g, sum(v), count(*) from fact, dim where fk = k and v > 100 group by g"
    plan = explain([], wh, shared, analyze=True)
    assert plan.count("built once for the query's star joins") == 2 and plan.count("fallbacks=1") == 2, plan
    con = q.duckdb_connect(wh, threads=2)
    try:
        check([], wh, con, sql, tmp_path, "repeated key")
        check([], wh, con, shared, tmp_path, "repeated key, shared dimension")
    finally:
        con.close()


def test_sparse_keys_over_a_wide_range_find_their_rows(tmp_path, quarry_bin):
    """20,000 dimension keys in clusters of four over 2M values (too sparse for a directly
    indexed table, close enough for a ranked bitmap): fact rows with a key, with a neighbouring value that is no key,
    below and above every key, or NULL, aggregated by a dimension attribute, equal DuckDB's.
    A repeated key still makes the star join fall back."""
    rng = random.Random(7)
    keys = [50 + (i // 4) * 400 + (i % 4) * 3 for i in range(20_000)]
    rng.shuffle(keys)
    dim = pa.table({"k": pa.array(keys, pa.int64()), "g": pa.array([f"g{k % 13}" for k in keys])})
    probes = [rng.choice(keys) + rng.choice([0, 0, 0, -1, 1]) for _ in range(100_000)] + [None, 0, 49, 10**7, -(10**12)]
    fact = pa.table({"fk": pa.array(probes, pa.int64()), "v": pa.array(range(len(probes)), pa.int64())})
    sql = "select g, sum(v), count(*) from fact, dim where fk = k group by g"
    for repeated in (False, True):
        wh = tmp_path / f"wh-{repeated}"
        rows = dim if not repeated else pa.concat_tables([dim, dim.slice(123, 1)])
        for name, table in (("fact", fact), ("dim", rows)):
            pq.write_table(table, tmp_path / f"{name}.parquet")
            q.run_quarry(["load", name, tmp_path / f"{name}.parquet"], wh)
        plan = explain([], wh, sql, analyze=True)
        assert "StarAggregateExec" in plan, plan
        if repeated:
            assert "fallbacks=1" in plan, plan
        else:
            assert "fallbacks=0" in plan and "20000 ranked keys" in plan, plan
        con = q.duckdb_connect(wh, threads=2)
        try:
            check([], wh, con, sql, tmp_path, f"sparse keys, repeated={repeated}")
        finally:
            con.close()
