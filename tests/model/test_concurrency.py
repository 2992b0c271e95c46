"""One loaded model shared by several users at once: no pass sees another's state.

A serving run and a Session on one model, the lens and attention while another Session steps,
rewind racing step: each ends with the answers it would give alone (explorer.model.sharing).
"""

from __future__ import annotations

import threading

import pytest

from explorer import Sampling, Session
from explorer.engine.session import SessionBusy
from explorer.model.sharing import exclusive_run, model_lock

PROMPT = "The cat sat on the"


def _greedy(lm, n: int = 8) -> Session:
    return Session(lm, PROMPT, Sampling(greedy=True), max_new_tokens=n, stop_at_eos=False)


@pytest.fixture(scope="module")
def reference(target):
    s = _greedy(target)
    s.run()
    return s.tokens


def _in_thread(fn) -> tuple[threading.Thread, list]:
    """Run fn on a thread; any exception it raises is kept in the returned list."""
    errors: list[BaseException] = []

    def body():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, errors


def test_a_serving_run_and_a_session_share_one_model(target, reference):
    from explorer.serving import Workload, serve

    causal_before = getattr(target.model.config, "is_causal", None)
    served, outputs = threading.Event(), []

    def sessions_until_served():  # Sessions step the model for as long as the run lasts
        while not served.is_set() or not outputs:
            s = _greedy(target)
            s.run()
            outputs.append(s.tokens)

    wl = Workload(num_prompts=6, input_len=12, output_len=12, seed=1)
    stepper, errors = _in_thread(sessions_until_served)
    try:
        res = serve(target, wl, engine="continuous")
    finally:
        served.set()
        stepper.join(120)
    assert not errors, errors
    assert res.meta["status"] == "complete"
    assert all(tokens == reference for tokens in outputs)
    assert getattr(target.model.config, "is_causal", None) == causal_before
    after = _greedy(target)
    after.run()
    assert after.tokens == reference  # the model is left as it was


def test_exclusive_run_restores_is_causal(target):
    config = target.model.config
    before = getattr(config, "is_causal", None)
    with exclusive_run(target.model):
        config.is_causal = not before  # what transformers' wrapper leaves behind in a race
    assert getattr(config, "is_causal", None) == before


def test_lens_and_attention_see_only_their_own_pass(target):
    looked = _greedy(target)
    looked.run(3)
    lens_alone, attention_alone = looked.logit_lens(), looked.attention()
    other = _greedy(target, n=400)
    stop = threading.Event()

    def step_other():
        while not stop.is_set() and not other.done:
            other.step()

    stepper, errors = _in_thread(step_other)
    try:
        while len(other.steps) < 2:  # the other session is stepping
            stepper.join(0.01)
            assert stepper.is_alive() or other.done, errors
        for _ in range(3):
            assert looked.logit_lens() == lens_alone
            assert looked.attention() == attention_alone
    finally:
        stop.set()
        stepper.join(60)
    assert not errors, errors
    assert len(other.steps) >= 2


def test_rewind_racing_step_keeps_cache_and_ids_consistent(target, reference):
    s = _greedy(target, n=len(reference))
    stop = threading.Event()

    def step_loop():
        while not stop.is_set():
            try:
                if not s.done:
                    s.step()
            except SessionBusy:  # a rewind holds the session: refused, nothing changed
                continue

    def rewind_loop():
        while not stop.is_set():
            if s.steps:
                s.rewind(1)

    a, errors_a = _in_thread(step_loop)
    b, errors_b = _in_thread(rewind_loop)
    rewound = 0
    while rewound < 20 and a.is_alive() and b.is_alive():
        b.join(0.01)
        rewound += 1
    stop.set()
    a.join(60)
    b.join(60)
    assert not errors_a + errors_b, errors_a + errors_b
    n = len(s.steps)
    assert s._ids.shape[1] == s.prompt_len + n
    if n:
        assert s._cache.get_seq_length() == s.prompt_len + n - 1
    assert s.tokens == reference[:n]
    s.run()
    assert s.tokens == reference


def test_the_model_lock_is_one_per_model(target, draft):
    assert model_lock(target.model) is model_lock(target.model)
    assert model_lock(target.model) is not model_lock(draft.model)
