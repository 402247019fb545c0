"""Damaged data is found, never returned: segment checksums verified on every read, and
`quarry scrub` (embedded and through storage nodes)."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import quarry_py as q
from conftest import assert_no_panic

BLOCK = 64 * 1024  # checksum block size (quarry_table::checksum::CHECKSUM_BLOCK_BYTES)

# Reads of the damaged column through every reader: DataFusion's Parquet scan (auto, no filter),
# stored bytes decoded on the host (off), the page-by-page filter on the node (on).
DAMAGED_READS = [
    ("auto", "SELECT max(l_receiptdate) FROM lineitem"),
    ("off", "SELECT max(l_receiptdate) FROM lineitem"),
    ("on", "SELECT count(*) FROM lineitem WHERE l_receiptdate > DATE '1997-01-01'"),
    ("on", "SELECT l_orderkey, l_receiptdate FROM lineitem WHERE l_quantity < 3"),
]


def _chunk_ranges(path):
    """Byte range of each column chunk of the (one row group) Parquet file at `path`."""
    row_group = pq.ParquetFile(path).metadata.row_group(0)
    ranges = {}
    for i in range(row_group.num_columns):
        column = row_group.column(i)
        start = column.dictionary_page_offset or column.data_page_offset
        ranges[column.path_in_schema] = (start, start + column.total_compressed_size)
    return ranges


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x20
    path.write_bytes(bytes(data))


def _damage_receiptdate(warehouse):
    """Flips one bit in the middle of lineitem's l_receiptdate chunk: the segment file, the
    offset, and the byte range of l_orderkey (checked to lie in other checksum blocks)."""
    [segment] = map(Path, q.segment_paths(warehouse, "lineitem"))
    chunks = _chunk_ranges(segment)
    start, end = chunks["l_receiptdate"]
    offset = (start + end) // 2
    orderkey = chunks["l_orderkey"]
    assert orderkey[1] // BLOCK < offset // BLOCK, "l_orderkey shares no block with the damage"
    original = segment.read_bytes()
    _flip(segment, offset)
    return segment, offset, original


@pytest.fixture
def tpch_copy(tpch_warehouse, tmp_path):
    """A private copy of the TPC-H warehouse (its one lineitem segment is damaged by tests)."""
    copy = tmp_path / "tpch"
    shutil.copytree(tpch_warehouse, copy)
    assert len(q.segment_paths(copy, "lineitem")) == 1
    return copy


def test_a_flipped_bit_fails_the_reads_that_cover_it_and_scrub_names_it(tpch_copy):
    segment, offset, original = _damage_receiptdate(tpch_copy)
    name = segment.name
    for mode, sql in DAMAGED_READS:
        run = q.run_quarry(["sql", sql, "--pushdown", mode], tpch_copy, check=False)
        assert run.returncode != 0, f"{mode}: {sql} returned a result from damaged data:\n{run.stdout}"
        assert f"table 'lineitem': segment file lineitem/data/{name} is damaged" in run.stderr, run.stderr
        assert re.search(r"bytes \d+\.\.\d+ do not match", run.stderr), run.stderr
        assert_no_panic(run.stderr)
    # Reads of other blocks and other tables are answered, and right.
    for sql in ["SELECT count(*), sum(l_orderkey) FROM lineitem", "SELECT count(*), sum(o_totalprice) FROM orders"]:
        cmp = q.compare_with_duckdb(tpch_copy, sql)
        assert cmp, f"{sql}\n{cmp}"
    # Scrub reports exactly the damaged block, and fails.
    scrub = q.run_quarry(["scrub"], tpch_copy, check=False)
    assert scrub.returncode == 1, scrub.stdout + scrub.stderr
    damaged = [line for line in scrub.stdout.splitlines() if line.startswith("damaged")]
    block = offset // BLOCK * BLOCK
    assert damaged == [f"damaged\tlineitem\tlineitem/data/{name} bytes {block}..{block + BLOCK}: do not match the checksum written with them"], scrub.stdout
    report = json.loads(q.run_quarry(["scrub", "--json"], tpch_copy, check=False).stdout)
    assert len(report["damage"]) == 1 and report["damage"][0]["bytes"] == {"start": block, "end": block + BLOCK}, report
    assert set(report["tables"]) == set(q.list_tables(tpch_copy)) and not report["unverifiable"], report
    assert q.run_quarry(["scrub", "orders", "part"], tpch_copy).returncode == 0
    # Repaired: scrub is clean and the query answers as DuckDB does.
    segment.write_bytes(original)
    assert q.run_quarry(["scrub"], tpch_copy).returncode == 0
    cmp = q.compare_with_duckdb(tpch_copy, DAMAGED_READS[0][1])
    assert cmp, cmp


def test_scrub_through_a_storage_node(tpch_copy):
    segment, offset, _ = _damage_receiptdate(tpch_copy)
    with q.StorageNodes([tpch_copy]) as nodes:
        scrub = q.run_quarry(["scrub", "--nodes", nodes.arg], "/nonexistent-warehouse", check=False)
        assert scrub.returncode == 1, scrub.stdout + scrub.stderr
        assert f"lineitem/data/{segment.name} bytes {offset // BLOCK * BLOCK}.." in scrub.stdout, scrub.stdout
        run = q.run_quarry(["sql", DAMAGED_READS[0][1], "--nodes", nodes.arg], "/nonexistent-warehouse", check=False)
        assert run.returncode != 0 and f"segment file lineitem/data/{segment.name} is damaged" in run.stderr, run.stderr
        missing = q.run_quarry(["scrub", "nope", "--nodes", nodes.arg], "/nonexistent-warehouse", check=False)
        assert missing.returncode != 0 and "no table 'nope'" in missing.stderr, missing.stderr


def test_segments_without_checksums_can_be_given_them(tpch_copy):
    """A warehouse written before checksums: scrub says so (and cannot fail on it);
    `--record-missing` records checksums of the bytes as they are, after which damage is found."""
    for table in q.list_tables(tpch_copy):
        path = q.current_manifest_path(tpch_copy, table)
        manifest = json.loads(path.read_text())
        for segment in manifest["segments"]:
            del segment["checksums"]
        path.write_text(json.dumps(manifest))
    tables = len(q.list_tables(tpch_copy))
    legacy = q.run_quarry(["scrub"], tpch_copy)
    assert f"0 damaged, {tables} without checksums" in legacy.stdout, legacy.stdout
    recorded = q.run_quarry(["scrub", "--record-missing"], tpch_copy)
    assert "recorded checksums of 1 segment files of lineitem" in recorded.stdout, recorded.stdout
    assert "0 damaged, 0 without checksums" in recorded.stdout, recorded.stdout
    segment, _, _ = _damage_receiptdate(tpch_copy)
    assert q.run_quarry(["scrub", "lineitem"], tpch_copy, check=False).returncode == 1
    cmp = q.compare_with_duckdb(tpch_copy, "SELECT count(*) FROM lineitem")
    assert cmp, cmp


def test_scrub_checks_graph_files(warehouse):
    q.run_quarry(["graph", "gen", "kron", "g", "--scale", "10", "--memory", "64MB"], warehouse)
    clean = q.run_quarry(["scrub"], warehouse)
    assert "0 tables and 1 graphs" in clean.stdout and "0 damaged, 0 without checksums" in clean.stdout, clean.stdout
    edges = warehouse / ".graphs" / "g" / "in.edges"
    _flip(edges, edges.stat().st_size // 2)
    scrub = q.run_quarry(["scrub"], warehouse, check=False)
    assert scrub.returncode == 1, scrub.stdout + scrub.stderr
    damaged = [line for line in scrub.stdout.splitlines() if line.startswith("damaged")]
    assert len(damaged) == 1 and damaged[0].startswith("damaged\tg\t.graphs/g/in.edges: its CRC-32C is"), scrub.stdout


def _metrics(address):
    text = urllib.request.urlopen(address, timeout=5).read().decode()
    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("#")}


def test_background_scrub_finds_damage_within_its_rate(tpch_copy):
    """`quarry serve --scrub-mbps`: pass after pass over the warehouse, never reading faster than
    the rate; the damage is logged and counted in the metrics."""
    segment, offset, _ = _damage_receiptdate(tpch_copy)
    mbps = 5.0
    started = time.monotonic()
    nodes = q.StorageNodes([tpch_copy], ["--metrics-listen", "127.0.0.1:0", "--scrub-mbps", mbps, "--scrub-pause", "0.2"])
    with nodes:
        proc = nodes.procs[0]
        line = ""
        while "metrics on " not in line:
            line = proc.stderr.readline()
            assert line, "the node exited before reporting its metrics address"
        address = line.split("metrics on ", 1)[1].strip()
        values = {}
        while values.get("quarry_node_scrub_passes_total", 0) < 1:
            assert time.monotonic() - started < 60, f"no scrub pass finished within 60 s: {values}"
            time.sleep(0.5)
            values = _metrics(address)
            elapsed = time.monotonic() - started
            # The rate holds: never more than the bytes it allows since the node started (plus one block).
            assert values["quarry_node_scrub_bytes_total"] <= mbps * 1e6 * elapsed + BLOCK, (elapsed, values)
        assert values["quarry_node_scrub_damage"] == 1, values
        assert values["quarry_node_scrub_bytes_total"] > 0
    log = proc.stderr.read()
    block = offset // BLOCK * BLOCK
    assert f"scrub found damage in lineitem lineitem/data/{segment.name} bytes {block}..{block + BLOCK}" in log, log
    assert_no_panic(log)
