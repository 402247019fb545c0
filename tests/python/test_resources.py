"""Bounded resources: generators claim bounded memory at any scale factor.

Method: run `quarry gen ssb` at two scale factors five times apart and read each child's peak
resident set size from `os.wait4` (the kernel's accounting for exactly that process). The
generator keeps at most one chunk per thread in flight, so the peak must not grow with the data:
the larger run may use at most 25% more (allocator noise) than the smaller one, while its data is
5x larger.
"""

from __future__ import annotations

import os
import subprocess


def peak_rss_mib(args: list[str]) -> float:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert os.waitstatus_to_exitcode(status) == 0, stderr
    return usage.ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def test_ssb_generation_memory_does_not_grow_with_scale(quarry_bin, tmp_path):
    small = peak_rss_mib([quarry_bin, "--warehouse", str(tmp_path / "small"), "--threads", "2", "gen", "ssb", "--sf", "0.4"])
    large = peak_rss_mib([quarry_bin, "--warehouse", str(tmp_path / "large"), "--threads", "2", "gen", "ssb", "--sf", "2"])
    assert large <= small * 1.25 + 16, f"peak RSS {large:.0f} MiB at SF 2 vs {small:.0f} MiB at SF 0.4"
