"""`quarry server`: Arrow Flight SQL, queried by a real client (ADBC's Flight SQL driver, through
its DB-API) and, for cancellation, by pyarrow's Flight client. Results are compared with DuckDB
reading the same segments."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import quarry_py as q
from conftest import assert_no_panic

adbc = pytest.importorskip("adbc_driver_flightsql.dbapi")
from adbc_driver_flightsql import DatabaseOptions  # noqa: E402

TPCH_FILES = q.query_files("tpch")
TPCH_TABLES = ["customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier"]


class Server:
    """`quarry server` on a free loopback port; `url` is what it printed."""

    def __init__(self, warehouse, *args):
        cmd = [q.quarry_bin(), "--warehouse", str(warehouse), "server", "--listen", "127.0.0.1:0", *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        try:
            self.url = q.read_node_url(self.proc)
        except BaseException:
            self.stop()
            raise

    def connect(self, **db_kwargs):
        with warnings.catch_warnings():
            # ADBC warns that a read-only server has no transactions to turn autocommit off for.
            warnings.simplefilter("ignore")
            return adbc.connect(self.url, db_kwargs=db_kwargs)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        _, stderr = self.proc.communicate(timeout=30)
        return stderr


@pytest.fixture(scope="module")
def tpch01(tmp_path_factory, quarry_bin):
    """TPC-H at SF 0.1, as the issue asks of the ADBC run."""
    wh = tmp_path_factory.mktemp("wh-tpch01")
    q.run_quarry(["gen", "tpch", "--sf", "0.1"], wh, timeout=600)
    return wh


@pytest.fixture(scope="module")
def server(tpch01):
    s = Server(tpch01)
    yield s
    assert_no_panic(s.stop())


@pytest.fixture(scope="module")
def duck(tpch01):
    con = q.duckdb_connect(tpch01, threads=2)
    yield con
    con.close()


def _arrow_result(table: pa.Table) -> q.Result:
    types = [f"DECIMAL({t.precision},{t.scale})" if pa.types.is_decimal(t) else str(t) for t in table.schema.types]
    return q.Result(table.column_names, types, [tuple(r.values()) for r in table.to_pylist()])


def _adbc_query(con, sql, parameters=None) -> q.Result:
    cur = con.cursor()
    try:
        cur.execute(sql, parameters=parameters)
        return _arrow_result(cur.fetch_arrow_table())
    finally:
        cur.close()


def _assert_equal(sql, quarry: q.Result, duck: q.Result, what: str):
    cmp = q.compare_query_results(sql, quarry, duck)
    assert cmp, f"{what}: Quarry over Flight SQL and DuckDB disagree\n{cmp}"


@pytest.mark.parametrize("path", TPCH_FILES, ids=[p.stem for p in TPCH_FILES])
def test_tpch_over_adbc_equals_duckdb(server, duck, path):
    sql = path.read_text(encoding="utf-8")
    with server.connect() as con:
        quarry = _adbc_query(con, sql)
    _assert_equal(sql, quarry, q.duckdb_result(duck, sql), path.stem)


def test_prepared_statement_binds_parameters(server, duck):
    """`?` and `$n` placeholders; one prepared statement executed with two parameter rows; a
    date parameter given as text is cast to the column's type."""
    sql = "select l_returnflag, count(*) as n, sum(l_extendedprice) as s from lineitem where l_quantity < ? and l_shipmode = ? and l_shipdate < ? group by l_returnflag order by l_returnflag"
    duck_sql = sql.replace("?", "{}")
    with server.connect() as con:
        cur = con.cursor()
        for params in [(10, "AIR", "1995-01-01"), (30, "MAIL", "1993-06-30")]:
            cur.execute(sql, parameters=params)
            quarry = _arrow_result(cur.fetch_arrow_table())
            expected = q.duckdb_result(duck, duck_sql.format(params[0], q.sql_string(params[1]), f"date {q.sql_string(params[2])}"))
            assert quarry.rows, params
            _assert_equal(sql, quarry, expected, f"parameters {params}")
        cur.execute("select n_name from nation where n_nationkey = $1 or n_nationkey = $2 order by n_name", parameters=(7, 3))
        assert cur.fetchall() == [("CANADA",), ("GERMANY",)]
        cur.close()


def test_catalog_calls_list_tables_with_schemas(server, tpch01, duck):
    with server.connect() as con:
        objects = con.adbc_get_objects(depth="all").read_all().to_pylist()
        assert [c["catalog_name"] for c in objects] == ["quarry"]
        schemas = {s["db_schema_name"]: s for s in objects[0]["catalog_db_schemas"]}
        tables = {t["table_name"]: t for t in schemas["main"]["db_schema_tables"]}
        assert sorted(tables) == TPCH_TABLES
        for name, table in tables.items():
            assert table["table_type"] == "TABLE"
            columns = [c["column_name"] for c in sorted(table["table_columns"], key=lambda c: c["ordinal_position"])]
            expected = [row[0] for row in duck.execute(f"describe {name}").fetchall()]
            assert columns == expected, name
        lineitem = con.adbc_get_table_schema("lineitem")
        assert lineitem.field("l_shipdate").type == pa.date32()
        assert pa.types.is_decimal(lineitem.field("l_extendedprice").type)
        assert con.adbc_get_table_types() == ["TABLE", "VIEW"]
        assert con.adbc_get_info()["vendor_name"] == "Quarry"
        # A pattern filters the tables.
        filtered = con.adbc_get_objects(depth="tables", table_name_filter="part%").read_all().to_pylist()
        names = sorted(t["table_name"] for s in filtered[0]["catalog_db_schemas"] for t in (s["db_schema_tables"] or []))
        assert names == ["part", "partsupp"]


def test_bad_sql_is_an_error_with_the_cli_message_and_the_server_keeps_serving(server, tpch01):
    cli = subprocess.run([q.quarry_bin(), "--warehouse", str(tpch01), "sql", "select nope from nation"], capture_output=True, text=True)
    assert cli.returncode != 0
    cli_message = cli.stderr.strip().removeprefix("error: ")
    assert "nope" in cli_message, cli.stderr
    with server.connect() as con:
        cur = con.cursor()
        with pytest.raises(adbc.ProgrammingError) as error:
            cur.execute("select nope from nation")
        assert cli_message in str(error.value)
        with pytest.raises(adbc.ProgrammingError, match=r"SQL syntax error: .*selec.* Line: 1, Column: 1"):
            cur.execute("selec 1")
        with pytest.raises(adbc.Error, match="only queries are supported"):
            cur.execute("create table t (x int)")
        cur.execute("select count(*) from region")
        assert cur.fetchall() == [(5,)]
        cur.close()


def test_eight_concurrent_clients(server, duck):
    """Eight clients at once, each its own connection, each running TPC-H queries; every result
    equals DuckDB's."""
    chosen = [p for p in TPCH_FILES if p.stem in ("q01", "q03", "q05", "q06", "q10", "q12", "q14", "q19")]
    expected = {p.stem: q.duckdb_result(duck, p.read_text(encoding="utf-8")) for p in chosen}
    failures: list[str] = []

    def client(i):
        try:
            with server.connect() as con:
                for p in chosen[i:] + chosen[:i]:
                    sql = p.read_text(encoding="utf-8")
                    cmp = q.compare_query_results(sql, _adbc_query(con, sql), expected[p.stem])
                    if not cmp:
                        failures.append(f"client {i} {p.stem}: {cmp}")
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert not failures, "\n".join(failures)


def _with_session(name: str) -> dict:
    """Client options that send the session cookie `name`, as a cookie-keeping client sends
    the one the server set (ADBC's Python driver did not send it back with its cookie option
    on, so the test sends it as a call header)."""
    return {DatabaseOptions.RPC_CALL_HEADER_PREFIX.value + "cookie": f"quarry_session={name}"}


def test_each_client_has_its_own_session(server):
    """A setting made in one client's session holds there and not in another's; a client
    without a session cookie gets a fresh session per statement."""
    setting = "select value from information_schema.df_settings where name = 'datafusion.execution.batch_size'"
    with server.connect(**_with_session("a1" * 16)) as a, server.connect(**_with_session("b2" * 16)) as b, server.connect() as none:
        default = _adbc_query(b, setting).rows
        assert default != [("1234",)]
        for con in (a, none):
            cur = con.cursor()
            cur.execute("set datafusion.execution.batch_size = 1234")
            assert cur.fetchall() == []
            cur.close()
        assert _adbc_query(a, setting).rows == [("1234",)]
        assert _adbc_query(b, setting).rows == default
        assert _adbc_query(none, setting).rows == default


def _statement_descriptor(sql: str) -> flight.FlightDescriptor:
    """A Flight SQL CommandStatementQuery in a protobuf Any, encoded by hand."""
    def field(number: int, payload: bytes) -> bytes:
        return _varint(number << 3 | 2) + _varint(len(payload)) + payload

    command = field(1, sql.encode())
    any_message = field(1, b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery") + field(2, command)
    return flight.FlightDescriptor.for_command(any_message)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


# Runs a query through pyarrow's Flight client: prints its FlightInfo (hex), then how the read
# ended. In a process of its own: pyarrow raises a cancelled read as KeyboardInterrupt, in
# whichever thread of the process it likes.
_CANCELLED_READER = r"""
import sys
import pyarrow.flight as flight
client = flight.connect(sys.argv[1])
info = client.get_flight_info(flight.FlightDescriptor.for_command(bytes.fromhex(sys.argv[2])))
print(info.serialize().hex(), flush=True)
try:
    client.do_get(info.endpoints[0].ticket).read_all()
    print("finished", flush=True)
except BaseException as e:
    print(type(e).__name__, str(e).replace(chr(10), " "), flush=True)
"""


@pytest.mark.parametrize("endless", [
    "select count(*) from lineitem a, lineitem b where a.l_quantity + b.l_quantity < 0",  # nested-loop join
    "select count(*), sum(a.l_quantity * b.l_quantity) from lineitem a, lineitem b",  # cross join
])
def test_cancel_stops_a_running_query(server, endless):
    """CancelFlightInfo on a query that would run for hours: its stream ends with a cancelled
    error at once, the query stops (a join computes for seconds between the points where its
    task can stop, so it checks a stop flag), and the server goes on serving."""
    command = _statement_descriptor(endless).command.hex()
    reader = subprocess.Popen([sys.executable, "-c", _CANCELLED_READER, server.url, command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = bytes.fromhex(reader.stdout.readline().strip())
        time.sleep(2)
        assert reader.poll() is None, reader.communicate()
        request = b"\x0a" + _varint(len(info)) + info
        client = flight.connect(server.url)
        started = time.monotonic()
        results = list(client.do_action(flight.Action("CancelFlightInfo", request)))
        # CancelFlightInfoResult { status: CANCEL_STATUS_CANCELLED (1) }
        assert [r.body.to_pybytes() for r in results] == [b"\x08\x01"]
        ended, stderr = reader.communicate(timeout=30)
        assert time.monotonic() - started < 5
        # pyarrow raises a read that ends with gRPC's CANCELLED as a bare KeyboardInterrupt.
        assert ended.startswith(("KeyboardInterrupt", "FlightCancelledError")), (ended, stderr)
        # Cancelling it again finds nothing running.
        again = list(client.do_action(flight.Action("CancelFlightInfo", request)))
        assert [r.body.to_pybytes() for r in again] == [b"\x08\x03"]
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    # Both of the server's query threads are free again: a query still joining would hold them.
    started = time.monotonic()
    with server.connect() as con:
        assert _adbc_query(con, "select count(*) from nation").rows == [(25,)]
    assert time.monotonic() - started < 5


def test_token_is_required_as_bearer_or_basic_password(tpch01, tmp_path):
    token = tmp_path / "token"
    token.write_text("flight-sql-secret\n")
    s = Server(tpch01, "--token-file", token)
    try:
        with s.connect() as con:
            with pytest.raises(adbc.Error, match="requires a token"):
                con.cursor().execute("select 1")
        # The driver's handshake at connect sends the password.
        with pytest.raises(adbc.Error, match="wrong token"):
            s.connect(username="analyst", password="wrong")
        with s.connect(username="analyst", password="flight-sql-secret") as con:
            assert _adbc_query(con, "select count(*) from region").rows == [(5,)]
        with s.connect(**{DatabaseOptions.AUTHORIZATION_HEADER.value: "Bearer flight-sql-secret"}) as con:
            assert _adbc_query(con, "select count(*) from region").rows == [(5,)]
    finally:
        assert_no_panic(s.stop())


def test_refuses_to_listen_beyond_loopback_without_a_token(tpch01):
    proc = subprocess.run([q.quarry_bin(), "--warehouse", str(tpch01), "server", "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "without authentication" in proc.stderr, proc.stderr


def test_tls_server_is_queried_by_a_client_that_trusts_its_ca(tpch01, certificates):
    """`quarry server --tls-cert --tls-key` serves grpc+tls://; a client with the CA queries it,
    one with another CA is refused."""
    s = Server(tpch01, "--tls-cert", certificates["cert"], "--tls-key", certificates["key"])
    try:
        assert s.url.startswith("grpc+tls://127.0.0.1:"), s.url
        with s.connect(**{DatabaseOptions.TLS_ROOT_CERTS.value: certificates["ca"].read_text()}) as con:
            assert _adbc_query(con, "select count(*) from region").rows == [(5,)]
        with pytest.raises(adbc.Error, match="certificate"):
            with s.connect(**{DatabaseOptions.TLS_ROOT_CERTS.value: certificates["other_ca"].read_text()}) as con:
                _adbc_query(con, "select count(*) from region")
    finally:
        assert_no_panic(s.stop())


def test_server_over_storage_nodes(tpch01, duck):
    """The same server with the warehouse behind a storage node (`--nodes`)."""
    sql = next(p for p in TPCH_FILES if p.stem == "q03").read_text(encoding="utf-8")
    with q.StorageNodes([tpch01]) as node:
        s = Server(tpch01, "--nodes", node.arg)
        try:
            with s.connect() as con:
                _assert_equal(sql, _adbc_query(con, sql), q.duckdb_result(duck, sql), "q03 over a node")
        finally:
            assert_no_panic(s.stop())


JDBC_DRIVER = "org.apache.arrow:flight-sql-jdbc-driver:18.3.0"


@pytest.fixture(scope="module")
def jdbc_driver() -> Path:
    """The Arrow Flight SQL JDBC driver's jar, fetched by Maven into ~/.m2 on first use."""
    group, artifact, version = JDBC_DRIVER.split(":")
    jar = Path.home() / ".m2" / "repository" / Path(*group.split(".")) / artifact / version / f"{artifact}-{version}.jar"
    if not jar.exists():
        subprocess.run(["mvn", "-q", "dependency:get", f"-Dartifact={JDBC_DRIVER}"], check=True, timeout=600)
    assert jar.exists(), jar
    return jar


def test_jdbc_client(server, duck, jdbc_driver):
    """The Arrow Flight SQL JDBC driver, through `java`: a query, a prepared statement with a
    date and a string parameter, the tables and columns from DatabaseMetaData, a setting that
    holds for the connection (the driver keeps the session cookie), and an error's message."""
    source = q.REPO_ROOT / "tests" / "jdbc" / "QuarryJdbc.java"
    url = "jdbc:arrow-flight-sql://" + server.url.removeprefix("grpc://") + "?useEncryption=false"
    # Arrow's Java memory needs java.nio opened to it.
    run = subprocess.run(["java", "--add-opens=java.base/java.nio=ALL-UNNAMED", "-cp", str(jdbc_driver), str(source), url],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    groups = [tuple(line.split()[1:]) for line in lines if line.startswith("group ")]
    expected = duck.execute("select l_returnflag, l_linestatus, count(*), sum(l_quantity) from lineitem group by 1, 2 order by 1, 2").fetchall()
    assert groups == [(f, s, str(n), f"{qty:.2f}") for f, s, n, qty in expected]
    prepared = [line.split()[1:] for line in lines if line.startswith("prepared ")]
    assert len(prepared) == 2
    for day, priority, count in prepared:
        (want,), = duck.execute("select count(*) from orders where o_orderdate < ?::date and o_orderpriority = ?", [day, priority]).fetchall()
        assert int(count) == want > 0, (day, priority)
    assert sorted(line.split()[1] for line in lines if line.startswith("table ")) == sorted(TPCH_TABLES)
    assert [line.split()[2] for line in lines if line.startswith("column nation ")] == ["n_nationkey", "n_name", "n_regionkey", "n_comment"]
    assert "setting 1234" in lines
    error = next(line for line in lines if line.startswith("error "))
    assert "No field named nope" in error, error
