"""End-to-end tests of the quarry command line: --stats, every --format, EXPLAIN [ANALYZE],
the ways to name the warehouse, Parquet loads and the synthetic generator."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
import math
import os
import re

import pytest

import quarry_py as q
from conftest import assert_no_panic

SEQ_ROWS_PER_FILE = 25_000
SEQ_FILES = 4


def _write_seq_csv(path, start, n):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("id,grp,val,note\n")
        for i in range(start, start + n):
            f.write(f"{i},{'abc'[i % 3]},{i * 0.5},note-{i:08d}-{(i * 7919) % 100000:05d}\n")


@pytest.fixture(scope="module")
def seq_warehouse(tmp_path_factory, quarry_bin):
    """Table seq: ids 0..99999 in four appended loads, so four segments with disjoint id ranges."""
    base = tmp_path_factory.mktemp("cli")
    wh = base / "warehouse"
    wh.mkdir()
    for k in range(SEQ_FILES):
        path = base / f"seq{k}.csv"
        _write_seq_csv(path, k * SEQ_ROWS_PER_FILE, SEQ_ROWS_PER_FILE)
        args = ["load", "seq", str(path), "--format", "csv",
                "--schema", "id BIGINT, grp VARCHAR, val DOUBLE, note VARCHAR"]
        if k:
            args.append("--append")
        q.run_quarry(args, wh)
    mixed = base / "mixed.csv"
    mixed.write_text(
        "id,amount,ratio,day,name,flag\n"
        "1,12.50,0.25,2024-02-29,plain,true\n"
        '2,-3.75,1e-3,1999-12-31,"comma, and ""quotes""",false\n'
        '3,,2.5,,"two\nlines",\n'
        "4,1000000.01,-7.125,1970-01-01,Zürich 東京 🎉,true\n",
        encoding="utf-8",
    )
    q.run_quarry(["load", "mixed", str(mixed), "--format", "csv", "--schema",
                  "id BIGINT, amount DECIMAL(12,2), ratio DOUBLE, day DATE, name VARCHAR, flag BOOLEAN"], wh)
    return wh


def _stats(wh, tmp_path, sql, name):
    stats = tmp_path / f"{name}.json"
    out = tmp_path / f"{name}.parquet"
    proc = q.run_quarry(["sql", sql, "--format", "parquet", "--output", str(out), "--stats", str(stats)], wh)
    assert_no_panic(proc.stderr)
    assert stats.exists(), "--stats wrote no file"
    with open(stats, encoding="utf-8") as f:
        doc = json.load(f)
    return doc, q.read_parquet_result(out)


def _check_stats_shape(doc):
    for key in ("wall_ms", "rows_returned", "bytes_read_storage", "bytes_over_link"):
        assert key in doc, f"--stats JSON lacks {key!r}: {doc}"
    assert isinstance(doc["wall_ms"], (int, float)) and not isinstance(doc["wall_ms"], bool)
    assert 0 <= doc["wall_ms"] < 600_000, doc
    for key in ("rows_returned", "bytes_read_storage", "bytes_over_link"):
        assert isinstance(doc[key], int) and not isinstance(doc[key], bool), f"{key} is not an integer: {doc}"
        assert doc[key] >= 0, doc


def test_stats_keys_and_row_counts(seq_warehouse, tmp_path):
    doc, res = _stats(seq_warehouse, tmp_path, "select count(*) from seq", "count")
    _check_stats_shape(doc)
    assert res.rows == [(SEQ_FILES * SEQ_ROWS_PER_FILE,)]
    assert doc["rows_returned"] == 1

    doc, res = _stats(seq_warehouse, tmp_path, "select id, grp from seq where id % 1000 = 7", "filter")
    _check_stats_shape(doc)
    assert len(res.rows) == SEQ_FILES * SEQ_ROWS_PER_FILE // 1000
    assert doc["rows_returned"] == len(res.rows)
    assert doc["bytes_read_storage"] > 0, f"a scan read no bytes: {doc}"
    assert doc["bytes_over_link"] > 0, f"rows were returned but nothing crossed the link: {doc}"

    doc, res = _stats(seq_warehouse, tmp_path, "select * from seq where id < 0", "empty")
    _check_stats_shape(doc)
    assert res.rows == [] and doc["rows_returned"] == 0


def test_stats_selective_scan_reads_less(seq_warehouse, tmp_path):
    full, res_full = _stats(seq_warehouse, tmp_path, "select sum(val), count(note) from seq", "full")
    sel, res_sel = _stats(
        seq_warehouse, tmp_path, "select sum(val), count(note) from seq where id between 100 and 199", "sel"
    )
    assert res_full.rows == [(sum(i * 0.5 for i in range(SEQ_FILES * SEQ_ROWS_PER_FILE)), SEQ_FILES * SEQ_ROWS_PER_FILE)]
    assert res_sel.rows == [(sum(i * 0.5 for i in range(100, 200)), 100)]
    assert full["bytes_read_storage"] > 0
    assert sel["bytes_read_storage"] < full["bytes_read_storage"], (
        "a selective WHERE on the clustered id column should read fewer bytes than a full scan: "
        f"selective {sel}, full {full}"
    )


MIXED_SQL = "select id, amount, ratio, day, name, flag from mixed order by id"


@pytest.fixture(scope="module")
def mixed_reference(seq_warehouse, tmp_path_factory):
    res = q.quarry_query(seq_warehouse, MIXED_SQL, out_dir=tmp_path_factory.mktemp("ref"))
    duck = q.duckdb_result(q.duckdb_connect(seq_warehouse), MIXED_SQL)
    cmp = q.compare_query_results(MIXED_SQL, res, duck)
    assert cmp, f"parquet output differs from the segments:\n{cmp}"
    assert res.columns == ["id", "amount", "ratio", "day", "name", "flag"]
    return res


def _text_matches(ref, text) -> bool:
    """Does a textual cell (CSV/JSON/table) represent the reference value?"""
    if ref is None:
        return text in (None, "", "NULL", "null")
    if text is None:
        return False
    if isinstance(ref, bool):
        return str(text).lower() in (("true", "t", "1") if ref else ("false", "f", "0"))
    if isinstance(ref, int):
        try:
            return int(str(text)) == ref
        except ValueError:
            return False
    if isinstance(ref, decimal.Decimal):
        try:
            return decimal.Decimal(str(text)) == ref
        except decimal.InvalidOperation:
            return False
    if isinstance(ref, float):
        try:
            return math.isclose(float(text), ref, rel_tol=1e-12, abs_tol=1e-15)
        except ValueError:
            return False
    if isinstance(ref, dt.datetime):
        return str(text).replace("T", " ").startswith(ref.isoformat(sep=" ")[:19])
    if isinstance(ref, dt.date):
        return str(text)[:10] == ref.isoformat()
    return str(text) == ref


def _assert_rows_match(ref, columns, rows, what):
    assert list(columns) == ref.columns, f"{what}: columns {columns} != {ref.columns}"
    assert len(rows) == len(ref.rows), f"{what}: {len(rows)} rows, expected {len(ref.rows)}:\n{rows}"
    for r_ref, r in zip(ref.rows, rows):
        for c, v_ref, v in zip(ref.columns, r_ref, r):
            assert _text_matches(v_ref, v), f"{what}: column {c}: {v!r} does not represent {v_ref!r}"


def _parse_json_rows(text, columns):
    text = text.strip()
    try:
        doc = json.loads(text, parse_float=decimal.Decimal)
        if isinstance(doc, dict):  # {"columns": [...], "rows": [[...]]} or {"data": [...]}
            for key in ("rows", "data", "records"):
                if key in doc:
                    doc = doc[key]
                    break
        objs = doc
    except json.JSONDecodeError:
        objs = [json.loads(line, parse_float=decimal.Decimal) for line in text.splitlines() if line.strip()]
    rows = []
    for o in objs:
        if isinstance(o, dict):
            rows.append(tuple(None if o.get(c) is None else o.get(c) for c in columns))
        else:
            rows.append(tuple(o))
    return rows


def test_format_parquet_csv_json_roundtrip(seq_warehouse, mixed_reference, tmp_path):
    ref = mixed_reference
    # csv, to a file and to stdout
    out = tmp_path / "r.csv"
    q.run_quarry(["sql", MIXED_SQL, "--format", "csv", "--output", str(out)], seq_warehouse)
    with open(out, encoding="utf-8", newline="") as f:
        table = list(csv.reader(f))
    _assert_rows_match(ref, table[0], [tuple(r) for r in table[1:]], "csv file")
    proc = q.run_quarry(["sql", MIXED_SQL, "--format", "csv"], seq_warehouse)
    table = list(csv.reader(io.StringIO(proc.stdout, newline="")))
    _assert_rows_match(ref, table[0], [tuple(r) for r in table[1:]], "csv stdout")
    # DuckDB reads quarry's CSV back with the reference types
    import duckdb

    con = duckdb.connect()
    types = ", ".join(f"'{c}': '{t}'" for c, t in zip(ref.columns, ref.types))
    back = q.duckdb_result(
        con, f"select * from read_csv('{out}', header = true, columns = {{{types}}}, quote = '\"', escape = '\"')"
    )
    assert q.compare_results(back.rows, ref.rows, ordered=True), "DuckDB reads the CSV back differently"

    # json, to a file and to stdout
    out = tmp_path / "r.json"
    q.run_quarry(["sql", MIXED_SQL, "--format", "json", "--output", str(out)], seq_warehouse)
    _assert_rows_match(ref, ref.columns, _parse_json_rows(out.read_text(encoding="utf-8"), ref.columns), "json file")
    proc = q.run_quarry(["sql", MIXED_SQL, "--format", "json"], seq_warehouse)
    _assert_rows_match(ref, ref.columns, _parse_json_rows(proc.stdout, ref.columns), "json stdout")


def test_format_table(seq_warehouse, mixed_reference, tmp_path):
    proc = q.run_quarry(["sql", "select id, amount, day, flag from mixed order by id", "--format", "table"], seq_warehouse)
    text = proc.stdout
    for c in ("id", "amount", "day", "flag"):
        assert c in text, f"table output lacks column {c}:\n{text}"
    for v in ("12.50", "-3.75", "1000000.01", "2024-02-29", "1999-12-31", "1970-01-01"):
        assert v in text, f"table output lacks {v}:\n{text}"
    # the default format is a table too, and --output writes it to a file
    proc2 = q.run_quarry(["sql", "select id, amount, day, flag from mixed order by id"], seq_warehouse)
    assert proc2.stdout.strip() == text.strip()
    out = tmp_path / "t.txt"
    q.run_quarry(["sql", "select id, amount, day, flag from mixed order by id", "--format", "table",
                  "--output", str(out)], seq_warehouse)
    assert out.read_text(encoding="utf-8").strip() == text.strip()


def test_explain_and_explain_analyze(seq_warehouse):
    sql = "select grp, count(*) from seq where id > 50000 group by grp"
    proc = q.run_quarry(["sql", "EXPLAIN " + sql], seq_warehouse)
    assert_no_panic(proc.stderr, proc.stdout)
    assert proc.stdout.strip(), "EXPLAIN printed nothing"
    assert "plan" in proc.stdout.lower(), proc.stdout
    proc = q.run_quarry(["sql", "EXPLAIN ANALYZE " + sql], seq_warehouse)
    assert_no_panic(proc.stderr, proc.stdout)
    low = proc.stdout.lower()
    assert "metrics" in low or "output_rows" in low or "elapsed" in low, (
        f"EXPLAIN ANALYZE shows no runtime metrics:\n{proc.stdout}"
    )


def test_warehouse_flag_positions_and_env(seq_warehouse, tmp_path):
    sql = "select count(*) from seq"
    expected = str(SEQ_FILES * SEQ_ROWS_PER_FILE)
    before = q.run_quarry(["sql", sql, "--format", "csv"], seq_warehouse)
    after = q.run_quarry(["sql", sql, "--format", "csv", "--warehouse", str(seq_warehouse)], None)
    env = q.run_quarry(["sql", sql, "--format", "csv"], None, env={"QUARRY_WAREHOUSE": str(seq_warehouse)})
    for proc in (before, after, env):
        assert expected in proc.stdout, proc.stdout
    # -f FILE and --threads
    f = tmp_path / "count.sql"
    f.write_text("-- count\n" + sql + ";\n", encoding="utf-8")
    proc = q.run_quarry(["sql", "-f", str(f), "--format", "csv", "--threads", "1"], seq_warehouse)
    assert expected in proc.stdout


def test_datafusion_options_from_the_environment(seq_warehouse):
    """DataFusion's own convention: DATAFUSION_<SECTION>_<KEY> sets datafusion.<section>.<key>
    (here a self-join planned as a sort-merge join instead of a hash join); a value the option
    does not take is an error naming the variable."""
    sql = "EXPLAIN select count(*) from seq a join seq b on a.id = b.id"
    default = q.run_quarry(["sql", "--format", "csv", sql], seq_warehouse).stdout
    assert "HashJoinExec" in default and "SortMergeJoin" not in default, default
    merge = q.run_quarry(["sql", "--format", "csv", sql], seq_warehouse, env={"DATAFUSION_OPTIMIZER_PREFER_HASH_JOIN": "false"}).stdout
    assert "SortMergeJoin" in merge and "HashJoinExec" not in merge, merge
    bad = q.run_quarry(["sql", "--format", "csv", sql], seq_warehouse, check=False, env={"DATAFUSION_OPTIMIZER_PREFER_HASH_JOIN": "maybe"})
    assert bad.returncode != 0
    assert "DATAFUSION_OPTIMIZER_PREFER_HASH_JOIN=maybe" in bad.stderr, bad.stderr
    assert_no_panic(bad.stderr)


def test_threads_do_not_change_results(seq_warehouse, tmp_path):
    sql = "select grp, count(*), sum(val), min(note) from seq group by grp order by grp"
    one = q.quarry_query(seq_warehouse, sql, threads=1, out_dir=tmp_path)
    two = q.quarry_query(seq_warehouse, sql, threads=2, out_dir=tmp_path)
    assert q.compare_query_results(sql, one, two)


def test_load_parquet(warehouse, tmp_path):
    import duckdb

    src = tmp_path / "src.parquet"
    con = duckdb.connect()
    con.execute(
        "copy (select i::bigint as id, (i * 1.25)::decimal(12,2) as amount, 'n' || i as name, "
        "(date '2020-01-01' + i::int) as day, case when i % 5 = 0 then null else i * 0.5 end as half "
        f"from range(1000) t(i)) to '{src}' (format parquet)"
    )
    q.run_quarry(["load", "pq", str(src), "--format", "parquet"], warehouse)
    q.run_quarry(["load", "pq", str(src), "--format", "parquet", "--append"], warehouse)
    sql = "select count(*), count(half), sum(amount), min(day), max(name) from pq"
    res = q.quarry_query(warehouse, sql, out_dir=tmp_path)
    duck = q.duckdb_result(q.duckdb_connect(warehouse), sql)
    ref = q.duckdb_result(con, sql.replace("from pq", f"from (select * from '{src}' union all select * from '{src}')"))
    assert q.compare_query_results(sql, res, duck)
    assert q.compare_query_results(sql, res, ref), f"{res.rows} != {ref.rows}"


def test_gen_synthetic(warehouse, tmp_path):
    q.run_quarry(["gen", "synthetic", "--columns", "16", "--rows", "5000", "--name", "syn16"], warehouse)
    assert "syn16" in q.list_tables(warehouse)
    res = q.quarry_query(warehouse, "select count(*) from syn16", out_dir=tmp_path)
    assert res.rows == [(5000,)]
    cols = q.quarry_query(warehouse, "select * from syn16 limit 3", out_dir=tmp_path)
    assert len(cols.columns) >= 16, cols.columns
    duck = q.duckdb_result(q.duckdb_connect(warehouse), "select * from syn16")
    full = q.quarry_query(warehouse, "select * from syn16", out_dir=tmp_path)
    assert q.compare_results(full.rows, duck.rows, ordered=False)


def test_errors_are_clean(warehouse):
    proc = q.run_quarry(["sql", "select * from no_such_table"], warehouse, check=False)
    assert proc.returncode != 0
    assert "no_such_table" in proc.stderr
    assert_no_panic(proc.stderr, proc.stdout)
    proc = q.run_quarry(["load", "t", os.path.join(str(warehouse), "does-not-exist.csv"), "--format", "csv"],
                        warehouse, check=False)
    assert proc.returncode != 0
    assert "does-not-exist.csv" in proc.stderr
    assert_no_panic(proc.stderr, proc.stdout)


def test_tables_json_lists_schemas_rows_and_sizes(seq_warehouse, tmp_path):
    listed = {t["name"]: t for t in json.loads(q.run_quarry(["tables", "--json"], seq_warehouse).stdout)}
    assert set(listed) == set(q.list_tables(seq_warehouse)), listed
    mixed = listed["mixed"]
    assert [(c["name"], c["type"]) for c in mixed["columns"]] == [
        ("id", "BIGINT"), ("amount", "DECIMAL(12,2)"), ("ratio", "DOUBLE"), ("day", "DATE"), ("name", "VARCHAR"), ("flag", "BOOLEAN")]
    manifest = q.read_manifest(seq_warehouse, "mixed")
    assert mixed["rows"] == 4 and mixed["segments"] == len(manifest["segments"]), mixed
    assert mixed["bytes"] == sum(os.path.getsize(p) for p in q.segment_paths(seq_warehouse, "mixed")), mixed
    assert mixed["versions"] == [{"node": "local", "version": manifest["version"]}], mixed
    # Spread over two nodes: rows, segments and bytes are summed, each node's version listed.
    warehouses = [tmp_path / "a", tmp_path / "b"]
    with q.StorageNodes(warehouses) as nodes:
        q.run_quarry(["gen", "tpch", "--sf", "0.01", "--segment-rows", "20000", "--nodes", nodes.arg], tmp_path / "staging")
        listed = {t["name"]: t for t in json.loads(q.run_quarry(["tables", "--json", "--nodes", nodes.arg], "/nonexistent-warehouse").stdout)}
    spread = listed["lineitem"]
    manifests = [q.read_manifest(wh, "lineitem") for wh in warehouses]
    assert spread["rows"] == sum(s["rows"] for m in manifests for s in m["segments"]) > 0, spread
    assert spread["segments"] == sum(len(m["segments"]) for m in manifests) > 2, spread
    assert [v["version"] for v in spread["versions"]] == [m["version"] for m in manifests], spread


def _run_on_terminal(args, typed=()):
    """Runs quarry with stdout and stderr on a pseudo-terminal; everything it drew. Lines in
    `typed` are typed on it too, one at each shell prompt."""
    import pty
    import select
    import subprocess
    import time

    master, slave = pty.openpty()
    stdin = slave if typed else subprocess.DEVNULL
    proc = subprocess.Popen([q.quarry_bin(), *map(str, args)], stdin=stdin, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    drawn = b""
    sent = 0
    deadline = time.monotonic() + 120
    while True:
        if sent < len(typed) and drawn.count(b"quarry> ") > sent:
            os.write(master, typed[sent].encode() + b"\r")
            sent += 1
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"quarry did not finish: {drawn[-2000:]!r}")
        ready, _, _ = select.select([master], [], [], 1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    assert proc.wait(timeout=60) == 0, drawn[-2000:]
    return drawn.decode("utf-8", "replace")


def test_progress_bar_on_a_terminal_and_none_in_a_pipe(tmp_path):
    """`quarry gen ssb --sf 1` draws a live bar (rows done of total, rate, ETA) on a terminal;
    into a pipe it prints only its summary lines."""
    drawn = _run_on_terminal(["--warehouse", tmp_path / "tty", "gen", "ssb", "--sf", "1"])
    bars = re.findall(r"lineorder \[[=> ]{30}\] ([\d,]+)/6,000,000 rows ([\d,]+)/s eta \d+", drawn)
    assert len(bars) >= 2, drawn[:2000]
    done = [int(b[0].replace(",", "")) for b in bars]
    assert done == sorted(done) and done[-1] > done[0], done
    piped = q.run_quarry(["gen", "ssb", "--sf", "1"], tmp_path / "pipe")
    assert "eta" not in piped.stdout + piped.stderr and "\r" not in piped.stdout + piped.stderr, piped.stderr
    assert re.search(r"lineorder: \d+ rows in \d+ segments", piped.stdout + piped.stderr), piped.stdout + piped.stderr


def _query_bars(drawn):
    """The query bars drawn: (bytes read, bytes planned) of each."""

    def size(text):
        number, unit = text.split()
        return float(number) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]

    return [(size(done), size(total)) for done, total in re.findall(r"query \[[=> ]{30}\] ([\d.]+ \w+)/([\d.]+ \w+) ", drawn)]


def _assert_live_bar_then_result(drawn):
    bars = _query_bars(drawn)
    assert len(bars) >= 2, drawn[-3000:]
    done, totals = [b[0] for b in bars], {b[1] for b in bars}
    # Live: the bar moved, and showed the query part way through.
    assert len(totals) == 1 and done == sorted(done) and any(0 < d < bars[0][1] for d in done), bars
    # The result comes after the last bar (which was cleared), with every group.
    assert drawn.rfind("query [") < drawn.find("| A "), drawn[-3000:]
    counts = dict(re.findall(r"\| ([ANR]) +\| (\d+) +\|", drawn))
    assert set(counts) == {"A", "N", "R"} and sum(map(int, counts.values())) == 600572, counts


def test_long_query_shows_its_progress_on_a_terminal_and_none_in_a_pipe(tmp_path):
    """A query that runs past a second draws a live bar of the stored bytes read of those
    planned, gone before its result: in the shell (embedded), and in `quarry sql` through a
    storage node, whose progress crosses the link while the fragment runs; into a pipe, none.
    A device profile that reads 4 MB/s makes TPC-H SF 0.1's lineitem (12 segments) slow."""
    warehouse = tmp_path / "wh"
    q.run_quarry(["gen", "tpch", "--sf", "0.1", "--segment-rows", "50000"], warehouse)
    profile = json.loads((q.REPO_ROOT / "profiles" / "softflash.json").read_text())
    profile.update(name="slow", read_mbps=4, link_mbps=4)
    (tmp_path / "slow.json").write_text(json.dumps(profile))
    sql = "select l_returnflag, count(*) as n from lineitem group by l_returnflag order by l_returnflag"
    slow = ["--profile", tmp_path / "slow.json"]
    _assert_live_bar_then_result(_run_on_terminal(["--warehouse", warehouse, *slow, "shell"], typed=[f"{sql};", ".quit"]))
    with q.StorageNodes([warehouse], extra_args=slow) as nodes:
        _assert_live_bar_then_result(_run_on_terminal(["--nodes", nodes.arg, "sql", sql]))
        piped = q.run_quarry(["--nodes", nodes.arg, "sql", sql])
    assert "query [" not in piped.stderr + piped.stdout and "\r" not in piped.stderr, piped.stderr
    assert re.search(r"\| R +\| 148301", piped.stdout), piped.stdout


def test_bench_shows_its_runs_on_a_terminal_and_none_in_a_pipe(tmp_path):
    """`quarry bench` draws a bar of runs done (the query at hand, runs of all, ETA) on a
    terminal; into a pipe it prints only its table."""
    args = ["bench", "ssb", "--sf", "0.1", "--repeat", "2"]
    drawn = _run_on_terminal(["--warehouse", tmp_path / "tty", *args])
    bars = re.findall(r"(q\d\.\d) \[[=> ]{30}\] (\d+)/39 runs eta \d+", drawn)
    assert len(bars) >= 2, drawn[-3000:]
    done = [int(b[1]) for b in bars]
    assert done == sorted(done) and done[-1] > done[0], done
    assert re.search(r"q4\.3 +[\d.]+ ms", drawn), drawn[-2000:]
    piped = q.run_quarry(["--warehouse", tmp_path / "pipe", *args])
    assert "eta" not in piped.stdout + piped.stderr and "runs" not in piped.stdout, piped.stdout
    assert re.search(r"q4\.3 +[\d.]+ ms", piped.stdout), piped.stdout


def test_graph_import_shows_edges_read_on_a_terminal(tmp_path):
    """`quarry graph import` of a Parquet edge list draws a bar of edges read of the file's rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 3_000_000
    src = pa.array([i % 100_003 for i in range(n)], pa.uint64())
    dst = pa.array([(i * 7919) % 100_003 for i in range(n)], pa.uint64())
    path = tmp_path / "edges.parquet"
    pq.write_table(pa.table({"src": src, "dst": dst}), path, row_group_size=65_536)
    drawn = _run_on_terminal(["--warehouse", tmp_path / "wh", "graph", "import", "g", "--from", path])
    bars = re.findall(r"edges \[[=> ]{30}\] ([\d,]+)/3,000,000 rows", drawn)
    assert any(int(b.replace(",", "")) > 0 for b in bars), drawn[-2000:]
    assert re.search(r"g: \d+ vertices, \d+ edges", drawn), drawn[-2000:]
    piped = q.run_quarry(["graph", "import", "h", "--from", path], tmp_path / "wh")
    assert "rows" not in piped.stdout + piped.stderr and "\r" not in piped.stderr, piped.stderr


def test_graph_gen_shows_edges_generated_on_a_terminal(tmp_path):
    """`quarry graph gen kron` draws a bar of edges generated of the 16 * 2^scale it makes."""
    drawn = _run_on_terminal(["--warehouse", tmp_path / "wh", "graph", "gen", "kron", "k", "--scale", "18"])
    bars = re.findall(r"generating \[[=> ]{30}\] (\d+)/4194304 edges", drawn)
    assert any(int(b) > 0 for b in bars), drawn[-2000:]
    assert re.search(r"k: \d+ vertices, \d+ edges kept of 4194304 generated", drawn), drawn[-2000:]
    piped = q.run_quarry(["graph", "gen", "kron", "j", "--scale", "18"], tmp_path / "wh")
    assert "generating" not in piped.stdout + piped.stderr and "\r" not in piped.stderr, piped.stderr


def test_bench_draws_a_chart_with_a_peers_times_and_ratios(tmp_path):
    """`quarry bench --chart` draws the per-query times as PNG or SVG; with `--peer` (another
    run's --json) each query gets the peer's bar and the ratio of the times above."""
    from xml.etree import ElementTree

    from PIL import Image

    wh = tmp_path / "wh"
    args = ["bench", "ssb", "--sf", "0.01", "--repeat", "1", "--queries", "q1.1,q2.1,q3.1"]
    q.run_quarry([*args, "--json", tmp_path / "peer.json", "--chart", tmp_path / "alone.png"], wh)
    with Image.open(tmp_path / "alone.png") as image:
        assert image.size == (1200, 600)
        colors = {color for _, color in image.convert("RGB").getcolors(1 << 20)}
    assert (31, 119, 180) in colors and (255, 127, 14) not in colors, "Quarry's bars alone"
    q.run_quarry([*args, "--chart", tmp_path / "beside.svg", "--peer", tmp_path / "peer.json", "--peer-name", "earlier"], wh)
    texts = [(t.text or "").strip() for t in ElementTree.parse(tmp_path / "beside.svg").iter() if t.tag.endswith("text")]
    assert {"q1.1", "q2.1", "q3.1"} <= set(texts), texts
    assert "earlier" in texts, texts
    assert len([t for t in texts if re.fullmatch(r"\d+\.\d\dx", t)]) == 3, texts
    bad = q.run_quarry([*args, "--chart", tmp_path / "chart.gif"], wh, check=False)
    assert bad.returncode != 0 and "must end in .png or .svg" in bad.stderr, bad.stderr


def test_ctrl_c_stops_a_statement_not_the_shell(tpch_warehouse):
    """In `quarry shell`, Ctrl-C (SIGINT) stops the running statement within seconds, even a
    join that computes for seconds between yields: the shell says so and runs the next one."""
    import signal
    import subprocess
    import time

    endless = "select count(*) from lineitem a, lineitem b where a.l_quantity + b.l_quantity < 0;\n"
    proc = subprocess.Popen([q.quarry_bin(), "--warehouse", str(tpch_warehouse), "shell"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(endless)
        proc.stdin.flush()
        time.sleep(3)
        assert proc.poll() is None, proc.communicate()
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(input="select 42 as answer;\n", timeout=60)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (out[-2000:], err[-2000:])
    assert "interrupted (Ctrl-C)" in err, err
    assert re.search(r"\| 42 +\|", out), out
    assert took < 15, took
