"""Bounded resources: generators claim bounded memory at any scale factor.

Method: run `quarry gen ssb` at two scale factors five times apart; each reports its own peak
resident set size (`VmHWM`, with QUARRY_REPORT_PEAK_RSS set). The
generator keeps at most one chunk per thread in flight, so the peak must not grow with the data:
the larger run may use at most 25% more (allocator noise) than the smaller one, while its data is
5x larger.
"""

from __future__ import annotations


import quarry_py


def peak_rss_mib(args: list[str]) -> float:
    return quarry_py.run_quarry_measured(args, timeout=600)[1]


def test_ssb_generation_memory_does_not_grow_with_scale(quarry_bin, tmp_path):
    small = peak_rss_mib([quarry_bin, "--warehouse", str(tmp_path / "small"), "--threads", "2", "gen", "ssb", "--sf", "0.4"])
    large = peak_rss_mib([quarry_bin, "--warehouse", str(tmp_path / "large"), "--threads", "2", "gen", "ssb", "--sf", "2"])
    assert large <= small * 1.25 + 16, f"peak RSS {large:.0f} MiB at SF 2 vs {small:.0f} MiB at SF 0.4"
