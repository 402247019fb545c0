"""scripts/soak.py, briefly: concurrent clients against two groups of storage nodes (SSB's and
TPC-H's, one node of each under --device-memory), queries checked against DuckDB, appends and
graph jobs checked against what they must give. The committed report is the long run
(docs/benchmarks/soak); this runs the same script for seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import quarry_py as q


def test_a_short_soak_answers_everything_right(tmp_path, quarry_bin):
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, str(q.REPO_ROOT / "scripts" / "soak.py"), "--clients", "3", "--duration", "15", "--sf", "0.01",
         "--graph-scale", "8", "--graph-memory", "4MB", "--work", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "QUARRY_BIN": quarry_bin},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "soak.json").read_text())
    assert report["wrong"] == 0 and report["errors"] == 0, report
    # Every kind of work ran, under load from the other clients.
    assert all(report["kinds"][kind]["done"] > 0 for kind in ("query", "append", "graph")), report["kinds"]
    assert len(report["nodes"]) == 6 and all(node["exit_status_during_soak"] is None for node in report["nodes"])
    # The nodes' peak memory is read from the nodes themselves: above what they held idle.
    assert all(node["vm_hwm_mib"] >= node["idle_rss_mib"] > 0 and node["peak_anon_mib"] > 0 for node in report["nodes"]), report["nodes"]
    # Each node's metrics were read (its pool's reservations are sampled beside its memory, which
    # a run this short may see only at rest): how much work it admitted past its budget.
    assert all(node["admissions_overcommitted"] is not None and node["peak_pool_reserved_mib"] >= 0 for node in report["nodes"]), report["nodes"]
    assert "Wrong answers: 0. Errors: 0." in (out / "soak.md").read_text()
