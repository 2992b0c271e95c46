"""Speculative decoding (explorer.engine.speculative): lossless, greedy-exact, and honestly recorded.

Lossless is checked two ways:
  * exactly: on hand-made tiny models every branch of the session's own code (each draft proposal,
    each accept/reject verdict, each residual or bonus draw) is enumerated with its probability by
    swapping the session's random source for an enumerator; the resulting distribution of the first
    two emitted tokens must equal the target's own to 1e-6;
  * statistically: a chi-square test over many seeds on the bundled pair.
"""

from __future__ import annotations

import copy
import json
import math
from collections import Counter, defaultdict
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from explorer import Sampling
from explorer.bench.speculative import benchmark, decode_target_only, measure_cost_ratio
from explorer.costs.speculation import breakeven_alpha, expected_speedup, expected_tokens_per_round
from explorer.engine import forward
from explorer.engine.drafts import PromptLookup, parse_ks
from explorer.engine.rounds import Round, round_stats
from explorer.engine.sampling import Draw, process
from explorer.engine.speculative import SpeculativeSession
from explorer.engine.trace import Trace
from explorer.model.loader import LoadedModel, ModelInfo, model_info

# --- hand-made models -----------------------------------------------------------------------------


class TableLM(torch.nn.Module):
    """A causal LM whose logits for a prefix are a fixed pseudo-random function of the whole prefix.

    It keeps the ids it has read in a real DynamicCache (as 1-dim "keys"), so a wrongly cropped cache
    changes its output, as it would for a transformer. `base`/`mix` make a draft that resembles a target;
    `sign=-1` makes an anti-draft whose argmax is the target's argmin.
    """

    def __init__(
        self,
        vocab: int,
        seed: int,
        scale: float = 1.5,
        base: TableLM | None = None,
        mix: float = 0.0,
        sign: float = 1.0,
    ):
        super().__init__()
        self.vocab, self.seed, self.scale, self.base, self.mix, self.sign = (
            vocab,
            seed,
            scale,
            base,
            mix,
            sign,
        )
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the module a device and dtype

    def prefix_logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        h = self.seed
        for t in prefix:
            h = (h * 1_000_003 + t + 1) % (1 << 61)
        own = (
            torch.randn(self.vocab, generator=torch.Generator().manual_seed(h)) * self.scale
        )  # [V]
        if self.base is not None:
            own = self.mix * self.base.prefix_logits(prefix) + (1 - self.mix) * own
        return self.sign * own

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=False, **_
    ):
        T = input_ids.shape[1]
        history = input_ids  # [1, T] without a cache
        if cache is not None:
            kv = input_ids.float().view(1, 1, T, 1)
            keys, _ = cache.update(kv, kv, 0)  # [1, 1, L, 1]: everything read so far
            history = keys.view(1, -1).long()
        ids = history[0].tolist()
        L = len(ids)
        logits = torch.stack(
            [self.prefix_logits(tuple(ids[: L - T + i + 1])) for i in range(T)]
        )  # [T, V]
        return SimpleNamespace(logits=logits.unsqueeze(0), cache=cache)


def table_lm(name: str, model: TableLM) -> LoadedModel:
    info = ModelInfo(
        name=name,
        source="local",
        family="table",
        parameters=1,
        non_embedding_parameters=1,
        layers=1,
        attention_heads=1,
        kv_heads=1,
        head_dim=1,
        hidden_size=1,
        intermediate_size=1,
        vocab_size=model.vocab,
        max_positions=64,
        tied_embeddings=False,
        dtype="float32",
        device="cpu",
        weight_bytes=4,
        random_weights=True,
    )
    return LoadedModel(model, None, info)


def tiny_llama(
    name: str,
    seed: int,
    *,
    vocab: int = 512,
    hidden: int = 64,
    layers: int = 2,
    emb_scale: float = 4.0,
) -> LoadedModel:
    """A random LlamaForCausalLM; the embedding is scaled up so its distributions are far from uniform."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(emb_scale)
    return LoadedModel(
        model, None, model_info(model, name=name, source="local", random_weights=True)
    )


def noisy_copy(lm: LoadedModel, name: str, noise: float, seed: int = 0) -> LoadedModel:
    """A draft that resembles the target: its weights plus noise (relative to each tensor's spread)."""
    model = copy.deepcopy(lm.model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * p.std())
    return LoadedModel(
        model, None, model_info(model, name=name, source="local", random_weights=True)
    )


@pytest.fixture(scope="module")
def tiny_pair():
    target = tiny_llama("tiny-target", 0, hidden=32, layers=1)
    return target, noisy_copy(target, "tiny-draft", noise=0.3)


# --- exact enumeration of the session's branches --------------------------------------------------


class Unscripted(Exception):
    def __init__(self, n: int):
        self.n = n


class ScriptedDraws:
    """A stand-in for RandomDraws: follows a script of branch choices and multiplies their probabilities.

    At the first decision beyond the script it raises Unscripted(number of live options), so a
    depth-first search can extend the script by every option in turn.
    """

    def __init__(self, script: list[int]):
        self.script, self.pos, self.weight = script, 0, 1.0

    def _pick(self, weights: list[float]) -> int:
        live = [i for i, w in enumerate(weights) if w > 0]
        if self.pos == len(self.script):
            raise Unscripted(len(live))
        i = live[self.script[self.pos]]
        self.pos += 1
        self.weight *= weights[i]
        return i

    def token(self, final_logits: torch.Tensor) -> Draw:
        probs = final_logits.double().softmax(dim=-1)[0]  # [V]
        i = self._pick(probs.tolist())
        return Draw(tokens=torch.tensor([i]), u=[None], cdf_lo=[0.0], cdf_hi=[float(probs[i])])

    def accept(self, p: float, q: float) -> tuple[None, bool]:
        r = min(1.0, p / q)
        return None, self._pick([r, 1.0 - r]) == 0


def enumerate_outputs(make_session, n: int = 2) -> dict[tuple[int, ...], float]:
    """Exact distribution of the first n emitted ids: every branch of the session's code, weighted."""
    dist: dict[tuple[int, ...], float] = defaultdict(float)
    stack: list[list[int]] = [[]]
    while stack:
        script = stack.pop()
        session = make_session()
        session.draws = ScriptedDraws(script)
        try:
            while len(session.tokens) < n:
                session.step()
        except Unscripted as branch:
            stack.extend(script + [i] for i in range(branch.n))
            continue
        dist[tuple(session.tokens[:n])] += session.draws.weight
    return dict(dist)


def exact_sequences(
    lm: LoadedModel, prompt: list[int], s: Sampling, n: int = 2
) -> dict[tuple[int, ...], float]:
    """The model's own distribution of its next n ids under the settings: prod_i p(t_i | prompt, t_<i)."""
    out = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for prefix, w in out.items():
            ids = torch.tensor([prompt + list(prefix)])
            logits, _ = forward(
                lm.model, ids, None
            )  # no cache: independent of the session's bookkeeping
            p = process(logits[:, -1], ids, s)[-1][1].double().softmax(dim=-1)[0]
            nxt.update({prefix + (t,): w * float(p[t]) for t in range(p.numel()) if p[t] > 0})
        out = nxt
    return out


def max_gap(a: dict, b: dict) -> float:
    return max(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


V = 4
_BASE = TableLM(V, seed=1)
TABLE_TARGET = table_lm("table-target", _BASE)
TABLE_DRAFT = table_lm("table-draft", TableLM(V, seed=2, base=_BASE, mix=0.5))

EXACT_CASES = [  # (vocab of the case, k, settings): each enumerates a few hundred branches at most
    (3, 1, Sampling(seed=0)),
    (4, 2, Sampling(temperature=0.7, top_k=2, repetition_penalty=1.5, seed=0)),
    (4, 3, Sampling(top_p=0.7, min_p=0.2, seed=0)),
]


def _table_pair(vocab: int) -> tuple[LoadedModel, LoadedModel]:
    if vocab == V:
        return TABLE_TARGET, TABLE_DRAFT
    base = TableLM(vocab, seed=5)
    return table_lm("t", base), table_lm("d", TableLM(vocab, seed=6, base=base, mix=0.3))


@pytest.mark.parametrize(
    "vocab,k,s", EXACT_CASES, ids=["plain-k1", "temp-topk-reppen-k2", "topp-minp-k3"]
)
def test_output_distribution_equals_target_exactly(vocab, k, s):
    target, draft = _table_pair(vocab)
    prompt = [0, 1]
    got = enumerate_outputs(
        lambda: SpeculativeSession(target, draft, prompt, s, k=k, record_steps=False)
    )
    want = exact_sequences(target, prompt, s)
    assert math.isclose(sum(got.values()), 1.0, abs_tol=1e-9)
    assert max_gap(got, want) < 1e-6
    # Not trivially true: the draft's own distribution is far from the target's.
    assert 0.5 * sum(abs(a - b) for a, b in _aligned(exact_sequences(draft, prompt, s), want)) > 0.1


def _aligned(a: dict, b: dict):
    return [(a.get(x, 0.0), b.get(x, 0.0)) for x in set(a) | set(b)]


def test_output_distribution_equals_target_exactly_on_a_tiny_llama():
    """The same enumeration through real transformers models, DynamicCache and crop()."""
    target = tiny_llama("t", 3, vocab=3, hidden=8, layers=1, emb_scale=8.0)
    draft = tiny_llama("d", 4, vocab=3, hidden=8, layers=1, emb_scale=8.0)
    s = Sampling(top_k=2, seed=0)
    got = enumerate_outputs(
        lambda: SpeculativeSession(target, draft, [2], s, k=1, record_steps=False)
    )
    want = exact_sequences(target, [2], s)
    assert max_gap(got, want) < 1e-6
    assert max_gap(exact_sequences(draft, [2], s), want) > 0.05


class _ResampleFromP(SpeculativeSession):
    """A deliberately wrong rule (after a rejection, sample from p instead of the residual)."""

    def _resample(self, at, q, position):
        return super()._resample(at, torch.zeros_like(q), position)


def test_enumeration_detects_a_wrong_residual():
    s = Sampling(temperature=0.7, top_k=2, repetition_penalty=1.5, seed=0)
    got = enumerate_outputs(
        lambda: _ResampleFromP(TABLE_TARGET, TABLE_DRAFT, [0, 1], s, k=2, record_steps=False)
    )
    assert max_gap(got, exact_sequences(TABLE_TARGET, [0, 1], s)) > 1e-3


# --- chi-square on the bundled pair ---------------------------------------------------------------


def _chi_square(counts: Counter, probs: dict, n: int) -> tuple[float, int, float]:
    """Pearson's statistic over bins with expected count >= 5 (the rest pooled), its df and p-value."""
    big = {x for x, p in probs.items() if p * n >= 5}
    observed = [counts[x] for x in big] + [n - sum(counts[x] for x in big)]
    expected = [probs[x] * n for x in big] + [n * (1 - sum(probs[x] for x in big))]
    if expected[-1] < 5:  # fold a tiny rest into the smallest bin
        observed, expected = observed[:-1], expected[:-1]
        i = min(range(len(expected)), key=expected.__getitem__)
        observed[i] += n - sum(observed)
        expected[i] += n - sum(expected)
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(expected) - 1
    return (
        stat,
        df,
        float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0))),
    )


def test_chi_square_first_two_tokens_bundled_pair(target, draft):
    s = Sampling(temperature=1.0, top_k=5)
    prompt = "The"
    n = 150  # ~4 passes of ~5-10 ms per sample on 2 idle CPU cores; the power check below shows n is ample
    base = SpeculativeSession(target, draft, prompt, s, k=2, record_steps=False)
    base.prefill()
    counts = Counter()
    for seed in range(n):
        run = base.fork()
        run.draws = type(base.draws)(seed)
        while len(run.tokens) < 2:
            run.step()
        counts[tuple(run.tokens[:2])] += 1
    want = exact_sequences(target, base.prompt_ids, s)
    stat, df, pvalue = _chi_square(counts, want, n)
    assert df >= 3 and pvalue > 1e-3, (stat, df, pvalue)
    # Power: had the session emitted the draft's own samples, the same test would reject them.
    q = exact_sequences(draft, base.prompt_ids, s)
    expected_q = Counter({x: round(p * n) for x, p in q.items()})
    assert _chi_square(expected_q, want, sum(expected_q.values()))[2] < 1e-3


# --- greedy parity --------------------------------------------------------------------------------


def _hf_greedy(
    lm: LoadedModel, ids: list[int], n: int, assistant: LoadedModel | None = None
) -> list[int]:
    x = torch.tensor([ids])
    kw = {"assistant_model": assistant.model} if assistant is not None else {}
    with torch.inference_mode():
        out = lm.model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            **kw,
        )
    return out[0, len(ids) :].tolist()


GREEDY_PROMPT, GREEDY_N = "Once upon a time", 24


@pytest.fixture(scope="module")
def bundled_greedy(target):
    """Target-only greedy decoding of the bundled target (stops at EOS, as every decoder here does)."""
    ids = list(target.tokenizer(GREEDY_PROMPT)["input_ids"])
    return ids, decode_target_only(target, ids, GREEDY_N, Sampling(greedy=True))[0]


def test_greedy_references_agree_bundled(target, draft, bundled_greedy):
    """The reference itself: our plain loop == the engine's Session == generate() == assisted generate()."""
    from explorer.engine import Session

    ids, ref = bundled_greedy
    plain = Session(target, ids, Sampling(greedy=True), max_new_tokens=GREEDY_N, roofline=False)
    plain.run()
    assert plain.tokens == ref
    assert _hf_greedy(target, ids, GREEDY_N) == ref
    assert _hf_greedy(target, ids, GREEDY_N, assistant=draft) == ref


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_equals_target_greedy_bundled(target, draft, bundled_greedy, k):
    ids, ref = bundled_greedy
    session = SpeculativeSession(
        target, draft, GREEDY_PROMPT, Sampling(greedy=True), k=k, max_new_tokens=GREEDY_N
    )
    session.run(GREEDY_N)
    assert session.prompt_ids == ids
    assert session.tokens == ref
    assert session.stop_reason in ("max_new_tokens", "eos")
    assert sum(r.accepted for r in session.rounds) > 0  # the draft did some of the work


def test_greedy_equals_hf_assisted_generation_tiny(tiny_pair):
    target, draft = tiny_pair
    s = Sampling(greedy=True)
    session = SpeculativeSession(target, draft, [5, 17, 33, 2], s, k=4, max_new_tokens=12)
    session.run(12)
    assert session.tokens == _hf_greedy(target, [5, 17, 33, 2], 12)
    assert session.tokens == _hf_greedy(target, [5, 17, 33, 2], 12, assistant=draft)
    assert session.tokens == decode_target_only(target, [5, 17, 33, 2], 12, s)[0]


def test_greedy_rejections_emit_the_target_argmax():
    s = Sampling(greedy=True)
    session = SpeculativeSession(TABLE_TARGET, TABLE_DRAFT, [0, 1], s, k=3)
    session.run(12)
    assert session.tokens[:12] == decode_target_only(TABLE_TARGET, [0, 1], 12, s)[0]
    rejected = [r for r in session.rounds if r.residual]
    assert rejected and any(r.accepted for r in session.rounds)
    for r in (
        rejected
    ):  # p and q are one-hot at their argmaxes, so the residual is one-hot at the target's
        assert [(e["id"], e["residual"]) for e in r.residual["top"]] == [(r.residual["id"], 1.0)]
        assert r.drafts[r.accepted]["id"] != r.residual["id"] and r.drafts[r.accepted]["u"] is None


# --- caches, records, trace -----------------------------------------------------------------------


def test_caches_hold_the_accepted_prefix(tiny_pair):
    target, draft = tiny_pair
    session = SpeculativeSession(target, draft, [3, 1, 4, 1, 5], Sampling(seed=7, top_k=20), k=3)
    for _ in range(6):
        session.step()
        n = len(session._ids)
        assert session._tcache.get_seq_length() == n - 1
        assert n - 2 <= session._dcache.get_seq_length() <= n - 1
    # The cropped cache gives the logits a fresh pass over the whole sequence gives.
    ids = session._ids
    for lm, cache in ((target, session._tcache), (draft, session._dcache)):
        have = cache.get_seq_length()
        cached, _ = forward(lm.model, torch.tensor([ids[have:]]), cache)
        full, _ = forward(lm.model, torch.tensor([ids]), None)
        assert torch.allclose(cached[0, -1], full[0, -1], atol=1e-4)


def test_round_record_is_consistent_and_plain_data(tiny_pair):
    from explorer.costs import forward_cost

    target, draft = tiny_pair
    session = SpeculativeSession(target, draft, [9, 8, 7], Sampling(seed=1, top_k=30), k=3, top_n=5)
    rounds = session.run(16)
    assert session.tokens == [t for r in rounds for t in r.tokens]
    saw = set()
    for r in rounds:
        verdicts = [d["accepted"] for d in r.drafts]
        assert len(r.drafts) == r.k and len(r.draft_passes) == r.k
        assert verdicts == [True] * r.accepted + (
            [False] + [None] * (r.k - r.accepted - 1) if r.accepted < r.k else []
        )
        for d in r.drafts[: r.tested]:
            assert (
                (d["u"] < d["accept_prob"]) == d["accepted"]
                and 0 < d["q"] <= 1
                and 0 <= d["p"] <= 1
            )
        assert (r.residual is not None) == (r.accepted < r.k) and (r.bonus is not None) == (
            r.accepted == r.k
        )
        last = r.residual or r.bonus
        assert r.tokens == [d["id"] for d in r.drafts[: r.accepted]] + [last["id"]]
        if r.residual:
            saw.add("residual")
            assert len(r.residual["top"]) <= 5 and 0 < r.residual["mass"] <= 1
            assert all(e["residual"] > 0 and e["p"] > e["q"] for e in r.residual["top"])
        else:
            saw.add("bonus")
        ver = r.verify_pass
        assert ver["tokens_fed"] == r.k + 1 and ver["latency_s"] > 0
        assert (
            ver["flops"]
            == forward_cost(
                target.info, batch=1, tokens_fed=r.k + 1, context_len=ver["context_len"]
            ).total_flops
        )
        assert all(
            p["latency_s"] > 0 and p["flops"] > 0 and sum(p["bytes"].values()) > 0
            for p in r.draft_passes
        )
        assert Round.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert saw == {"residual", "bonus"}
    assert rounds[0].prefill["target"]["tokens_fed"] == 2 and rounds[1].prefill is None


def test_trace_has_one_step_per_emitted_token(tiny_pair):
    target, draft = tiny_pair
    session = SpeculativeSession(
        target, draft, [2, 4, 6], Sampling(seed=3, top_k=10), k=2, max_new_tokens=12
    )
    session.run(50)
    trace = session.trace
    assert session.stop_reason == "max_new_tokens" and len(session.tokens) == 12
    assert trace.tokens == session.tokens and trace.stop_reason == "max_new_tokens"
    assert [s.round for s in trace.steps] == [r.index for r in session.rounds for _ in r.tokens]
    for r in session.rounds:
        steps = [s for s in trace.steps if s.round == r.index]
        origins = ["draft"] * min(r.accepted, len(r.tokens))
        origins += ["residual" if r.residual else "bonus"] * (len(r.tokens) - len(origins))
        assert [s.origin for s in steps] == origins
    again = Trace.from_json(trace.to_json())
    assert (
        again.tokens == trace.tokens
        and again.rounds == trace.rounds
        and len(again.rounds) == len(session.rounds)
    )
    assert len(trace.to_json()) < 5_000 * len(
        trace.steps
    )  # bounded: top_n entries, never whole vocabularies


def test_eos_stops_and_truncates_the_round(tiny_pair):
    target, draft = tiny_pair
    free = SpeculativeSession(target, draft, [5, 6], Sampling(greedy=True), k=4)
    free.run(8)
    stop_id = free.tokens[4]
    session = SpeculativeSession(target, draft, [5, 6], Sampling(greedy=True), k=4)
    session.eos_ids = {stop_id}
    session.run(8)
    assert session.stop_reason == "eos"
    assert session.tokens == free.tokens[: free.tokens.index(stop_id) + 1]
    assert session._tcache.get_seq_length() == len(session._ids) - 1
    with pytest.raises(RuntimeError, match="stopped"):
        session.step()


def test_fork_continues_independently(tiny_pair):
    target, draft = tiny_pair
    a = SpeculativeSession(target, draft, [1, 2, 3], Sampling(seed=11, top_k=20), k=3)
    a.run(5)
    b = a.fork()
    before = list(a.tokens)
    b.run(10)
    assert a.tokens == before
    a.run(10)
    assert a.tokens == b.tokens  # same draws state, same caches: the same continuation


# --- statistics -----------------------------------------------------------------------------------


def test_speedup_formula():
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert math.isclose(expected_tokens_per_round(0.5, 3), 1 + 0.5 + 0.25 + 0.125)
    assert math.isclose(expected_speedup(0.8, 4, 0.05), (1 - 0.8**5) / (0.2 * 1.2))
    a = breakeven_alpha(4, 0.3)
    assert math.isclose(expected_speedup(a, 4, 0.3), 1.0, rel_tol=1e-9)
    assert breakeven_alpha(4, 1.0) is None  # a draft as slow as the target never pays
    assert breakeven_alpha(2, 0.2, v=1.5) > breakeven_alpha(
        2, 0.2
    )  # a dearer verify pass needs more acceptance


def _made_round(k: int, accepted: int, overlap: float = 0.5) -> Round:
    drafts = [
        {"id": i, "overlap": overlap, "accepted": i < accepted if i <= accepted else None}
        for i in range(k)
    ]
    return Round(
        index=0,
        k=k,
        context_len=1,
        tokens=[0] * (accepted + 1),
        texts=[""] * (accepted + 1),
        drafts=drafts,
        accepted=accepted,
        residual=None,
        bonus=None,
        draft_passes=[{"latency_s": 0.001}] * k,
        verify_pass={"latency_s": 0.004},
    )


def test_round_stats_by_hand():
    st = round_stats([_made_round(3, 3), _made_round(3, 0), _made_round(2, 1, overlap=0.8)])
    assert st["tested"] == 3 + 1 + 2 and st["accepted"] == 4 and st["alpha"] == 4 / 6
    assert st["accepted_histogram"] == [1, 1, 0, 1] and st["mean_accepted"] == 4 / 3
    assert math.isclose(st["alpha_overlap"], (0.5 * 4 + 0.8 * 2) / 6)
    assert (
        st["emitted"] == 4 + 1 + 2
        and math.isclose(st["draft_s"], 0.008)
        and math.isclose(st["verify_s"], 0.012)
    )


def test_round_stats(tiny_pair):
    target, draft = tiny_pair
    session = SpeculativeSession(target, draft, [1, 2], Sampling(seed=5, top_k=30), k=3)
    session.run(16)
    st = session.stats()
    tested = sum(min(r.accepted + 1, r.k) for r in session.rounds if r.k)
    assert st["alpha"] == sum(r.accepted for r in session.rounds) / tested
    assert sum(st["accepted_histogram"]) == st["rounds"] == len(session.rounds)
    assert st["emitted"] == len(session.tokens)
    assert (
        0 <= st["alpha_overlap"] <= 1
        and st["mean_tokens_per_round"] == st["emitted"] / st["rounds"]
    )


def test_adaptive_k_grows_and_shrinks():
    twin = SpeculativeSession(
        TABLE_TARGET, TABLE_TARGET, [0], Sampling(greedy=True), k=2, adaptive=True, k_max=4
    )
    twin.run(20)
    assert [r.k for r in twin.rounds[:4]] == [
        2,
        3,
        4,
        4,
    ]  # the draft is the target: everything is accepted
    anti = table_lm(
        "anti", TableLM(V, seed=1, sign=-1.0)
    )  # always proposes the target's least likely id
    session = SpeculativeSession(TABLE_TARGET, anti, [0], Sampling(greedy=True), k=3, adaptive=True)
    session.run(4)
    assert [r.k for r in session.rounds] == [3, 2, 1, 1] and [r.k_next for r in session.rounds] == [
        2,
        1,
        1,
        1,
    ]
    assert session.tokens == decode_target_only(TABLE_TARGET, [0], 4, Sampling(greedy=True))[0]


def test_benchmark_and_cost_ratio_smoke(tiny_pair):
    target, draft = tiny_pair
    rows = benchmark(
        target, draft, [1, 2, 3], Sampling(greedy=True), ks=[1, 2], n_tokens=6, repeats=1
    )
    assert [r["k"] for r in rows] == [1, 2]
    for r in rows:
        assert 0 <= r["alpha"] <= 1 and r["c"] > 0 and r["v"] > 0 and r["measured"] > 0
        assert math.isclose(r["predicted"], expected_speedup(r["alpha"], r["k"], r["c"]))
    cost = measure_cost_ratio(target, draft, ks=[1, 3], context_len=8, repeats=1)
    assert cost["c"] > 0 and [row["k"] for row in cost["per_k"]] == [1, 3]
    for row in cost["per_k"]:
        a = row["breakeven_alpha"]
        if (
            a is None
        ):  # never pays: even a draft accepted almost always does not beat the target alone
            assert expected_speedup(1 - 1e-9, row["k"], cost["c"]) <= 1 + 1e-6
        else:
            assert math.isclose(expected_speedup(a, row["k"], cost["c"]), 1.0, rel_tol=1e-6)
    assert parse_ks("1..3") == [1, 2, 3] and parse_ks("2,4") == [2, 4]
    with pytest.raises(ValueError):
        parse_ks("0..2")


# --- bad input ------------------------------------------------------------------------------------


class _VocabTokenizer:
    """A duck-typed tokenizer with a given vocabulary (for pairing checks)."""

    def __init__(self, vocab: dict[str, int]):
        self.vocab, self.eos_token_id = vocab, None

    def get_vocab(self):
        return dict(self.vocab)


def test_pairs_that_cannot_work_are_refused(tiny_pair):
    target, draft = tiny_pair
    other = tiny_llama("vocab-256", 2, vocab=256, hidden=32, layers=1)
    with pytest.raises(ValueError, match="cannot pair.*vocabularies differ in size.*512.*256"):
        SpeculativeSession(target, other, [1, 2])
    words = {f"t{i}": i for i in range(512)}
    shuffled = {f"t{i}": 511 - i for i in range(512)}
    a = LoadedModel(target.model, _VocabTokenizer(words), target.info)
    b = LoadedModel(draft.model, _VocabTokenizer(shuffled), draft.info)
    with pytest.raises(ValueError, match="tokenizers map tokens to ids differently"):
        SpeculativeSession(a, b, [1, 2])
    with pytest.raises(ValueError, match="only the target has a tokenizer"):
        SpeculativeSession(a, draft, [1, 2])
    for bad_k in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="k must be a whole number >= 1"):
            SpeculativeSession(target, draft, [1, 2], k=bad_k)
    with pytest.raises(ValueError, match="list of token ids"):
        SpeculativeSession(target, draft, "text needs a tokenizer")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        SpeculativeSession(target, draft, [1, 9999])


def test_bad_settings_leave_the_session_unchanged(tiny_pair):
    target, draft = tiny_pair
    session = SpeculativeSession(target, draft, [1, 2], Sampling(seed=2), k=3)
    session.run(4)
    snapshot = (list(session.tokens), session.k, session.sampling, len(session.rounds))
    with pytest.raises(ValueError):
        session.set_k(0)
    bad = Sampling()
    bad.top_p = 0.0  # invalid after construction: set_sampling validates first
    with pytest.raises(ValueError, match="top_p"):
        session.set_sampling(bad)
    with pytest.raises(ValueError, match="n_tokens"):
        session.run(0)
    assert (list(session.tokens), session.k, session.sampling, len(session.rounds)) == snapshot


class _FailingDraws:
    """Wraps RandomDraws and fails on the n-th acceptance test (after the draft passes have run)."""

    def __init__(self, inner, fail_at: int):
        self.inner, self.calls, self.fail_at = inner, 0, fail_at

    def token(self, logits):
        return self.inner.token(logits)

    def accept(self, p, q):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("injected failure")
        return self.inner.accept(p, q)

    def get_state(self):
        return self.inner.get_state()

    def set_state(self, state):
        self.inner.set_state(state)


def test_an_error_mid_round_leaves_both_models_state_unchanged(tiny_pair):
    target, draft = tiny_pair
    s = Sampling(seed=4, top_k=20)
    clean = SpeculativeSession(target, draft, [4, 4, 2], s, k=3)
    clean.run(8)
    session = SpeculativeSession(target, draft, [4, 4, 2], s, k=3)
    session.run(3)
    before = (
        list(session._ids),
        session._tcache.get_seq_length(),
        session._dcache.get_seq_length(),
        len(session.rounds),
        len(session.trace.steps),
    )
    session.draws = _FailingDraws(session.draws, fail_at=1)
    with pytest.raises(RuntimeError, match="injected"):
        session.step()
    after = (
        list(session._ids),
        session._tcache.get_seq_length(),
        session._dcache.get_seq_length(),
        len(session.rounds),
        len(session.trace.steps),
    )
    assert after == before
    session.draws = session.draws.inner
    session.run(8 - len(session.tokens))
    assert session.tokens[:8] == clean.tokens[:8]  # draws rolled back too: the same continuation


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_speculate_greedy_json(target, capsys):
    from explorer.cli import main

    assert (
        main(
            [
                "speculate",
                "--prompt",
                "Once upon a time",
                "--k",
                "3",
                "--max-new-tokens",
                "10",
                "--greedy",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    ids = target.tokenizer("Once upon a time")["input_ids"]
    assert (
        out["tokens"]
        == decode_target_only(target, list(ids), 10, Sampling(greedy=True))[0][: len(out["tokens"])]
    )
    assert out["stats"]["rounds"] == len(out["rounds"])


def test_cli_bench_speculative_json(capsys):
    from explorer.cli import main

    assert (
        main(
            [
                "bench",
                "speculative",
                "--k",
                "1..2",
                "--max-new-tokens",
                "6",
                "--repeats",
                "1",
                "--modes",
                "greedy",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["k"] for r in rows] == [1, 2]
    assert all(r["greedy"] and r["n_tokens"] == 6 and r["repeats"] == 1 for r in rows)
    assert all(0 <= r["alpha"] <= 1 for r in rows)


def test_cli_bad_k(capsys):
    from explorer.cli import main

    assert main(["speculate", "--prompt", "x", "--k", "0"]) == 2
    assert "k must be a whole number >= 1" in capsys.readouterr().err


# --- prompt lookup: a draft without a model ------------------------------------------------------


def test_prompt_lookup_proposes_the_continuation_of_the_latest_match():

    pl = PromptLookup(ngram=3)
    ids = [5, 1, 2, 3, 9, 8, 7, 1, 2, 3]
    assert pl.propose(ids, 2) == ([9, 8], {"n": 3, "from": 4, "to": 6})
    assert pl.propose([4, 1, 2, 6, 1, 2], 4) == ([6, 1, 2], {"n": 2, "from": 3, "to": 6})
    assert pl.propose([1, 7, 1], 3) == ([7, 1], {"n": 1, "from": 1, "to": 3})
    assert pl.propose([1, 2, 3, 4], 3) == ([], None)  # no n-gram of the tail occurs earlier
    assert PromptLookup(3, min_ngram=2).propose([1, 7, 1], 3) == ([], None)
    assert pl.propose(ids, 0) == ([], None)
    for bad, match in (({"ngram": 0}, "ngram"), ({"ngram": 2, "min_ngram": 3}, "min_ngram")):
        with pytest.raises(ValueError, match=match):
            PromptLookup(**bad)


@pytest.mark.parametrize("s", [Sampling(seed=0), Sampling(temperature=0.7, top_k=3, seed=0)])
def test_prompt_lookup_output_distribution_equals_target_exactly(s):

    target, _ = _table_pair(V)
    prompt = [0, 1, 2, 0]  # "0" occurs earlier: the first round proposes 1, 2
    got = enumerate_outputs(
        lambda: SpeculativeSession(target, PromptLookup(2), prompt, s, k=2, record_steps=False)
    )
    want = exact_sequences(target, prompt, s)
    assert math.isclose(sum(got.values()), 1.0, abs_tol=1e-9)
    assert max_gap(got, want) < 1e-6


def test_prompt_lookup_greedy_equals_plain_greedy_and_records_its_source(target):
    from explorer.bench.speculative import lookup_benchmark

    prompt = "import os\nimport sys\nimport re\nimport os\nimport sys\nimport"
    from explorer.engine.session import Session

    plain = Session(target, prompt, Sampling(greedy=True), max_new_tokens=24, stop_at_eos=False)
    plain.run()
    spec = SpeculativeSession(
        target, PromptLookup(3), prompt, Sampling(greedy=True), k=4, max_new_tokens=24,
        stop_at_eos=False,
    )  # fmt: skip
    while not spec.done:
        spec.step()
    assert spec.tokens == plain.tokens
    found = [r for r in spec.rounds if r.lookup]
    assert found and all(r.k == r.lookup["to"] - r.lookup["from"] for r in found)
    assert all(r.draft_passes == [] for r in spec.rounds)  # no draft model ran
    r = found[0]
    assert r.to_dict()["lookup"] == r.lookup and Round.from_dict(r.to_dict()).lookup == r.lookup
    assert spec.trace.settings["draft_model"]["prompt_lookup"] == {"ngram": 3, "min_ngram": 1}
    from explorer import plots

    hover = plots.rounds_columns(spec.rounds)
    texts = [h for cols in hover.values() for h in cols["hovertext"]]
    assert any("copied by prompt lookup from positions" in h for h in texts)
    fork = spec.fork()
    assert fork.tokens == spec.tokens
    rows = lookup_benchmark(target, {"code": prompt}, k=4, new_tokens=8, repeats=1)
    assert rows[0]["greedy_equal"] and rows[0]["found"] >= 1 and 0 <= rows[0]["alpha"] <= 1
