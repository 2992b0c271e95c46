"""The Speculative tab: rounds, the k benchmark, prompt lookup.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import pytest
from app_helpers import message, tiny_llama, trace_of

from explorer.app import Dashboard
from explorer.model.loader import model_info


def _speculative_dashboard(tiny, tiny_draft, k: int):
    """A dashboard over `tiny` whose Speculative tab drafts with `tiny_draft`, k tokens per round."""
    d = Dashboard(lm=tiny, prompt="abcd", measure_peaks=False, max_new_tokens=None)
    d.models.add(tiny_draft)
    draft = d.parts["spec-draft"]
    draft.options = [*draft.options, "tiny-draft"]
    draft.value = "tiny-draft"
    d.parts["spec-k"].value = k
    return d, d.tab("speculative")


def test_speculative_rounds_fill_the_charts(tiny, tiny_draft):
    d, spec = _speculative_dashboard(tiny, tiny_draft, k=3)
    d.parts["spec-step"].click()
    d.parts["spec-step"].click()
    rounds = spec.session.rounds
    assert len(rounds) == 2
    cells = sum(len(t.x) for t in d.parts["spec-rounds"].data if t.x is not None)
    assert cells == sum(len(r.drafts) + 1 for r in rounds)  # every draft plus the target's token
    assert sum(d.parts["spec-hist"].data[0].y) == 2
    alpha = trace_of(d.parts["spec-alpha"], "running alpha (accepted / tested)").y[-1]
    assert alpha == pytest.approx(spec.session.stats()["alpha"])
    assert "2 rounds" in d.parts["spec-status"].value
    assert d.guard.errors == [], d.guard.errors
    d.parts["spec-k"].value = 0
    d.parts["spec-step"].click()
    assert "k (draft tokens per round)" in message(d) and len(spec.session.rounds) == 2


def test_speculative_benchmark_runs_in_the_background(tiny, tiny_draft):
    d, spec = _speculative_dashboard(tiny, tiny_draft, k=2)
    d.parts["spec-bench"].click()
    assert d.parts["step"].disabled  # conflicting controls are off while it runs
    d.wait(120)
    assert d.parts["spec-progress"].value == 2
    measured = trace_of(d.parts["spec-speedup"], "measured (forward passes)")
    assert list(measured.x) == [1, 2] and all(v > 0 for v in measured.y)
    assert "Benchmark done" in message(d) and not d.parts["step"].disabled
    assert d.guard.errors == [], d.guard.errors


def test_speculative_pair_mismatch_is_a_message(tiny):
    d = Dashboard(lm=tiny, prompt="abcd", measure_peaks=False)
    other = tiny_llama("other", seed=2)
    other.model.resize_token_embeddings(600)
    other.info = model_info(other.model, name="other", source="local", random_weights=True)
    d.models.add(other)
    d.parts["spec-draft"].options = [*d.parts["spec-draft"].options, "other"]
    d.parts["spec-draft"].value = "other"
    d.parts["spec-step"].click()
    assert "cannot pair" in message(d) and d.tab("speculative").session is None


def test_speculative_tab_drafts_by_prompt_lookup(tiny):
    from explorer.app.tabs.speculative import PROMPT_LOOKUP

    d = Dashboard(lm=tiny, prompt="5 6 7 8 5 6 7", measure_peaks=False, max_new_tokens=None)
    spec = d.tab("speculative")
    assert PROMPT_LOOKUP in d.parts["spec-draft"].options
    d.parts["spec-draft"].value = PROMPT_LOOKUP
    d.parts["spec-k"].value = 2
    d.parts["spec-step"].click()
    first = spec.session.rounds[0]
    assert first.lookup == {"n": 3, "from": 3, "to": 5} and first.k == 2  # "5 6 7" seen: 8, 5
    assert (
        first.draft_passes == []
        and "copied 2 ids from positions 3..4" in d.parts["spec-status"].value
    )
    d.parts["spec-bench"].click()
    assert "prompt lookup has none" in message(d) and d.guard.busy is None
    d.parts["spec-step"].click()
    assert len(spec.session.rounds) == 2 and len(d.guard.errors) == 1  # the refusal only
