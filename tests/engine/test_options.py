"""The ladder's engine options: static cache, int8 / float weights, compile fallback, bad input."""

import pytest
import torch

from explorer import Sampling, Session
from explorer.costs.parts import parameter_bytes
from explorer.model.loader import with_weights
from explorer.model.quant import WeightsNotSupportedError

PROMPT = "The cat sat on the"


def _greedy(lm, **kw):
    s = Session(lm, PROMPT, Sampling(greedy=True), max_new_tokens=12, stop_at_eos=False, **kw)
    s.run()
    return s


def test_static_cache_equals_dynamic_and_keeps_rewind_and_fork(target):
    base, static = _greedy(target), _greedy(target, cache="static")
    assert static.tokens == base.tokens
    assert static.steps[-1].cache_type == "static" and base.steps[-1].cache_type == "dynamic"
    assert static.trace.settings["cache_len"] == static.prompt_len + 12
    static.rewind(4)
    other = static.fork()
    static.run()
    other.run()
    assert static.tokens == base.tokens == other.tokens


def test_static_cache_too_short_names_both_lengths(target):
    with pytest.raises(ValueError, match=r"holds 10 positions but the run needs \d+"):
        Session(target, PROMPT, max_new_tokens=50, cache="static", cache_len=10)
    with pytest.raises(ValueError, match="use_cache=True"):
        Session(target, PROMPT, use_cache=False, cache="static")


def test_int8_weights_bytes_are_real_and_about_a_quarter(target):
    q = with_weights(target, "int8")
    assert q is with_weights(target, "int8")  # converted once, cached
    assert q.info.weights == "int8:fbgemm" and q.info.dtype == "float32"
    assert sum(parameter_bytes(q.info).values()) == q.info.weight_bytes  # modelled = real tensors
    fp, i8 = parameter_bytes(target.info), parameter_bytes(q.info)
    for part in ("weights/attention", "weights/mlp"):
        assert 0.25 <= i8[part] / fp[part] < 0.28  # 1 byte + per-row scale and zero point
    s = _greedy(target, weights="int8")
    w = lambda st: sum(v for k, v in st.bytes.items() if k in ("weights/attention", "weights/mlp"))  # noqa: E731
    assert s.steps[-1].weights == "int8:fbgemm"
    assert 0.25 <= w(s.steps[-1]) / w(_greedy(target).steps[-1]) < 0.28
    assert target.info.weights == "fp32"  # the original is untouched


def test_bad_weights_are_named(target):
    with pytest.raises(ValueError, match="unknown weights"):
        with_weights(target, "int3")
    with pytest.raises(WeightsNotSupportedError, match="int4"):
        with_weights(target, "int4")


def test_bf16_weights_run(target):
    s = _greedy(target, weights="bf16")
    assert s.lm.info.dtype == "bfloat16" and s.steps[-1].weights == "bf16"
    assert sum(parameter_bytes(s.lm.info).values()) == target.info.weight_bytes // 2


def test_compile_failure_falls_back_to_eager_and_says_so(target, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(torch, "compile", broken)
    target.model.__dict__.pop("_explorer_compiled", None)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        s = _greedy(target, cache="static", compile=True)
    assert s.trace.settings["compile"]["active"] is False
    assert "no C compiler" in s.trace.settings["compile"]["reason"]
    assert all(st.compiled is False for st in s.steps)
    assert s.tokens == _greedy(target).tokens


def test_compiled_decode_equals_eager_without_recompiles_and_a_copy_compiles_its_own(draft):
    # the one test that really compiles (the small draft model; a few seconds each)
    eager = _greedy(draft, cache="static")
    comp = _greedy(draft, cache="static", compile=True)
    c = comp.trace.settings["compile"]
    assert c["active"] and c["compile_s"] > 0 and c["graphs_at_warmup"] >= 1
    assert comp.tokens == eager.tokens
    assert [st.recompiles for st in comp.steps[1:]] == [0] * (len(comp.steps) - 1)
    assert comp.steps[0].compiled is False and all(st.compiled for st in comp.steps[1:])
    # an int8 copy carries the fp32 model's __dict__: it must compile its own forward, else the
    # compiled steps would run the fp32 weights
    q = with_weights(draft, "int8")
    q_eager, q_comp = _greedy(q, cache="static"), _greedy(q, cache="static", compile=True)
    assert q_comp.trace.settings["compile"]["compile_s"] > 0
    assert q.model._explorer_compiled["owner"] == id(q.model)
    assert q_comp.tokens == q_eager.tokens
