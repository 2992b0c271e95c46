"""explorer.costs.guards: pinned threads, spread, the machine check and the impossible-row guard."""

from __future__ import annotations

import pytest
import torch

from explorer.costs import guards
from explorer.costs.calibrate import Calibration
from explorer.costs.speculation import expected_speedup


def test_pin_threads_sets_torch_and_reads_the_environment(monkeypatch):
    before = torch.get_num_threads()
    try:
        assert guards.pin_threads(1) == 1 == torch.get_num_threads()
        monkeypatch.setenv("EXPLORER_THREADS", "2")
        assert guards.default_threads() == 2
        monkeypatch.delenv("EXPLORER_THREADS")
        monkeypatch.setenv("OMP_NUM_THREADS", "junk")
        assert guards.default_threads() == 1  # unreadable: the safe default
        for bad in (0, -1, 1.5, "2", True):
            with pytest.raises(ValueError, match="THREADS must be a whole number"):
                guards.pin_threads(bad)
    finally:
        torch.set_num_threads(before)


def test_spread_of_repeats():
    s = guards.spread([0.010, 0.012, 0.011])
    assert (s.median, s.low, s.high, s.n) == (0.011, 0.010, 0.012, 3)
    assert s.pct == pytest.approx(100 * 0.001 / 0.011)
    assert "over 3" in s.text and "11 ms" in s.text
    assert guards.spread([0.5]).pct == 0
    with pytest.raises(ValueError, match="no samples"):
        guards.spread([])


def test_machine_check_warns_past_the_tolerance():
    ok = guards.machine_check(0.012, 0.010)
    assert ok.ok and ok.ratio == pytest.approx(1.2) and "machine check ok" in ok.line
    off = guards.machine_check(0.013, 0.010)
    assert not off.ok and "FAILED" in off.line and "+30%" in off.line
    assert not guards.machine_check(0.007, 0.010).ok  # too fast is as stale as too slow
    with pytest.raises(ValueError, match="positive number"):
        guards.machine_check(0.0, 0.01)
    with pytest.raises(ValueError, match="predicted_s"):
        guards.machine_check(0.01, float("nan"))


def test_step_check_measures_a_real_step(target):
    # a calibration that predicts only a fixed overhead of 1 s: a real small step is far below it
    cal = Calibration(s_per_byte=0.0, s_per_flop=0.0, step_overhead_s=1.0, layer_overhead_s=None,
                      models=[target.info.name])  # fmt: skip
    check = guards.step_check(target, cal, context=16, repeats=3)
    assert check.predicted_s == 1.0 and 0 < check.measured_s < 1.0 and not check.ok
    assert "batch-1 decode step at context 16" in check.line


def test_longer_uncached_pass_faster_is_flagged():
    assert guards.longer_not_faster([8, 64, 256], [0.01, 0.02, 0.05]) == []
    assert guards.longer_not_faster([8, 256], [0.010, 0.0095]) == []  # within the noise slack
    (line,) = guards.longer_not_faster([8, 256], [0.05, 0.02], what="uncached pass")
    assert "uncached pass at 256" in line and "beat the one at 8" in line


def test_impossible_pays_rows():
    def rows(trick, values, speedups, base=None):
        base = base or [0.01 * (i + 1) for i in range(len(values))]
        return [
            {"trick": trick, "value": v, "speedup": s, "baseline_s": b, "skipped": None}
            for v, s, b in zip(values, speedups, base)
        ]

    assert guards.impossible_rows(rows("kv-cache", [8, 256], [2.0, 40.0])) == []
    flagged = guards.impossible_rows(rows("kv-cache", [8, 256], [2.0, 40.0], base=[0.06, 0.02]))
    assert len(flagged) == 1 and "uncached pass" in flagged[0]
    assert len(guards.impossible_rows(rows("kv-cache", [8], [12.0]))) == 1  # above L + 1
    assert len(guards.impossible_rows(rows("int8", [1, 64], [0.8, 5.0]))) == 1
    cont = guards.impossible_rows(rows("continuous", [0.0, 1.0], [6.0, 6.0]))
    assert len(cont) == 1 and "at 0.0" in cont[0]  # only spread 0 has a bound
    spec = rows("speculative", [1, 8], [0.9, 0.5])
    bound = expected_speedup(0.5, 4, 0.5, 1.0)
    assert bound == pytest.approx(guards.speculative_bound(0.5, 4, 0.5)) and 0.6 < bound < 0.7
    flagged = guards.impossible_rows(spec, {"k": 4, "alpha": {4: 0.5}, "draft_cost": 0.5})
    assert len(flagged) == 1 and "at 1" in flagged[0]
    by_batch = {"k": 4, "alpha": {4: 0.5}, "draft_cost": {1: 0.1, 8: 0.9}}  # as the sweep keeps it
    flagged = guards.impossible_rows(spec, by_batch)
    assert len(flagged) == 1 and "at 8" in flagged[0]  # 0.5 > the bound at c = 0.9; 0.9 < at 0.1
    assert guards.impossible_rows(spec, {}) == []  # no measured alpha: no stated bound
    assert guards.impossible_rows([]) == []
