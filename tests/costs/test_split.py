"""The speed-of-light split (explorer.costs.split) of recorded steps."""

import math

import pytest

import explorer
from explorer.costs import split as split_mod
from explorer.costs.hardware import Peaks
from explorer.engine.trace import Trace
from explorer.inside.hooks import hook_count, hooked
from explorer.model.layout import LayoutError, layout


@pytest.fixture(scope="module")
def session(target):
    s = explorer.Session(target, "The return statement", explorer.Sampling(greedy=True))
    s.run(4)
    return s


def test_split_adds_up_and_utilisations_stay_below_one(session):
    for st in session.steps:
        stack = split_mod.split_step(st, Peaks(**session.trace.hardware))["stack"]
        assert math.isclose(sum(stack.values()), st.latency_s, rel_tol=1e-12)
        assert st.bound_s + st.overhead_s == pytest.approx(st.latency_s, rel=1e-12)
        assert 0 < st.mbu <= 1 and 0 < st.mfu <= 1
        assert set(st.floors) == {"weights", "kv_read", "kv_write", "activations", "compute"}
        assert st.regime in {"memory", "compute", "overhead"}


def test_bundled_decode_is_overhead_bound(session):
    decode = [s for s in session.steps if s.phase == "decode"]
    print({s.index: (s.latency_s, s.bound_s, s.mbu) for s in decode})
    assert decode and all(s.regime == "overhead" for s in decode)


def test_split_of_a_saved_trace_needs_no_model(session):
    trace = Trace.from_json(session.trace.to_json())
    for st in trace.steps:
        st.regime = st.overhead_s = None
    rows = split_mod.split_trace(trace)
    assert [r["regime"] for r in rows] == [s.regime for s in session.steps]
    trace.hardware = None
    with pytest.raises(ValueError, match="no measured peaks"):
        split_mod.split_trace(trace)


def test_replay_why_splits_an_older_file_and_says_what_needs_the_model(session, tmp_path, capsys):
    import json

    from explorer.cli import main

    trace = Trace.from_json(session.trace.to_json())
    for st in trace.steps:  # as a file saved before the split existed
        st.regime = st.overhead_s = st.mbu = st.mfu = st.floors = None
    path = tmp_path / "old.json"
    trace.save(path)
    assert main(["replay", str(path), "--why", "--json"]) == 0
    why = json.loads(capsys.readouterr().out)["why"]
    # the bundled model: every decode step overhead-bound; the prefill's regime reads the measured
    # peaks, and a machine busy while they were measured has turned it compute-bound
    regimes = why["regimes"]
    assert sum(regimes.values()) == len(session.steps) and set(regimes) <= {"overhead", "compute"}
    assert regimes["overhead"] >= len(session.steps) - 1 and regimes.get("compute", 0) <= 1
    assert "load bundled:target" in why["needs_model"] and why["overhead_floor_s"] > 0
    assert main(["replay", str(path), "--why"]) == 0
    text = capsys.readouterr().out
    assert text.count(" overhead\n") == regimes["overhead"] and "MBU" in text
    assert "replay a step on the model itself" in text


def test_regime_rule():
    assert split_mod.regime(1.0, 1.5, "memory") == "overhead"
    assert split_mod.regime(1.0, 0.5, "memory") == "memory"
    assert split_mod.regime(1.0, 0.5, "compute") == "compute"


def test_layout_and_hooks_leave_nothing_behind(session):
    model = session.lm.model
    lay = layout(model)
    assert len(lay.layers) == model.config.num_hidden_layers
    assert all(len(layer.projections) == 4 for layer in lay.layers)  # q, k, v, o
    seen = []
    with hooked({lay.lm_head: (None, lambda m, a, o: seen.append(o.shape))}):
        assert hook_count(model) == 1
        session.fork().step()
    assert seen and hook_count(model) == 0
    import torch

    with pytest.raises(LayoutError, match="no ModuleList"):
        layout(torch.nn.Linear(2, 2))
