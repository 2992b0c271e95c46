"""Prefix caching (explorer.PrefixCache): a prompt prefix's KV computed once and copied in."""

import pytest
import torch

import explorer
from explorer.costs import shape_of
from explorer.engine.prefix import PrefixCache
from explorer.engine.session import Session
from explorer.serving import Workload, serve

SYSTEM = "You are a helpful assistant for Python. Answer briefly and show code.\n" * 3
QUESTION = "Question: how do I open a file?\nAnswer:"


@pytest.fixture(scope="module")
def pc(target):
    return PrefixCache(target, SYSTEM)


def test_a_session_starts_from_the_prefix_and_feeds_only_the_rest(target, pc):
    greedy = explorer.Sampling(greedy=True)
    cached = Session(target, SYSTEM + QUESTION, greedy, prefix_cache=pc)
    plain = Session(target, SYSTEM + QUESTION, greedy)
    a, b = cached.step(), plain.step()
    assert b.tokens_fed == cached.prompt_len and a.tokens_fed == cached.prompt_len - len(pc)
    assert a.context_len == b.context_len and a.flops < b.flops  # the cost model sees the saving
    assert torch.allclose(cached._last[1], plain._last[1], atol=1e-4)  # next-token logits
    cached.run(6)
    plain.run(6)
    assert cached.tokens == plain.tokens
    assert cached.trace.settings["prefix_cache"]["tokens"] == len(pc)
    assert pc.cache.get_seq_length() == len(pc)  # copied, never grown by a session
    fork = cached.fork()
    cached.rewind(len(cached.steps))  # back before the prefill: the prefix is copied in again
    assert cached.step().tokens_fed == a.tokens_fed and fork.step().tokens_fed == 1
    assert pc.build_s > 0 and pc.bytes > 0 and "tokens" in repr(pc)


def test_a_prompt_equal_to_the_prefix_still_feeds_one_token(target, pc):
    s = Session(target, pc.ids, explorer.Sampling(greedy=True), prefix_cache=pc)
    assert s.step().tokens_fed == 1


def test_batches_of_one_length_share_the_prefix(target, pc):
    rows = [pc.ids + [11, 12], pc.ids + [13, 14]]
    s = Session(target, rows, explorer.Sampling(greedy=True), prefix_cache=pc)
    plain = Session(target, rows, explorer.Sampling(greedy=True))
    assert s.step().tokens_fed == 2
    plain.step()
    assert torch.allclose(s._last[1], plain._last[1], atol=1e-4)


def test_prefix_cache_bad_input_is_refused_with_a_reason(target, draft, pc):
    with pytest.raises(
        ValueError,
        match="does not begin with the cached prefix: its 18 tokens part from the prefix.s 70 at token",
    ):
        Session(target, QUESTION, prefix_cache=pc)
    with pytest.raises(
        ValueError, match="built on bundled:target .* the session runs bundled:draft"
    ):
        Session(draft, SYSTEM + QUESTION, prefix_cache=pc)
    with pytest.raises(ValueError, match="needs use_cache=True"):
        Session(target, SYSTEM + QUESTION, use_cache=False, prefix_cache=pc)
    with pytest.raises(ValueError, match="rows of one length"):
        Session(target, [pc.ids + [1], pc.ids + [1, 2]], prefix_cache=pc)
    with pytest.raises(
        ValueError,
        match="the prefix of 600 tokens and one more needs 601 positions, more than bundled:target's context of 512",
    ):
        PrefixCache(target, [1] * 600)
    done = Session(target, pc.ids + [11, 12], explorer.Sampling(greedy=True))
    done.step()
    copy = PrefixCache.from_session(done, pc.ids)
    assert torch.allclose(copy.cache.layers[0].keys, pc.cache.layers[0].keys, atol=1e-5)
    assert (
        copy.build_s == 0 and copy.head(5).ids == pc.ids[:5] and copy.shared_with(pc.ids[:7]) == 7
    )


def test_sequential_engine_reuses_the_shared_prefix(target):
    wl = Workload(
        num_prompts=4, arrival="burst", input_len=64, output_len=3, shared_prefix_fraction=1.0,
        shared_prefix_len=48, ignore_eos=True,
    )  # fmt: skip
    runs = {on: serve(target, wl, engine="sequential", prefix_caching=on) for on in (False, True)}
    fed = {
        on: [i.prefill_tokens for i in r.iterations if i.prefill_requests] for on, r in runs.items()
    }
    assert fed[False] == [64] * 4
    assert fed[True][0] == 64 and all(n <= 64 - 48 for n in fed[True][1:])
    outs = {on: [rec.output_ids for rec in r.records] for on, r in runs.items()}
    assert outs[True] == outs[False]
    # every engine knob is recorded, off as well as on
    assert (
        runs[True].engine["prefix_caching"] is True
        and runs[False].engine["prefix_caching"] is False
    )
    assert "prefix_reused_tokens" not in runs[False].engine
    assert runs[True].engine["prefix_reused_tokens"] == sum(64 - n for n in fed[True])


def test_prefix_benchmark_and_cli(target, capsys):
    from explorer.cli import main
    from explorer.engine.prefix import prefix_benchmark

    out = prefix_benchmark(target, prefix_tokens=32, repeats=1)
    assert out["prefix_tokens"] == 32 and out["prompt_tokens"] > 32
    assert out["max_abs_logit_diff"] < 1e-4
    # the cached copy holds the prefix's keys and values: exactly what the cost model says 32 take
    assert out["prefix_kv_bytes"] == 32 * shape_of(target.info).kv_bytes_per_token
    assert main(["bench", "prefix", "--prefix-tokens", "16", "--repeats", "1"]) == 0
    assert "max |logit difference|" in capsys.readouterr().out
