#!/usr/bin/env python3
"""Soak: concurrent clients against storage nodes for a while, every answer checked.

Starts NODES `quarry serve` processes on loopback (the last one under `--device-memory`),
generates SSB and TPC-H at `--sf` through them (segments spread over the nodes) and a Kronecker
graph, and computes the expected answers before any client starts: DuckDB over the nodes' own
segments for every query in queries/ssb and queries/tpch, and a first run of the graph job.
Then CLIENTS threads, each its own seeded random mix, run until DURATION has passed:
- a query (a random SSB or TPC-H file, `quarry --nodes ... sql -f`), compared with DuckDB's
  rows by value;
- an append to the client's own table (`quarry load --append` of a small CSV), then its row
  count and sum checked against every append the client made so far;
- a graph job (weakly connected components, into the client's own table), its components'
  count and sum checked against the first run's.
Each node's resident memory, and from its metrics (`quarry serve --metrics-listen`) the bytes
reserved from its memory pool and the demand it has admitted, are sampled while they run; its
resident peak (VmHWM) and how much work it admitted past its budget are read at the end.

The report (JSON and Markdown, with the command and commit) gives operations done, wrong
answers, errors, p50/p99 latency per kind, and each node's peak memory against its device
memory. Exit status 1 if any answer was wrong or any operation failed.

    python3 scripts/soak.py --clients 16 --duration 600 --sf 1 --out docs/benchmarks/soak
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quarry_py as q  # noqa: E402

KINDS = ("query", "append", "graph")
SUITES = ("ssb", "tpch")


@dataclass
class Tally:
    """What the clients did, under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    latencies: dict = field(default_factory=lambda: {k: [] for k in KINDS})
    wrong: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    def record(self, kind: str, seconds: float, wrong: str | None = None, error: str | None = None) -> None:
        with self.lock:
            self.latencies[kind].append(seconds)
            if wrong:
                self.wrong.append(wrong)
            if error:
                self.errors.append(error)


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def node_memory_kib(pid: int) -> dict[str, int]:
    """The memory fields of a process's /proc status (VmRSS, VmHWM, RssAnon, RssFile, ...), in
    KiB; empty once it has exited."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {key: int(rest.split()[0]) for key, _, rest in (ln.partition(":") for ln in lines) if rest.strip().endswith("kB")}


def free_port() -> int:
    """A loopback port free now (for a node's metrics listener)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# A node's metrics the soak samples: the pool's reserved bytes and the admitted demand (peaks),
# and the admissions past the budget (a count, read at the end).
POOL_RESERVED, ADMITTED_DEMAND, OVERCOMMITTED = "quarry_node_memory_reserved_bytes", "quarry_node_admitted_demand_bytes", "quarry_node_admissions_overcommitted_total"


def node_metrics(port: int) -> dict[str, float]:
    """The node's Prometheus metrics by name (one sample each); empty if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("#")}


def node_warehouse(work: Path, suite: str, index: int) -> Path:
    """The warehouse of a suite's node `index`."""
    return work / suite / f"node{index}"


def suite_staging(work: Path, suite: str) -> Path:
    """The host-side warehouse of a suite's nodes."""
    return work / suite / "staging"


def components_summary(nodes: str, staging: Path, table: str) -> tuple:
    """Row count, distinct components and the sum of component ids of a `graph cc` table."""
    out = q.run_quarry(["--nodes", nodes, "sql", f"select count(*), count(distinct component), sum(component) from {table}", "--format", "csv"], staging, timeout=600)
    return tuple(out.stdout.strip().splitlines()[-1].split(","))


class Soak:
    def __init__(self, args: argparse.Namespace, urls: dict, work: Path, expected: dict, graph_expected: tuple):
        self.args = args
        self.urls = urls
        self.work = work
        self.expected = expected
        self.graph_expected = graph_expected
        self.tally = Tally()
        self.deadline = time.monotonic() + args.duration
        self.scratch = Path(tempfile.mkdtemp(prefix="quarry-soak-"))

    def staging(self, suite: str) -> Path:
        return suite_staging(self.work, suite)

    def client(self, index: int) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        appended = {"rows": 0, "sum": 0}
        files = sorted(self.expected)
        step = 0
        while time.monotonic() < self.deadline:
            step += 1
            roll = rng.random()
            kind = "query" if roll < self.args.query_share else "append" if roll < self.args.query_share + (1 - self.args.query_share) / 2 else "graph"
            started = time.monotonic()
            try:
                if kind == "query":
                    wrong = self.query(rng.choice(files), index, step)
                elif kind == "append":
                    wrong = self.append(index, step, appended, rng)
                else:
                    wrong = self.graph(index)
                self.tally.record(kind, time.monotonic() - started, wrong=wrong)
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                self.tally.record(kind, time.monotonic() - started, error=f"client {index} {kind}: {q.error_line(getattr(e, 'stderr', '') or str(e), getattr(e, 'returncode', 1))}")

    def query(self, path: Path, index: int, step: int) -> str | None:
        out = self.scratch / f"c{index}-{step}.parquet"
        suite = path.parent.name
        q.run_quarry(["--nodes", self.urls[suite], "sql", "-f", str(path), "--format", "parquet", "--output", str(out)], self.staging(suite), timeout=600)
        result = q.read_parquet_result(out)
        out.unlink()
        comparison = q.compare_query_results(path.read_text(), result, self.expected[path])
        return None if comparison else f"client {index} {suite}/{path.stem}: {comparison}"

    def append(self, index: int, step: int, appended: dict, rng: random.Random) -> str | None:
        table = f"soak_c{index}"
        rows = rng.randint(1, 500)
        values = [rng.randint(-10**9, 10**9) for _ in range(rows)]
        csv = self.scratch / f"c{index}-{step}.csv"
        csv.write_text("k,v\n" + "".join(f"{step},{v}\n" for v in values))
        q.run_quarry(["--nodes", self.urls["tpch"], "load", table, str(csv), "--schema", "k BIGINT, v BIGINT", *(["--append"] if appended["rows"] else [])], self.staging("tpch"), timeout=600)
        csv.unlink()
        appended["rows"] += rows
        appended["sum"] += sum(values)
        out = q.run_quarry(["--nodes", self.urls["tpch"], "sql", f"select count(*), sum(v) from {table}", "--format", "csv"], self.staging("tpch"), timeout=600)
        got = out.stdout.strip().splitlines()[-1]
        want = f"{appended['rows']},{appended['sum']}"
        return None if got == want else f"client {index} {table}: count, sum {got}, expected {want}"

    def graph(self, index: int) -> str | None:
        table = f"soak_cc_c{index}"
        staging = self.staging("tpch")
        q.run_quarry(["--nodes", self.urls["tpch"], "graph", "cc", "g", "--table", table, "--memory", self.args.graph_memory], staging, timeout=600)
        got = components_summary(self.urls["tpch"], staging, table)
        return None if got == self.graph_expected else f"client {index} graph cc: {got}, expected {self.graph_expected}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=600, help="seconds the clients run")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--device-memory", default="512MB", help="device memory of the last node")
    ap.add_argument("--sf", type=float, default=1)
    ap.add_argument("--graph-scale", type=int, default=16, help="log2 of the graph's vertex count")
    ap.add_argument("--graph-memory", default="64MB", help="sort-reduce memory of each graph job")
    ap.add_argument("--query-share", type=float, default=0.8, help="share of queries; the rest split between appends and graph jobs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", help="directory for the nodes' warehouses (default: a temporary one)")
    ap.add_argument("--out", help="directory for soak.json and soak.md")
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="quarry-soak-work-"))
    # SSB and TPC-H both have tables named part, customer and supplier: each suite gets its own
    # NODES nodes (the last under --device-memory); appends and graph jobs go to TPC-H's.
    groups: dict[str, list[q.StorageNodes]] = {}
    nodes_running = contextlib.ExitStack()
    metrics_ports: list[int] = []
    try:
        for suite in SUITES:
            # The last node of each suite under the device memory.
            extra = [[]] * (args.nodes - 1) + [["--device-memory", args.device_memory]]
            ports = [free_port() for _ in extra]
            metrics_ports += ports
            groups[suite] = [nodes_running.enter_context(q.StorageNodes([node_warehouse(work, suite, i)], [*e, "--metrics-listen", f"127.0.0.1:{port}"]))
                             for i, (e, port) in enumerate(zip(extra, ports))]
        urls = {suite: ",".join(n.arg for n in nodes) for suite, nodes in groups.items()}
        all_nodes = [(suite, i, n) for suite, nodes in groups.items() for i, n in enumerate(nodes)]
        pids = [n.procs[0].pid for _, _, n in all_nodes]
        idle_kib = [node_memory_kib(p).get("VmRSS") for p in pids]
        setup_started = time.monotonic()
        expected = {}
        for suite in SUITES:
            staging = suite_staging(work, suite)
            q.run_quarry(["--nodes", urls[suite], "gen", suite, "--sf", str(args.sf)], staging, timeout=3600)
            con = q.duckdb_connect([node_warehouse(work, suite, i) for i in range(args.nodes)], threads=2)
            expected.update({path: q.duckdb_result(con, path.read_text()) for path in q.query_files(suite)})
            con.close()
        # A graph lives on one node (the first); jobs name every node and run where it is.
        staging = suite_staging(work, "tpch")
        q.run_quarry(["--nodes", groups["tpch"][0].arg, "graph", "gen", "kron", "g", "--scale", str(args.graph_scale)], staging, timeout=3600)
        q.run_quarry(["--nodes", urls["tpch"], "graph", "cc", "g", "--table", "soak_cc_reference", "--memory", args.graph_memory], staging, timeout=3600)
        graph_expected = components_summary(urls["tpch"], staging, "soak_cc_reference")
        setup_seconds = time.monotonic() - setup_started

        soak = Soak(args, urls, work, expected, graph_expected)
        # Resident memory, and its anonymous part: segment reads map the files, and the page
        # cache's pages of a mapped file count as resident too.
        peaks = {key: [0] * len(pids) for key in ("VmRSS", "RssAnon", "RssFile", POOL_RESERVED, ADMITTED_DEMAND)}
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                for i, (pid, port) in enumerate(zip(pids, metrics_ports)):
                    now = {**node_memory_kib(pid), **{k: v / 1024 for k, v in node_metrics(port).items()}}
                    for key, peak in peaks.items():
                        peak[i] = max(peak[i], now.get(key, 0))
                sampling.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        clients = [threading.Thread(target=soak.client, args=(i,)) for i in range(args.clients)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        elapsed = time.monotonic() - started
        shutil.rmtree(soak.scratch, ignore_errors=True)
        sampling.set()
        sampler.join()
        hwm = [node_memory_kib(p).get("VmHWM") for p in pids]
        overcommitted = [node_metrics(port).get(OVERCOMMITTED) for port in metrics_ports]
        exited = [n.procs[0].poll() for _, _, n in all_nodes]
    finally:
        nodes_running.close()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)

    tally = soak.tally
    kinds = {
        kind: {
            "done": len(tally.latencies[kind]),
            "p50_s": percentile(tally.latencies[kind], 50),
            "p99_s": percentile(tally.latencies[kind], 99),
            "mean_s": statistics.fmean(tally.latencies[kind]) if tally.latencies[kind] else None,
        }
        for kind in KINDS
    }
    node_rows = []
    for i, (suite, index, n) in enumerate(all_nodes):
        device = args.device_memory if index == args.nodes - 1 else None
        node_rows.append({"suite": suite, "url": n.arg, "device_memory": device, "idle_rss_mib": (idle_kib[i] or 0) / 1024,
                          "peak_rss_mib": peaks["VmRSS"][i] / 1024,
                          "peak_anon_mib": peaks["RssAnon"][i] / 1024, "peak_file_mib": peaks["RssFile"][i] / 1024, "vm_hwm_mib": (hwm[i] or 0) / 1024,
                          "peak_pool_reserved_mib": peaks[POOL_RESERVED][i] / 1024, "peak_admitted_demand_mib": peaks[ADMITTED_DEMAND][i] / 1024,
                          "admissions_overcommitted": overcommitted[i], "exit_status_during_soak": exited[i]})
    report = {
        "command": " ".join(sys.argv),
        "git": q.git_state(),
        "binary": q.binary_info(),
        "clients": args.clients,
        "duration_s": elapsed,
        "sf": args.sf,
        "graph_scale": args.graph_scale,
        "setup_s": setup_seconds,
        "kinds": kinds,
        "wrong": len(tally.wrong),
        "errors": len(tally.errors),
        "wrong_details": tally.wrong[:50],
        "error_details": tally.errors[:50],
        "nodes": node_rows,
    }
    failed = bool(tally.wrong or tally.errors or any(e is not None for e in exited))
    lines = [
        "# Soak", "",
        f"Command: `{report['command']}`  ",
        f"Commit: {report['git'].get('commit')} ({'dirty' if report['git'].get('dirty') else 'clean'})", "",
        f"{args.clients} clients for {elapsed:.0f} s. SSB and TPC-H at SF {args.sf}, each on its own {args.nodes} nodes"
        f" (the last with --device-memory {args.device_memory}); appends and graph jobs (a Kronecker graph of"
        f" 2^{args.graph_scale} vertices) on TPC-H's nodes.", "",
        f"**Wrong answers: {len(tally.wrong)}. Errors: {len(tally.errors)}.**", "",
        "| kind | done | p50 (s) | p99 (s) |", "|---|---|---|---|",
    ]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines += [f"| {k} | {v['done']} | {fmt(v['p50_s'])} | {fmt(v['p99_s'])} |" for k, v in kinds.items()]
    lines += ["", "Node memory in MiB: resident when idle; peaks sampled every 0.5 s (resident, its anonymous part, its"
              " file-mapped part; the bytes reserved from the node's memory pool and the weighted demand it had admitted);"
              " VmHWM, the kernel's resident peak; and the work the node admitted past its budget (its admitted work stalled,"
              " or the wait reached its limit).", "",
              "| suite | node | device memory | idle | peak resident | peak anonymous | peak file-mapped | VmHWM | peak pool reserved | peak admitted demand | admitted past budget |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    count = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    lines += [f"| {n['suite']} | {n['url']} | {n['device_memory'] or '-'} | {n['idle_rss_mib']:.0f} | {n['peak_rss_mib']:.0f} |"
              f" {n['peak_anon_mib']:.0f} | {n['peak_file_mib']:.0f} | {n['vm_hwm_mib']:.0f} | {n['peak_pool_reserved_mib']:.0f} |"
              f" {n['peak_admitted_demand_mib']:.0f} | {count(n['admissions_overcommitted'])} |" for n in node_rows]
    lines += [""] + [f"- wrong: {w}" for w in tally.wrong[:20]] + [f"- error: {e}" for e in tally.errors[:20]]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "soak.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (out / "soak.md").write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
