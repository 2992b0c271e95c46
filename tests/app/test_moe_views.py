"""Mixture-of-experts views: the Inside tab's Routing on a tiny random Qwen3-MoE; on a dense model it
says so; the Capacity tab refuses experts that do not divide across the GPUs (one dashboard each)."""

from __future__ import annotations

import html
import math

import pytest
from app_helpers import message, show_tab
from moe_helpers import tiny_moe

from explorer.app import Dashboard


@pytest.fixture(scope="module")
def moe_lm():
    return tiny_moe(8, 2)


def test_routing_view_draws_the_step_and_the_load(moe_lm):
    dash = Dashboard(lm=moe_lm, prompt="Hello there", measure_peaks=False, max_new_tokens=None)
    try:
        for _ in range(3):
            dash.parts["step"].click()
        show_tab(dash, "inside")
        dash.parts["inside-routing-run"].click()
        one = dash.tab("inside").routing["steps"][0]
        assert one["index"] == 2 and one["experts_touched"] == [2, 2]  # a decode step: k each
        heat, touched = dash.parts["inside-routing"].data
        assert [sum(not math.isnan(v) for v in row) for row in heat.z] == [2, 2]
        assert sum(sum(v for v in row if not math.isnan(v)) for row in heat.z) == pytest.approx(2)
        assert len(touched.x) == 4
        load = dash.parts["inside-expert-load"].data[0]
        tokens = sum(s.batch_size * s.tokens_fed for s in dash.session.steps)
        assert [sum(row) for row in load.customdata] == [2 * tokens] * 2  # k picks per token
        assert "touched 2, 2 of 8 experts" in dash.parts["inside-text"].value
    finally:
        dash.pause()
        dash.wait(10)


def test_dense_routing_message_and_capacity_expert_parallel(dash):
    dash.parts["step"].click()
    show_tab(dash, "inside")
    dash.parts["inside-routing-run"].click()
    assert "dense model" in dash.parts["inside-text"].value
    assert not dash.parts["inside-routing"].data or not dash.parts["inside-routing"].data[0].z
    dash.parts["inside-lens-run"].click()  # the rest works
    assert dash.tab("inside").lens
    tab = dash.tab("capacity")
    assert "arch:qwen3-30b-a3b" in dash.parts["cap-model"].options
    dash.parts["cap-model"].value = "arch:qwen3-30b-a3b"
    dash.parts["cap-gpus"].value = 3
    dash.parts["cap-ep"].value = True
    dash.parts["cap-run"].click()
    said = html.unescape(message(dash))
    assert "does not divide the model's 128 experts" in said and "1, 2, 4" in said
    assert tab.rows == []  # nothing drawn from a refused setup
    dash.parts["cap-model"].value = "arch:llama-3.1-8b"
    dash.parts["cap-gpus"].value = 2
    dash.parts["cap-run"].click()
    assert "model is dense" in html.unescape(message(dash))
