"""TLS on the Flight transport: a node serving `grpc+tls://` is queried by a host that trusts its
CA (`--tls-ca`), refused by one that does not; beyond loopback a node needs TLS or `--insecure`.
Certificates come from conftest's `certificates` (the `openssl` command line)."""

from __future__ import annotations

import subprocess

import quarry_py as q
from conftest import assert_no_panic

COUNT = "SELECT count(*), sum(o_totalprice) FROM orders"


def _sql(url, *extra):
    return q.run_quarry(["sql", COUNT, "--nodes", url, "--format", "csv", *extra], "/nonexistent-warehouse", check=False)


def test_a_host_with_the_ca_queries_a_tls_node(tpch_warehouse, certificates):
    expected = q.compare_with_duckdb(tpch_warehouse, COUNT)
    assert expected, expected
    with q.StorageNodes([tpch_warehouse], ["--tls-cert", certificates["cert"], "--tls-key", certificates["key"]]) as node:
        [url] = node.urls
        assert url.startswith("grpc+tls://127.0.0.1:"), url
        trusted = _sql(url, "--tls-ca", certificates["ca"])
        assert trusted.returncode == 0, trusted.stderr
        embedded = q.run_quarry(["sql", COUNT, "--format", "csv"], tpch_warehouse)
        assert trusted.stdout == embedded.stdout
        # Without the CA (the system's roots do not know it), or with another CA: refused, clearly.
        for extra in [(), ("--tls-ca", certificates["other_ca"])]:
            refused = _sql(url, *extra)
            assert refused.returncode != 0
            assert f"storage node {url}: its TLS certificate is not trusted" in refused.stderr, refused.stderr
            assert_no_panic(refused.stderr)
        # Plaintext to a TLS node names the remedy.
        plain = _sql(url.replace("grpc+tls://", "grpc://"))
        assert plain.returncode != 0 and "a node that serves TLS is named grpc+tls://" in plain.stderr, plain.stderr


def test_beyond_loopback_a_node_needs_tls_or_insecure(tpch_warehouse, tmp_path, certificates):
    token = tmp_path / "token"
    token.write_text("a-token\n")
    base = ["serve", "--listen", "0.0.0.0:0", "--token-file", token]
    refused = q.run_quarry(base, tpch_warehouse, check=False, timeout=60)
    assert refused.returncode != 0 and "refusing to listen on 0.0.0.0:0 without TLS" in refused.stderr, refused.stderr
    for extra, scheme, warned in [(["--insecure"], "grpc://", True), (["--tls-cert", certificates["cert"], "--tls-key", certificates["key"]], "grpc+tls://", False)]:
        cmd = [q.quarry_bin(), "--warehouse", str(tpch_warehouse), *map(str, base), *map(str, extra)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        try:
            url = q.read_node_url(proc)
            assert url.startswith(scheme), url
        finally:
            proc.kill()
            stderr = proc.communicate(timeout=30)[1]
        assert ("without TLS (--insecure)" in stderr) == warned, stderr
