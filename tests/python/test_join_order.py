"""Cost-based join ordering (the `quarry_join_order` rule).

Method: the plan must not depend on how a query is written, so every SSB query is rewritten
with its FROM list reversed, rotated, and as explicit `JOIN ... ON` clauses, and the physical
plan EXPLAIN prints must be the same text for all of them. One query checks that the rule
changes the order the query names (the selective dimension is joined first). Results are
checked against DuckDB on edge cases the reordering must keep: NULL and duplicated keys, an
empty relation, semi and anti joins from IN / NOT IN / EXISTS, two aliases of one table with a
condition over both, non-equi and multi-column join conditions.
"""

from __future__ import annotations

import csv
import io
import re

import pytest

import quarry_py as q

SSB_FILES = q.query_files("ssb")
PREFIX_TABLE = {"lo": "lineorder", "d": '"date"', "p": "part", "s": "supplier", "c": "customer"}


def split_top_level_and(text: str) -> list[str]:
    """`a and (b or c) and d` -> [a, (b or c), d]."""
    parts, depth, start, i, low = [], 0, 0, 0, text.lower()
    while i < len(text):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
        elif depth == 0 and low.startswith(" and ", i):
            parts.append(text[start:i].strip())
            start = i + 5
            i += 4
        i += 1
    parts.append(text[start:].strip())
    return parts


def parse_ssb(sql: str):
    """(select list, tables, join conditions as (left column, right column), other conditions, tail)."""
    text = " ".join(q.strip_sql_comments(sql).split())
    m = re.match(r"(?is)^(select .*?) from (.*?) where (.*?)( group by .*| order by .*)?;?$", text)
    assert m, f"not an SSB query shape: {text}"
    select, tables, where, tail = m.group(1), [t.strip() for t in m.group(2).split(",")], m.group(3), (m.group(4) or "").rstrip(";")
    joins, others = [], []
    for cond in split_top_level_and(where):
        jm = re.fullmatch(r"(\w+)\s*=\s*(\w+)", cond)
        if jm and not jm.group(2).isdigit():
            joins.append((jm.group(1), jm.group(2)))
        else:
            others.append(cond)
    return select, tables, joins, others, tail


def table_of(column: str) -> str:
    return PREFIX_TABLE[column.split("_")[0]]


def with_from(select, tables, joins, others, tail) -> str:
    where = " and ".join([f"{a} = {b}" for a, b in joins] + others)
    return f"{select} from {', '.join(tables)} where {where}{tail}"


def with_explicit_joins(select, tables, joins, others, tail) -> str:
    """FROM lineorder JOIN dim ON ... JOIN ...: each dimension joined by its condition."""
    text = "lineorder"
    for a, b in joins:
        dim = table_of(b) if table_of(a) == "lineorder" else table_of(a)
        text += f" join {dim} on {a} = {b}"
    where = f" where {' and '.join(others)}" if others else ""
    return f"{select} from {text}{where}{tail}"


def physical_plan(warehouse, sql: str) -> str:
    out = q.run_quarry(["sql", "--format", "csv", f"EXPLAIN {sql}"], warehouse).stdout
    assert "physical_plan" in out, out
    return out[out.index("physical_plan"):]


@pytest.mark.parametrize("path", SSB_FILES, ids=[p.stem for p in SSB_FILES])
def test_plan_does_not_depend_on_how_the_joins_are_written(ssb_warehouse, path):
    parts = parse_ssb(path.read_text(encoding="utf-8"))
    select, tables, joins, others, tail = parts
    assert len(tables) >= 2 and len(joins) == len(tables) - 1, parts
    variants = {
        "as written": with_from(*parts),
        "reversed": with_from(select, tables[::-1], joins, others, tail),
        "rotated": with_from(select, tables[1:] + tables[:1], joins[::-1], others, tail),
        "explicit JOIN": with_explicit_joins(*parts),
    }
    plans = {name: physical_plan(ssb_warehouse, sql) for name, sql in variants.items()}
    for name, plan in plans.items():
        assert plan == plans["as written"], f"{path.stem} {name}:\n{variants[name]}\n{plan}\n--- as written:\n{plans['as written']}"


def test_selective_dimension_is_joined_first(ssb_warehouse):
    """q2.1 names `date` right after `lineorder`; the part filter keeps 1/25 of the rows, so the
    fact rows meet `part` first (the innermost join), `date` (no filter) last."""
    sql = (
        "select sum(lo_revenue), d_year, p_brand1 from lineorder, \"date\", part, supplier "
        "where lo_orderdate = d_datekey and lo_partkey = p_partkey and lo_suppkey = s_suppkey "
        "and p_category = 'MFGR#12' and s_region = 'AMERICA' group by d_year, p_brand1"
    )
    joins = [line for line in physical_plan(ssb_warehouse, sql).splitlines() if "HashJoinExec" in line]
    assert len(joins) == 3, joins
    assert "p_partkey" in joins[-1] and "lo_partkey" in joins[-1], joins
    assert "d_datekey" in joins[0], joins


EDGE_TABLES = {
    # id, key into dim_a (NULLs and keys without a partner), key into dim_b, amount
    "fact": ("id,a,b,amount\n1,1,10,5\n2,1,20,7\n3,2,10,1\n4,,20,3\n5,3,30,8\n6,2,,2\n7,4,10,9\n8,1,10,4\n",
             "id INT, a INT, b INT, amount INT"),
    # a duplicated key (2), a NULL key
    "dim_a": ("a,name,region\n1,one,x\n2,two,y\n2,deux,y\n3,three,x\n,nil,x\n", "a INT, name VARCHAR, region VARCHAR"),
    "dim_b": ("b,label\n10,ten\n20,twenty\n40,forty\n", "b INT, label VARCHAR"),
    "empty": ("a,z\n", "a INT, z INT"),
    # a two-column key
    "pairs": ("a,b,w\n1,10,100\n2,10,200\n1,20,300\n3,30,400\n", "a INT, b INT, w INT"),
}

EDGE_QUERIES = [
    "select f.id, da.name, db.label from fact f, dim_a da, dim_b db where f.a = da.a and f.b = db.b",
    "select f.id, da.name, db.label from dim_b db, fact f, dim_a da where f.b = db.b and da.a = f.a and da.region = 'y'",
    "select count(*) from fact f join dim_a da on f.a = da.a join empty e on e.a = da.a",
    "select f.id, p.w from fact f, pairs p, dim_b db where f.a = p.a and f.b = p.b and p.b = db.b",
    "select f.id from fact f, dim_a da, dim_b db where f.a = da.a and f.b = db.b and f.amount < da.a * 3",
    "select f.id, db.label from fact f, dim_b db, dim_a da where f.b = db.b and f.a = da.a "
    "and f.a in (select a from pairs where w > 150)",
    "select f.id from fact f, dim_b db, dim_a da where f.b = db.b and f.a = da.a "
    "and f.a not in (select a from pairs where a is not null and w > 250)",
    "select f.id from fact f, dim_b db, dim_a da where f.b = db.b and f.a = da.a "
    "and exists (select 1 from pairs p where p.a = f.a and p.b = db.b)",
    "select f.id from fact f, dim_b db, dim_a da where f.b = db.b and f.a = da.a "
    "and not exists (select 1 from pairs p where p.a = f.a and p.b = db.b)",
    "select x.name, y.name, f.id from fact f, dim_a x, dim_a y, dim_b db where f.a = x.a and f.b = db.b "
    "and y.a = f.a + 1 and ((x.region = 'x' and y.region = 'y') or (x.region = 'y' and y.region = 'x'))",
    "select da.region, db.label, sum(f.amount), count(*) from dim_b db join fact f on f.b = db.b "
    "join dim_a da on da.a = f.a group by da.region, db.label",
    # TPC-H Q21's shape: EXISTS / NOT EXISTS over one relation against a larger table, which
    # waits for the join that shrinks that relation (NULL and repeated keys on both sides)
    "select f.id, da.name from fact f, dim_a da, dim_b db where f.a = da.a and f.b = db.b and da.region = 'x' "
    "and exists (select 1 from fact g where g.a = f.a and g.id <> f.id)",
    "select f.id, da.name from fact f, dim_a da, dim_b db where f.a = da.a and f.b = db.b and da.region = 'x' "
    "and not exists (select 1 from fact g where g.a = f.a and g.id <> f.id and g.amount > 4)",
    # uncorrelated scalar subqueries over joins, ordered on their own (TPC-H Q11's shape)
    "select f.id, f.amount from fact f where f.amount > (select avg(g.amount) from dim_b db, dim_a da, fact g "
    "where g.a = da.a and g.b = db.b and da.region = 'x')",
    "select f.id, (select count(*) from empty e, dim_a da, fact g where e.a = da.a and g.a = da.a) as n from fact f",
    # implied equalities: `f.a = da.a and da.a = p.a` also joins `f` with `p` (NULL and
    # duplicated keys); a cycle the query states; a class holding two columns of one relation
    # (not closed: `f.a = f.b` must still hold); an empty relation in the class
    "select f.id, da.name, p.w, db.label from fact f, dim_a da, pairs p, dim_b db where f.a = da.a and da.a = p.a and p.b = db.b",
    "select f.id, da.name, p.w from fact f, dim_a da, pairs p where f.a = da.a and da.a = p.a and p.a = f.a and da.region = 'x'",
    "select f.id, p.w from fact f, pairs p, dim_b db where f.a = p.a and p.a = f.b and f.b = db.b",
    "select f.id, p.w from fact f, pairs p, dim_b db where f.b = p.b and p.b = db.b and f.amount > p.a",
    "select count(*) from fact f, dim_a da, empty e where f.a = da.a and da.a = e.a",
]


@pytest.fixture(scope="module")
def edge_warehouse(tmp_path_factory, quarry_bin):
    return q.load_csv_tables(tmp_path_factory.mktemp("wh-join-order"), EDGE_TABLES)


@pytest.mark.parametrize("sql", EDGE_QUERIES, ids=[f"edge{i}" for i in range(len(EDGE_QUERIES))])
def test_reordered_joins_keep_results(edge_warehouse, sql, tmp_path):
    cmp = q.compare_with_duckdb(edge_warehouse, sql, out_dir=tmp_path)
    assert cmp, f"{sql}\n{cmp}"


def test_large_semi_join_waits_for_the_joins_that_shrink_its_side(tpch_warehouse):
    """TPC-H Q21: EXISTS and NOT EXISTS over `lineitem l1` probe all of `lineitem`. Run on `l1`
    itself they would build hash tables of most of `lineitem`; after `l1` is joined with the
    suppliers of one nation and the 'F' orders they hold a few percent of it, so they are the
    last joins of the plan (the topmost in EXPLAIN)."""
    path = next(p for p in q.query_files("tpch") if p.stem == "q21")
    joins = [line for line in physical_plan(tpch_warehouse, q.strip_sql_comments(path.read_text(encoding="utf-8"))).splitlines() if "HashJoinExec" in line]
    assert len(joins) == 5, joins
    assert all(re.search(r"join_type=(Left|Right)(Semi|Anti)", j) for j in joins[:2]), joins
    assert all("join_type=Inner" in j for j in joins[2:]), joins


def test_joins_inside_an_uncorrelated_scalar_subquery_are_ordered(tpch_warehouse):
    """TPC-H Q11 compares each part's stock value with a scalar subquery over partsupp,
    supplier and nation, which DataFusion runs as an expression rather than a join. Its joins
    are ordered as the outer query's are: the plan is the same whichever order the subquery's
    FROM list names its tables in, and the join with the filtered `nation` comes first (the
    innermost of the subquery's joins), not after 8M `partsupp` rows met all suppliers."""
    path = next(p for p in q.query_files("tpch") if p.stem == "q11")
    sql = " ".join(q.strip_sql_comments(path.read_text(encoding="utf-8")).split()).rstrip(";")
    written = "from partsupp, supplier, nation where ps_suppkey = s_suppkey and s_nationkey = n_nationkey and n_name = 'GERMANY')"
    assert written in sql, sql
    reversed_sql = sql.replace(written, written.replace("from partsupp, supplier, nation", "from nation, supplier, partsupp"))
    plan = physical_plan(tpch_warehouse, sql)
    assert physical_plan(tpch_warehouse, reversed_sql) == plan, plan
    subquery = plan[plan.rindex("ScalarSubqueryExec"):]
    joins = [line for line in subquery.splitlines() if "HashJoinExec" in line]
    assert len(joins) == 2, subquery
    assert "n_nationkey" in joins[-1] and "s_nationkey" in joins[-1], subquery


def test_implied_equality_joins_a_table_to_one_it_is_not_written_against(tpch_warehouse):
    """TPC-H Q05 states `c_nationkey = s_nationkey` and `s_nationkey = n_nationkey`. Their
    consequence `c_nationkey = n_nationkey` lets `customer` meet the region's five nations
    before `orders`, so `orders` and `lineitem` meet a fifth of the customers; `supplier`
    then joins on its key and one nation key, not on both nation columns."""
    path = next(p for p in q.query_files("tpch") if p.stem == "q05")
    plan = physical_plan(tpch_warehouse, q.strip_sql_comments(path.read_text(encoding="utf-8")))
    keys = [sorted(re.findall(r"(\w+)@\d+", line.split("on=[", 1)[1].split("]", 1)[0])) for line in plan.splitlines() if "HashJoinExec" in line]
    assert ["c_nationkey", "n_nationkey"] in keys, plan
    supplier = [k for k in keys if "s_suppkey" in k]
    assert len(supplier) == 1 and len(supplier[0]) == 4, keys


def _build_side_tables():
    """`big`: 20K rows of which a filter with an OR and a comparison of two columns keeps under
    1%; `small`: 1K rows, fewer bytes than 20% of `big` (DataFusion's guess for such a filter)."""
    rows = "\n".join(f"{i},{i % 1000},{(i * 7) % 100},{(i * 13) % 100},{i % 100}" for i in range(20_000))
    small = "\n".join(f"{i},name-{i}" for i in range(1000))
    return {
        "big": ("id,fk,a,b,k\n" + rows + "\n", "id BIGINT, fk BIGINT, a BIGINT, b BIGINT, k BIGINT"),
        "small": ("id,name\n" + small + "\n", "id BIGINT, name VARCHAR"),
    }


BUILD_SIDE_SQL = "select s.name, g.id from big g, small s where g.fk = s.id and (g.k = 1 or g.k = 2) and g.a < g.b"


@pytest.fixture(scope="module")
def build_side_warehouse(tmp_path_factory, quarry_bin):
    return q.load_csv_tables(tmp_path_factory.mktemp("wh-build-side") / "wh", _build_side_tables())


def test_filter_estimate_chooses_the_build_side(build_side_warehouse, tmp_path):
    """The `quarry_filter_estimate` rule: Quarry's estimate of the `big` filter (an OR and a
    comparison of two columns, which DataFusion's analysis leaves at 20%) is 1%, so the join
    builds its hash table on the filtered `big` rows (the first input of HashJoinExec in
    EXPLAIN), not on `small`. The result equals DuckDB's."""
    plan = physical_plan(build_side_warehouse, BUILD_SIDE_SQL)
    lines = plan.splitlines()
    join = next(i for i, line in enumerate(lines) if "HashJoinExec" in line)
    build = next(line for line in lines[join + 1:] if "FragmentExec" in line)
    assert "table=big" in build, plan
    cmp = q.compare_with_duckdb(build_side_warehouse, BUILD_SIDE_SQL, out_dir=tmp_path)
    assert cmp, cmp


def optimizer_passes(warehouse, sql: str) -> list[list[tuple[str, bool]]]:
    """EXPLAIN VERBOSE's logical optimizer steps, pass by pass: (rule, changed the plan)."""
    csv.field_size_limit(1 << 30)
    out = q.run_quarry(["sql", "--format", "csv", f"EXPLAIN VERBOSE {sql}"], warehouse).stdout
    steps = [(row[0].removeprefix("logical_plan after "), row[1].strip() != "SAME TEXT AS ABOVE")
             for row in csv.reader(io.StringIO(out)) if row and row[0].startswith("logical_plan after ")]
    # Each pass of DataFusion's optimizer starts with its first rule; the analyzer's come before.
    starts = [i for i, (rule, _) in enumerate(steps) if rule == "rewrite_set_comparison"]
    assert starts, out[:2000]
    return [steps[a:b] for a, b in zip(starts, starts[1:] + [len(steps)])]


def test_ordering_a_plan_it_has_ordered_changes_nothing(tpch_warehouse):
    """The rule leaves a plan it has ordered (and DataFusion has pruned of unused columns) as
    it is. It used to end a reordered region in a projection of the columns its consumer reads,
    under the consumer's own; `optimize_projections` merged the two and the rule's next pass
    stacked them again, so the rule changed the plan in every pass of the optimizer."""
    path = next(p for p in q.query_files("tpch") if p.stem == "q10")
    passes = optimizer_passes(tpch_warehouse, q.strip_sql_comments(path.read_text(encoding="utf-8")))
    assert any(changed for rule, changed in passes[0] if rule == "quarry_join_order"), passes[0]
    later = [(n + 2, rule) for n, steps in enumerate(passes[1:]) for rule, changed in steps if changed and rule == "quarry_join_order"]
    assert not later, later


# (query, the join types EXPLAIN shows, top first): an outer join under a join keyed on a
# column of its null-padded side is inner (or one-sided, if full); keyed on its preserved side,
# it stays outer. NULL and duplicated keys on both sides.
NULL_REJECTING_KEYS = [
    ("select f.id, da.name, p.w from fact f left join dim_a da on f.a = da.a, pairs p where da.a = p.a", ["Inner", "Inner"]),
    ("select f.id, da.name, p.w from fact f left join dim_a da on f.a = da.a, pairs p where f.a = p.a", ["Inner", "Left"]),
    ("select f.id, da.name, p.w from fact f full join dim_a da on f.a = da.a join pairs p on p.a = da.a", ["Inner", "Right"]),
    ("select t.id, t.name, p.w from (select f.id, da.name, da.a + 0 as k from fact f left join dim_a da on f.a = da.a) t "
     "join pairs p on t.k = p.a", ["Inner", "Inner"]),
    ("select f.id, da.name from fact f left join dim_a da on f.a = da.a where da.a in (select a from pairs)", ["Semi", "Inner"]),
]


@pytest.mark.parametrize("sql,join_types", NULL_REJECTING_KEYS, ids=[f"keys{i}" for i in range(len(NULL_REJECTING_KEYS))])
def test_outer_join_under_a_join_on_its_padded_side_is_inner(edge_warehouse, sql, join_types, tmp_path):
    """The `quarry_null_rejecting_join_keys` rule (TPC-DS q93's shape: `store_sales LEFT JOIN
    store_returns ..., reason WHERE sr_reason_sk = r_reason_sk`): a join key never matches NULL,
    so the rows the outer join pads are dropped above it anyway, and as an inner join it can be
    ordered with the others. The results equal DuckDB's."""
    plan = physical_plan(edge_warehouse, sql)
    # which input a semi join builds on is the join order's choice
    found = [re.sub("^(Left|Right)Semi$", "Semi", t) for t in re.findall(r"(?:HashJoinExec|SortMergeJoinExec|NestedLoopJoinExec).*?join_type=(\w+)", plan)]
    assert sorted(found) == sorted(join_types), plan
    cmp = q.compare_with_duckdb(edge_warehouse, sql, out_dir=tmp_path)
    assert cmp, f"{sql}\n{cmp}"
