"""`quarry model emos`: the EMOS storage-energy simulator over traces a storage node records
(`quarry serve --io-trace`) and over traces built from Table 4.4's own rows."""

from __future__ import annotations

import json

import quarry_py as q

QUERY = "SELECT l_returnflag, count(*), sum(l_quantity) FROM lineitem WHERE l_shipdate < DATE '1995-01-01' GROUP BY 1"


def _emos(trace, *args):
    return json.loads(q.run_quarry(["model", "emos", trace, *map(str, args), "--json"]).stdout)


def test_a_node_records_its_reads_and_emos_charges_them(tpch_warehouse, tmp_path):
    trace = tmp_path / "io.trace"
    with q.StorageNodes([tpch_warehouse], ["--io-trace", trace]) as node:
        for _ in range(2):  # the second run reads what the first did
            for mode in ("on", "off"):
                q.run_quarry(["sql", QUERY, "--nodes", node.arg, "--pushdown", mode, "--format", "csv"], "/nonexistent-warehouse")
    lines = [line.split() for line in trace.read_text().splitlines()]
    assert lines and all(len(f) == 5 and f[1] == "R" and f[2].endswith(".parquet") for f in lines), lines[:5]
    times = [float(f[0]) for f in lines]
    assert min(times) >= 0 and max(times) > min(times), "seconds since the node started, over four queries"
    total = sum(int(f[4]) for f in lines)
    big = _emos(trace, "--platform", "android", "--cache", "1GB")
    assert (big["requests"], big["bytes_read"], big["bytes_written"]) == (len(lines), total, 0), big
    assert big["hit_bytes"] > total / 3, "the repeated queries read cached pages"
    none = _emos(trace, "--platform", "android", "--cache", "0")
    assert none["hit_bytes"] == 0 and none["miss_bytes"] == total, none
    assert none["energy_j"] > big["energy_j"] > 0, (none["energy_j"], big["energy_j"])
    windows = _emos(trace, "--platform", "windows-rt", "--cache", "0")
    assert windows["energy_j"] != none["energy_j"]


def test_a_trace_of_one_request_type_costs_its_table_row(tmp_path):
    """8 KB random reads, all cached, on Windows RT: 14.2 uJ/KB (Table 4.4); all missed: 96.7."""
    trace = tmp_path / "reads.trace"
    slots = [(i * 7) % 64 for i in range(64)]
    trace.write_text("".join(f"{n * 0.001:.3f} R data {slot * 2 * 8192} 8192\n" for n, slot in enumerate(slots + slots)))
    cached = _emos(trace, "--platform", "windows-rt", "--cache", "64MB")
    [miss, hit] = sorted(cached["by_category"], key=lambda c: c["hit"])
    assert (hit["access"], hit["bytes"], round(hit["uj_per_kb"], 6)) == ("random_read", 64 * 8192, 14.2), cached
    assert round(miss["uj_per_kb"], 6) == 96.7, cached
    text = q.run_quarry(["model", "emos", trace, "--platform", "windows-rt", "--cache", "64MB"]).stdout
    assert "random_read" in text and "14.2" in text and "total energy" in text, text
    bad = tmp_path / "bad.trace"
    bad.write_text("0 R f 0 8192\n0.1 X f 0 8192\n")
    error = q.run_quarry(["model", "emos", bad, "--platform", "android", "--cache", "1MB"], check=False)
    assert error.returncode != 0 and "bad.trace: trace line 2: the operation is not R or W" in error.stderr, error.stderr
