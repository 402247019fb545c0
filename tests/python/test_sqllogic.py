"""SQL logic tests for Quarry with DuckDB as the oracle.

Every ``tests/sqllogic/*.test`` file runs against a fresh warehouse. A file is a sequence of
records separated by blank lines; lines starting with ``#`` (between records) are comments.
Directive lines are split like a shell command line (``shlex``), so arguments holding spaces are
quoted: ``--schema 'id INT, name VARCHAR'``.

``load TABLE FILE [--schema 'S'] [--append] [--format csv|parquet]``
    Load ``tests/sqllogic/data/FILE`` into TABLE with
    ``quarry load TABLE PATH --format csv [--schema S] [--append]`` (the format defaults to the
    file's extension). The load must succeed. Then the runner checks what Quarry wrote: DuckDB
    reads the table's current segments and they must hold exactly the rows DuckDB's own CSV
    reader gets from the file(s) loaded into the table so far (RFC 4180 quoting, empty field =
    NULL), cast to the column types Quarry chose. That is the oracle for the CSV parser
    (quotes, commas and newlines inside quoted fields, UTF-8) and for type inference values.

``schema TABLE 'name TYPE, name TYPE, ...'``
    The table's columns, as DuckDB types of the written segments (BIGINT, INTEGER, DOUBLE,
    DECIMAL(p,s), DATE, TIMESTAMP, BOOLEAN, VARCHAR). A type may use ``*`` wildcards:
    ``DECIMAL(*,2)`` is any decimal of scale 2, ``TIMESTAMP*`` any timestamp precision.

``query [ordered]``  followed by SQL up to the next blank line
    Runs in Quarry (``quarry sql SQL --format parquet --output X``) and in DuckDB over views of
    the same segments; the results must be equal (``quarry_py.compare_results``). Without
    ``ordered`` rows are compared as a multiset; with it, in order (rows tied on the ORDER BY
    columns may come in any order). The SQL must mean the same in both dialects: spell out
    ``NULLS FIRST/LAST`` (DuckDB and DataFusion differ for DESC), avoid integer ``/``, and cast
    ``date ± interval`` back to ``date``.

``error SUBSTRING``  followed by SQL up to the next blank line
    Quarry must exit non-zero with SUBSTRING (case-insensitive; '' = any message) in stderr and
    without panic text ("panicked at", "RUST_BACKTRACE", a backtrace).

``load-error SUBSTRING TABLE FILE [--schema 'S'] [--append] [--format F]``
    The load must fail with SUBSTRING in stderr (no panic), and leave the table as it was: a
    table that existed gives the same ``count(*)`` and the same rows as before and its current
    segments still hold exactly the rows of its earlier loads; a table that did not exist still
    does not.

All failures of a file are collected and reported together.
"""

from __future__ import annotations

import fnmatch
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import quarry_py as q
from conftest import PANIC_MARKERS, REPO_ROOT

SQLLOGIC_DIR = REPO_ROOT / "tests" / "sqllogic"
DATA_DIR = SQLLOGIC_DIR / "data"
TEST_FILES = sorted(SQLLOGIC_DIR.glob("*.test"))


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


@dataclass
class Record:
    kind: str  # load | load-error | schema | query | error
    line: int
    table: str = ""
    file: str = ""
    schema: str | None = None
    append: bool = False
    fmt: str | None = None
    expect: str = ""  # error substring (error, load-error) or schema text (schema)
    ordered: bool = False
    sql: str = ""


class ParseError(Exception):
    pass


def _parse_load_args(tokens: list[str], rec: Record, where: str) -> None:
    if len(tokens) < 2:
        raise ParseError(f"{where}: expected TABLE FILE, got {tokens}")
    rec.table, rec.file = tokens[0], tokens[1]
    rest = tokens[2:]
    i = 0
    while i < len(rest):
        opt = rest[i]
        if opt == "--append":
            rec.append = True
            i += 1
        elif opt in ("--schema", "--format") and i + 1 < len(rest):
            if opt == "--schema":
                rec.schema = rest[i + 1]
            else:
                rec.fmt = rest[i + 1]
            i += 2
        else:
            raise ParseError(f"{where}: unknown load option {opt!r}")


def parse_test_file(path: Path) -> list[Record]:
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[Record] = []
    i = 0
    while i < len(lines):
        raw = lines[i]
        stripped = raw.strip()
        lineno = i + 1
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        where = f"{path.name}:{lineno}"
        try:
            tokens = shlex.split(stripped)
        except ValueError as e:
            raise ParseError(f"{where}: {e}") from None
        kind, args = tokens[0], tokens[1:]
        rec = Record(kind=kind, line=lineno)
        i += 1
        if kind == "load":
            _parse_load_args(args, rec, where)
        elif kind == "load-error":
            if not args:
                raise ParseError(f"{where}: load-error needs SUBSTRING TABLE FILE")
            rec.expect = args[0]
            _parse_load_args(args[1:], rec, where)
        elif kind == "schema":
            if len(args) != 2:
                raise ParseError(f"{where}: schema needs TABLE 'name TYPE, ...'")
            rec.table, rec.expect = args
        elif kind in ("query", "error"):
            if kind == "query":
                if args not in ([], ["ordered"]):
                    raise ParseError(f"{where}: query takes only 'ordered', got {args}")
                rec.ordered = args == ["ordered"]
            else:
                if len(args) != 1:
                    raise ParseError(f"{where}: error needs exactly one SUBSTRING (quote it)")
                rec.expect = args[0]
            body = []
            while i < len(lines) and lines[i].strip():
                body.append(lines[i])
                i += 1
            if not body:
                raise ParseError(f"{where}: {kind} without SQL")
            rec.sql = "\n".join(body)
        else:
            raise ParseError(f"{where}: unknown directive {kind!r}")
        records.append(rec)
    return records


# --------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------


class QuarryEngine:
    """Runs loads and queries through the quarry binary."""

    def __init__(self, warehouse: Path):
        self.warehouse = Path(warehouse)

    def load(self, table, path, fmt, schema, append) -> subprocess.CompletedProcess:
        args = ["load", table, str(path), "--format", fmt]
        if schema is not None:
            args += ["--schema", schema]
        if append:
            args.append("--append")
        return q.run_quarry(args, self.warehouse, check=False, timeout=600)

    def query(self, sql: str, out: Path) -> subprocess.CompletedProcess:
        return q.run_quarry(
            ["sql", sql, "--format", "parquet", "--output", str(out)], self.warehouse, check=False, timeout=600
        )


# --------------------------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------------------------


def _panic_text(*texts: str) -> str | None:
    for t in texts:
        for m in PANIC_MARKERS:
            if m in (t or ""):
                return m
    return None


@dataclass
class TableState:
    files: list[tuple[Path, str]] = field(default_factory=list)  # (path, format) since the last replace


class Runner:
    def __init__(self, path: Path, engine, warehouse: Path, work_dir: Path):
        self.path = path
        self.engine = engine
        self.warehouse = Path(warehouse)
        self.work = Path(work_dir)
        self.failures: list[str] = []
        self.tables: dict[str, TableState] = {}
        self._duck = None
        self._n = 0

    # -- helpers ------------------------------------------------------------------------------
    def fail(self, rec: Record, msg: str) -> None:
        head = f"{self.path.name}:{rec.line}: {rec.kind}"
        if rec.sql:
            head += "\n    " + rec.sql.replace("\n", "\n    ")
        elif rec.file:
            head += f" {rec.table} {rec.file}"
        self.failures.append(f"{head}\n  {msg.rstrip()}".replace("\n", "\n  ").rstrip())

    def duck(self):
        if self._duck is None:
            self._duck = q.duckdb_connect(self.warehouse)
        return self._duck

    def invalidate(self):
        if self._duck is not None:
            self._duck.close()
        self._duck = None

    def out_path(self) -> Path:
        self._n += 1
        return self.work / f"out-{self._n}.parquet"

    def quarry_rows(self, sql: str):
        """(Result, None) or (None, stderr) for one quarry query."""
        out = self.out_path()
        proc = self.engine.query(sql, out)
        if proc.returncode != 0:
            return None, proc.stderr or proc.stdout or f"exit status {proc.returncode}"
        if not out.exists():
            return None, "quarry exited 0 but wrote no output file"
        return q.read_parquet_result(out), None

    def table_exists(self, table: str) -> bool:
        return (self.warehouse / table / "CURRENT").is_file()

    # -- directives ---------------------------------------------------------------------------
    def run(self) -> list[str]:
        try:
            records = parse_test_file(self.path)
        except ParseError as e:
            return [f"parse error: {e}"]
        for rec in records:
            try:
                getattr(self, "do_" + rec.kind.replace("-", "_"))(rec)
            except Exception as e:  # keep going; report everything at the end
                self.fail(rec, f"{type(e).__name__}: {e}")
        self.invalidate()
        return self.failures

    def _data_file(self, rec: Record) -> tuple[Path, str]:
        path = DATA_DIR / rec.file
        fmt = rec.fmt or (path.suffix.lstrip(".").lower() or "csv")
        return path, fmt

    def do_load(self, rec: Record) -> None:
        path, fmt = self._data_file(rec)
        if not path.is_file():
            self.fail(rec, f"data file {path} does not exist")
            return
        proc = self.engine.load(rec.table, path, fmt, rec.schema, rec.append)
        self.invalidate()
        panic = _panic_text(proc.stderr, proc.stdout)
        if proc.returncode != 0 or panic:
            self.fail(rec, f"load failed (status {proc.returncode}){' with ' + panic if panic else ''}:\n{proc.stderr}")
            return
        state = self.tables.setdefault(rec.table, TableState())
        if not rec.append:
            state.files = []
        state.files.append((path, fmt))
        self.verify_contents(rec, rec.table)

    def expected_rows(self, table: str, types: list[str]):
        """Rows DuckDB reads from the table's loaded files, cast to ``types``."""
        con = self.duck()
        rows = []
        for path, fmt in self.tables[table].files:
            if fmt == "csv":
                src = (
                    f"read_csv({q.sql_string(str(path))}, header = true, all_varchar = true, "
                    "delim = ',', quote = '\"', escape = '\"', strict_mode = true, null_padding = false)"
                )
            else:
                src = f"read_parquet({q.sql_string(str(path))})"
            cols = q.duckdb_result(con, f"SELECT * FROM {src} LIMIT 0").columns
            if len(cols) != len(types):
                raise AssertionError(
                    f"{path.name} has {len(cols)} columns but the table has {len(types)}"
                )
            exprs = ", ".join(f"CAST({q.quote_ident(c)} AS {t})" for c, t in zip(cols, types))
            rows += q.duckdb_result(con, f"SELECT {exprs} FROM {src}").rows
        return rows

    def verify_contents(self, rec: Record, table: str) -> None:
        con = self.duck()
        actual = q.duckdb_result(con, f"SELECT * FROM {q.quote_ident(table)}")
        expected = self.expected_rows(table, actual.types)
        cmp = q.compare_results(actual.rows, expected, ordered=False, columns=actual.columns)
        if not cmp:
            self.fail(
                rec,
                f"the segments of {table} do not hold the rows of its CSV file(s) "
                f"(quarry = segments, duckdb = DuckDB's read_csv cast to {actual.types}):\n{cmp}",
            )

    def do_schema(self, rec: Record) -> None:
        con = self.duck()
        actual = q.duckdb_result(con, f"SELECT * FROM {q.quote_ident(rec.table)} LIMIT 0")
        want = [c.strip() for c in _split_top_level(rec.expect)]
        got = [f"{n} {t}" for n, t in zip(actual.columns, actual.types)]
        ok = len(want) == len(got)
        if ok:
            for w, (n, t) in zip(want, zip(actual.columns, actual.types)):
                wn, _, wt = w.partition(" ")
                if wn.strip('"') != n or not fnmatch.fnmatchcase(t.upper().replace(" ", ""), wt.upper().replace(" ", "")):
                    ok = False
                    break
        if not ok:
            self.fail(rec, f"schema differs\n  expected: {', '.join(want)}\n  actual:   {', '.join(got)}")

    def do_query(self, rec: Record) -> None:
        quarry, err = self.quarry_rows(rec.sql)
        if quarry is None:
            self.fail(rec, f"quarry failed:\n{err}")
            return
        try:
            duck = q.duckdb_result(self.duck(), rec.sql)
        except Exception as e:
            self.fail(rec, f"DuckDB (the oracle) failed, fix the test: {e}")
            return
        if len(quarry.columns) != len(duck.columns):
            self.fail(rec, f"column counts differ: quarry {quarry.columns}, duckdb {duck.columns}")
            return
        order_key = q.order_key_indices(rec.sql, duck.columns) if rec.ordered else None
        cmp = q.compare_results(
            quarry.rows,
            duck.rows,
            ordered=rec.ordered,
            decimal_scales=list(zip(quarry.decimal_scales, duck.decimal_scales)),
            order_key=order_key,
            columns=duck.columns,
        )
        if not cmp:
            self.fail(rec, f"{cmp}\nquarry types: {quarry.types}\nduckdb types: {duck.types}")

    def _check_error(self, rec: Record, proc, what: str) -> None:
        panic = _panic_text(proc.stderr, proc.stdout)
        if proc.returncode == 0:
            self.fail(rec, f"{what} succeeded but should have failed with {rec.expect!r}")
        elif panic:
            self.fail(rec, f"{what} failed with {panic!r} in its output:\n{proc.stderr}")
        elif rec.expect.lower() not in (proc.stderr or "").lower():
            self.fail(rec, f"{what} failed, but stderr lacks {rec.expect!r}:\n{proc.stderr}")

    def do_error(self, rec: Record) -> None:
        proc = self.engine.query(rec.sql, self.out_path())
        self._check_error(rec, proc, "query")

    def do_load_error(self, rec: Record) -> None:
        path, fmt = self._data_file(rec)
        existed = self.table_exists(rec.table)
        table = q.quote_ident(rec.table)
        before_count = before_rows = None
        if existed:
            before_count, err = self.quarry_rows(f"SELECT count(*) FROM {table}")
            before_rows, err2 = self.quarry_rows(f"SELECT * FROM {table}")
            if before_count is None or before_rows is None:
                self.fail(rec, f"cannot query {rec.table} before the load: {err or err2}")
                return
        proc = self.engine.load(rec.table, path, fmt, rec.schema, rec.append)
        self.invalidate()
        self._check_error(rec, proc, "load")
        if existed:
            after_count, err = self.quarry_rows(f"SELECT count(*) FROM {table}")
            after_rows, err2 = self.quarry_rows(f"SELECT * FROM {table}")
            if after_count is None or after_rows is None:
                self.fail(rec, f"{rec.table} cannot be queried after the failed load: {err or err2}")
                return
            if after_count.rows != before_count.rows:
                self.fail(rec, f"count(*) of {rec.table} changed from {before_count.rows[0][0]} "
                               f"to {after_count.rows[0][0]} after the failed load")
            cmp = q.compare_results(after_rows.rows, before_rows.rows, ordered=False, columns=after_rows.columns)
            if not cmp:
                self.fail(rec, f"rows of {rec.table} changed after the failed load "
                               f"(quarry = after, duckdb = before):\n{cmp}")
            if rec.table in self.tables:
                self.verify_contents(rec, rec.table)
        else:
            if self.table_exists(rec.table):
                self.fail(rec, f"the failed load created table {rec.table}")
            res, _ = self.quarry_rows(f"SELECT count(*) FROM {table}")
            if res is not None:
                self.fail(rec, f"{rec.table} did not exist before the failed load but can be queried "
                               f"after it (count(*) = {res.rows})")


def _split_top_level(text: str) -> list[str]:
    """Split 'a INT, b DECIMAL(10,2)' at the commas outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def run_file(path: Path, engine_factory, base_dir: Path) -> list[str]:
    """Run one .test file in a fresh warehouse under base_dir; returns the failure messages."""
    wh = base_dir / "warehouse"
    wh.mkdir(parents=True, exist_ok=False)
    work = base_dir / "work"
    work.mkdir()
    return Runner(path, engine_factory(wh), wh, work).run()


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def test_sqllogic_files_present():
    names = {p.stem for p in TEST_FILES}
    for required in ("nulls", "empty", "decimals", "dates", "strings", "wide", "errors", "inference"):
        assert required in names, f"tests/sqllogic/{required}.test is missing"
    for p in TEST_FILES:
        parse_test_file(p)  # raises ParseError on a malformed file
        first = p.read_text(encoding="utf-8").lstrip().splitlines()[0]
        assert first.startswith("#"), f"{p.name} must open with a comment paragraph"


@pytest.mark.parametrize("path", TEST_FILES, ids=[p.stem for p in TEST_FILES])
def test_sqllogic(path, quarry_bin, tmp_path):
    failures = run_file(path, QuarryEngine, tmp_path)
    if failures:
        pytest.fail(
            f"{len(failures)} failing record(s) in tests/sqllogic/{path.name}:\n\n" + "\n\n".join(failures),
            pytrace=False,
        )
