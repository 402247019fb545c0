"""Shared pytest fixtures for Quarry's Python tests.

The fixtures build nothing: they need a binary that was built beforehand
(scripts/test.sh builds it with the `ci` profile and sets QUARRY_BIN). The binary is
``$QUARRY_BIN`` or ``<repo>/target/release/quarry``; a test that needs it *fails* (it does not
skip) when it is missing, so a CI run without the binary cannot pass by skipping everything.
Tests of the pure Python helpers (test_quarry_py.py) do not need the binary.

Environment knobs:
  QUARRY_BIN          path of the quarry binary
  QUARRY_TEST_SF      scale factor of the differential tests' SSB/TPC-H data (default 0.05)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

import quarry_py  # noqa: E402

# Text that must never appear in quarry's output: a Rust panic or a backtrace hint.
# (quarry's panic hook prints "quarry: internal error: panicked at ... This is a bug in Quarry".)
PANIC_MARKERS = ("panicked at", "RUST_BACKTRACE", "stack backtrace", "This is a bug in Quarry")


def assert_no_panic(*texts: str) -> None:
    for text in texts:
        for marker in PANIC_MARKERS:
            assert marker not in (text or ""), f"quarry output contains {marker!r}:\n{text}"


@pytest.fixture(scope="session")
def quarry_bin() -> str:
    """Path of a working quarry binary (fails the test when there is none)."""
    path = quarry_py.quarry_bin()
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        pytest.fail(
            f"quarry binary not found at {path}: build it first (cargo build --release) "
            "or set QUARRY_BIN",
            pytrace=False,
        )
    try:
        proc = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        pytest.fail(f"cannot run {path}: {e}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"{path} --help exited {proc.returncode}:\n{proc.stderr}", pytrace=False)
    return path


@pytest.fixture
def warehouse(tmp_path, quarry_bin) -> Path:
    """A fresh, empty warehouse directory for one test."""
    wh = tmp_path / "warehouse"
    wh.mkdir()
    return wh


@pytest.fixture(scope="session")
def test_sf() -> float:
    return float(os.environ.get("QUARRY_TEST_SF", "0.05"))


def _gen_warehouse(tmp_path_factory, suite: str, sf: float) -> Path:
    wh = tmp_path_factory.mktemp(f"wh-{suite}")
    sf_text = str(int(sf)) if float(sf).is_integer() else str(sf)
    quarry_py.run_quarry(["gen", suite, "--sf", sf_text], wh, timeout=1800)
    tables = quarry_py.list_tables(wh)
    assert tables, f"quarry gen {suite} wrote no tables into {wh}"
    return wh


@pytest.fixture(scope="session")
def ssb_warehouse(tmp_path_factory, quarry_bin, test_sf) -> Path:
    """A warehouse holding ``quarry gen ssb --sf $QUARRY_TEST_SF`` (generated once a session)."""
    return _gen_warehouse(tmp_path_factory, "ssb", test_sf)


@pytest.fixture(scope="session")
def tpch_warehouse(tmp_path_factory, quarry_bin, test_sf) -> Path:
    """A warehouse holding ``quarry gen tpch --sf $QUARRY_TEST_SF`` (generated once a session)."""
    return _gen_warehouse(tmp_path_factory, "tpch", test_sf)


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(directory, name):
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-days", "2", "-subj", f"/CN={name}", cwd=directory)
    return directory / f"{name}.pem"


@pytest.fixture(scope="session")
def certificates(tmp_path_factory):
    """A CA, a node certificate it signed for 127.0.0.1, and another CA that signed nothing."""
    d = tmp_path_factory.mktemp("tls")
    ca = _ca(d, "ca")
    other_ca = _ca(d, "other")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "node.pem",
             "-days", "2", "-extfile", "ext.cnf", cwd=d)
    return {"ca": ca, "other_ca": other_ca, "cert": d / "node.pem", "key": d / "node.key"}
