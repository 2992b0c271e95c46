"""The sampling chain: settings validation, every stage against transformers' own processors, the draw."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from explorer.engine import sampling as S
from explorer.engine.sampling import Sampling

V = 200


def tied_logits(batch: int = 4, seed: int = 0) -> torch.Tensor:
    """Random logits rounded to 0.5, so many values tie (including at the top-k and top-p cuts)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, V, generator=g) * 3).mul(2).round().div(2)  # [B, V]


def context(batch: int = 4, length: int = 30, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V // 4, (batch, length), generator=g)  # repeats guaranteed


# --- settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("temperature", -0.5, "temperature"),
        ("temperature", float("nan"), "temperature"),
        ("temperature", "hot", "temperature"),
        ("top_k", -1, "top_k"),
        ("top_k", 2.5, "top_k"),
        ("top_k", True, "top_k"),
        ("top_p", 0.0, "top_p"),
        ("top_p", 1.5, "top_p"),
        ("min_p", 1.0, "min_p"),
        ("min_p", -0.1, "min_p"),
        ("repetition_penalty", 0.0, "repetition_penalty"),
        ("repetition_penalty", -2.0, "repetition_penalty"),
        ("seed", -3, "seed"),
        ("seed", 1.5, "seed"),
        ("greedy", 1, "greedy"),
    ],
)
def test_invalid_settings_raise_a_readable_value_error(field, value, words):
    with pytest.raises(ValueError, match=words) as err:
        Sampling(**{field: value})
    assert repr(value) in str(err.value) or str(value) in str(err.value)


def test_defaults_are_plain_sampling_and_greedy_modes():
    s = Sampling()
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty) == (
        1.0,
        0,
        1.0,
        0.0,
        1.0,
    )
    assert not s.is_greedy
    assert Sampling(temperature=0).is_greedy and Sampling(greedy=True).is_greedy
    assert Sampling(top_k=5, seed=3).to_dict()["top_k"] == 5
    assert "top_k=50" in S.__doc__  # the docs say how generate()'s hidden default differs


# --- every stage equals transformers' processor -------------------------------------------------


@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(penalty):
    logits, ids = tied_logits(), context()
    ours = S.repetition_penalty(logits, ids, penalty)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
    assert torch.equal(ours, theirs)
    if penalty != 1.0:
        assert not torch.equal(ours, logits)


def test_repetition_penalty_ignores_left_padding():
    logits, ids = tied_logits(batch=2), context(batch=2, length=12)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    padded = ids.clone()
    padded[1, :5] = V - 1  # a pad id that does not occur in the real tokens
    ours = S.repetition_penalty(logits, padded, 1.7, mask)
    for row, real in ((0, ids[0:1]), (1, ids[1:2, 5:])):
        theirs = RepetitionPenaltyLogitsProcessor(1.7)(real, logits[row : row + 1].clone())
        assert torch.equal(ours[row : row + 1], theirs)


@pytest.mark.parametrize("t", [0.3, 0.7, 1.0, 1.5, 4.0])
def test_temperature_matches_transformers(t):
    logits = tied_logits()
    assert torch.equal(S.temperature(logits, t), TemperatureLogitsWarper(t)(None, logits.clone()))


@pytest.mark.parametrize("k", [1, 2, 5, 17, 50, V - 1, V, V + 10])
def test_top_k_matches_transformers_and_keeps_ties(k):
    logits = tied_logits()
    ours = S.top_k(logits, k)
    assert torch.equal(ours, TopKLogitsWarper(k)(None, logits.clone()))
    kept = torch.isfinite(ours).sum(-1)
    assert (kept >= min(k, V)).all()
    if k in (5, 17, 50):
        assert (kept > k).any()  # ties at the cut survive on these rounded logits


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.95, 0.999, 1.0])
def test_top_p_matches_transformers(p):
    logits = tied_logits()
    theirs = TopPLogitsWarper(p)(None, logits.clone()) if p < 1 else logits
    assert torch.equal(S.top_p(logits, p), theirs)


@pytest.mark.parametrize("m", [0.0, 0.01, 0.1, 0.5, 0.9])
def test_min_p_matches_transformers(m):
    logits = tied_logits()
    theirs = MinPLogitsWarper(m)(None, logits.clone()) if m > 0 else logits
    assert torch.equal(S.min_p(logits, m), theirs)


SETTINGS = [
    Sampling(),
    Sampling(temperature=0.7, top_k=40),
    Sampling(temperature=1.3, top_p=0.9),
    Sampling(temperature=0.8, top_k=20, top_p=0.8, min_p=0.05, repetition_penalty=1.2),
    Sampling(min_p=0.2, repetition_penalty=0.8),
    Sampling(top_k=3, top_p=0.5),
]


@pytest.mark.parametrize("s", SETTINGS, ids=str)
def test_whole_chain_matches_transformers_stage_by_stage(s):
    logits, ids = tied_logits(batch=5, seed=7), context(batch=5)
    stages = S.process(logits, ids, s)
    assert [name for name, _ in stages] == list(S.STAGE_NAMES)
    procs = [
        RepetitionPenaltyLogitsProcessor(s.repetition_penalty)
        if s.repetition_penalty != 1
        else None,
        TemperatureLogitsWarper(s.temperature) if s.temperature != 1 else None,
        TopKLogitsWarper(s.top_k) if s.top_k else None,
        TopPLogitsWarper(s.top_p) if s.top_p < 1 else None,
        MinPLogitsWarper(s.min_p) if s.min_p > 0 else None,
    ]
    x = logits.clone()
    for (name, ours), proc in zip(stages, procs):
        x = proc(ids, x) if proc is not None else x
        assert torch.equal(ours, x), name
    chain = LogitsProcessorList([p for p in procs if p is not None])
    assert torch.equal(stages[-1][1], chain(ids, logits.clone()))


# --- summaries, statistics, the draw --------------------------------------------------------------


def test_stage_summary_counts_kept_tokens_and_mass():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    stages = S.process(logits, torch.zeros(1, 1, dtype=torch.long), Sampling(top_k=2, top_p=0.6))
    summary = S.stage_summary(logits, stages)
    assert [d["kept"] for d in summary] == [4, 4, 2, 1, 1]
    assert summary[2]["mass"] == pytest.approx(0.8)  # top-2 keeps 0.5 + 0.3 of the raw mass
    assert summary[3]["mass"] == pytest.approx(
        0.5 / 0.8
    )  # top-p keeps the first of the renormalised two
    assert summary[4]["mass"] == pytest.approx(1.0)


@pytest.mark.parametrize("s", SETTINGS + [Sampling(greedy=True, top_k=5)], ids=str)
def test_step_statistics_equal_stage_summary_and_entropy(s):
    logits, ids = tied_logits(batch=3, seed=11), context(batch=3)
    stages = S.process(logits, ids, s)
    final = stages[-1][1]
    for row in range(3):
        for token in (
            int(final[row].argmax()),
            int(torch.isfinite(final[row]).logical_not().int().argmax()),
        ):
            st = S.step_statistics(logits, stages, token, top_n=7, row=row)
            ref = S.stage_summary(logits, stages, row=row)
            assert [d["kept"] for d in st["stages"]] == [d["kept"] for d in ref]
            assert [d["mass"] for d in st["stages"]] == pytest.approx(
                [d["mass"] for d in ref], abs=1e-6
            )
            assert st["entropy_raw"] == pytest.approx(S.entropy(logits)[row].item(), abs=1e-5)
            assert st["entropy_final"] == pytest.approx(S.entropy(final)[row].item(), abs=1e-5)
            p_raw, p_fin = logits[row].softmax(-1), final[row].softmax(-1)
            assert st["prob_raw"] == pytest.approx(p_raw[token].item(), abs=1e-7)
            assert st["prob_final"] == pytest.approx(p_fin[token].item(), abs=1e-7)
            assert st["rank_raw"] == int((logits[row] > logits[row, token]).sum())
            assert st["rank_final"] == int((final[row] > final[row, token]).sum())
            assert st["cdf_lo_final"] == pytest.approx(
                p_fin[final[row] > final[row, token]].sum().item(), abs=1e-6
            )
            top_ids = [i for i, _, _ in st["top"]]
            assert sorted(p_raw[top_ids].tolist(), reverse=True) == pytest.approx(
                p_raw.topk(7).values.tolist(), abs=1e-7
            )
            assert [f for _, _, f in st["top"]] == pytest.approx(p_fin[top_ids].tolist(), abs=1e-7)


def test_entropy_in_nats():
    assert S.entropy(torch.zeros(1, 8)).item() == pytest.approx(math.log(8))
    masked = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]])
    assert S.entropy(masked).item() == pytest.approx(math.log(2))


def test_greedy_draw_is_argmax_with_first_index_on_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 2.0, 5.0]])
    d = S.choose_token(logits, greedy=True, generator=None)
    assert d.tokens.tolist() == [1, 0] == logits.argmax(-1).tolist()
    assert d.u == [None, None] and d.cdf_lo == [0.0, 0.0]
    assert d.cdf_hi == pytest.approx(logits.softmax(-1).amax(-1).tolist())
    lean = S.choose_token(logits, greedy=True, generator=None, greedy_cdf=False)
    assert torch.equal(lean.tokens, d.tokens) and lean.cdf_hi == []


def test_unseeded_generator_takes_its_seed_from_the_os_not_torchs_global_generator():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, b = S.make_generator(None), S.make_generator(None)
    assert torch.equal(torch.rand(3), expected)  # the caller's torch.manual_seed still holds
    assert a.initial_seed() != b.initial_seed() and 0 <= a.initial_seed() < 2**63
    assert S.make_generator(7).initial_seed() == 7


def test_sampled_draw_says_where_u_fell_and_never_picks_a_filtered_token():
    logits = S.top_k(tied_logits(batch=8, seed=3), 10)
    g = S.make_generator(0)
    for _ in range(50):
        d = S.choose_token(logits, greedy=False, generator=g)
        assert torch.isfinite(logits.gather(1, d.tokens[:, None])).all()
        for u, lo, hi in zip(d.u, d.cdf_lo, d.cdf_hi):
            assert lo - 1e-6 <= u <= hi + 1e-6 and hi > lo


def test_sampling_frequencies_follow_the_final_distribution():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    logits = probs.log().expand(4000, -1)  # 4000 rows drawn at once
    d = S.choose_token(logits, greedy=False, generator=S.make_generator(123))
    freq = torch.bincount(d.tokens, minlength=5).float() / 4000
    assert freq[4] == 0
    assert freq.tolist() == pytest.approx(probs.tolist(), abs=0.03)  # ~4 standard errors


def test_same_seed_same_draws():
    logits = tied_logits()
    a = S.choose_token(logits, False, S.make_generator(9)).tokens
    b = S.choose_token(logits, False, S.make_generator(9)).tokens
    c = [S.choose_token(logits, False, S.make_generator(s)).tokens for s in range(10, 20)]
    assert torch.equal(a, b)
    assert any(not torch.equal(a, x) for x in c)
