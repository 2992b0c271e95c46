"""The broken-vs-fixed charts of a failure scenario, from hand-made ServingResults (no model)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from explorer import plots
from explorer.serving import ServingResult
from explorer.serving.engines import Iteration
from explorer.serving.metrics import RequestRecord


def _record(i: int, sent: float, start: float, tokens: list[float]) -> RequestRecord:
    return RequestRecord(
        f"r{i}", 8, len(tokens), sent, sent, start, tokens, tokens[-1], len(tokens)
    )


def _run(label: str, preempt_at: set[int], *, iterations: bool = True, **meta) -> ServingResult:
    recs = [_record(i, 0.1 * i, 0.1 * i + 0.05 * i, [1 + i, 1.2 + i, 1.5 + i]) for i in range(4)]
    its = [
        Iteration(k, 0.1 * k, 0.1 * k + 0.1, 2, 1, 9, 11, waiting=4 - k // 2,
                  kv_blocks_used=3 + k % 3, kv_blocks_total=6, preempted=2 if k in preempt_at else 0)
        for k in range(8)
    ]  # fmt: skip
    return ServingResult(
        {"engine": "continuous"}, {}, recs, its if iterations else [], {}, {"label": label, **meta}
    )


def test_broken_and_fixed_share_the_charts_with_preemptions_marked_and_the_verdict_in_the_title():
    broken, fixed = _run("few blocks", {2, 5}), _run("many blocks", set())
    scen = SimpleNamespace(
        broken=broken, fixed=fixed, verdict="4 preemptions", scenario="kv-exhaustion"
    )
    fig = plots.scenario_figure(scen)
    assert "kv-exhaustion" in fig.layout.title.text and "4 preemptions" in fig.layout.title.text
    by_name = {t.name: t for t in fig.data}
    assert "broken: preemption (4)" in by_name and not any(
        "fixed: preemption" in n for n in by_name
    )
    marks = by_name["broken: preemption (4)"]
    assert np.allclose(marks.x, [0.3, 0.6]) and list(marks.customdata) == [2, 2]
    runs = [t for t in fig.data if t.name == "broken: few blocks (measured)"]
    assert [t.yaxis for t in runs] == ["y", "y2", "y3", "y4"]  # queue, KV, TTFT, ITL
    queue, kv, ttft, itl = runs
    assert list(queue.y) == [4, 4, 3, 3, 2, 2, 1, 1] and list(kv.y) == [3, 4, 5, 3, 4, 5, 3, 4]
    # TTFT at each arrival, ms; ITL at each token after the first
    assert np.allclose(ttft.x, [0, 0.1, 0.2, 0.3]) and np.allclose(ttft.y, [1000, 1900, 2800, 3700])
    assert len(itl.x) == 8 and np.allclose(sorted(set(np.round(itl.y))), [200, 300])
    assert sum(t.showlegend is not False for t in fig.data if t.legendgroup == "fixed") == 1


def test_a_run_without_iterations_has_its_queue_from_the_records_and_says_it_has_no_kv_record():
    res = _run("static", set(), iterations=False, partial=True, modelled=True)
    t, q = plots.queue_from_records(res)
    # arrivals at 0, .1, .2, .3; starts at 0, .15, .3, .45: one waits at a time, never fewer than none
    assert np.allclose(t, [0.1, 0.15, 0.2, 0.3, 0.3, 0.45]) and list(q) == [1, 0, 1, 0, 1, 0]
    fig = plots.scenario_figure(res, res, verdict="v")
    names = {t.name for t in fig.data}
    assert "broken: static (modelled, partial)" in names
    assert any("no KV-cache record" in a.text for a in fig.layout.annotations)
