"""Speculative decoding, one round at a time, lossless (Leviathan et al. 2023; Chen et al. 2023).

One round (`SpeculativeSession.step()`):

    propose   the draft runs k forward passes (with its KV cache): x_i ~ q_i = q(. | ids, x_<i)
    verify    the target scores [last id, x_1..x_k] in ONE forward pass: p_1 .. p_{k+1}
    accept    x_i is kept with probability min(1, p_i(x_i) / q_i(x_i)), in order, up to the first rejection
    resample  at the first rejection n: y ~ normalise(max(0, p_n - q_n))          (the residual)
    bonus     if all k are kept: y ~ p_{k+1}                                       (one token for free)
    crop      both KV caches are cropped to the accepted prefix (never recomputed)

The emitted tokens x_1..x_n, y are distributed exactly as the target's own samples. p and q are the
*final* distributions after the same sampling chain (explorer.engine.sampling.process: repetition penalty,
temperature, top-k, top-p, min-p). Greedy mode keeps x_i while it equals the target's argmax and
then emits the target's argmax, so the output equals target-only greedy decoding token for token.

Cache invariant between rounds: the target cache holds every id but the last (len(ids) - 1
positions); the draft cache holds len(ids) - 1, or len(ids) - 2 after a fully accepted round
(x_k was proposed but never fed to the draft), so its next pass feeds 2 tokens.

Prompt-lookup decoding (Saxena 2023; transformers' prompt_lookup_num_tokens): the draft is no
model but `PromptLookup(ngram=3)`, which proposes the k ids that followed the most recent earlier
occurrence of the context's last n-gram (n = ngram down to min_ngram), or nothing when there is
none (the round is then a plain target step). Its q is one-hot at each proposed id, so acceptance is
min(1, p(x)) and the residual is p with x removed: the same lossless rule, with no draft pass at
all. Each Round's `lookup` says where the proposal came from ({"n", "from", "to"}: positions).

Statistics (modelled, with measured inputs): per-token acceptance rate alpha, and the expected
speedup of Leviathan et al. (their eq. 1), with c = draft pass time / target decode pass time:

    E[tokens per round] = (1 - alpha^(k+1)) / (1 - alpha)
    speedup             = (1 - alpha^(k+1)) / ((1 - alpha) (k c + 1))

which assumes a verify pass of k+1 tokens costs what a 1-token target pass does. We also give the
version with the measured verify cost v = verify pass time / target decode pass time:
E[tokens per round] / (k c + v).
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
from transformers import DynamicCache

from explorer.costs.timing import Timer
from explorer.engine.prompt import decode_ids, encode, eos_ids  # the engine's prompt rules
from explorer.engine.sampling import (
    Draw,
    Sampling,
    choose_token,
    entropy,
    make_generator,
    process,
    stage_summary,
)
from explorer.engine.session import SessionDone
from explorer.engine.trace import Step, Trace
from explorer.model.loader import LoadedModel
from explorer.model.passes import copy_cache, crop_cache, forward, kv_cache_bytes

RESIDUAL_EPS = 1e-12  # residual mass below this counts as empty (p == q): fall back to p


@dataclass(frozen=True)
class PromptLookup:
    """A draft without a model: propose the continuation of the last n-gram's most recent earlier
    occurrence in the context (prompt + emitted ids). ngram: the longest n-gram tried first;
    min_ngram: the shortest one still trusted."""

    ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self):
        for name in ("ngram", "min_ngram"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"PromptLookup {name} must be a whole number >= 1, got {v!r}")
        if self.min_ngram > self.ngram:
            raise ValueError(
                f"PromptLookup min_ngram ({self.min_ngram}) must be <= ngram ({self.ngram})"
            )

    @property
    def name(self) -> str:
        return f"prompt-lookup(ngram={self.ngram}, min_ngram={self.min_ngram})"

    def propose(self, ids: list[int], k: int) -> tuple[list[int], dict | None]:
        """(up to k ids, {"n", "from", "to"}) where ids[from:to] is the copied span; ([], None) when
        no n-gram of the context's tail occurs earlier."""
        if k < 1:
            return [], None
        for n in range(min(self.ngram, len(ids) - 1), self.min_ngram - 1, -1):
            tail = ids[-n:]
            for start in range(len(ids) - n - 1, -1, -1):  # most recent earlier occurrence first
                if ids[start : start + n] == tail:
                    span = ids[start + n : start + n + k]
                    if span:
                        return span, {"n": n, "from": start + n, "to": start + n + len(span)}
        return [], None


# --- pairing and input checks --------------------------------------------------------------------


def check_pair(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise ValueError saying why two models cannot pair: the target must score the draft's ids as they are."""
    tv, dv = _vocab_size(target), _vocab_size(draft)
    why = None
    if tv != dv:
        why = f"their vocabularies differ in size (target {tv:,} logits, draft {dv:,})"
    elif (target.tokenizer is None) != (draft.tokenizer is None):
        has = "target" if target.tokenizer is not None else "draft"
        why = f"only the {has} has a tokenizer, so nothing shows that their token ids mean the same text"
    elif (
        target.tokenizer is not None and target.tokenizer.get_vocab() != draft.tokenizer.get_vocab()
    ):
        diff = len(
            set(target.tokenizer.get_vocab().items()) ^ set(draft.tokenizer.get_vocab().items())
        )
        why = f"their tokenizers map tokens to ids differently ({diff:,} (token, id) pairs differ)"
    if why:
        raise ValueError(
            f"cannot pair target {target.info.name!r} with draft {draft.info.name!r}: {why}; "
            "speculative decoding feeds the draft's token ids to the target unchanged, so both "
            "need the same tokenizer and vocabulary"
        )
    if target.device != draft.device:
        raise ValueError(
            f"target is on {target.device} but draft is on {draft.device}; load both on one device"
        )


def _vocab_size(lm: LoadedModel) -> int:
    out = lm.model.get_output_embeddings() if hasattr(lm.model, "get_output_embeddings") else None
    return int(out.weight.shape[0]) if out is not None else int(lm.info.vocab_size)


def check_k(k, name: str = "k") -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(
            f"{name} must be a whole number >= 1 (draft tokens proposed per round), got {k!r}"
        )
    return k


def token_text(lm: LoadedModel, token_id: int) -> str:
    if lm.tokenizer is None:
        return f"<{token_id}>"
    return lm.tokenizer.decode([token_id], clean_up_tokenization_spaces=False)


# --- random draws (replaceable: tests swap in an enumerator) -------------------------------------


class RandomDraws:
    """The session's source of randomness: token draws (inverse CDF) and acceptance tests, one generator.

    Any object with token(final_logits) -> Draw and accept(p, q) -> (u, accepted) can replace it
    (`session.draws = ...`); get_state()/set_state() let a failed round roll back.
    """

    def __init__(self, seed: int | None):
        self.generator = make_generator(seed)

    def token(self, final_logits: torch.Tensor) -> Draw:  # final_logits [1, V]
        """Sample one id by inverse CDF (explorer.engine.sampling.choose_token)."""
        return choose_token(final_logits, False, self.generator)

    def accept(self, p: float, q: float) -> tuple[float, bool]:
        """Keep a draft token with probability min(1, p/q): u ~ U[0, 1), keep iff u < p / q."""
        u = torch.rand((), generator=self.generator, dtype=torch.float64).item()
        return u, u < p / q

    def get_state(self):
        return self.generator.get_state()

    def copy(self) -> RandomDraws:
        new = RandomDraws(0)
        new.set_state(self.get_state())
        return new

    def set_state(self, state) -> None:
        self.generator.set_state(state)


# --- the round record ----------------------------------------------------------------------------


@dataclass
class Round:
    """One speculative round as plain data (JSON-able; bounded: top_n entries, never whole vocabularies).

    drafts: one dict per proposed token, in order: id, text, q (draft's final prob), p (target's final
    prob), accept_prob = min(1, p/q), overlap = sum_x min(p, q) at that position (the chance a draft token
    drawn there is kept), u (the acceptance draw; None in greedy mode or when not tested), accepted
    (True / False / None = not tested, after a rejection), draw (where the proposal fell in q's CDF).
    """

    index: int
    k: int  # draft tokens proposed this round
    context_len: int  # ids (prompt + emitted) before the round
    tokens: list[int]  # ids emitted this round: accepted drafts, then the residual or bonus token
    texts: list[str]
    drafts: list[dict]
    accepted: int  # draft tokens kept (before any stop truncation)
    residual: dict | None  # at the first rejection: {position, id, text, mass, fallback, top, draw}
    bonus: dict | None  # after full acceptance: {id, text, p, draw}
    draft_passes: list[
        dict
    ]  # per draft pass: tokens_fed, context_len, latency_s, kv_cache_bytes, cost fields
    verify_pass: dict  # the target's scoring pass, same keys
    greedy: bool = False
    k_next: int = 0  # k of the next round (differs from k with adaptive k)
    prefill: dict | None = None  # round 0 only: {"target": pass, "draft": pass} over prompt[:-1]
    stop: str | None = (
        None  # "eos" | "max_new_tokens" | "max_positions" when this round ended the run
    )
    wall_s: float = 0.0  # the whole round (passes, sampling chain, bookkeeping), perf_counter
    lookup: dict | None = None  # prompt lookup: {"n", "from", "to"} of the copied span, else None

    @property
    def draft_s(self) -> float:
        return float(sum(p["latency_s"] for p in self.draft_passes))

    @property
    def verify_s(self) -> float:
        return float(self.verify_pass["latency_s"])

    @property
    def tested(self) -> int:
        """Draft tokens whose acceptance was tested: the accepted ones plus the first rejected one."""
        return self.accepted + (1 if self.accepted < self.k else 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Round:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# --- expected speedup (Leviathan et al. 2023, eq. 1) ---------------------------------------------


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E[tokens emitted per round] = (1 - alpha^(k+1)) / (1 - alpha), for i.i.d. acceptance with rate alpha."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """(1 - alpha^(k+1)) / ((1 - alpha)(k c + v)): c = draft pass / target pass time, v = verify / target pass
    (v = 1 is the paper's formula, which assumes scoring k+1 tokens costs one decode pass)."""
    return expected_tokens_per_round(alpha, k) / (k * c + v)


def breakeven_alpha(k: int, c: float, v: float = 1.0) -> float | None:
    """Smallest alpha at which expected_speedup(alpha, k, c, v) reaches 1 (None if even alpha=1 does not)."""
    need = k * c + v  # tokens per round needed to break even
    if need <= 1:
        return 0.0
    if k + 1 <= need:
        return None
    lo, hi = 0.0, 1.0  # expected_tokens_per_round rises from 1 to k+1 on [0, 1]
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_round(mid, k) < need else (lo, mid)
    return hi


# --- small helpers -------------------------------------------------------------------------------


def _peaks(device: torch.device, dtype: torch.dtype):
    from explorer.costs import hardware

    return hardware.measure(device, dtype=dtype)


def _pass_record(
    lm: LoadedModel,
    tokens_fed: int,
    context_len: int,
    latency_s: float,
    cache,
    peaks_fn,
    logits_positions: int,
) -> dict:
    """One forward pass: what was fed, its measured latency, and its modelled cost (explorer.costs)."""
    from explorer import costs

    rec = {
        "model": lm.info.name,
        "tokens_fed": tokens_fed,
        "context_len": context_len,
        "latency_s": latency_s,
        "logits_positions": logits_positions,
        "kv_cache_bytes": kv_cache_bytes(cache),
    }
    if lm.info.family in costs.FAMILIES:
        rec.update(
            costs.step_roofline(
                lm.info,
                batch=1,
                tokens_fed=tokens_fed,
                context_len=context_len,
                use_cache=True,
                latency_s=latency_s,
                peaks=peaks_fn(),
                logits_positions=logits_positions,
            )
        )
    else:  # a family with no cost model (e.g. a hand-made test model)
        rec.update(dict.fromkeys(costs.STEP_COST_FIELDS))
    return rec


def _timed_forward(
    lm: LoadedModel, ids: list[int], cache: DynamicCache, last_only: bool = False
) -> tuple[torch.Tensor, float]:
    """Feed `ids` on top of the cache; returns (logits [1, T, V] or [1, 1, V], device-synchronised seconds)."""
    x = torch.tensor([ids], dtype=torch.long, device=lm.device)  # [1, T]
    timer = Timer(lm.device)
    with timer.region():
        logits, _ = forward(lm.model, x, cache, last_only=last_only)
    return logits, timer.seconds


def _final_probs(
    logits: torch.Tensor, context: list[int], s: Sampling
) -> tuple[torch.Tensor, list]:
    """The sampling chain on one position: logits [1, V] -> (final probs [V], stages)."""
    ctx = torch.tensor([context], dtype=torch.long, device=logits.device)  # [1, T]
    stages = process(logits, ctx, s)
    return stages[-1][1].softmax(dim=-1)[0], stages


def _draw_dict(d: Draw, greedy: bool, of: str) -> dict:
    return {"u": d.u[0], "cdf_lo": d.cdf_lo[0], "cdf_hi": d.cdf_hi[0], "greedy": greedy, "of": of}


def _logits_of(probs: torch.Tensor) -> torch.Tensor:
    """Log-probabilities [1, V] of a probability vector [V] (zeros become -inf)."""
    return torch.where(probs > 0, probs.log(), torch.full_like(probs, float("-inf"))).unsqueeze(0)


# --- the session ---------------------------------------------------------------------------------


@dataclass
class _Scored:
    """The target's view of one verified position."""

    raw: torch.Tensor  # [1, V] raw logits
    stages: list  # process() output
    p: torch.Tensor  # [V] final probabilities


@dataclass
class _Proposal:
    tokens: list[int] = field(default_factory=list)
    q: list[torch.Tensor] = field(
        default_factory=list
    )  # [V] final draft probabilities per position
    draws: list[dict] = field(default_factory=list)
    passes: list[dict] = field(default_factory=list)
    lookup: dict | None = None  # prompt lookup: where the proposal was copied from


class SpeculativeSession:
    """Speculative decoding step by step: each step() is one round (see the module docstring).

    SpeculativeSession(target, draft, prompt, sampling=Sampling(), *, k=4, top_n=20, max_new_tokens=None,
    adaptive=False, k_max=None, record_steps=True, stop_at_eos=True)

    draft: a LoadedModel that shares the target's tokenizer, or PromptLookup(ngram) (no model).

    prompt: a string (needs the target's tokenizer) or a list of token ids. With adaptive=True, k grows
    by 1 after a fully accepted round (up to k_max, default 2k) and shrinks by 1 after a rejection (down
    to 1); each Round records its k and k_next. record_steps=False skips the per-token Steps of the
    Trace (the Rounds are always kept), for benchmarks and enumerations.
    """

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel,
        prompt: str | list[int],
        sampling: Sampling | None = None,
        *,
        k: int = 4,
        top_n: int = 20,
        max_new_tokens: int | None = None,
        adaptive: bool = False,
        k_max: int | None = None,
        record_steps: bool = True,
        stop_at_eos: bool = True,
    ):
        self.lookup = draft if isinstance(draft, PromptLookup) else None
        if self.lookup is None:
            check_pair(target, draft)
        check_k(k)
        k_max = check_k(2 * k if k_max is None else k_max, "k_max")
        if k_max < k:
            raise ValueError(f"k_max ({k_max}) must be >= k ({k})")
        sampling = Sampling() if sampling is None else sampling
        if not isinstance(sampling, Sampling):
            raise ValueError(
                f"sampling must be an explorer.Sampling, got {type(sampling).__name__}"
            )
        sampling.validate()
        if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
            raise ValueError(f"top_n must be a whole number >= 1, got {top_n!r}")
        if max_new_tokens is not None and (
            not isinstance(max_new_tokens, int) or max_new_tokens < 1
        ):
            raise ValueError(
                f"max_new_tokens must be None or a whole number >= 1, got {max_new_tokens!r}"
            )
        self.target, self.draft = target, draft
        self.prompt_ids = encode(target, prompt)
        self.sampling, self.k, self.k_max, self.adaptive = sampling, k, k_max, bool(adaptive)
        self.top_n = min(top_n, _vocab_size(target))
        self.max_new_tokens, self.record_steps = max_new_tokens, bool(record_steps)
        draft_positions = None if self.lookup else draft.info.max_positions
        self.max_positions = min(
            p for p in (target.info.max_positions, draft_positions, 1 << 62) if p
        )
        if len(self.prompt_ids) >= self.max_positions:
            raise ValueError(
                f"the prompt has {len(self.prompt_ids)} tokens; the models hold {self.max_positions}"
            )
        self.k_requested = k
        self.k = self._fit_k(k)
        self.k_max = max(self.k, min(self.k_max, self.max_positions - len(self.prompt_ids) - 1))
        self.draws = RandomDraws(sampling.seed)
        self.eos_ids = eos_ids(target) if stop_at_eos else set()
        self.rounds: list[Round] = []
        self.stop_reason: str | None = None
        self._ids = list(self.prompt_ids)
        self._tcache: DynamicCache | None = None  # created by the prefill of round 0
        self._dcache: DynamicCache | None = None
        self._peaks = None
        self._prefill_record: dict | None = None
        self._texts: dict[int, str] = {}
        dt = target.info.dtype
        self._trace = Trace(
            prompt=prompt
            if isinstance(prompt, str)
            else decode_ids(target.tokenizer, self.prompt_ids),
            settings=self._settings(),
            model=target.info.to_dict(),
            device=str(target.device),
            dtype=dt,
            prompt_ids=list(self.prompt_ids),
        )

    # --- public API ---

    @property
    def trace(self) -> Trace:
        """The run as a Trace: one Step per emitted id (phase "speculative"), and every Round in `rounds`."""
        t = self._trace
        del t.rounds[len(self.rounds) :]
        t.rounds.extend(r.to_dict() for r in self.rounds[len(t.rounds) :])
        return t

    @property
    def tokens(self) -> list[int]:
        """All emitted ids (prompt excluded)."""
        return self._ids[len(self.prompt_ids) :]

    @property
    def text(self) -> str:
        return decode_ids(self.target.tokenizer, self.tokens)

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def lm(self) -> LoadedModel:
        return self.target

    def step(self) -> Round:
        """Run one round. On any error the session (ids, both caches, draws, records) is left unchanged."""
        return self._guarded()

    def run(self, n_tokens: int) -> list[Round]:
        """Run rounds until at least n_tokens more ids are emitted (a round may overshoot by up to k; the
        max_new_tokens limit is exact) or the session stops."""
        if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens < 1:
            raise ValueError(f"n_tokens must be a whole number >= 1, got {n_tokens!r}")
        goal, out = len(self.tokens) + n_tokens, []
        while len(self.tokens) < goal and not self.done:
            out.append(self._guarded())
        return out

    def __iter__(self):
        while not self.done:
            yield self.step()

    def set_sampling(self, sampling: Sampling) -> None:
        """New settings for the next round (validated first; on error nothing changes). The seed is not reused."""
        if not isinstance(sampling, Sampling):
            raise ValueError(
                f"sampling must be an explorer.Sampling, got {type(sampling).__name__}"
            )
        sampling.validate()
        self.sampling = sampling
        self._trace.settings = self._settings()

    def _fit_k(self, k: int) -> int:
        """k, or the positions left after the prompt when k asks for more (with a warning that says so)."""
        room = max(1, self.max_positions - len(self.prompt_ids) - 1)
        if k > room:
            warnings.warn(
                f"k={k} draft tokens do not fit: the models hold {self.max_positions} positions and the "
                f"prompt takes {len(self.prompt_ids)}, so k={room} is used (see session.k and each "
                "round's k)",
                stacklevel=3,
            )
            return room
        return k

    def set_k(self, k: int) -> None:
        """Draft tokens per round from the next round on (k >= 1; raises k_max if needed)."""
        check_k(k)
        self.k_requested = k
        k = self._fit_k(k)
        self.k, self.k_max = k, max(self.k_max, k)
        self._trace.settings = self._settings()

    def stats(self) -> dict[str, Any]:
        """Acceptance statistics over the rounds so far (measured counts; see module docstring)."""
        return round_stats(self.rounds)

    # --- one round, phase by phase ---

    def _guarded(self) -> Round:
        if self.done:
            raise SessionDone(f"the session has stopped ({self.stop_reason}); start a new one")
        saved = self._save()
        try:
            return self._round()
        except BaseException:
            self._restore(saved)
            raise

    def _round(self) -> Round:
        t0 = time.perf_counter()
        self.prefill()
        prefill = self._prefill_record if not self.rounds else None
        k = self._round_k()
        prop = self._propose(k)
        k = len(prop.tokens)  # prompt lookup may find fewer than k (or none: a plain target step)
        scored, verify = self._verify(prop.tokens)
        drafts, n = self._accept(prop, scored)
        residual = bonus = None
        if n < k:
            new, residual = self._resample(scored[n], prop.q[n], n)
        else:
            new, bonus = self._bonus(scored[k])
        emitted, stop = self._apply_stops(prop.tokens[:n] + [new])
        rnd = Round(
            index=len(self.rounds),
            k=k,
            context_len=len(self._ids),
            tokens=emitted,
            texts=[self._text(t) for t in emitted],
            drafts=drafts,
            accepted=n,
            residual=residual,
            bonus=bonus,
            draft_passes=prop.passes,
            verify_pass=verify,
            greedy=self.sampling.is_greedy,
            prefill=prefill,
            stop=stop,
            lookup=prop.lookup,
        )
        self._commit(rnd, scored, prop)
        rnd.wall_s = time.perf_counter() - t0
        return rnd

    def prefill(self) -> dict:
        """Both models read prompt[:-1] into fresh caches (the last prompt id is fed by the first round).

        The first step() does this by itself; call it early to prefill once and fork() many times.
        Returns {"target": pass, "draft": pass} (None for a 1-token prompt); round 0 records it too.
        """
        if self._tcache is not None:
            return self._prefill_record
        tcache, dcache = DynamicCache(), DynamicCache()
        body, out = self._ids[:-1], {}
        models = [("target", self.target, tcache)]
        if self.lookup is None:
            models.append(("draft", self.draft, dcache))
        else:
            dcache, out["draft"] = None, None  # prompt lookup: no draft model, no draft cache
        for name, lm, cache in models:
            out[name] = None
            if body:
                _, sec = _timed_forward(lm, body, cache, last_only=True)
                out[name] = _pass_record(lm, len(body), len(body), sec, cache, self._get_peaks, 1)
        self._tcache, self._dcache, self._prefill_record = tcache, dcache, out
        return out

    def fork(self) -> SpeculativeSession:
        """An independent copy that shares the two models: caches cloned, records and draw state copied."""
        new = copy.copy(self)
        new._ids, new.rounds, new._texts = list(self._ids), list(self.rounds), dict(self._texts)
        new._tcache, new._dcache = copy_cache(self._tcache), copy_cache(self._dcache)
        new.draws = self.draws.copy() if hasattr(self.draws, "copy") else copy.deepcopy(self.draws)
        new._trace = dataclasses.replace(
            self._trace,
            steps=list(self._trace.steps),
            rounds=[],
            settings=dict(self._trace.settings),
        )
        return new

    def _round_k(self) -> int:
        """k for this round: no more drafts than positions left, nor than max_new_tokens still allows
        (less the residual/bonus token); 0 means a plain target step."""
        k = min(self.k, self.max_positions - len(self._ids))
        if self.max_new_tokens is not None:
            k = min(k, self.max_new_tokens - len(self.tokens) - 1)
        return max(k, 0)

    def _propose(self, k: int) -> _Proposal:
        """k draft passes: each feeds the ids the draft cache lacks and draws x_i from q_i. Prompt
        lookup: up to k ids copied from the context, each with a one-hot q (no pass, no randomness)."""
        if self.lookup is not None:
            return self._propose_lookup(k)
        prop, ctx = _Proposal(), list(self._ids)
        greedy = self.sampling.is_greedy
        for _ in range(k):
            have = self._dcache.get_seq_length()
            feed = ctx[have:]  # 1 id, or 2 after a fully accepted round
            logits, sec = _timed_forward(
                self.draft, feed, self._dcache, last_only=True
            )  # [1, 1, V]
            q, stages = _final_probs(logits[:, -1], ctx, self.sampling)
            draw = self._draw(stages[-1][1])
            x = int(draw.tokens[0])
            prop.passes.append(
                _pass_record(self.draft, len(feed), len(ctx), sec, self._dcache, self._get_peaks, 1)
            )
            prop.tokens.append(x)
            prop.q.append(q)
            prop.draws.append(_draw_dict(draw, greedy, "q"))
            ctx.append(x)
        return prop

    def _propose_lookup(self, k: int) -> _Proposal:
        tokens, where = self.lookup.propose(self._ids, k)
        vocab = _vocab_size(self.target)
        prop = _Proposal(lookup=where)
        for x in tokens:
            q = torch.zeros(vocab, device=self.target.device)
            q[x] = 1.0
            prop.tokens.append(x)
            prop.q.append(q)
            prop.draws.append(
                {"u": None, "cdf_lo": 0.0, "cdf_hi": 1.0, "greedy": self.sampling.is_greedy,
                 "of": "lookup"}
            )  # fmt: skip
        return prop

    def _verify(self, xs: list[int]) -> tuple[list[_Scored], dict]:
        """One target pass over [last id, x_1..x_k]: the final distributions p_1 .. p_{k+1}."""
        feed = self._ids[-1:] + xs
        logits, sec = _timed_forward(self.target, feed, self._tcache)  # [1, k+1, V]
        ctx_len = len(self._ids) + len(xs)
        record = _pass_record(
            self.target, len(feed), ctx_len, sec, self._tcache, self._get_peaks, len(feed)
        )
        scored = []
        for i in range(len(feed)):
            p, stages = _final_probs(logits[:, i], self._ids + xs[:i], self.sampling)
            scored.append(_Scored(raw=logits[:, i], stages=stages, p=p))
        return scored, record

    def _accept(self, prop: _Proposal, scored: list[_Scored]) -> tuple[list[dict], int]:
        """Test the drafts in order: keep x_i with probability min(1, p/q) (greedy: iff it is the target's argmax)."""
        drafts, n, rejected = [], 0, False
        greedy = self.sampling.is_greedy
        for i, x in enumerate(prop.tokens):
            p, q = float(scored[i].p[x]), float(prop.q[i][x])
            entry = {
                "id": x,
                "text": self._text(x),
                "q": q,
                "p": p,
                "accept_prob": min(1.0, p / q) if q > 0 else 0.0,
                "overlap": float(torch.minimum(scored[i].p, prop.q[i]).sum()),
                "u": None,
                "accepted": None,
                "draw": prop.draws[i],
            }
            if not rejected:
                if greedy:
                    ok = int(self._draw(scored[i].stages[-1][1]).tokens[0]) == x
                else:
                    entry["u"], ok = self.draws.accept(p, q)
                entry["accepted"] = bool(ok)
                rejected = not ok
                n += int(ok)
            drafts.append(entry)
        return drafts, n

    def _resample(self, at: _Scored, q: torch.Tensor, position: int) -> tuple[int, dict]:
        """After rejecting x_{n+1}: draw from normalise(max(0, p - q)). Greedy: p and q are one-hot at their
        argmaxes, so the residual is one-hot at the target's argmax (mass 1)."""
        greedy = self.sampling.is_greedy
        if greedy:
            draw = self._draw(at.stages[-1][1])
            dist = torch.zeros_like(at.p).scatter_(
                0, draw.tokens.to(at.p.device), 1.0
            )  # [V] one-hot
            mass, fallback = 1.0, False
        else:
            residual = (at.p - q).clamp(min=0)  # [V]
            mass = float(residual.sum())
            fallback = (
                mass <= RESIDUAL_EPS
            )  # p == q up to rounding: the rejection had probability ~0
            dist = at.p if fallback else residual / mass
            draw = self._draw(_logits_of(dist))
        y = int(draw.tokens[0])
        top = torch.topk(dist, min(self.top_n, dist.numel()))
        entries = [
            {
                "id": int(i),
                "text": self._text(int(i)),
                "p": float(at.p[i]),
                "q": float(q[i]),
                "residual": float(v),
            }
            for v, i in zip(top.values, top.indices)
            if v > 0
        ]
        return y, {
            "position": position,
            "id": y,
            "text": self._text(y),
            "mass": mass,
            "fallback": fallback,
            "top": entries,
            "draw": _draw_dict(draw, greedy, "residual"),
        }

    def _bonus(self, at: _Scored) -> tuple[int, dict]:
        """All k drafts kept: one more token from the target's last distribution p_{k+1}."""
        greedy = self.sampling.is_greedy
        draw = self._draw(at.stages[-1][1])
        y = int(draw.tokens[0])
        return y, {
            "id": y,
            "text": self._text(y),
            "p": float(at.p[y]),
            "draw": _draw_dict(draw, greedy, "p"),
        }

    def _draw(self, final_logits: torch.Tensor) -> Draw:
        """argmax in greedy mode (no randomness used), else a draw from self.draws."""
        if self.sampling.is_greedy:
            return choose_token(final_logits, True, None)
        return self.draws.token(final_logits)

    def _apply_stops(self, emitted: list[int]) -> tuple[list[int], str | None]:
        """Cut the emitted ids at EOS, max_new_tokens or the position limit."""
        out = []
        for t in emitted:
            out.append(t)
            if t in self.eos_ids:
                return out, "eos"
            if (
                self.max_new_tokens is not None
                and len(self.tokens) + len(out) >= self.max_new_tokens
            ):
                return out, "max_new_tokens"
            if len(self._ids) + len(out) >= self.max_positions:
                return out, "max_positions"
        return out, None

    def _commit(self, rnd: Round, scored: list[_Scored], prop: _Proposal) -> None:
        """Append the ids, crop both caches to the accepted prefix, adapt k, record the round and its Steps."""
        base = len(self._ids)
        self._ids.extend(rnd.tokens)
        keep = len(self._ids) - 1
        crop_cache(self._tcache, min(keep, self._tcache.get_seq_length()))
        if self._dcache is not None:
            crop_cache(self._dcache, min(keep, self._dcache.get_seq_length()))
        if self.adaptive and rnd.k > 0:
            self.k = min(self.k + 1, self.k_max) if rnd.accepted == rnd.k else max(self.k - 1, 1)
        rnd.k_next = self.k
        rnd.verify_pass["kv_cache_bytes_after"] = kv_cache_bytes(self._tcache)
        self.rounds.append(rnd)
        share = (rnd.draft_s + rnd.verify_s) / len(rnd.tokens)
        for i, t in enumerate(rnd.tokens if self.record_steps else []):
            origin = (
                "draft"
                if i < rnd.accepted
                else ("residual" if rnd.residual is not None else "bonus")
            )
            draw = (
                rnd.drafts[i]["draw"] if origin == "draft" else (rnd.residual or rnd.bonus)["draw"]
            )
            self._trace.steps.append(
                self._token_step(base + i, t, scored[i], rnd, origin, draw, share)
            )
        if rnd.stop:
            self.stop_reason = self._trace.stop_reason = rnd.stop
            if self._trace.steps:
                self._trace.steps[-1].stop = rnd.stop

    def _token_step(
        self, pos: int, tok: int, at: _Scored, rnd: Round, origin: str, draw: dict, share: float
    ) -> Step:
        """A Step for one emitted id, from the target's scoring of its position (probabilities are the target's;
        latency_s is the round's forward time shared evenly over the ids it emitted; cost fields stay None,
        the per-pass costs are in the Round)."""
        raw_p, fin = at.raw.softmax(dim=-1)[0], at.stages[-1][1]  # [V], [1, V]
        top = torch.topk(raw_p, self.top_n)
        ent = entropy(torch.cat([at.raw, fin]))  # [2]
        return Step(
            index=len(self._trace.steps),
            phase="speculative",
            tokens_fed=rnd.verify_pass["tokens_fed"],
            context_len=pos + 1,
            token_id=tok,
            token_text=self._text(tok),
            prob_raw=float(raw_p[tok]),
            prob_final=float(at.p[tok]),
            rank_raw=int((at.raw[0] > at.raw[0, tok]).sum()),
            rank_final=int((fin[0] > fin[0, tok]).sum()),
            entropy_raw=float(ent[0]),
            entropy_final=float(ent[1]),
            top=[
                {"id": i, "text": self._text(i), "raw": a, "final": float(at.p[i])}
                for a, i in zip(top.values.tolist(), top.indices.tolist())
            ],
            stages=stage_summary(at.raw, at.stages),
            draw=draw,
            latency_s=share,
            kv_cache_bytes=rnd.verify_pass["kv_cache_bytes_after"],
            device=str(self.target.device),
            dtype=self.target.info.dtype,
            round=rnd.index,
            origin=origin,
        )

    # --- state for rollback ---

    def _save(self) -> tuple:
        lens = tuple(
            None if c is None else c.get_seq_length() for c in (self._tcache, self._dcache)
        )
        return (
            len(self._ids),
            lens,
            self.draws.get_state() if hasattr(self.draws, "get_state") else None,
            self.k,
            len(self.rounds),
            len(self._trace.steps),
            self.stop_reason,
            self._prefill_record,
        )

    def _restore(self, saved: tuple) -> None:
        n_ids, (tlen, dlen), draws, k, n_rounds, n_steps, stop, self._prefill_record = saved
        del self._ids[n_ids:]
        self._tcache = None if tlen is None else crop_cache(self._tcache, tlen)
        self._dcache = None if dlen is None else crop_cache(self._dcache, dlen)
        if draws is not None:
            self.draws.set_state(draws)
        self.k, self.stop_reason = k, stop
        del self.rounds[n_rounds:], self._trace.steps[n_steps:]
        self._trace.stop_reason = stop

    def _text(self, token_id: int) -> str:
        """Text of one id (cached; target and draft share the tokenizer, check_pair made sure)."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = token_text(self.target, token_id)
        return text

    def _get_peaks(self):
        if self._peaks is None:
            self._peaks = _peaks(self.target.device, next(self.target.model.parameters()).dtype)
            self._trace.hardware = (
                self._peaks.to_dict() if hasattr(self._peaks, "to_dict") else None
            )
        return self._peaks

    def _settings(self) -> dict:
        return {
            **self.sampling.to_dict(),
            "k": self.k,
            "k_requested": self.k_requested,
            "adaptive": self.adaptive,
            "k_max": self.k_max,
            "top_n": self.top_n,
            "max_new_tokens": self.max_new_tokens,
            "use_cache": True,
            "batch_size": 1,
            "speculative": True,
            "draft_model": (
                {"name": self.lookup.name, "prompt_lookup": asdict(self.lookup)}
                if self.lookup is not None
                else self.draft.info.to_dict()
            ),
        }


# --- statistics over rounds ----------------------------------------------------------------------


def round_stats(rounds: list[Round]) -> dict[str, Any]:
    """alpha = accepted / tested drafts (the MLE of a per-token acceptance rate under censoring at the first
    rejection); alpha_overlap = mean of sum_x min(p, q) over the tested positions (the same rate, from the
    distributions rather than the draws); accepted-length histogram; draft / verify time."""
    spec = [r for r in rounds if r.k > 0]
    tested = sum(r.tested for r in spec)
    accepted = sum(r.accepted for r in spec)
    overlaps = [d["overlap"] for r in spec for d in r.drafts[: r.tested]]
    hist = [0] * (max((r.k for r in rounds), default=0) + 1)
    for r in spec:
        hist[r.accepted] += 1
    emitted = sum(len(r.tokens) for r in rounds)
    return {
        "rounds": len(rounds),
        "emitted": emitted,
        "proposed": sum(r.k for r in spec),
        "tested": tested,
        "accepted": accepted,
        "alpha": accepted / tested if tested else None,
        "alpha_overlap": statistics.fmean(overlaps) if overlaps else None,
        "mean_accepted": statistics.fmean(r.accepted for r in spec) if spec else None,
        "mean_tokens_per_round": emitted / len(rounds) if rounds else None,
        "accepted_histogram": hist,
        "draft_s": sum(r.draft_s for r in rounds),
        "verify_s": sum(r.verify_s for r in rounds),
        "draft_passes": sum(len(r.draft_passes) for r in rounds),
        "verify_passes": len(rounds),
    }


# --- target-only decoding (the baseline) and the benchmark ----------------------------------------


def decode_target_only(
    target: LoadedModel, prompt_ids: list[int], n_tokens: int, sampling: Sampling
) -> tuple[list[int], list[float]]:
    """Plain cached decoding with the target alone, set up like a SpeculativeSession (prompt[:-1] prefilled,
    then one 1-token pass per new id). Returns (ids, per-pass decode latencies in seconds; prefill excluded)."""
    gen = make_generator(sampling.seed)
    cache, ids, lat = DynamicCache(), list(prompt_ids), []
    if len(ids) > 1:
        _timed_forward(target, ids[:-1], cache, last_only=True)
    eos = eos_ids(target)
    for _ in range(n_tokens):
        logits, sec = _timed_forward(target, ids[-1:], cache, last_only=True)
        _, stages = _final_probs(logits[:, -1], ids, sampling)
        ids.append(int(choose_token(stages[-1][1], sampling.is_greedy, gen).tokens[0]))
        lat.append(sec)
        if ids[-1] in eos:
            break
    return ids[len(prompt_ids) :], lat


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def benchmark(
    target: LoadedModel,
    draft: LoadedModel,
    prompt: str | list[int],
    sampling: Sampling,
    ks=range(1, 9),
    *,
    n_tokens: int = 48,
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """Per k: alpha, mean accepted length, predicted and measured speedup against target-only decoding of the
    same length, in the same run (each repeat runs baseline and speculative back to back, k by k).

    Measured speedup = (target-only decode time per token) / (speculative time per token), both over the timed
    forward passes only (device-synchronised perf_counter; prefill excluded); `measured_wall` also counts the
    sampling chain and bookkeeping of both. c = median draft pass / median target decode pass; v = median
    verify pass / median target decode pass, all measured in this run.
    """
    ks = [check_k(k) for k in ks]
    ids = encode(target, prompt)
    names = ("rounds", "base", "base_tok", "spec", "base_wall", "spec_wall", "draft", "verify")
    per_k: dict[int, dict[str, list]] = {k: {name: [] for name in names} for k in ks}
    _warm_up(target, draft, ids)
    for rep in range(repeats):
        s = Sampling(**{**sampling.to_dict(), "seed": (sampling.seed or 0) + rep})
        for k in ks:
            acc = per_k[k]
            t0 = time.perf_counter()
            base_ids, base_lat = decode_target_only(target, ids, n_tokens, s)
            acc["base_wall"].append((time.perf_counter() - t0) / len(base_ids))
            acc["base"].extend(base_lat)
            acc["base_tok"].append(sum(base_lat) / len(base_lat))
            sess = SpeculativeSession(
                target, draft, ids, s, k=k, max_new_tokens=n_tokens, top_n=1, record_steps=False
            )
            t0 = time.perf_counter()
            sess.run(n_tokens)
            wall = time.perf_counter() - t0 - sum(_prefill_s(r) for r in sess.rounds)
            acc["spec_wall"].append(wall / len(sess.tokens))
            acc["spec"].append(sum(r.draft_s + r.verify_s for r in sess.rounds) / len(sess.tokens))
            acc["rounds"].extend(sess.rounds)
            acc["draft"].extend(
                p["latency_s"] for r in sess.rounds for p in r.draft_passes if p["tokens_fed"] == 1
            )
            acc["verify"].extend(
                r.verify_s for r in sess.rounds if r.verify_pass["tokens_fed"] == k + 1
            )
    return [_bench_row(k, per_k[k], sampling, n_tokens, repeats, target) for k in ks]


LOOKUP_PROMPTS = {  # offline; "repetitive" is the case prompt lookup is made for
    "repetitive (code)": (
        "import os\nimport sys\nimport re\nimport json\nimport time\nimport math\n"
        "import os\nimport sys\nimport re\nimport"
    ),
    "repetitive (list)": (
        "red, green, blue, red, green, blue, red, green, blue, red, green, blue, red,"
    ),
    "prose": (
        "The quick brown fox jumps over the lazy dog while the sun sets behind the hills, and"
    ),
}


def lookup_benchmark(
    lm: LoadedModel,
    prompts: dict[str, str | list[int]] | None = None,
    *,
    k: int = 4,
    ngram: int = 3,
    new_tokens: int = 48,
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """Prompt-lookup decoding vs plain greedy decoding, per prompt: the same `new_tokens` greedy
    tokens (EOS ignored) both ways, timed alternately (ABBA, wall clock after a device sync) after
    one warm-up of each. Rows: prompt, alpha, tokens_per_round, rounds, greedy_equal, both medians,
    speedup = plain / lookup (measured)."""
    from explorer.costs.timing import alternate, time_call
    from explorer.engine.session import Session

    check_k(k)
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number >= 1, got {repeats!r}")
    prompts = prompts or (
        LOOKUP_PROMPTS if lm.tokenizer is not None else {"ids 1..8 twice": list(range(1, 9)) * 2}
    )
    draft, greedy = PromptLookup(ngram), Sampling(greedy=True)
    rows = []
    for name, prompt in prompts.items():

        def plain(prompt=prompt):
            s = Session(lm, prompt, greedy, max_new_tokens=new_tokens, stop_at_eos=False)
            s.run()
            return s

        def lookup(prompt=prompt):
            s = SpeculativeSession(
                lm, draft, prompt, greedy, k=k, max_new_tokens=new_tokens, stop_at_eos=False,
                record_steps=False,
            )  # fmt: skip
            while not s.done:
                s.step()
            return s

        base, spec = plain(), lookup()  # warm-up, and the outputs compared
        times = alternate(
            {
                "plain": lambda f=plain: time_call(f, lm.device)[1],
                "lookup": lambda f=lookup: time_call(f, lm.device)[1],
            },
            repeats,
        )
        st = round_stats(spec.rounds)
        t_plain, t_lookup = statistics.median(times["plain"]), statistics.median(times["lookup"])
        rows.append(
            {
                "prompt": name,
                "model": lm.info.name,
                "device": str(lm.device),
                "k": k,
                "ngram": ngram,
                "new_tokens": new_tokens,
                "repeats": repeats,
                "rounds": len(spec.rounds),
                "found": sum(1 for r in spec.rounds if r.lookup),
                "alpha": st["alpha"],
                "tokens_per_round": len(spec.tokens) / len(spec.rounds),
                "greedy_equal": spec.tokens == base.tokens,
                "plain_s": t_plain,
                "lookup_s": t_lookup,
                "speedup": t_plain / t_lookup,
                "timer": Timer(lm.device).method,
            }
        )
    return rows


def _prefill_s(r: Round) -> float:
    return sum(p["latency_s"] for p in (r.prefill or {}).values() if p) if r.prefill else 0.0


def _warm_up(target: LoadedModel, draft: LoadedModel, ids: list[int]) -> None:
    """Untimed: a few passes of each model, and the machine's peaks (measured once per process)."""
    _peaks(target.device, next(target.model.parameters()).dtype)
    for lm in (target, draft):
        for _ in range(2):
            decode_target_only(lm, ids, 4, Sampling(greedy=True))


def _bench_row(
    k: int, acc: dict, sampling: Sampling, n_tokens: int, repeats: int, target: LoadedModel
) -> dict:
    st = round_stats(acc["rounds"])
    t_dec, t_draft, t_ver = _median(acc["base"]), _median(acc["draft"]), _median(acc["verify"])
    c = t_draft / t_dec if t_draft and t_dec else None
    v = t_ver / t_dec if t_ver and t_dec else None
    alpha = st["alpha"]
    ok = alpha is not None and c is not None
    return {
        "k": k,
        "greedy": sampling.is_greedy,
        "temperature": sampling.temperature,
        "alpha": alpha,
        "alpha_overlap": st["alpha_overlap"],
        "mean_accepted": st["mean_accepted"],
        "mean_tokens_per_round": st["mean_tokens_per_round"],
        "accepted_histogram": st["accepted_histogram"],
        "c": c,
        "v": v,
        "target_decode_s": t_dec,
        "draft_pass_s": t_draft,
        "verify_pass_s": t_ver,
        "predicted": expected_speedup(alpha, k, c) if ok else None,
        "predicted_with_verify_cost": expected_speedup(alpha, k, c, v) if ok and v else None,
        "measured": statistics.median(acc["base_tok"]) / statistics.median(acc["spec"]),
        "measured_wall": statistics.median(acc["base_wall"]) / statistics.median(acc["spec_wall"]),
        "n_tokens": n_tokens,
        "repeats": repeats,
        "device": str(target.device),
        "dtype": target.info.dtype,
        "timing": "forward passes, perf_counter after device sync; medians over repeats; prefill excluded",
    }


def measure_cost_ratio(
    target: LoadedModel,
    draft: LoadedModel,
    ks=range(1, 9),
    *,
    context_len: int = 64,
    repeats: int = 5,
    warmup: int = 1,
) -> dict[str, Any]:
    """Time the passes speculative decoding is made of, for any two models (vocabularies need not match):
    a draft decode pass (1 token), a target decode pass (1 token) and a target verify pass (k+1 tokens),
    each over a cached prefix of context_len random ids. The passes are interleaved (one of each per
    repeat) so load on a shared machine hits all of them alike; medians over repeats. Returns c, v(k) and
    the alpha from which speculative decoding pays off, per k, by expected_speedup()."""
    from explorer.costs.timing import time_call

    ks = [check_k(k) for k in ks]
    jobs = {"draft": _pass_job(draft, 1, context_len), "decode": _pass_job(target, 1, context_len)}
    jobs.update({f"verify{k}": _pass_job(target, k + 1, context_len) for k in ks})
    samples: dict[str, list[float]] = {name: [] for name in jobs}
    for rep in range(warmup + repeats):
        for name, (once, device) in jobs.items():
            sec = time_call(once, device)[1]
            if rep >= warmup:
                samples[name].append(sec)
    t_draft, t_dec = statistics.median(samples["draft"]), statistics.median(samples["decode"])
    c = t_draft / t_dec
    rows = []
    for k in ks:
        t_ver = statistics.median(samples[f"verify{k}"])
        v = t_ver / t_dec
        rows.append(
            {
                "k": k,
                "verify_pass_s": t_ver,
                "v": v,
                "c_vs_verify": t_draft / t_ver,
                "predicted_at_alpha": {a: expected_speedup(a, k, c) for a in (0.6, 0.8, 0.9)},
                "breakeven_alpha": breakeven_alpha(k, c),
                "breakeven_alpha_with_verify_cost": breakeven_alpha(k, c, v),
            }
        )
    return {
        "target": target.info.name,
        "draft": draft.info.name,
        "device": str(target.device),
        "dtype": target.info.dtype,
        "threads": torch.get_num_threads(),
        "context_len": context_len,
        "repeats": repeats,
        "warmup": warmup,
        "draft_pass_s": t_draft,
        "target_decode_s": t_dec,
        "c": c,
        "spread_s": {name: [min(x), max(x)] for name, x in samples.items()},
        "per_k": rows,
        "timing": f"passes interleaved, median of {repeats} repeats after {warmup} warm-up, "
        "perf_counter after device sync",
    }


def _pass_job(lm: LoadedModel, fed: int, context_len: int):
    """A closure running one pass of `fed` random ids over a cached prefix (cropped back after each call)."""
    gen = torch.Generator().manual_seed(fed)
    vocab = min(_vocab_size(lm), 1000)
    prefix = torch.randint(0, vocab, (context_len,), generator=gen).tolist()
    new = torch.tensor(
        [torch.randint(0, vocab, (fed,), generator=gen).tolist()], device=lm.device
    )  # [1, fed]
    cache = DynamicCache()
    _timed_forward(lm, prefix, cache, last_only=True)

    def once():  # a decode pass needs the last position's logits only; a verify pass needs all of them
        forward(lm.model, new, cache, last_only=fed == 1)
        crop_cache(cache, context_len)

    return once, lm.device


def parse_ks(text: str) -> list[int]:
    """'1..8' -> [1..8]; '1,2,4' -> [1, 2, 4]; '3' -> [3]."""
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split("..", 1))
            ks = list(range(lo, hi + 1))
        else:
            ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(
            f"--k takes a number, a list like 1,2,4 or a range like 1..8, got {text!r}"
        ) from None
    if not ks:
        raise ValueError(f"--k {text!r} names no k")
    return [check_k(k) for k in ks]
