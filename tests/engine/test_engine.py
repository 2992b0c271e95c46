"""The step-by-step engine: parity with generate(), cache on/off, rewind / choose / fork, batches, errors."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from explorer import Sampling, Session
from explorer.engine import SessionDone, crop_cache, forward, kv_cache_bytes
from explorer.model.loader import LoadedModel, model_info

PROMPT = "The return statement"


def tiny_lm(
    vocab: int = 512, positions: int = 64, seed: int = 0, eos: int | None = None
) -> LoadedModel:
    """A random 2-layer GQA Llama with no tokenizer (text shows as <id>)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=positions,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=None,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = eos
    return LoadedModel(
        model, None, model_info(model, name="tiny", source="arch", random_weights=True)
    )


@pytest.fixture(scope="module")
def tiny():
    return tiny_lm()


def snapshot(s: Session) -> dict:
    """Everything observable about a session's state (to check an error left it unchanged)."""
    return {
        "tokens": s.tokens,
        "steps": [st.to_dict() for st in s.steps],
        "done": s.done,
        "cache": None if s._cache is None else s._cache.get_seq_length(),
        "sampling": s.sampling.to_dict(),
        "gen": s._gen.get_state().clone(),
    }


def assert_unchanged(s: Session, before: dict) -> None:
    after = snapshot(s)
    gen_b, gen_a = before.pop("gen"), after.pop("gen")
    assert after == before and torch.equal(gen_a, gen_b)
    s.step()  # and it still steps


# --- low-level phases -----------------------------------------------------------------------------


def test_forward_with_cache_equals_whole_sequence(tiny):
    ids = torch.randint(0, 512, (2, 12))
    full, none = forward(tiny.model, ids, None)
    assert none is None and full.dtype == torch.float32 and full.shape == (2, 12, 512)
    cache = DynamicCache()
    a, cache = forward(tiny.model, ids[:, :7], cache)
    b, cache = forward(tiny.model, ids[:, 7:], cache)
    assert torch.allclose(torch.cat([a, b], 1), full, atol=1e-5)
    last, _ = forward(tiny.model, ids, DynamicCache(), last_only=True)
    assert last.shape == (2, 1, 512) and torch.allclose(last[:, 0], full[:, -1], atol=1e-5)


def test_forward_left_padding_gives_the_single_row_logits(tiny):
    ids = torch.randint(0, 512, (1, 9))
    short = ids[:, 4:]
    batch = torch.cat([ids, torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1)])
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    cache = DynamicCache()
    lb, cache = forward(tiny.model, batch, cache, mask)
    alone, _ = forward(tiny.model, short, None)
    assert torch.allclose(lb[1, 4:], alone[0], atol=1e-5)
    nxt = torch.tensor([[5], [5]])
    step_b, _ = forward(
        tiny.model, nxt, cache, torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
    )
    step_a, _ = forward(tiny.model, torch.cat([short, nxt[:1]], 1), None)
    assert torch.allclose(step_b[1, -1], step_a[0, -1], atol=1e-5)
    with pytest.raises(ValueError, match="attention_mask covers"):
        forward(tiny.model, nxt, cache, mask)


def test_kv_cache_bytes_and_crop(tiny):
    assert kv_cache_bytes(None) == 0
    cache = DynamicCache()
    _, cache = forward(tiny.model, torch.randint(0, 512, (3, 10)), cache)
    per_token = tiny.info.kv_bytes_per_token
    assert kv_cache_bytes(cache) == 3 * 10 * per_token
    crop_cache(cache, 4)
    assert cache.get_seq_length() == 4 and kv_cache_bytes(cache) == 3 * 4 * per_token
    with pytest.raises(ValueError, match="cannot crop"):
        crop_cache(cache, 5)
    assert cache.get_seq_length() == 4


def test_kv_cache_bytes_counts_a_quantized_layers_states_beside_its_residual():
    from types import SimpleNamespace as Layer

    plain = Layer(keys=torch.zeros(1, 2, 3, 4), values=torch.zeros(1, 2, 3, 4))  # 96 B each
    quantized = Layer(
        keys=torch.zeros(1, 2, 1, 4),  # the unquantised residual window: 32 B
        values=None,
        _quantized_keys=(torch.zeros(8, dtype=torch.int8), torch.zeros(2)),  # (values, scales)
        _quantized_values=torch.zeros(4, dtype=torch.uint8),  # a backend's packed tensor
    )
    assert kv_cache_bytes(Layer(layers=[plain, quantized])) == 2 * 96 + 32 + (8 + 8) + 4


# --- parity with transformers (bundled target) ----------------------------------------------------


def test_greedy_session_equals_generate_over_64_tokens(target):
    s = Session(
        target, PROMPT, Sampling(greedy=True), max_new_tokens=64, stop_at_eos=False, roofline=False
    )
    steps = s.run()
    inputs = target.tokenizer(PROMPT, return_tensors="pt")
    ref = target.model.generate(**inputs, do_sample=False, max_new_tokens=64, min_new_tokens=64)
    gen = ref[0, inputs["input_ids"].shape[1] :].tolist()
    eos = target.tokenizer.eos_token_id
    # min_new_tokens masks EOS in generate() while the session (stop_at_eos=False) may pick it:
    # the two agree up to the first EOS either side, and may differ after it
    n = min(seq.index(eos) if eos in seq else 64 for seq in (gen, s.tokens))
    assert len(steps) == 64 and s.stop_reason == "max_new_tokens"
    assert s.tokens[:n] == gen[:n] and n >= 16
    assert [st.phase for st in steps[:2]] == ["prefill", "decode"]
    assert steps[0].tokens_fed == inputs["input_ids"].shape[1] and steps[1].tokens_fed == 1
    assert all(st.rank_raw == 0 and st.draw["u"] is None for st in steps)
    assert s.text == target.tokenizer.decode(s.tokens)


def test_session_decodes_with_the_forward_generate_uses():
    """A decode pass gets what generate() gives the model: the same cache class, the last
    position's logits only, the same positions (so bench overhead compares like with like)."""
    lm, seen, arm = tiny_lm(), {"generate": [], "session": []}, ["generate"]
    inner = lm.model.forward

    @functools.wraps(inner)  # generate() and the Session read its signature (logits_to_keep)
    def spy(*args, **kw):
        seen[arm[0]].append(kw)
        return inner(*args, **kw)

    lm.model.forward = spy
    ids = torch.tensor([[1, 2, 3, 4]])
    lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=3,
                      min_new_tokens=3, pad_token_id=0)  # fmt: skip
    arm[0] = "session"
    s = Session(lm, [1, 2, 3, 4], Sampling(greedy=True), max_new_tokens=3, roofline=False)
    s.run()
    g, ours = seen["generate"][-1], seen["session"][-1]
    assert len(seen["generate"]) == len(seen["session"]) == 3
    assert type(ours["cache"]) is type(g["cache"])
    assert ours["logits_to_keep"] == g["logits_to_keep"] == 1
    assert ours["input_ids"].shape == g["input_ids"].shape == (1, 1)
    assert ours["position_ids"].tolist() == g["position_ids"].tolist() == [[5]]
    mask = g.get("attention_mask")  # generate() drops an all-ones mask; the Session sends none
    assert ours["attention_mask"] is None and (mask is None or bool(mask.all()))


def test_cached_and_uncached_logits_agree_at_every_step(target):
    on = Session(
        target, PROMPT, Sampling(greedy=True), max_new_tokens=24, roofline=False, stop_at_eos=False
    )
    off = Session(
        target,
        PROMPT,
        Sampling(greedy=True),
        max_new_tokens=24,
        use_cache=False,
        roofline=False,
        stop_at_eos=False,
    )
    p = len(on.trace.prompt_ids)
    for i in range(24):
        a, b = on.step(), off.step()
        la, lb = on.distribution()["logits"], off.distribution()["logits"]
        assert torch.allclose(la, lb, atol=1e-4), f"step {i}: {(la - lb).abs().max()}"
        assert a.token_id == b.token_id
        assert b.tokens_fed == b.context_len == p + i and b.kv_cache_bytes == 0
        assert a.tokens_fed == (p if i == 0 else 1) and a.context_len == p + i
        assert a.kv_cache_bytes == (p + i) * target.info.kv_bytes_per_token


def test_rewind_then_choose_equals_a_fresh_session_fed_the_same_tokens(target):
    s = Session(target, PROMPT, Sampling(seed=3, top_k=50), roofline=False)
    s.run(10)
    s.rewind(4)
    assert len(s.tokens) == 6 and s._cache.get_seq_length() == len(s.trace.prompt_ids) + 5
    alt = s.steps[-1].top[3]["id"]  # a token the model did not pick
    forced = s.choose(alt)
    assert forced.forced and forced.token_id == alt and forced.draw["u"] is None
    s.step()
    fresh = Session(
        target, s.trace.prompt_ids + s.tokens[:-1], Sampling(seed=3, top_k=50), roofline=False
    )
    fresh.step()
    assert torch.allclose(s.distribution()["logits"], fresh.distribution()["logits"], atol=1e-4)


# --- determinism, rewind, fork, choose --------------------------------------------------------------


def test_same_seed_same_tokens_and_rewind_replays(tiny):
    a = Session(
        tiny, [1, 2, 3], Sampling(seed=42, temperature=1.2), max_new_tokens=20, roofline=False
    )
    b = Session(
        tiny, [1, 2, 3], Sampling(seed=42, temperature=1.2), max_new_tokens=20, roofline=False
    )
    a.run(), b.run()
    assert a.tokens == b.tokens
    c = Session(
        tiny, [1, 2, 3], Sampling(seed=43, temperature=1.2), max_new_tokens=20, roofline=False
    )
    c.run()
    assert c.tokens != a.tokens
    first = a.tokens
    a.rewind(8)
    assert a.tokens == first[:12] and not a.done and a.stop_reason is None
    a.run()
    assert a.tokens == first and a.stop_reason == "max_new_tokens"
    a.rewind(20)  # back to before the prefill
    assert a.tokens == [] and a._cache.get_seq_length() == 0
    assert a.step().phase == "prefill"
    a.run()
    assert a.tokens == first


def test_rewind_crops_the_cache_without_recomputing(tiny, monkeypatch):
    s = Session(tiny, [4, 5, 6, 7], Sampling(seed=1), roofline=False)
    s.run(6)
    calls = []
    original = tiny.model.forward
    monkeypatch.setattr(tiny.model, "forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    s.rewind(3)
    assert calls == [] and s._cache.get_seq_length() == 4 + 3 - 1
    s.step()
    assert len(calls) == 1 and s.steps[-1].tokens_fed == 1 and s.steps[-1].context_len == 7


def test_fork_branches_independently(tiny):
    s = Session(tiny, [9, 8, 7], Sampling(seed=5), max_new_tokens=12, roofline=False)
    s.run(4)
    f = s.fork()
    assert f.tokens == s.tokens and f.steps is not s.steps
    a, b = s.run(), f.run()
    assert s.tokens == f.tokens  # same generator state, same continuation
    assert [x.to_dict() for x in a] != [] and len(a) == len(b)
    g = s.fork()
    g.rewind(3)
    g.choose(0)
    assert len(s.tokens) == 12 and s.done and g.tokens[-1] == 0 and len(g.tokens) == 10
    assert s.steps[-1].stop == "max_new_tokens" and g.steps[-1].forced


def test_choose_records_the_forced_tokens_probabilities(tiny):
    s = Session(tiny, [1, 2], Sampling(top_k=5, seed=0), roofline=False)
    st = s.choose(100)
    dist = s.distribution()
    assert st.forced and st.token_id == 100 and s.tokens == [100]
    assert st.prob_raw == pytest.approx(dist["raw"][100].item(), abs=1e-7)
    assert st.rank_raw == int((dist["raw"] > dist["raw"][100]).sum())
    if st.rank_final >= 5:  # filtered out by top-k: final probability 0, CDF interval empty
        assert st.prob_final == 0 and st.draw["cdf_lo"] == pytest.approx(st.draw["cdf_hi"])


# --- recording --------------------------------------------------------------------------------------


def test_step_records_every_field(tiny):
    s = Session(
        tiny, [3, 1, 4, 1, 5], Sampling(temperature=0.8, top_k=10, top_p=0.9, seed=0), top_n=6
    )
    st = s.step()
    dist = s.distribution()
    assert st.index == 0 and st.phase == "prefill" and st.tokens_fed == 5 and st.context_len == 5
    assert st.token_text == f"<{st.token_id}>" and st.device == "cpu" and st.dtype == "float32"
    assert len(st.top) == 6 and [t["id"] for t in st.top] == dist["raw"].topk(6).indices.tolist()
    assert all(set(t) == {"id", "text", "raw", "final"} for t in st.top)
    assert [d["name"] for d in st.stages] == [
        "repetition_penalty",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
    ]
    assert st.stages[2]["kept"] == 10 and st.stages[3]["kept"] <= 10
    assert st.prob_final == pytest.approx(dist["final"][st.token_id].item(), abs=1e-6)
    assert float(dist["final"].sum()) == pytest.approx(1.0, abs=1e-5)
    assert int((dist["final"] > 0).sum()) == st.stages[-1]["kept"]
    assert st.draw["cdf_lo"] <= st.draw["u"] <= st.draw["cdf_hi"] + 1e-6
    assert 0 < st.entropy_final < st.entropy_raw
    assert st.latency_s > 0 and st.kv_cache_bytes == 5 * tiny.info.kv_bytes_per_token
    assert (
        st.flops > 0
        and set(st.bytes) >= {"kv_write", "weights/mlp"}
        and st.bound in ("memory", "compute")
    )
    assert st.achieved_gbps > 0 and st.bound_s > 0 and s.trace.hardware["bandwidth_gbps"] > 0
    assert s.step().kv_cache_bytes == 6 * tiny.info.kv_bytes_per_token


def test_roofline_false_skips_the_peaks_but_keeps_the_model(tiny):
    st = Session(tiny, [1], roofline=False).step()
    assert (
        st.flops > 0
        and st.bytes
        and st.bound is None
        and st.bound_s is None
        and st.pct_of_peak_bw is None
    )


def test_step_json_stays_small_for_a_150k_vocabulary():
    big = tiny_lm(vocab=151_936, positions=32)
    s = Session(big, [10, 20, 30], Sampling(top_p=0.9, seed=0), top_n=20, roofline=False)
    for st in s.run(3):
        size = len(json.dumps(st.to_dict()))
        assert size < 4096, size
    assert s.distribution()["raw"].shape == (151_936,)


def test_set_sampling_mid_run_is_recorded_and_validated(tiny):
    s = Session(tiny, [1, 2, 3], Sampling(seed=0), roofline=False)
    s.step()
    bad = Sampling(seed=0)
    bad.top_p = 0.0  # made invalid after construction
    before = snapshot(s)
    with pytest.raises(ValueError, match="top_p"):
        s.set_sampling(bad)
    assert_unchanged(s, before)
    s.set_sampling(Sampling(seed=0, top_k=3))
    st = s.step()
    assert st.sampling["top_k"] == 3 and s.steps[0].sampling is None and st.stages[2]["kept"] == 3


# --- batches ----------------------------------------------------------------------------------------


def test_batch_rows_equal_single_prompt_runs(tiny):
    prompts = [[5, 6, 7, 8, 9], [11, 12], [13, 14, 15]]
    batch = Session(tiny, prompts, Sampling(greedy=True), max_new_tokens=8, roofline=False)
    batch.run()
    assert batch.batch_size == 3 and batch.steps[0].row_tokens is not None
    assert [st.row_tokens for st in batch.steps] == [list(col) for col in zip(*batch.row_tokens)]
    for r, p in enumerate(prompts):
        single = Session(tiny, p, Sampling(greedy=True), max_new_tokens=8, roofline=False)
        single.run()
        assert batch.row_tokens[r] == single.tokens
        assert torch.allclose(
            batch.distribution(row=r)["logits"], single.distribution()["logits"], atol=1e-4
        )
    assert batch.steps[-1].kv_cache_bytes == 3 * (5 + 7) * tiny.info.kv_bytes_per_token


def test_batch_size_copies_one_prompt_and_samples_rows_independently(tiny):
    s = Session(tiny, [1, 2, 3], Sampling(seed=0), batch_size=4, max_new_tokens=10, roofline=False)
    s.run()
    rows = s.row_tokens
    assert len(rows) == 4 and len({tuple(r) for r in rows}) > 1
    assert s.tokens == rows[0]


def test_batch_stops_when_every_row_has_produced_eos():
    lm = tiny_lm(seed=2)
    probe = Session(
        lm, [[1, 2], [3, 4, 5]], Sampling(greedy=True), max_new_tokens=6, roofline=False
    )
    probe.run()
    eos = probe.row_tokens[1][2]
    lm.model.generation_config.eos_token_id = eos
    s = Session(lm, [[1, 2], [3, 4, 5]], Sampling(greedy=True), max_new_tokens=6, roofline=False)
    s.run()
    row1 = s.row_tokens[1]
    assert row1[row1.index(eos)] == eos
    if eos in s.row_tokens[0]:
        assert s.stop_reason == "eos"
    else:
        assert s.stop_reason == "max_new_tokens" and all(
            t == s._pad for t in row1[row1.index(eos) + 1 :]
        )


# --- stopping ---------------------------------------------------------------------------------------


def test_eos_stops_with_its_reason():
    lm = tiny_lm(seed=1)
    first = Session(lm, [7, 7, 7], Sampling(greedy=True), roofline=False).step().token_id
    lm.model.generation_config.eos_token_id = first
    s = Session(lm, [7, 7, 7], Sampling(greedy=True), max_new_tokens=30, roofline=False)
    steps = s.run()
    assert (
        len(steps) == 1
        and s.done
        and s.stop_reason == "eos" == steps[0].stop == s.trace.stop_reason
    )
    with pytest.raises(SessionDone, match="eos"):
        s.step()
    assert s.run(5) == [] and list(s) == []
    s.rewind(1)
    assert not s.done
    other = s.choose((first + 1) % 512)  # a counterfactual branch past the EOS
    assert other.stop is None and not s.done


def test_max_positions_stops_and_run_n(tiny):
    small = tiny_lm(positions=8)
    s = Session(small, [1, 2, 3, 4, 5], Sampling(seed=0), roofline=False)
    assert len(s.run(2)) == 2 and not s.done
    steps = list(s)
    assert s.stop_reason == "max_positions" and steps[-1].context_len == 8 and len(s.tokens) == 4
    off = Session(small, [1, 2, 3, 4, 5], Sampling(seed=0), use_cache=False, roofline=False)
    off.run()
    assert off.tokens == s.tokens and off.steps[-1].tokens_fed == 8


def test_iteration_steps_until_max_new_tokens(tiny):
    s = Session(tiny, [1], max_new_tokens=5, roofline=False)
    assert [st.index for st in s] == [0, 1, 2, 3, 4] and s.stop_reason == "max_new_tokens"


# --- bad input --------------------------------------------------------------------------------------


def test_empty_prompt_uses_bos_when_the_tokenizer_has_one(target):
    s = Session(target, "", Sampling(greedy=True), roofline=False)
    assert s.trace.prompt_ids == [target.tokenizer.bos_token_id]
    assert s.step().tokens_fed == 1


def test_empty_prompt_without_bos_is_a_clear_error(tiny):
    with pytest.raises(ValueError, match="empty"):
        Session(tiny, [])
    with pytest.raises(ValueError, match="no tokenizer"):
        Session(tiny, "hello")


def test_prompt_longer_than_the_model_names_both_lengths():
    small = tiny_lm(positions=8)
    with pytest.raises(
        ValueError, match=r"12 tokens needs 12 positions, more than .*context of 8 positions"
    ):
        Session(small, list(range(12)))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"top_n": -1}, "top_n"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"batch_size": 0}, "batch_size"),
        ({"sampling": "greedy"}, "sampling"),
        ({"top_n": 2.5}, "top_n"),
    ],
)
def test_invalid_session_arguments(tiny, kwargs, words):
    with pytest.raises(ValueError, match=words):
        Session(tiny, [1, 2], **kwargs)


@pytest.mark.parametrize("prompt", [[1, 600], [-1], [[1, 2], [3, 999]], 5, [1.5], None])
def test_invalid_prompts(tiny, prompt):
    with pytest.raises(ValueError, match="prompt"):
        Session(tiny, prompt)


@pytest.mark.parametrize("bad", [512, -1, 10**9, 2.0, True, [1, 2]])
def test_choose_outside_the_vocabulary_leaves_the_session_unchanged(tiny, bad):
    s = Session(tiny, [1, 2, 3], Sampling(seed=0), roofline=False)
    s.run(2)
    before = snapshot(s)
    with pytest.raises(ValueError, match="vocabulary|ids for a batch"):
        s.choose(bad)
    assert_unchanged(s, before)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.rewind(5),
        lambda s: s.rewind(-1),
        lambda s: s.run(-2),
        lambda s: s.distribution(row=3),
    ],
)
def test_bad_calls_leave_the_session_unchanged(tiny, call):
    s = Session(tiny, [1, 2, 3], Sampling(seed=0), roofline=False)
    s.run(3)
    before = snapshot(s)
    with pytest.raises(ValueError):
        call(s)
    assert_unchanged(s, before)


def test_a_failing_forward_leaves_the_session_unchanged(tiny, monkeypatch):
    s = Session(tiny, [1, 2, 3], Sampling(seed=0), roofline=False)
    s.run(2)
    before = snapshot(s)
    original = tiny.model.model.layers[1].forward

    def boom(*a, **k):
        raise RuntimeError("simulated out of memory")

    monkeypatch.setattr(tiny.model.model.layers[1], "forward", boom)
    with pytest.raises(RuntimeError, match="simulated"):
        s.step()
    monkeypatch.setattr(tiny.model.model.layers[1], "forward", original)
    assert_unchanged(s, before)


def test_distribution_before_any_step_and_after_rewind_is_explained(tiny):
    s = Session(tiny, [1, 2], roofline=False)
    with pytest.raises(ValueError, match="step"):
        s.distribution()
    s.run(2)
    s.rewind(1)
    with pytest.raises(ValueError, match="rewind"):
        s.distribution()


# --- benchmark and CLI ------------------------------------------------------------------------------


def test_overhead_benchmark_reports_both_estimates_and_the_ratio(tiny):
    from explorer.bench import overhead
    from explorer.costs import noise

    # a fake wall clock: 2 ms per generate() call, 3 ms per Session, in ABBA order; the
    # process had the CPU the whole time (its fake CPU clock moves with the wall clock)
    ticks = iter([0, 0.002, 0.002, 0.005, 0.005, 0.008, 0.008, 0.010])
    now = {"t": 0.0}

    def wall():
        now["t"] = next(ticks)
        return now["t"]

    threads = min(torch.get_num_threads(), noise.usable_cores())  # every one of them busy
    clocks = noise.Clocks(wall=wall, cpu=lambda: now["t"] * threads, load=lambda: 1.0)
    out = overhead.overhead_benchmark(tiny, [1, 2, 3, 4], new_tokens=6, repeats=2, clocks=clocks)
    assert out["generate"]["repeats"] == out["session"]["repeats"] == 2
    assert out["generate"]["estimate_s"] == pytest.approx(0.002)
    assert out["session"]["estimate_s"] == pytest.approx(0.003)
    assert out["generate"]["median_s"] == pytest.approx(0.002) and out["generate"]["load"] == 1.0
    assert out["ratio"] == pytest.approx(1.5)  # session / generate, not the other way round
    assert out["per_token_ms"] == pytest.approx({"generate": 2 / 6, "session": 3 / 6})
    assert out["same_tokens"] is True and out["new_tokens"] == 6 and out["session_forward_ms"] > 0
    assert out["noisy"] is False and out["session"]["cpu_share"] == pytest.approx(1.0)
    assert out["cpu_ratio"] == pytest.approx(1.5)  # the fake CPU clock moved with the wall
    assert out["recording_share"] is not None
    # the recording part of a step timed in place (real clocks): positive times, a share below one
    assert out["recording_ms"] > 0 and out["forward_ms"] > 0
    assert out["recording_step_share"] == pytest.approx(
        out["recording_ms"] / (out["recording_ms"] + out["forward_ms"])
    )
    assert 0 < out["recording_step_share"] < 1


def test_cli_generate_table_and_json(target, capsys):
    from explorer.cli import main

    assert (
        main(["generate", "--prompt", PROMPT, "--max-new-tokens", "5", "--greedy", "--no-roofline"])
        == 0
    )
    table = capsys.readouterr().out
    assert "prefill" in table and "latency ms" in table and "stop: max_new_tokens" in table
    assert len([line for line in table.splitlines() if line.strip()[:1].isdigit()]) == 5
    assert (
        main(
            [
                "generate",
                "--prompt",
                PROMPT,
                "--max-new-tokens",
                "4",
                "--seed",
                "1",
                "--top-k",
                "5",
                "--no-cache",
                "--top-n",
                "3",
                "--json",
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert {"prompt", "settings", "model", "steps"} <= set(d) and len(d["steps"]) == 4
    assert (
        d["settings"]["use_cache"] is False
        and d["settings"]["top_k"] == 5
        and len(d["steps"][0]["top"]) == 3
    )
    assert d["steps"][0]["flops"] > 0 and d["steps"][0]["bound"] in ("memory", "compute")


def test_cli_bad_settings_are_one_clear_line(capsys):
    from explorer.cli import main

    assert main(["generate", "--prompt", "x", "--top-p", "0"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("explorer: top_p must be a number > 0 and <= 1, got 0.0")
        and len(err.strip().splitlines()) == 1
    )


def test_cli_bench_overhead_json(capsys):
    from explorer.cli import main

    threads = torch.get_num_threads()
    try:
        assert (
            main(
                [
                    "bench",
                    "overhead",
                    "--model",
                    "bundled:draft",
                    "--new-tokens",
                    "4",
                    "--repeats",
                    "1",
                    "--threads",
                    "1",
                    "--json",
                ]
            )
            == 0
        )
    finally:
        torch.set_num_threads(threads)
    d = json.loads(capsys.readouterr().out)
    assert (
        d["same_tokens"] is True
        and d["new_tokens"] == 4
        and d["model"] == "bundled:draft"
        and d["threads"] == 1
    )
    assert main(["bench", "overhead", "--threads", "0"]) == 2
