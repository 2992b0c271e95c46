"""The Export tab: the trace and the charts as downloads.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import base64
import json
import re

import pytest

from explorer.engine.trace import Trace


def decode_link(html: str) -> str:
    data = re.search(r'href="data:[^;]+;base64,([^"]+)"', html).group(1)
    return base64.b64decode(data).decode()


def test_export_trace_and_charts(dash):
    for _ in range(3):
        dash.parts["step"].click()
    dash.parts["export-what"].value = "trace JSON"
    dash.parts["export-button"].click()
    trace = Trace.from_json(decode_link(dash.parts["export-links"].value))
    assert trace.tokens == dash.session.trace.tokens
    dash.parts["export-what"].value = "trace CSV"
    dash.parts["export-button"].click()
    csv = decode_link(dash.parts["export-links"].value)
    assert csv.splitlines()[0].startswith("index,") and len(csv.splitlines()) == 4
    dash.parts["export-what"].value = "chart: latency"
    dash.parts["export-button"].click()
    assert 'download="latency-' in dash.parts["export-links"].value
    page = decode_link(dash.parts["export-links"].value)
    assert "Latency per step" in page and len(page) > 1_000_000
    assert json.loads(dash.export("json"))["steps"][0]["index"] == 0
    with pytest.raises(ValueError):
        dash.export("xml")
    assert dash.guard.errors == [], dash.guard.errors
