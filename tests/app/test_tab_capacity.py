"""The Capacity tab: answers on paper, comparison with a measured result.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import html
import re

from app_helpers import message

from explorer.serving.simulate.whatif_settings import FAMILY_DEFAULTS


def test_capacity_tab_answers_on_paper_and_keeps_working_after_bad_input(dash):
    tab = dash.tab("capacity")
    dash.parts["cap-model"].value = "arch:llama-3.1-8b"
    dash.parts["cap-chip"].value = "a100"  # the efficiency boxes follow the chip's family
    assert dash.parts["cap-bw-eff"].value == FAMILY_DEFAULTS["ampere"]["bw_efficiency"]
    dash.parts["cap-chip"].value = "h100"
    assert dash.parts["cap-bw-eff"].value == FAMILY_DEFAULTS["hopper"]["bw_efficiency"]
    dash.parts["cap-gpus"].value = 2
    dash.parts["cap-check"].value = 300  # requests per seed's check run (8,000 by default)
    assert dash.parts["cap-replicas"].description == "replicas"  # the declared setting's label
    dash.parts["cap-replicas"].value = 2
    dash.parts["cap-run"].click()
    assert dash.guard.errors == [], dash.guard.errors
    rows = tab.rows
    assert len(rows) >= 5 and all(r["modelled"] and r["replicas"] == 2 for r in rows)
    answer = html.unescape(dash.parts["cap-answer"].value)
    assert "req/s" in answer and "per million" in answer and "(modelled)" in answer
    assert "for 4 GPU(s)" in answer and "-request runs with seeds 0, 1, 2" in answer
    assert "2 replicas of 2 GPU(s) each" in answer
    dash.parts["cap-replicas"].value = 1
    assert "H100" in answer and "tensor parallel 2" in answer  # the assumptions beside it
    chart = dash.parts["cap-chart"]
    assert "modelled" in chart.layout.title.text and len(chart.data) == 2
    # bad input: a message, the last curve stays, the next run works
    dash.parts["cap-replicas"].value = 0
    dash.parts["cap-run"].click()
    assert "replicas must be a whole number >= 1" in html.unescape(message(dash))
    dash.parts["cap-replicas"].value = 1
    dash.parts["cap-gpus"].value = 3
    dash.parts["cap-run"].click()
    assert "does not divide" in html.unescape(message(dash))
    assert tab.rows is rows and len(chart.data) == 2
    dash.parts["cap-model"].value = "arch:llama-3.1-70b"
    dash.parts["cap-gpus"].value = 1
    dash.parts["cap-run"].click()
    assert "needs 141" in html.unescape(message(dash))
    dash.parts["cap-gpus"].value = 4
    dash.parts["cap-run"].click()
    assert tab.rows is not rows and tab.rows[0]["tp"] == 4


def test_capacity_tab_compares_with_a_measured_result(dash, tmp_path):
    from explorer.model.loader import arch_info
    from explorer.serving import Workload
    from explorer.serving.simulate import simulate
    from explorer.serving.simulate.whatif import chip_model

    # a result file of the same setup (here made by the simulator itself: the error must be 0)
    info = arch_info("arch:llama-3.1-8b", "bfloat16")
    model, extra = chip_model(info, "h100", 1)
    wl = Workload(40, "poisson", 10.0, input_len=256, output_len=64)
    path = tmp_path / "measured.json"
    simulate(info, wl, "continuous", model, **extra["knobs"]).save(path)
    dash.parts["cap-model"].value = "arch:llama-3.1-8b"
    dash.parts["cap-chip"].value = "h100"
    dash.parts["cap-gpus"].value = 1
    dash.parts["cap-measured"].value = str(path)
    dash.parts["cap-compare"].click()
    table = dash.parts["cap-comparison"].value
    assert "median_tpot_ms" in table and "+0.0%" in table and "n/a" not in table, table
    dash.parts["cap-measured"].value = str(tmp_path / "missing.json")
    dash.parts["cap-compare"].click()
    assert (
        "missing.json" in html.unescape(message(dash))
        and table == dash.parts["cap-comparison"].value
    )


def test_capacity_tab_shows_the_published_row_of_its_scheduler_and_chip():
    from explorer.app.tabs.capacity import _engines, _published_html

    assert _engines() == ["continuous", "vllm", "vllm-v0", "sglang", "trtllm"]
    shown = re.sub("<[^>]+>", "", html.unescape(_published_html("vllm", "h100")))  # no replay
    assert "published runs of vllm on h100" in shown and "median |error| throughput" in shown
    none = html.unescape(_published_html("continuous", "h100"))
    assert "no published run used the continuous scheduler on h100" in none
