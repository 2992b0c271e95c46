"""The Charts tab: latency, traffic and roofline against the measured peaks.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import pytest
from app_helpers import trace_of

from explorer.app import Dashboard


def test_roofline_and_traffic_show_the_measured_peaks(tiny):
    d = Dashboard(
        lm=tiny, prompt="abc", max_new_tokens=None
    )  # measures peaks on a background thread
    d.parts["step"].click()
    d.parts["step"].click()
    hw = d.session.trace.hardware
    assert hw is not None and hw["method"] == "measured"
    names = [t.name for t in d.parts["roofline"].data]
    assert any(n.startswith("this machine (measured") for n in names)
    assert any("modelled: datasheet" in n for n in names)
    assert d.parts["traffic"].layout.shapes[0].y0 == pytest.approx(hw["bandwidth_gbps"])
    assert d.parts["traffic"].layout.yaxis2.range[1] > hw["bandwidth_gbps"]
    assert "error" not in d.message.value and d._ceilings_shown
    s = d.session.steps[1]
    assert s.achieved_gbps is not None
    d.parts["tabs"].selected_index = 1
    assert trace_of(d.parts["traffic"], "achieved GB/s").y[1] == pytest.approx(s.achieved_gbps)
    assert d.guard.errors == [], d.guard.errors
