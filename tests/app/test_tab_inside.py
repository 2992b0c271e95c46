"""The Inside tab: logit lens, attention, the head picker.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import pytest
from app_helpers import message, show_tab


def test_inside_tab_lens_attention_and_head_picker(dash, monkeypatch):
    for _ in range(3):
        dash.parts["step"].click()
    show_tab(dash, "inside")
    dash.parts["inside-lens-run"].click()
    lens = dash.tab("inside").lens
    heat = dash.parts["inside-lens"].data[0]
    assert len(lens) == 2 and list(heat.y) == [0, 1]
    assert heat.z[1][0] == pytest.approx(lens[1]["top"][0]["prob"])
    assert "chosen token" in dash.parts["inside-text"].value
    dash.parts["inside-attention-run"].click()
    att = dash.tab("inside").att
    assert att["heads"] == 4 and att["layers"] == 2
    assert len(att["positions"]) == dash.session.steps[-1].context_len
    z = dash.parts["inside-attention"].data[0].z
    assert [sum(row) for row in z] == pytest.approx(
        [1.0, 1.0], abs=1e-4
    )  # mean of rows that sum to 1
    assert ("head 3", 3) in dash.parts["inside-head"].options
    dash.parts["inside-head"].value = 3
    assert list(dash.parts["inside-attention"].data[0].z[0]) == pytest.approx(att["weights"][0][3])
    assert "head 3" in dash.parts["inside-attention"].layout.title.text
    from explorer.inside.hooks import InsideUnavailable

    def unavailable(*a, **k):
        raise InsideUnavailable("logit lens unavailable: no final norm found")

    monkeypatch.setattr(dash.session, "logit_lens", unavailable)
    dash.parts["inside-lens-run"].click()
    assert "no final norm" in message(dash)
    assert dash.parts["inside-lens"].data[0].z[1][0] == pytest.approx(lens[1]["top"][0]["prob"])
    dash.parts["step"].click()
    assert len(dash.session.steps) == 4 and dash.guard.busy is None
