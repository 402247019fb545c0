"""Shared Python helpers for Quarry's benchmark scripts and tests.

* reading a Quarry warehouse from DuckDB (``segment_paths``, ``duckdb_connect``),
* running the ``quarry`` binary (``quarry_bin``, ``run_quarry``, ``quarry_query``),
* comparing two query results (``compare_results``).

Warehouse layout (written by quarry-table)::

    WAREHOUSE/<table>/CURRENT                   -> text: the current manifest's file name
    WAREHOUSE/<table>/manifest-00000003.json    -> {"schema": {"fields": [...]},
                                                    "segments": [{"path": "data/x.parquet", ...}]}
    WAREHOUSE/<table>/data/x.parquet

Only the segments listed in the *current* manifest belong to the table; anything else under
``data/`` (files of older versions, half-written files of a failed load) is ignored.

Only the standard library and ``duckdb`` are needed (``duckdb`` is imported lazily, so the
pure helpers work without it).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import math
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------
# Warehouse layout
# --------------------------------------------------------------------------------------------


def current_manifest_path(warehouse: str | os.PathLike, table: str) -> Path:
    """Path of the manifest that ``WAREHOUSE/<table>/CURRENT`` points at."""
    table_dir = Path(warehouse) / table
    name = (table_dir / "CURRENT").read_text(encoding="utf-8").strip()
    if not name:
        raise ValueError(f"{table_dir / 'CURRENT'} is empty")
    return table_dir / name


def read_manifest(warehouse: str | os.PathLike, table: str) -> dict:
    """The current manifest of ``table`` as parsed JSON."""
    with open(current_manifest_path(warehouse, table), encoding="utf-8") as f:
        return json.load(f)


def segment_paths(warehouse: str | os.PathLike, table: str) -> list[str]:
    """Absolute paths of the Parquet segments of ``table``'s current version (may be empty)."""
    table_dir = Path(warehouse).resolve() / table
    manifest = read_manifest(warehouse, table)
    paths = []
    for seg in manifest.get("segments") or []:
        rel = seg["path"] if isinstance(seg, dict) else seg
        p = Path(rel)
        paths.append(str(p if p.is_absolute() else table_dir / p))
    return paths


def warehouse_segment_paths(warehouse: str | os.PathLike) -> list[str]:
    """Absolute paths of the segments of every table's current version."""
    return [path for table in list_tables(warehouse) for path in segment_paths(warehouse, table)]


def evict_from_page_cache(paths: Iterable[str | os.PathLike]) -> None:
    """Drops the page-cache pages of each file (``posix_fadvise(DONTNEED)``): its next read is cold."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def list_tables(warehouse: str | os.PathLike) -> list[str]:
    """Tables of a warehouse: its subdirectories holding a ``CURRENT`` file, sorted."""
    root = Path(warehouse)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "CURRENT").is_file())


_SIMPLE_TYPES = {
    "null": "INTEGER",
    "boolean": "BOOLEAN",
    "int8": "TINYINT",
    "int16": "SMALLINT",
    "int32": "INTEGER",
    "int64": "BIGINT",
    "uint8": "UTINYINT",
    "uint16": "USMALLINT",
    "uint32": "UINTEGER",
    "uint64": "UBIGINT",
    "float16": "FLOAT",
    "float32": "FLOAT",
    "float64": "DOUBLE",
    "utf8": "VARCHAR",
    "largeutf8": "VARCHAR",
    "utf8view": "VARCHAR",
    "binary": "BLOB",
    "largebinary": "BLOB",
    "binaryview": "BLOB",
    "date32": "DATE",
    "date64": "DATE",
}


def arrow_type_to_duckdb(data_type: str) -> str:
    """Map an Arrow ``DataType`` Display string (as stored in a manifest) to a DuckDB type.

    Handles the primitive types, ``Decimal128(p, s)``/``Decimal256(p, s)``, ``Timestamp(...)`` in
    both the old (``Timestamp(Microsecond, None)``) and new (``Timestamp(µs)``, ``Timestamp(ns,
    "+00:00")``) spellings, ``Time32/Time64`` and ``Interval``; a ``FixedSizeBinary(n)`` becomes a
    BLOB. Raises ``ValueError`` for anything else (lists, structs, ...).
    """
    t = data_type.strip()
    key = t.lower().replace(" ", "")
    if key in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[key]
    m = re.fullmatch(r"decimal(?:32|64|128|256)?\((\d+),(-?\d+)\)", key)
    if m:
        p, s = int(m.group(1)), int(m.group(2))
        if p > 38:  # DuckDB's widest decimal; Quarry never writes these for the test data
            return "DOUBLE"
        return f"DECIMAL({p},{max(s, 0)})"
    if key.startswith("timestamp"):
        inner = key[len("timestamp(") : -1] if key.endswith(")") else ""
        parts = [x for x in inner.split(",") if x]
        has_tz = len(parts) > 1 and parts[1] not in ("none",)
        return "TIMESTAMPTZ" if has_tz else "TIMESTAMP"
    if key.startswith("time32") or key.startswith("time64"):
        return "TIME"
    if key.startswith("interval") or key.startswith("duration"):
        return "INTERVAL"
    if key.startswith("fixedsizebinary"):
        return "BLOB"
    if key.startswith("dictionary("):
        # Dictionary(Int32, Utf8): the value type decides.
        inner = t[t.index("(") + 1 : -1]
        return arrow_type_to_duckdb(inner.split(",", 1)[1])
    raise ValueError(f"no DuckDB type for Arrow type {data_type!r}")


def quote_ident(name: str) -> str:
    """Quote an SQL identifier (works for DuckDB and DataFusion)."""
    return '"' + name.replace('"', '""') + '"'


def sql_string(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def duckdb_connect(
    warehouse: str | os.PathLike | Sequence[str | os.PathLike],
    tables: Iterable[str] | None = None,
    threads: int | None = None,
):
    """An in-memory DuckDB connection with one view per warehouse table.

    Each view reads exactly the segments of the table's current manifest
    (``read_parquet([...])``); a table without segments becomes an empty table with the
    manifest's schema. ``tables`` restricts the set (default: every table of the warehouse).
    ``warehouse`` may be a list: the warehouses of several storage nodes, each holding some of
    a table's segments; a view then reads the segments of all of them.
    """
    import duckdb

    warehouses = [warehouse] if isinstance(warehouse, (str, os.PathLike)) else list(warehouse)
    con = duckdb.connect(":memory:")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    names = list(tables) if tables is not None else list_tables(warehouses[0])
    for table in names:
        paths = [p for wh in warehouses for p in segment_paths(wh, table)]
        ident = quote_ident(table)
        if paths:
            files = ", ".join(sql_string(p) for p in paths)
            con.execute(f"CREATE VIEW {ident} AS SELECT * FROM read_parquet([{files}])")
        else:
            fields = read_manifest(warehouses[0], table).get("schema", {}).get("fields", [])
            if not fields:
                raise ValueError(f"table {table!r} has neither segments nor a schema in its manifest")
            cols = ", ".join(
                f"{quote_ident(f['name'])} {arrow_type_to_duckdb(f['data_type'])}" for f in fields
            )
            con.execute(f"CREATE TABLE {ident} ({cols})")
    return con


# --------------------------------------------------------------------------------------------
# Storage nodes (`quarry serve`) as separate processes
# --------------------------------------------------------------------------------------------


class StorageNodes:
    """``quarry serve`` processes, one per warehouse, on free loopback ports.

    Use as a context manager; ``urls`` is what ``--nodes`` takes (comma-joined by ``arg``).
    Each node prints its address as the first line of its stdout once it listens.
    """

    def __init__(self, warehouses: Sequence[str | os.PathLike], extra_args: Sequence[str] = (), env: dict | None = None):
        self.warehouses = [Path(w) for w in warehouses]
        self.extra_args = [str(a) for a in extra_args]
        self.env = env
        self.procs: list[subprocess.Popen] = []
        self.urls: list[str] = []

    def __enter__(self) -> "StorageNodes":
        try:
            for wh in self.warehouses:
                wh.mkdir(parents=True, exist_ok=True)
                self.procs.append(start_node(wh, self.extra_args, env=self.env))
                self.urls.append(read_node_url(self.procs[-1]))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def arg(self) -> str:
        return ",".join(self.urls)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def start_node(warehouse: str | os.PathLike, extra_args: Sequence[str] = (), env: dict | None = None) -> subprocess.Popen:
    """Starts ``quarry serve`` over ``warehouse`` on a free loopback port (read the URL with
    :func:`read_node_url`)."""
    cmd = [quarry_bin(), "--warehouse", str(warehouse), "serve", "--listen", "127.0.0.1:0", *map(str, extra_args)]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, **(env or {})},
    )


def read_node_url(proc: subprocess.Popen, timeout: float = 60) -> str:
    """The ``grpc://...`` (or ``grpc+tls://...``) line a starting node prints; raises with its
    stderr if it exits."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        proc.kill()
        raise RuntimeError(f"storage node did not report its address within {timeout} s")
    line = proc.stdout.readline().strip()
    if not line.startswith(("grpc://", "grpc+tls://")):
        proc.wait(timeout=30)
        raise RuntimeError(f"storage node failed to start (exit {proc.returncode}): {proc.stderr.read()}")
    return line


@dataclass
class Result:
    """A query result: column names, DuckDB type strings and rows (tuples of Python values)."""

    columns: list[str]
    types: list[str]
    rows: list[tuple]

    @property
    def decimal_scales(self) -> list[int | None]:
        return [decimal_scale(t) for t in self.types]


def decimal_scale(type_name: str) -> int | None:
    """Scale of a DuckDB ``DECIMAL(p,s)`` type string, else None."""
    m = re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", str(type_name).strip(), re.IGNORECASE)
    return int(m.group(2)) if m else None


def duckdb_result(con, sql: str) -> Result:
    """Run ``sql`` on a DuckDB connection and return the whole result."""
    cur = con.execute(sql)
    rows = cur.fetchall()
    desc = cur.description or []
    return Result([d[0] for d in desc], [str(d[1]) for d in desc], [tuple(r) for r in rows])


def read_parquet_result(path: str | os.PathLike) -> Result:
    """Read a Parquet file (e.g. Quarry's ``--format parquet`` output) with DuckDB."""
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        return duckdb_result(con, f"SELECT * FROM read_parquet({sql_string(str(path))})")
    finally:
        con.close()


# --------------------------------------------------------------------------------------------
# Running the binary
# --------------------------------------------------------------------------------------------


class QuarryError(RuntimeError):
    """``quarry`` exited with a non-zero status."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str):
        self.args_ = list(args)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(
            f"quarry exited with status {returncode}: {' '.join(map(str, args))}\n"
            f"--- stderr ---\n{stderr.strip()}\n--- stdout (tail) ---\n{stdout[-2000:].strip()}"
        )


def quarry_bin() -> str:
    """Path of the quarry binary: ``$QUARRY_BIN`` or ``<repo>/target/release/quarry``."""
    return os.environ.get("QUARRY_BIN") or str(REPO_ROOT / "target" / "release" / "quarry")


def run_quarry(
    args: Sequence[str],
    warehouse: str | os.PathLike | None = None,
    *,
    check: bool = True,
    timeout: float | None = 1800,
    env: dict | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``quarry [--warehouse W] ARGS...`` and capture its output (text).

    With ``check`` (the default) a non-zero exit raises :class:`QuarryError` carrying stderr.
    """
    cmd = [quarry_bin()]
    if warehouse is not None:
        cmd += ["--warehouse", str(warehouse)]
    cmd += [str(a) for a in args]
    full_env = dict(os.environ)
    full_env.setdefault("RUST_BACKTRACE", "0")
    if env:
        full_env.update(env)
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        timeout=timeout,
        env=full_env,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise QuarryError(cmd, proc.returncode, proc.stdout, proc.stderr)
    return proc


def quarry_query(
    warehouse: str | os.PathLike,
    sql: str | None = None,
    *,
    file: str | os.PathLike | None = None,
    threads: int | None = None,
    stats: str | os.PathLike | None = None,
    out_dir: str | os.PathLike | None = None,
) -> Result:
    """Run one query through ``quarry sql ... --format parquet --output X`` and read X back."""
    if (sql is None) == (file is None):
        raise ValueError("give exactly one of sql and file")
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="quarry-result-")
        out_dir = tmp.name
    try:
        out = Path(out_dir) / f"result-{os.getpid()}-{next(_counter)}.parquet"
        args = ["sql"]
        args += [sql] if sql is not None else ["-f", str(file)]
        args += ["--format", "parquet", "--output", str(out)]
        if threads:
            args += ["--threads", str(threads)]
        if stats:
            args += ["--stats", str(stats)]
        run_quarry(args, warehouse)
        if not out.exists():
            raise RuntimeError(f"quarry exited 0 but wrote no {out}")
        return read_parquet_result(out)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _count():
    n = 0
    while True:
        n += 1
        yield n


_counter = _count()


# --------------------------------------------------------------------------------------------
# SQL text helpers
# --------------------------------------------------------------------------------------------


def strip_sql_comments(sql: str) -> str:
    """Remove ``-- ...`` and ``/* ... */`` comments (outside string literals)."""
    out, i, n = [], 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "'" or c == '"':
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:
                        j += 2
                        continue
                    break
                j += 1
            out.append(sql[i : j + 1])
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _mask_nested(sql: str) -> str:
    """Blank out string literals and everything inside parentheses (keeps offsets)."""
    out = list(sql)
    depth, i, n = 0, 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"":
            j = i + 1
            while j < n and not (sql[j] == c and not (j + 1 < n and sql[j + 1] == c)):
                j += 2 if (sql[j] == c) else 1
            for k in range(i, min(j + 1, n)):
                out[k] = " "
            i = j + 1
            continue
        if c == "(":
            depth += 1
            out[i] = " "
        elif c == ")":
            depth -= 1
            out[i] = " "
        elif depth > 0:
            out[i] = " "
        i += 1
    return "".join(out)


def top_level_order_by(sql: str) -> list[str] | None:
    """The items of the statement's top-level ORDER BY (without ASC/DESC/NULLS ...), or None."""
    text = strip_sql_comments(sql).strip().rstrip(";")
    masked = _mask_nested(text)
    matches = list(re.finditer(r"\border\s+by\b", masked, re.IGNORECASE))
    if not matches:
        return None
    m = matches[-1]
    tail_masked = masked[m.end() :]
    stop = re.search(r"\b(limit|offset|fetch)\b", tail_masked, re.IGNORECASE)
    clause = text[m.end() : m.end() + (stop.start() if stop else len(tail_masked))]
    items, depth, cur = [], 0, []
    for ch in clause:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    cleaned = []
    for it in items:
        it = re.sub(r"\s+nulls\s+(first|last)\s*$", "", it.strip(), flags=re.IGNORECASE)
        it = re.sub(r"\s+(asc|desc)\s*$", "", it, flags=re.IGNORECASE)
        cleaned.append(it.strip())
    return cleaned


def has_top_level_order_by(sql: str) -> bool:
    return top_level_order_by(sql) is not None


def order_key_indices(sql: str, columns: Sequence[str]) -> list[int] | None:
    """Result-column indices of the top-level ORDER BY items when every item names an output
    column (by name, ``table.name`` or 1-based position); None when there is no ORDER BY or an
    item is an expression (then the caller compares the order strictly)."""
    items = top_level_order_by(sql)
    if not items:
        return None
    lower = [c.lower() for c in columns]
    idx = []
    for it in items:
        name = it.strip().strip('"').lower()
        if name.isdigit() and 1 <= int(name) <= len(columns):
            idx.append(int(name) - 1)
            continue
        name = name.split(".")[-1].strip('"')
        if name in lower:
            idx.append(lower.index(name))
        else:
            return None
    return idx


# --------------------------------------------------------------------------------------------
# Result comparison
# --------------------------------------------------------------------------------------------

FLOAT_REL_TOL = 1e-9
FLOAT_ABS_TOL = 1e-12


@dataclass
class Comparison:
    ok: bool
    message: str = ""

    def __bool__(self) -> bool:  # so `assert compare_results(...)` works
        return self.ok

    def __str__(self) -> str:
        return self.message or ("results match" if self.ok else "results differ")


def _is_num(v) -> bool:
    return isinstance(v, (int, float, decimal.Decimal)) and not isinstance(v, bool)


def _scale_of(v: decimal.Decimal, declared: int | None) -> int:
    if declared is not None:
        return declared
    exp = v.as_tuple().exponent
    return -exp if isinstance(exp, int) and exp < 0 else 0


def values_equal(a: Any, b: Any, scale_a: int | None = None, scale_b: int | None = None) -> bool:
    """Compare two cell values with the rules of :func:`compare_results`."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_num(a) and _is_num(b):
        a_dec, b_dec = isinstance(a, decimal.Decimal), isinstance(b, decimal.Decimal)
        if isinstance(a, float) or isinstance(b, float):
            fa, fb = float(a), float(b)
            if math.isnan(fa) or math.isnan(fb):
                return math.isnan(fa) and math.isnan(fb)
            if math.isinf(fa) or math.isinf(fb):
                return fa == fb
            tol = max(FLOAT_REL_TOL * max(abs(fa), abs(fb)), FLOAT_ABS_TOL)
            if a_dec or b_dec:
                # A decimal cut to its scale (DataFusion truncates AVG and division results at the
                # result scale, others round) is less than one unit away from the exact value.
                s = _scale_of(a if a_dec else b, scale_a if a_dec else scale_b)
                return abs(fa - fb) < max(tol, 10.0 ** (-s) * (1 + 1e-9))
            return abs(fa - fb) <= tol
        if a_dec and b_dec:
            da, db = a, b
            sa, sb = _scale_of(da, scale_a), _scale_of(db, scale_b)
            coarse = min(sa, sb)
            if sa == sb:
                return da == db
            # Both sides are exact at their own scale; the finer one may hold digits that the
            # coarser one rounded or truncated away: less than one unit of the coarser scale.
            return abs(da - db) < decimal.Decimal(1).scaleb(-coarse)
        # int vs int, or int vs decimal: exact
        return decimal.Decimal(a) == decimal.Decimal(b)
    if isinstance(a, _dt.datetime) and isinstance(b, _dt.datetime):
        if (a.tzinfo is None) != (b.tzinfo is None):
            a, b = a.replace(tzinfo=None), b.replace(tzinfo=None)
        return a == b
    if type(a) is _dt.date and isinstance(b, _dt.datetime) or type(b) is _dt.date and isinstance(a, _dt.datetime):
        return False
    if isinstance(a, (bytes, bytearray, memoryview)) or isinstance(b, (bytes, bytearray, memoryview)):
        return bytes(a) == bytes(b) if not isinstance(a, str) and not isinstance(b, str) else False
    return a == b


def _sort_key_value(v):
    """A total-order key: type-group first, then a normalized value (floats rounded)."""
    if v is None:
        return (0, 0)
    if isinstance(v, bool):
        return (1, int(v))
    if _is_num(v):
        f = float(v)
        if math.isnan(f):
            return (2, float("inf"), 1)
        if f == 0 or math.isinf(f):
            return (2, f, 0)
        digits = 9 - int(math.floor(math.log10(abs(f))))
        return (2, round(f, digits), 0)
    if isinstance(v, _dt.datetime):
        return (3, v.replace(tzinfo=None).isoformat())
    if isinstance(v, _dt.date):
        return (3, v.isoformat())
    if isinstance(v, (bytes, bytearray, memoryview)):
        return (5, bytes(v))
    return (4, str(v))


def _row_key(row):
    return tuple(_sort_key_value(v) for v in row)


def _fmt(v) -> str:
    if isinstance(v, decimal.Decimal):
        return f"Decimal('{v}')"
    return repr(v)


def _fmt_row(row) -> str:
    return "(" + ", ".join(_fmt(v) for v in row) + ")"


def _rows_equal(qa, dr, scales_q, scales_d) -> bool:
    return len(qa) == len(dr) and all(
        values_equal(x, y, sq, sd) for x, y, sq, sd in zip(qa, dr, scales_q, scales_d)
    )


def _multiset_match(q_rows, d_rows, scales_q, scales_d):
    """Match rows order-insensitively. Returns (unmatched quarry rows, unmatched duckdb rows)."""
    qs = sorted(q_rows, key=_row_key)
    ds = sorted(d_rows, key=_row_key)
    un_q, un_d = [], []
    i = j = 0
    # Fast path: walk both sorted lists; on a mismatch, set the smaller-keyed row aside.
    while i < len(qs) and j < len(ds):
        if _rows_equal(qs[i], ds[j], scales_q, scales_d):
            i += 1
            j += 1
        elif _row_key(qs[i]) <= _row_key(ds[j]):
            un_q.append(qs[i])
            i += 1
        else:
            un_d.append(ds[j])
            j += 1
    un_q.extend(qs[i:])
    un_d.extend(ds[j:])
    # Slow path for near-equal values that normalized to different sort keys.
    if un_q and un_d and len(un_q) * len(un_d) <= 4_000_000:
        rest_d = list(un_d)
        still_q = []
        for r in un_q:
            for k, d in enumerate(rest_d):
                if _rows_equal(r, d, scales_q, scales_d):
                    del rest_d[k]
                    break
            else:
                still_q.append(r)
        un_q, un_d = still_q, rest_d
    return un_q, un_d


def compare_results(
    quarry_rows: Sequence[Sequence],
    duck_rows: Sequence[Sequence],
    ordered: bool = False,
    decimal_scales: Sequence | None = None,
    *,
    order_key: Sequence[int] | None = None,
    columns: Sequence[str] | None = None,
    max_diff_rows: int = 10,
) -> Comparison:
    """Compare Quarry's rows with DuckDB's.

    * ``ordered``: rows must come in the same order (the query has a top-level ORDER BY). With
      ``order_key`` (the result-column indices of the ORDER BY items) rows whose key values are
      all equal form a tie group, compared order-insensitively, so a legitimate different order
      of ties is accepted; the sequence of key values itself must match.
    * values: NULL == NULL; ints exact; floats within 1e-9 relative; decimals (from either side)
      of different scales within one unit of the coarser side's scale, float vs decimal within one
      unit of the decimal's scale (a result cut to its scale is off by less than one unit: half a
      unit when the engine rounds, but DataFusion truncates AVG and decimal division results, e.g.
      avg 25.2804186 comes back as 25.280418); decimals of equal scale, dates, timestamps and
      strings exact.
    * ``decimal_scales``: per column, the declared decimal scale — either one int/None per column
      (used for both sides) or a ``(quarry_scale, duckdb_scale)`` pair per column. Without it the
      scale of each Decimal value is its exponent (DuckDB keeps the column scale in the value).

    Returns a :class:`Comparison` (truthy when equal) whose message shows the first differences.
    """
    q_rows = [tuple(r) for r in quarry_rows]
    d_rows = [tuple(r) for r in duck_rows]
    width_q = {len(r) for r in q_rows}
    width_d = {len(r) for r in d_rows}
    ncols = max(width_q | width_d | {0})
    if q_rows and d_rows and width_q != width_d:
        return Comparison(False, f"column counts differ: quarry {sorted(width_q)}, duckdb {sorted(width_d)}")
    scales_q: list[int | None] = [None] * ncols
    scales_d: list[int | None] = [None] * ncols
    if decimal_scales is not None:
        for i, s in enumerate(list(decimal_scales)[:ncols]):
            if isinstance(s, (tuple, list)):
                scales_q[i], scales_d[i] = s[0], s[1]
            else:
                scales_q[i] = scales_d[i] = s
    header = ""
    if columns:
        header = "columns: " + ", ".join(columns) + "\n"

    problems: list[str] = []
    if len(q_rows) != len(d_rows):
        problems.append(f"row counts differ: quarry {len(q_rows)}, duckdb {len(d_rows)}")

    if not ordered:
        un_q, un_d = _multiset_match(q_rows, d_rows, scales_q, scales_d)
        if not un_q and not un_d and not problems:
            return Comparison(True)
        lines = problems + [
            f"{len(un_q)} quarry row(s) without an equal duckdb row, "
            f"{len(un_d)} duckdb row(s) without an equal quarry row (order-insensitive)"
        ]
        if un_q:
            lines.append("only in quarry:")
            lines += ["  " + _fmt_row(r) for r in un_q[:max_diff_rows]]
        if un_d:
            lines.append("only in duckdb:")
            lines += ["  " + _fmt_row(r) for r in un_d[:max_diff_rows]]
        return Comparison(False, header + "\n".join(lines))

    # Ordered comparison.
    diffs = []
    if order_key:
        # Split duckdb's rows into tie groups by key; compare group by group.
        i = 0
        while i < len(d_rows) and i < len(q_rows):
            j = i + 1
            while j < len(d_rows) and all(
                values_equal(d_rows[j][k], d_rows[i][k], scales_d[k], scales_d[k]) for k in order_key
            ):
                j += 1
            group_d = d_rows[i:j]
            group_q = q_rows[i:j]
            if len(group_d) == 1:
                if not _rows_equal(group_q[0], group_d[0], scales_q, scales_d):
                    diffs.append((i, group_q[0], group_d[0]))
            else:
                un_q, un_d = _multiset_match(group_q, group_d, scales_q, scales_d)
                if un_q or un_d:
                    # A group cut by LIMIT may legitimately hold different tied rows when it is the
                    # last group; anything else is a real difference.
                    last_group = j >= len(d_rows)
                    keys_ok = all(
                        all(values_equal(r[k], group_d[0][k], scales_q[k], scales_d[k]) for k in order_key)
                        for r in group_q
                    )
                    if not (last_group and keys_ok and len(group_q) == len(group_d)):
                        for r_q, r_d in zip(un_q + [None] * len(un_d), un_d + [None] * len(un_q)):
                            diffs.append((i, r_q, r_d))
                            if len(diffs) >= max_diff_rows:
                                break
            if len(diffs) >= max_diff_rows:
                break
            i = j
    else:
        for i, (r_q, r_d) in enumerate(zip(q_rows, d_rows)):
            if not _rows_equal(r_q, r_d, scales_q, scales_d):
                diffs.append((i, r_q, r_d))
                if len(diffs) >= max_diff_rows:
                    break
    if not diffs and not problems:
        return Comparison(True)
    lines = list(problems)
    if diffs:
        lines.append(f"first differing rows (ordered comparison{', ties by ' + str(list(order_key)) if order_key else ''}):")
        for i, r_q, r_d in diffs:
            lines.append(f"  row {i}: quarry {_fmt_row(r_q) if r_q is not None else '-'}")
            lines.append(f"  row {i}: duckdb {_fmt_row(r_d) if r_d is not None else '-'}")
    elif problems and len(q_rows) != len(d_rows):
        n = min(len(q_rows), len(d_rows))
        extra = q_rows[n:] if len(q_rows) > n else d_rows[n:]
        who = "quarry" if len(q_rows) > n else "duckdb"
        lines.append(f"the first {n} rows agree; extra {who} rows:")
        lines += ["  " + _fmt_row(r) for r in extra[:max_diff_rows]]
    return Comparison(False, header + "\n".join(lines))


def assert_file_query_equals_duckdb(warehouse, con, path: Path, out_dir: Path) -> None:
    """Runs the query in ``path`` in Quarry over ``warehouse`` and in DuckDB (``con``, over the
    same segments) and asserts their results are equal (see :func:`compare_query_results`)."""
    sql = path.read_text(encoding="utf-8")
    quarry = quarry_query(warehouse, file=path, out_dir=out_dir)
    duck = duckdb_result(con, sql)
    cmp = compare_query_results(sql, quarry, duck)
    assert cmp, (
        f"{path.parent.name}/{path.name}: Quarry and DuckDB disagree\n{cmp}\n"
        f"quarry types: {quarry.types}\nduckdb types: {duck.types}"
    )


def logical_plan(warehouse, sql: str) -> str:
    """The optimized logical plan of ``sql`` (EXPLAIN's text between its two plans)."""
    out = run_quarry(["sql", "--format", "csv", f"EXPLAIN {sql}"], warehouse).stdout
    assert "logical_plan" in out and "physical_plan" in out, out
    return out[out.index("logical_plan"):out.index("physical_plan")]


def compare_query_results(sql: str, quarry: Result, duck: Result, **kw) -> Comparison:
    """Compare two :class:`Result` objects of the same SQL: ordered (with tie groups) when the
    SQL has a top-level ORDER BY, otherwise order-insensitive."""
    ordered = has_top_level_order_by(sql)
    order_key = order_key_indices(sql, duck.columns) if ordered else None
    scales = list(zip(quarry.decimal_scales, duck.decimal_scales)) if quarry.types and duck.types else None
    if len(quarry.columns) != len(duck.columns) and quarry.rows and duck.rows:
        return Comparison(
            False, f"column counts differ: quarry {quarry.columns}, duckdb {duck.columns}"
        )
    return compare_results(
        quarry.rows,
        duck.rows,
        ordered=ordered,
        decimal_scales=scales,
        order_key=order_key,
        columns=duck.columns,
        **kw,
    )


def load_csv_tables(warehouse: str | os.PathLike, tables: dict[str, tuple[str, str]]) -> Path:
    """Load each ``name: (csv text, schema)`` into ``warehouse`` with ``quarry load``; the CSV
    files are written beside it."""
    warehouse = Path(warehouse)
    for name, (csv, schema) in tables.items():
        path = warehouse.parent / f"{name}.csv"
        path.write_text(csv, encoding="utf-8")
        run_quarry(["load", name, str(path), "--schema", schema], warehouse)
    return warehouse


def compare_with_duckdb(warehouse: str | os.PathLike, sql: str, out_dir: str | os.PathLike | None = None) -> Comparison:
    """Run ``sql`` through Quarry and through DuckDB (2 threads) on the same segments; compare."""
    con = duckdb_connect(warehouse, threads=2)
    try:
        duck = duckdb_result(con, sql)
    finally:
        con.close()
    return compare_query_results(sql, quarry_query(warehouse, sql, out_dir=out_dir), duck)


def compare_on_nodes(sql: str, nodes: str, staging: str | os.PathLike, node_warehouses, out_dir: str | os.PathLike) -> Comparison:
    """Run ``sql`` through Quarry on the storage nodes ``nodes`` (``--nodes``, with ``staging``
    as the unused local warehouse) and through DuckDB (2 threads) on the nodes' own segments
    (``node_warehouses``); compare. Call while the nodes run."""
    out = Path(out_dir) / "nodes-result.parquet"
    run_quarry(["--threads", "2", "sql", sql, "--nodes", nodes, "--format", "parquet", "--output", out], staging)
    con = duckdb_connect(node_warehouses, threads=2)
    try:
        want = duckdb_result(con, sql)
    finally:
        con.close()
    return compare_query_results(sql, read_parquet_result(out), want)


def query_files(suite: str) -> list[Path]:
    """The query files of a suite (``ssb``, ``tpch`` or ``tpcds``), in natural order."""
    files = list((REPO_ROOT / "queries" / suite).glob("*.sql"))
    return sorted(files, key=lambda p: query_sort_key(p.stem))


def select_query_files(suite: str, wanted: str | None) -> list[Path]:
    """The suite's query files, or only those named in ``wanted`` (``"q1.1,q2.1"``; ``q01`` and
    ``q1`` are the same), in the suite's order. An unknown name raises ValueError rather than
    making a silently smaller run."""
    files = query_files(suite)
    if not wanted:
        return files
    names = {normalize_query_name(n) for n in wanted.split(",") if n.strip()}
    by_name = {normalize_query_name(p.stem): p for p in files}
    unknown = sorted(names - set(by_name), key=query_sort_key)
    if unknown:
        raise ValueError(f"unknown {suite} queries: {', '.join(unknown)} (have {', '.join(by_name)})")
    return [p for n, p in by_name.items() if n in names]


def query_sort_key(name: str) -> tuple:
    """Natural order key for ``q1.1``/``q01``/``Q1``-style query names."""
    nums = re.findall(r"\d+", name)
    return tuple(int(n) for n in nums) if nums else (float("inf"), name)


def normalize_query_name(name: str) -> str:
    """``q01`` -> ``q1``, ``Q1.1`` -> ``q1.1``, ``q01.sql`` -> ``q1`` (for matching names)."""
    stem = Path(str(name)).name
    if stem.lower().endswith(".sql"):
        stem = stem[:-4]
    nums = re.findall(r"\d+", stem)
    return "q" + ".".join(str(int(n)) for n in nums) if nums else stem.lower()


def run_quarry_measured(args: list[str], timeout: float | None = None) -> tuple[float, float, str]:
    """Runs a quarry command; returns (wall seconds, peak RSS MiB, stdout).

    The peak RSS is the one the process reports itself (QUARRY_REPORT_PEAK_RSS makes quarry print
    its VmHWM): a parent cannot measure it, since a forked child's peak includes the parent's
    pages until exec.
    """
    import time

    started = time.perf_counter()
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env={**os.environ, "QUARRY_REPORT_PEAK_RSS": "1"}
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed:\n{proc.stderr}")
    match = re.search(r"quarry: peak RSS (\d+) bytes", proc.stderr)
    if not match:
        raise RuntimeError(f"no peak RSS report in:\n{proc.stderr}")
    return wall, int(match.group(1)) / 2**20, proc.stdout



# --------------------------------------------------------------------------------------------
# Benchmark helpers (compare_duckdb.py, bench_modes.py)
# --------------------------------------------------------------------------------------------


@dataclass
class SqlRun:
    """One ``quarry ... sql -f FILE --stats S`` process.

    ``wall_ms`` is the query's own time from ``--stats`` (parse, plan, execute, collect),
    ``process_ms`` the whole process as seen from outside (start-up, catalog, writing the
    output); ``error`` is a one-line reason when the run failed (then ``wall_ms`` is None);
    ``stats`` is the whole ``--stats`` report of a run that succeeded."""

    wall_ms: float | None
    process_ms: float
    error: str | None = None
    stderr: str = ""
    stats: dict | None = None


def error_line(stderr: str, returncode: int, limit: int = 300) -> str:
    """A one-line reason for a failed quarry run: its ``error: ...`` line (quarry prints one), else
    the last line of stderr, else the exit status."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    for ln in lines:
        if ln.lower().startswith("error:"):
            return ln[len("error:"):].strip()[:limit]
        if "panicked at" in ln:
            return ln[:limit]
    return lines[-1][:limit] if lines else f"exit status {returncode}"


def timed_quarry_sql(
    global_args: Sequence[str],
    sql_file: str | os.PathLike,
    output: str | os.PathLike,
    stats: str | os.PathLike,
    timeout: float | None = 1800,
    binary: str | None = None,
) -> SqlRun:
    """Run ``quarry GLOBAL_ARGS... sql -f FILE --format parquet --output OUT --stats STATS`` as
    its own process and time it (``binary``, else :func:`quarry_bin`). Never raises for a failing
    query: the failure is in ``error``. ``output`` and ``stats`` are removed first, so a failed
    run leaves no stale result behind."""
    import time

    output, stats = Path(output), Path(stats)
    for p in (output, stats):
        p.unlink(missing_ok=True)
    cmd = [binary or quarry_bin(), *map(str, global_args), "sql", "-f", str(sql_file),
           "--format", "parquet", "--output", str(output), "--stats", str(stats)]
    env = {**os.environ}
    env.setdefault("RUST_BACKTRACE", "0")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace",
                              stdin=subprocess.DEVNULL, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return SqlRun(None, (time.perf_counter() - t0) * 1000.0, f"timed out after {timeout} s")
    process_ms = (time.perf_counter() - t0) * 1000.0
    if proc.returncode != 0:
        return SqlRun(None, process_ms, error_line(proc.stderr, proc.returncode), proc.stderr[-4000:])
    if not stats.is_file() or not output.is_file():
        return SqlRun(None, process_ms, f"exited 0 but wrote no {'stats' if not stats.is_file() else 'output'}",
                      proc.stderr[-4000:])
    with open(stats, encoding="utf-8") as f:
        report = json.load(f)
    return SqlRun(float(report["wall_ms"]), process_ms, None, proc.stderr[-4000:], report)


def round_order(modes: Sequence[str], round_no: int) -> tuple[str, ...]:
    """The order interleaved modes run in round ``round_no``: each round starts one mode later,
    so no mode always follows the same one (a heavy mode warms or disturbs the next run)."""
    shift = round_no % len(modes)
    return tuple(modes[shift:]) + tuple(modes[:shift])


def relative_spread(times: Sequence[float]) -> float | None:
    """Run-to-run noise of one query: (max - min) / min of its timed runs; None with fewer than
    two runs (one run says nothing about noise) or a non-positive minimum."""
    xs = [float(t) for t in times if t is not None]
    if len(xs) < 2 or min(xs) <= 0:
        return None
    return (max(xs) - min(xs)) / min(xs)


def median_spread(per_query_times: Iterable[Sequence[float]]) -> float | None:
    """The median over queries of :func:`relative_spread` (queries without one are left out);
    None when no query has two timed runs."""
    import statistics

    spreads = [s for s in (relative_spread(t) for t in per_query_times) if s is not None]
    return statistics.median(spreads) if spreads else None


def geomean(xs: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive finite values; None when there are none."""
    vals = [float(x) for x in xs if x is not None and math.isfinite(x) and x > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(x) for x in vals) / len(vals))


def git_state(repo: str | os.PathLike = REPO_ROOT) -> dict:
    """``{"commit": HEAD or None, "dirty": bool or None, "changed": [tracked files with changes]}``."""
    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)

    try:
        head = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None, "changed": []}
    if head.returncode != 0:
        return {"commit": None, "dirty": None, "changed": []}
    changed = [ln[3:] for ln in status.stdout.splitlines() if ln.strip()]
    return {"commit": head.stdout.strip(), "dirty": bool(changed) if status.returncode == 0 else None,
            "changed": changed}


def machine_info() -> dict:
    """The CPU (name, family and model: a virtual machine's name may say little), its cores,
    last-level cache, memory and kernel of the machine measuring: a calibrated rate or a
    measured time belongs to it (the calibrated fixed cost of a fragment was 0.71 ms in one
    session of this project and 0.44 ms in the next)."""
    import platform

    info: dict[str, Any] = {"cpus": os.cpu_count(), "kernel": platform.release()}
    try:
        fields = {"model name": "cpu", "cpu family": "cpu_family", "model": "cpu_model"}
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in fields:
                info.setdefault(fields[key.strip()], value.strip())
            elif not line.strip():
                break
        caches = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"))
        if caches:
            info["last_level_cache"] = (caches[-1] / "size").read_text(encoding="utf-8").strip()
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError as e:
        info["error"] = str(e)
    return info


def binary_info(path: str | None = None) -> dict:
    """Path, size, modification time and ``--version`` of the quarry binary (which may have been
    built from a different tree than the checked-out commit)."""
    import datetime

    path = path or quarry_bin()
    info: dict[str, Any] = {"path": str(Path(path).resolve()) if os.path.exists(path) else path}
    try:
        st = os.stat(path)
        info["size"] = st.st_size
        info["mtime"] = datetime.datetime.fromtimestamp(st.st_mtime).isoformat(timespec="seconds")
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        info["version"] = proc.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired) as e:
        info["error"] = str(e)
    return info
