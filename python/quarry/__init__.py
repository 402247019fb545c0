"""Quarry, the near-data analytics database, in Python.

    import quarry
    con = quarry.connect("path/to/warehouse")          # or nodes=["grpc://..."], profile="smartssd-2013"
    con.load("trips", pandas_df)                         # a pyarrow Table, pandas/polars DataFrame, or a CSV/Parquet path
    con.sql("select count(*) from trips").fetchall()
    con.sql("select * from trips").df()                  # also .arrow(), .pl(), .explain(), .stats()
    con.import_graph("web", "edges.parquet")
    con.graph("web").pagerank(iterations=10).df()

Queries run with the GIL released; results reach pyarrow without a copy (Arrow C stream).
Errors raise `quarry.Error` (`QueryError`, `LoadError`, `GraphError`) with the message the
`quarry` command prints.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import pyarrow as pa

from quarry._quarry import Connection as _Connection
from quarry._quarry import Error, GraphError, LoadError, QueryError

__all__ = ["connect", "Connection", "Relation", "Graph", "Error", "QueryError", "LoadError", "GraphError"]


def connect(
    warehouse: str | os.PathLike | None = None,
    *,
    nodes: Sequence[str] | None = None,
    profile: str | None = None,
    threads: int | None = None,
    pushdown: str = "auto",
    token_file: str | os.PathLike | None = None,
) -> "Connection":
    """A connection to the warehouse directory `warehouse` (created if missing; default
    ./quarry-data), embedded in this process, or to storage nodes (`nodes`, with the token in
    `token_file` if they require one)."""
    return Connection(_Connection(
        None if warehouse is None else os.fspath(warehouse),
        list(nodes) if nodes else None,
        profile,
        threads,
        pushdown,
        None if token_file is None else os.fspath(token_file),
    ))


class Connection:
    """A Quarry session; use `connect()`."""

    def __init__(self, inner: _Connection):
        self._inner = inner

    def sql(self, query: str) -> "Relation":
        """A relation over the result of `query` (run when first read)."""
        return Relation(self._inner, query)

    def load(self, name: str, data: Any, *, append: bool = False) -> int:
        """Loads `data` into table `name` (replacing it unless `append`); the rows loaded.
        `data` is a pyarrow Table or RecordBatchReader, a pandas or polars DataFrame, or the
        path of a CSV or Parquet file. A failed load leaves the table as it was."""
        if isinstance(data, (str, os.PathLike)):
            return self._inner.load_file(name, os.fspath(data), append)
        return self._inner.load_arrow(name, _as_reader(data), append)

    def tables(self) -> list[str]:
        """The tables' names."""
        return self._inner.tables()

    def import_graph(self, name: str, path: str | os.PathLike, *, keep_self_loops: bool = False, memory: int | None = None) -> str:
        """Imports an edge file (Parquet with src, dst[, weight]; CSV with that header; or
        text) as graph `name`; one line describing it."""
        return self._inner.import_graph(name, os.fspath(path), keep_self_loops, memory)

    def graph(self, name: str) -> "Graph":
        """The graph `name`, to run algorithms on."""
        return Graph(self, name)

    def close(self) -> None:
        self._inner = None

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Relation:
    """A query's result: read it as pyarrow (`arrow`), pandas (`df`), polars (`pl`) or tuples
    (`fetchall`). The query runs once, when first read."""

    def __init__(self, inner: _Connection, query: str):
        self._inner = inner
        self._query = query
        self._table: pa.Table | None = None
        self._stats: dict | None = None

    def _run(self) -> pa.Table:
        if self._table is None:
            reader, stats = self._inner.execute(self._query)
            self._table = reader.read_all()
            self._stats = json.loads(stats)
        return self._table

    def arrow(self) -> pa.Table:
        return self._run()

    def df(self):
        return self._run().to_pandas()

    def pl(self):
        import polars

        return polars.from_arrow(self._run())

    def fetchall(self) -> list[tuple]:
        table = self._run()
        columns = [column.to_pylist() for column in table.columns]
        return list(zip(*columns)) if columns else []

    def explain(self) -> str:
        """The plan, as EXPLAIN prints it (where each operator runs, predicted bytes and times)."""
        reader, _ = self._inner.execute("EXPLAIN " + self._query)
        table = reader.read_all()
        return "\n".join(f"{kind}:\n{plan}" for kind, plan in zip(table.column(0).to_pylist(), table.column(1).to_pylist()))

    def stats(self) -> dict:
        """The query's accounting, as `quarry sql --stats` writes it (runs the query if it has
        not run)."""
        self._run()
        return self._stats

    @property
    def columns(self) -> list[str]:
        return self._run().column_names

    def __repr__(self) -> str:
        return self._run().to_string(preview_cols=12)


class Graph:
    """A graph in the warehouse; each algorithm returns a relation over its result table."""

    def __init__(self, con: Connection, name: str):
        self._con = con
        self.name = name

    def _run(self, algorithm: str, **kw) -> Relation:
        table = self._con._inner.run_graph(self.name, algorithm, **kw)
        return self._con.sql(f'select * from "{table}"')

    def pagerank(self, iterations: int = 10, tolerance: float | None = None, memory: int | None = None) -> Relation:
        return self._run("pagerank", iterations=iterations, tolerance=tolerance, memory=memory)

    def bfs(self, root: int = 0, memory: int | None = None) -> Relation:
        return self._run("bfs", root=root, memory=memory)

    def cc(self, memory: int | None = None) -> Relation:
        return self._run("cc", memory=memory)

    def sssp(self, root: int = 0, memory: int | None = None) -> Relation:
        return self._run("sssp", root=root, memory=memory)

    def bc(self, root: int | None = None, sources: int | None = None, memory: int | None = None) -> Relation:
        return self._run("bc", root=root, sources=sources, memory=memory)


def _as_reader(data: Any) -> pa.RecordBatchReader:
    """`data` as a pyarrow RecordBatchReader with the types Quarry stores (plain strings)."""
    if isinstance(data, pa.RecordBatchReader):
        table = data.read_all()
    elif isinstance(data, pa.Table):
        table = data
    elif isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif type(data).__module__.startswith("pandas"):
        table = pa.Table.from_pandas(data, preserve_index=False)
    elif type(data).__module__.startswith("polars"):
        table = data.to_arrow()
    elif hasattr(data, "__arrow_c_stream__"):
        table = pa.table(data)
    else:
        raise LoadError(f"cannot load a {type(data).__name__}: give a pyarrow Table, a pandas or polars DataFrame, or a file path")
    plain = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    if hasattr(pa, "string_view"):
        plain[pa.string_view()] = pa.string()
    schema = pa.schema([field.with_type(plain.get(field.type, field.type)) for field in table.schema])
    return table.cast(schema).to_reader()
