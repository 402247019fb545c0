"""Reads of data that is not in memory (`local_files.rs`, `read_account.rs`, `stored_scan.rs`).

Method: an SSB warehouse on the disk the build lives on (a tmpfs keeps a file's pages however it
is evicted, so a cold read cannot happen there); before each cold run its segment files are
dropped from the page cache (`posix_fadvise(DONTNEED)`). A cold query, run on the node (pushdown)
and decoded on the host from the stored bytes (passthrough, which fetches segments ahead), must
answer as DuckDB does on the same segments, and its `--stats` must count its reads: requests,
bytes from the device (most of those read), and the time they took. Run again, warm, the same
reads come from the page cache: no bytes from the device. EXPLAIN ANALYZE shows the counters on
the fragment.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
from pathlib import Path

import pytest

import quarry_py as q

SQL = "SELECT lo_discount, sum(lo_revenue) AS revenue, count(*) AS n FROM lineorder WHERE lo_quantity < 25 GROUP BY lo_discount ORDER BY lo_discount"

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def disk_warehouse(quarry_bin, test_sf):
    # Under target/, on the build's disk: the system temp directory may be a tmpfs.
    base = REPO / "target"
    base.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cold-reads-", dir=base) as d:
        wh = Path(d) / "wh"
        sf = str(int(test_sf)) if float(test_sf).is_integer() else str(test_sf)
        q.run_quarry(["gen", "ssb", "--sf", sf], wh, timeout=1800)
        yield wh


def evict(warehouse: Path) -> None:
    q.evict_from_page_cache(q.warehouse_segment_paths(warehouse))


def page_cache_drops(warehouse: Path) -> bool:
    """Whether evicting a file here leaves none of it in the page cache (not on a tmpfs)."""
    probe = warehouse / "probe.bin"
    probe.write_bytes(b"\0" * (1 << 20))
    try:
        os.sync()
        evict(warehouse)
        fd = os.open(probe, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            try:
                os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
                return False
            except BlockingIOError:
                return True
        finally:
            os.close(fd)
    finally:
        probe.unlink()


def reads_of(warehouse: Path, tmp_path: Path, pushdown: str) -> tuple[dict, q.Result]:
    stats = tmp_path / f"stats-{pushdown}.json"
    result = q.run_quarry(["--pushdown", pushdown, "sql", SQL, "--format", "parquet", "--output", tmp_path / "r.parquet", "--stats", stats], warehouse)
    assert result.returncode == 0
    return json.loads(stats.read_text())["reads"], q.read_parquet_result(tmp_path / "r.parquet")


def kernel_tells_cached_pages() -> bool:
    """Whether the kernel has `cachestat` (Linux 6.5), by which the node tells device reads."""
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", platform.release()).groups())
    return (major, minor) >= (6, 5)


@pytest.mark.parametrize("pushdown", ["on", "off"])
def test_cold_reads_are_counted_and_answer_as_duckdb(disk_warehouse, tmp_path, pushdown):
    if not page_cache_drops(disk_warehouse):
        pytest.skip("this file system keeps evicted pages (tmpfs): no read here is cold")
    if not kernel_tells_cached_pages():
        pytest.skip(f"kernel {platform.release()} has no cachestat: the node cannot tell device reads")
    evict(disk_warehouse)
    cold, got = reads_of(disk_warehouse, tmp_path, pushdown)
    con = q.duckdb_connect(disk_warehouse, threads=2)
    try:
        want = q.duckdb_result(con, SQL)
    finally:
        con.close()
    cmp = q.compare_query_results(SQL, got, want)
    assert cmp, f"--pushdown {pushdown}, cold: {cmp}"
    assert cold["requests"] > 0 and cold["wait_ms"] > 0, cold
    assert cold["bytes_from_device"] >= cold["bytes"] // 2, f"a cold run reads most of its bytes from the device: {cold}"
    warm, _ = reads_of(disk_warehouse, tmp_path, pushdown)
    assert warm["requests"] > 0 and warm["bytes"] == cold["bytes"], warm
    assert warm["bytes_from_device"] == 0, f"a warm run reads from the page cache: {warm}"


def test_explain_analyze_shows_the_reads(disk_warehouse):
    out = q.run_quarry(["--pushdown", "on", "sql", "EXPLAIN ANALYZE " + SQL], disk_warehouse).stdout
    fragment = next(line for line in out.splitlines() if "FragmentExec" in line)
    for counter in ("read_requests", "bytes_read_device", "read_wait_ns"):
        assert re.search(rf"\b{counter}=[0-9]", fragment), f"{counter} missing from: {fragment[:400]}"
    requests = re.search(r"\bread_requests=([0-9.]+)", fragment)
    assert requests and float(requests.group(1)) > 0, fragment[:400]
