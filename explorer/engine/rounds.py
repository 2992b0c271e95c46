"""One speculative round: its randomness (RandomDraws), the Round record, its per-pass records, and
statistics over rounds.

A pass record is what one forward pass fed, its measured latency (device-synchronised) and its
modelled cost (explorer.costs). round_stats() turns a run's Rounds into the acceptance rate alpha
and the accepted-length histogram that the speedup theory (explorer.costs.speculation) takes.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from transformers import DynamicCache

from explorer.costs.timing import Timer
from explorer.engine.sampling import Draw, choose_token, make_generator
from explorer.model.loader import LoadedModel
from explorer.model.passes import forward, kv_cache_bytes


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


def pass_record(
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


def timed_forward(
    lm: LoadedModel, ids: list[int], cache: DynamicCache, last_only: bool = False
) -> tuple[torch.Tensor, float]:
    """Feed `ids` on top of the cache; returns (logits [1, T, V] or [1, 1, V], device-synchronised seconds)."""
    x = torch.tensor([ids], dtype=torch.long, device=lm.device)  # [1, T]
    timer = Timer(lm.device)
    with timer.region():
        logits, _ = forward(lm.model, x, cache, last_only=last_only)
    return logits, timer.seconds
