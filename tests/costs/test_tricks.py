"""The pays sweep's prediction formulas (explorer.costs.tricks) on hand-made numbers."""

from __future__ import annotations

import pytest

from explorer.costs.calibrate import Calibration
from explorer.costs.tricks import (
    fewer_bytes_speedup,
    kv_copy_bytes,
    overhead_cut_speedup,
    overhead_removed_s,
    prefix_expected_s,
    prefix_speedup,
    ratio,
    speculative_round_cost,
    speculative_speedup,
)


def _cal(s_per_byte=1e-9, s_per_flop=0.0, step=0.0, layer=None) -> Calibration:
    return Calibration(s_per_byte, s_per_flop, step, layer, models=["m"])


def test_ratio_needs_two_positive_times():
    assert ratio(2.0, 0.5) == 4.0
    assert ratio(None, 1.0) is None and ratio(1.0, 0.0) is None and ratio(-1.0, 1.0) is None


def test_speculative_speedup_counts_the_verify_pass_and_the_drafts():
    # alpha 0.5, k 2: E[tokens] = 1 + 0.5 + 0.25 = 1.75; a round costs (1.5 + 2 x 0.25) / 1 = 2
    assert speculative_round_cost(1.5, 0.25, 2, 1.0) == pytest.approx(2.0)
    assert speculative_speedup(0.5, 2, 1.5, 0.25, 1.0) == pytest.approx(1.75 / 2.0)
    # memory-bound: verify costs one pass, free drafts, every draft accepted -> k + 1
    assert speculative_speedup(1.0, 4, 1.0, 0.0, 1.0) == pytest.approx(5.0)
    # compute-bound: verify costs k + 1 passes, so even alpha = 1 cannot pay for a costly draft
    assert speculative_speedup(1.0, 4, 5.0, 0.1, 1.0) == pytest.approx(5.0 / 5.4)
    # in units of the 1-token pass: scaling every time alike changes nothing
    assert speculative_speedup(0.7, 3, 3e-3, 5e-4, 2e-3) == pytest.approx(
        speculative_speedup(0.7, 3, 1.5, 0.25, 1.0)
    )


def test_fewer_bytes_pay_only_in_the_bytes_term():
    cal = _cal(s_per_byte=1e-9, s_per_flop=1e-12, step=0.0)
    # bytes only: weights 1 GB + other 0 at half the bytes -> 2x
    only_bytes = dict(weight_bytes=1e9, other_bytes=0.0, flops=0.0, layers=4)
    assert fewer_bytes_speedup(_cal(), bytes_ratio=0.5, **only_bytes) == pytest.approx(2.0)
    # 1 s of bytes + 1 s of FLOPs: half the bytes -> 2 / 1.5
    mixed = dict(weight_bytes=1e9, other_bytes=0.0, flops=1e12, layers=4)
    assert fewer_bytes_speedup(cal, bytes_ratio=0.5, **mixed) == pytest.approx(2 / 1.5)
    # KV bytes are not weights: 1 GB weights + 1 GB KV, weights halved -> 2 / 1.5
    kv = dict(weight_bytes=1e9, other_bytes=1e9, flops=0.0, layers=4)
    assert fewer_bytes_speedup(_cal(), bytes_ratio=0.5, **kv) == pytest.approx(2 / 1.5)


def test_overhead_cut_is_a_ceiling_of_removed_overhead():
    cal = _cal(step=2e-3, layer=1e-4)
    assert overhead_removed_s(cal, 10) == pytest.approx(3e-3)
    assert overhead_removed_s(_cal(step=2e-3), 10) == pytest.approx(2e-3)  # no per-layer term
    assert overhead_cut_speedup(4e-3, 3e-3) == pytest.approx(4.0)
    assert overhead_cut_speedup(4e-3, 3e-3, kept=0.5) == pytest.approx(4 / 2.5)
    assert overhead_cut_speedup(4e-3, 0.0) == 1.0
    with pytest.raises(ValueError, match="kept"):
        overhead_cut_speedup(1.0, 0.5, kept=2)


def test_prefix_hit_fraction_mixes_hit_and_miss():
    assert prefix_expected_s(1.0, 0.2, 0.0) == 1.0
    assert prefix_expected_s(1.0, 0.2, 0.5) == pytest.approx(0.6)
    assert prefix_speedup(1.0, 0.2, 1.0) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="hit fraction"):
        prefix_expected_s(1.0, 0.2, 1.5)


def test_copy_bytes_read_and_write_the_cached_kv():
    assert kv_copy_bytes(100, 7, batch=2) == 2 * 100 * 7 * 2
    assert kv_copy_bytes(64, 10) == 2 * 64 * 10
