"""Unit tests of scripts/quarry_py.py (no quarry binary needed)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

import quarry_py as q


# ---------------------------------------------------------------------------- warehouse layout


def _make_table(wh, name, segments, fields=None, current="manifest-00000002.json", extra_files=()):
    import duckdb

    d = wh / name
    (d / "data").mkdir(parents=True)
    con = duckdb.connect()
    for rel, sql in list(segments) + list(extra_files):
        con.execute(f"copy ({sql}) to '{d / rel}' (format parquet)")
    fields = fields or [{"name": "id", "data_type": "Int64", "nullable": False}]
    # an older manifest that lists a file which is no longer part of the table
    (d / "manifest-00000001.json").write_text(json.dumps({
        "schema": {"fields": fields},
        "segments": [{"path": rel} for rel, _ in list(segments) + list(extra_files)],
    }))
    (d / current).write_text(json.dumps({
        "schema": {"fields": fields},
        "segments": [{"path": rel, "rows": 0} for rel, _ in segments],
    }))
    (d / "CURRENT").write_text(current + "\n")
    return d


def test_segment_paths_follow_current_manifest(tmp_path):
    d = _make_table(
        tmp_path, "t",
        [("data/a.parquet", "select 1::bigint as id"), ("data/b.parquet", "select 2::bigint as id")],
        extra_files=[("data/stale.parquet", "select 99::bigint as id")],
    )
    assert q.segment_paths(tmp_path, "t") == [str(d / "data/a.parquet"), str(d / "data/b.parquet")]
    assert q.list_tables(tmp_path) == ["t"]
    (tmp_path / "not_a_table").mkdir()
    assert q.list_tables(tmp_path) == ["t"]
    con = q.duckdb_connect(tmp_path)
    assert sorted(q.duckdb_result(con, "select id from t").rows) == [(1,), (2,)]


def test_empty_table_uses_manifest_schema(tmp_path):
    fields = [
        {"name": "id", "data_type": "Int64", "nullable": False},
        {"name": "price", "data_type": "Decimal128(15, 2)", "nullable": True},
        {"name": "d", "data_type": "Date32", "nullable": True},
        {"name": "s", "data_type": "Utf8", "nullable": True},
        {"name": "sv", "data_type": "Utf8View", "nullable": True},
        {"name": "ts", "data_type": "Timestamp(Microsecond, None)", "nullable": True},
        {"name": "ts2", "data_type": "Timestamp(ns)", "nullable": True},
        {"name": "f", "data_type": "Float64", "nullable": True},
        {"name": "b", "data_type": "Boolean", "nullable": True},
        {"name": "i", "data_type": "Int32", "nullable": True},
    ]
    _make_table(tmp_path, "date", [], fields=fields)
    assert q.segment_paths(tmp_path, "date") == []
    con = q.duckdb_connect(tmp_path)
    res = q.duckdb_result(con, 'select * from "date"')
    assert res.rows == []
    assert res.types == ["BIGINT", "DECIMAL(15,2)", "DATE", "VARCHAR", "VARCHAR", "TIMESTAMP", "TIMESTAMP",
                         "DOUBLE", "BOOLEAN", "INTEGER"]
    assert q.duckdb_result(con, 'select count(*), sum(price) from "date"').rows == [(0, None)]


@pytest.mark.parametrize("arrow,duck", [
    ("Int8", "TINYINT"), ("UInt64", "UBIGINT"), ("Float32", "FLOAT"), ("LargeUtf8", "VARCHAR"),
    ("Decimal128(38, 10)", "DECIMAL(38,10)"), ("Decimal128(5,0)", "DECIMAL(5,0)"),
    ('Timestamp(Nanosecond, Some("+00:00"))', "TIMESTAMPTZ"), ('Timestamp(µs, "UTC")', "TIMESTAMPTZ"),
    ("Date64", "DATE"), ("Binary", "BLOB"), ("Dictionary(Int32, Utf8)", "VARCHAR"),
])
def test_arrow_type_mapping(arrow, duck):
    assert q.arrow_type_to_duckdb(arrow) == duck


def test_arrow_type_mapping_rejects_unknown():
    with pytest.raises(ValueError):
        q.arrow_type_to_duckdb("List(Int64)")


# ---------------------------------------------------------------------------- ORDER BY parsing


def test_top_level_order_by():
    sql = """-- comment with order by x
    select a, sum(b) as s from t where c in (select c from u order by c) group by a
    order by s desc nulls last, a asc limit 10;"""
    assert q.top_level_order_by(sql) == ["s", "a"]
    assert q.order_key_indices(sql, ["a", "s"]) == [1, 0]
    assert q.top_level_order_by("select 'order by x' from t") is None
    assert q.top_level_order_by("select * from (select * from t order by a) x") is None
    assert q.order_key_indices("select a, b from t order by a + b", ["a", "b"]) is None
    assert q.order_key_indices("select a, b from t order by 2, t.a", ["a", "b"]) == [1, 0]


def test_query_names():
    assert q.normalize_query_name("q01") == "q1"
    assert q.normalize_query_name("Q1.1") == "q1.1"
    assert q.normalize_query_name("q22.sql") == "q22"
    assert q.query_sort_key("q1.10") > q.query_sort_key("q1.9")


# ---------------------------------------------------------------------------- compare_results


def test_compare_exact_and_unordered():
    a = [(1, "x", dt.date(2020, 1, 1), None), (2, "y", dt.date(2020, 1, 2), 1.5)]
    assert q.compare_results(a, list(reversed(a)), ordered=False)
    assert not q.compare_results(a, list(reversed(a)), ordered=True)
    assert not q.compare_results(a, a[:1], ordered=False)
    assert not q.compare_results([(1,)], [(None,)], ordered=False)
    assert q.compare_results([(None,)], [(None,)], ordered=True)
    assert not q.compare_results([("a",)], [("a ",)])
    assert not q.compare_results([(dt.date(2020, 1, 1),)], [(dt.datetime(2020, 1, 1),)])


def test_compare_numbers():
    assert q.compare_results([(1.0000000001,)], [(1.0,)])
    assert not q.compare_results([(1.00001,)], [(1.0,)])
    assert not q.compare_results([(3,)], [(4,)])
    assert q.compare_results([(3,)], [(Decimal("3.00"),)])
    assert not q.compare_results([(3,)], [(Decimal("3.01"),)])
    # decimals of equal scale are exact
    assert not q.compare_results([(Decimal("1.30"),)], [(Decimal("1.20"),)])
    # a decimal cut to its scale vs a double: less than one unit of the decimal's scale
    assert q.compare_results([(Decimal("25.280418"),)], [(25.28041863605672,)])
    assert q.compare_results([(Decimal("25.280419"),)], [(25.28041863605672,)])
    assert not q.compare_results([(Decimal("25.280417"),)], [(25.28041863605672,)])
    # different scales: within one unit of the coarser scale
    assert q.compare_results([(Decimal("3.333333"),)], [(Decimal("3.3333333333"),)])
    assert not q.compare_results([(Decimal("3.333331"),)], [(Decimal("3.3333333333"),)])
    assert q.compare_results([(float("nan"),)], [(float("nan"),)])


def test_compare_ties_in_ordered_results():
    quarry = [(1, "a"), (1, "b"), (2, "c")]
    duck = [(1, "b"), (1, "a"), (2, "c")]
    assert not q.compare_results(quarry, duck, ordered=True)
    assert q.compare_results(quarry, duck, ordered=True, order_key=[0])
    assert not q.compare_results([(2, "c"), (1, "a"), (1, "b")], duck, ordered=True, order_key=[0])


def test_compare_reports_differences():
    cmp = q.compare_results([(1, "x"), (2, "y")], [(1, "x"), (2, "z")], ordered=True, columns=["a", "b"])
    assert not cmp
    text = str(cmp)
    assert "row 1" in text and "'y'" in text and "'z'" in text and "columns: a, b" in text
    cmp = q.compare_results([(1,), (2,)], [(1,)], ordered=False)
    assert "row counts differ: quarry 2, duckdb 1" in str(cmp)


def test_compare_query_results_uses_order_by():
    sql = "select a, b from t order by a"
    r1 = q.Result(["a", "b"], ["INTEGER", "DECIMAL(10,2)"], [(1, Decimal("2.00")), (1, Decimal("1.00"))])
    r2 = q.Result(["a", "b"], ["INTEGER", "DOUBLE"], [(1, 1.0), (1, 2.0)])
    assert q.compare_query_results(sql, r1, r2)
    r3 = q.Result(["a", "b"], ["INTEGER", "DOUBLE"], [(1, 1.0), (0, 2.0)])
    assert not q.compare_query_results(sql, r1, r3)


# ---------------------------------------------------------------------------- benchmark helpers


def test_noise_and_geomean():
    assert q.relative_spread([10.0, 12.0, 11.0]) == pytest.approx(0.2)
    assert q.relative_spread([10.0]) is None  # one run says nothing about noise
    assert q.relative_spread([]) is None
    assert q.median_spread([[10, 11], [10, 13], [10, 20], [5]]) == pytest.approx(0.3)
    assert q.median_spread([[1.0], []]) is None
    assert q.geomean([2.0, 8.0, None]) == pytest.approx(4.0)
    assert q.geomean([None, 0.0]) is None


def test_error_line():
    assert q.error_line("warning: x\nerror: No field named nope\n", 1) == "No field named nope"
    assert q.error_line("something\nlast words\n", 2) == "last words"
    assert q.error_line("", 101) == "exit status 101"


def _entry(name, ratio=1.0, match=True, quarry_error=None, duckdb_error=None, q_times=(1.0, 1.1), d_times=(2.0, 2.0)):
    return {"name": name, "ratio": ratio, "match": match, "mismatch": None if match is not False else "columns: a\nrow counts differ: quarry 2, duckdb 1",
            "quarry": {"error": quarry_error, "times_ms": list(q_times)},
            "duckdb": {"error": duckdb_error, "times_ms": list(d_times)}}


def test_compare_duckdb_failure_accounting():
    import compare_duckdb as cd

    entries = [
        _entry("q1", ratio=2.0),
        _entry("q2", ratio=8.0, match=False),
        _entry("q3", ratio=None, match=None, quarry_error="boom", q_times=()),
        _entry("q4", ratio=None, match=None, duckdb_error="Binder Error", d_times=()),
    ]
    s = cd.summarize(entries, max_geomean=3.0, max_each=5.0)
    # the geomean covers the two queries both engines ran, and the two errors are counted as failed
    assert s["timed"] == 2 and s["geomean"] == pytest.approx(4.0)
    assert s["failed"] == 3 and s["queries"] == 4
    problems = [(f["query"], f["problem"]) for f in s["failures"]]
    assert ("q2", "result differs from DuckDB: row counts differ: quarry 2, duckdb 1") in problems
    assert ("q2", "8.00x DuckDB > --max-each 5.0") in problems
    assert ("q3", "quarry error: boom") in problems and ("q4", "duckdb error: Binder Error") in problems
    assert problems[-1][0] == "*" and "--max-geomean 3.0" in problems[-1][1]
    assert entries[0]["failures"] == []
    assert s["noise"]["quarry"] == pytest.approx(0.1) and s["noise"]["duckdb"] == 0.0
    # nothing timed: a --max-geomean bound is missed, not silently met
    s = cd.summarize([_entry("q1", ratio=None, match=None, quarry_error="x")], max_geomean=10.0)
    assert s["geomean"] is None and any(f["query"] == "*" for f in s["failures"])


def test_bench_modes_verdict():
    import bench_modes as bm

    def runs(auto, on, off, on_match=True, off_error=None):
        # the median is the time given; the best, 1 ms less (auto's 5 ms less)
        mk = lambda median, match=True, error=None, lead=1.0: {"median_ms": median, "best_ms": None if median is None else median - lead,
                                                               "match": match, "error": error, "plan": None}
        return {"auto": mk(auto, lead=5.0), "on": mk(on, on_match), "off": mk(off, True, off_error)}

    v = bm.verdict(runs(10.0, 12.0, 9.5), max_ratio=1.10)
    assert v["better"] == "off" and v["auto_over_best"] == pytest.approx(10 / 9.5) and v["failures"] == []
    assert v["statistic"] == "median" and v["auto_over_best_by_best"] == pytest.approx(5 / 8.5)
    # judged by the best times instead: the same runs, the other ratio
    v = bm.verdict(runs(20.0, 12.0, 14.0), max_ratio=1.10, statistic="best")
    assert v["auto_over_best"] == pytest.approx(15 / 11) and v["auto_over_best_by_median"] == pytest.approx(20 / 12)
    assert v["failures"] == ["auto 1.36x on > --max-ratio 1.1"]
    assert "auto/best  1.36 (median  1.67)" in bm.query_line({"name": "q01", "placement": "node", "modes": runs(20.0, 12.0, 14.0), **v})
    v = bm.verdict(runs(20.0, 10.0, 30.0), max_ratio=1.10)
    assert v["better"] == "on" and v["failures"] == ["auto 2.00x on > --max-ratio 1.1"]
    v = bm.verdict(runs(10.0, 10.0, None, on_match=False, off_error="boom"), max_ratio=1.10)
    assert v["better"] == "on" and v["failures"] == ["off error: boom", "on result differs from auto"]
    assert v["same_plan_as_better"] is False
    assert bm.relabel("row counts differ: quarry 2, duckdb 1", "off") == "row counts differ: off 2, auto 1"

    # auto ran on's plan: the line says so, and the verdict is judged as before
    ran = {"rows_in": 10, "rows_out": 1, "compute_ms": 0.5}
    stats = lambda *ops: {"operators": [{"operator": o, "side": side, **ran} for o, side in ops]}
    pushed = bm.plan_shape(stats(("AggregateExec", "host"), ("FragmentExec", "storage"), ("FilterExec", "storage")))
    kept = bm.plan_shape(stats(("AggregateExec", "host"), ("FilterExec", "host"), ("FragmentExec", "storage")))
    assert pushed == ["AggregateExec@host", "FragmentExec@storage", "FilterExec@storage"] and pushed != kept
    # an operator that never ran (a star join's unused fallback) is not part of the shape
    fallback = stats(("AggregateExec", "host"), ("FragmentExec", "storage"), ("FilterExec", "storage"), ("HashJoinExec", "host"))
    fallback["operators"][-1].update(rows_in=0, rows_out=0, compute_ms=0.0)
    assert bm.plan_shape(fallback) == pushed
    r = runs(11.5, 10.0, 30.0)
    r["auto"]["plan"], r["on"]["plan"], r["off"]["plan"] = pushed, list(pushed), kept
    v = bm.verdict(r, max_ratio=1.10)
    assert v["same_plan_as_better"] and v["failures"] == ["auto 1.15x on > --max-ratio 1.1"]
    line = bm.query_line({"name": "q06", "placement": "node", "modes": r, **v})
    assert "same plan as on" in line and "FAIL" in line
    r["auto"]["plan"] = kept
    v = bm.verdict(r, max_ratio=1.10)
    assert not v["same_plan_as_better"]
    assert "same plan" not in bm.query_line({"name": "q06", "placement": "node", "modes": r, **v})


def test_bench_modes_rounds_rotate_the_mode_order():
    """Over any three consecutive rounds each mode runs once in each position."""
    import bench_modes as bm

    assert bm.round_order(0) == ("auto", "on", "off")
    for first in range(4):
        rounds = [bm.round_order(r) for r in range(first, first + 3)]
        assert all(sorted(r) == sorted(bm.MODES) for r in rounds), rounds
        for position in range(3):
            assert sorted(r[position] for r in rounds) == sorted(bm.MODES), rounds


def test_bench_modes_link_pacing_needs_a_node():
    """--link-mbps paces `quarry serve`'s link: embedded has none, so it is refused there."""
    import bench_modes as bm

    args = bm.parse_args(["--suite", "tpch", "--warehouse", "wh", "--node", "--link-mbps", "125"])
    assert args.placement == "node" and args.link_mbps == 125.0
    assert bm.parse_args(["--suite", "tpch", "--warehouse", "wh", "--both"]).link_mbps is None
    with pytest.raises(SystemExit):
        bm.parse_args(["--suite", "tpch", "--warehouse", "wh", "--link-mbps", "125"])


def test_bench_layout_totals_and_failures():
    import bench_layout as bl

    def entry(name, default, planned, match=True, error=None):
        layout = lambda bytes_read, ms, error=None: {"bytes_read": bytes_read, "best_ms": ms, "times_ms": [] if ms is None else [ms, ms * 1.1], "error": error}  # noqa: E731
        return {"name": name, "match": match, "mismatch": None if match else "values differ",
                "layouts": {"default": layout(*default), "planned": layout(*planned, error) if error is None else layout(None, None, error)}}

    good = [entry("q1", (1000, 100.0), (100, 50.0)), entry("q2", (1000, 100.0), (500, 90.0))]
    totals = bl.totals_of(good)
    assert totals["queries"] == 2 and totals["bytes_ratio"] == pytest.approx(0.3) and totals["time_ratio"] == pytest.approx(0.7)
    assert bl.failures(good, totals, 0.35) == []
    assert bl.failures(good, totals, 0.25) == ["planned bytes 0.300x the default's > 0.25"]
    slower = [entry("q1", (1000, 100.0), (100, 150.0))]
    assert bl.failures(slower, bl.totals_of(slower), 0.35) == ["planned time 1.500x the default's, not lower"]
    # A query that errors is a failure and stays out of the totals; so is a differing result.
    broken = good + [entry("q3", (1000, 100.0), None, error="boom"), entry("q4", (10, 1.0), (10, 1.0), match=False)]
    totals = bl.totals_of(broken)
    assert totals["queries"] == 3 and totals["default"]["bytes_read"] == 2010
    assert bl.failures(broken, totals, 0.35) == ["q3 planned: boom", "q4: results differ: values differ"]


def test_bench_link_verdict():
    import bench_link as bl

    assert bl.verdict({"embedded": 100.0, "node": 140.0}, 999_999, True, 1e6, 1.5) == []
    assert bl.verdict({"embedded": 100.0, "node": 160.0}, 1_000_001, True, 1e6, 1.5) == [
        "1000001 link bytes > 1e+06", "node 1.60x embedded > 1.5"]
    assert bl.verdict({"embedded": 100.0, "node": 90.0}, 0, q.Comparison(False, "row counts differ"), 1e6, 1.5) == [
        "node and embedded results differ: row counts differ"]


def test_bench_memory_verdict():
    import bench_memory as bm

    duck = [{"interpreter_mib": 18.0, "peak_mib": 400.0}, {"interpreter_mib": 20.0, "peak_mib": 410.0}]
    ok = bm.verdict([{"peak_mib": 300.0}, {"peak_mib": 330.0}], duck)
    assert ok["failures"] == [] and ok["quarry_peak_mib"] == 330.0 and ok["duckdb_peak_mib"] == 392.0
    assert bm.verdict([{"peak_mib": 393.0}], duck)["failures"] == ["quarry's peak 393 MiB is above duckdb's 392 MiB"]
    assert bm.verdict([{"error": "boom"}], duck) == {"failures": ["quarry: boom"]}


def test_select_query_files():
    assert [p.stem for p in q.select_query_files("tpch", "q6, Q01,q10")] == ["q01", "q06", "q10"]
    assert len(q.select_query_files("ssb", None)) == len(q.query_files("ssb"))
    with pytest.raises(ValueError, match="q99"):
        q.select_query_files("tpch", "q1,q99")


def test_benchmark_charts_are_drawn_from_the_scripts_json(tmp_path):
    import charts

    modes = lambda on, off: {"on": {"wall_ms": on}, "off": {"wall_ms": off}, "auto": {"wall_ms": min(on, off)}}  # noqa: E731
    sweep = [{"table": t, "query": qy, "selectivity_pct": s, **modes(10 * s, 50)} for t in ("a", "b") for qy in ("x", "y") for s in (0.1, 1, 100)]
    charts.selectivity(sweep, tmp_path / "sweep.png")
    graph = [{"scale": s, "memory": "1GB", "bfs_s": s / 10, "pr_s": s / 5, "scipy_bfs_s": s / 40, "scipy_pr_s": None} for s in (20, 22)]
    charts.graph(graph, tmp_path / "graph.svg")
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "graph.svg").read_bytes()[:500]
