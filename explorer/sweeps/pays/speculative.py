"""speculative and lookup: speculative decoding (the bundled draft model, or prompt lookup) against
the target alone, over batch size and draft length k.

Measured parts, at each batch B (context CONTEXT, seeded ids): t_1, the target's 1-token pass;
t_v, its (k+1)-token verify pass; t_d, the draft's 1-token pass (prompt lookup: 0, a CPU n-gram
search, not timed). alpha, the per-token acceptance rate, is measured at batch 1 on PROMPTS
(greedy; rows accept or reject independently, so a batch shares it). Then per generated token:

    baseline_s = t_1,  trick_s = (t_v + k t_d) / E[tokens per round]   (modelled from measured parts)

At batch 1 the row is the real SpeculativeSession's measured speedup instead (explorer.bench.
speculative: both decoders alternately, forward passes timed), with the parts-model in `why`.
attrs parts_speedup, draft_cost (t_d / t_1) and verify_cost (t_v / t_1), by batch, keep the
parts-model at every batch, batch 1 included: the like-for-like line.
predicted_speedup: the same formula (explorer.costs.tricks.speculative_speedup) over the
calibrated cost model's pass times. No batched speculative engine exists here: rows at B > 1
say "modelled from measured parts".
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from explorer._format import ms
from explorer.bench.speculative import LOOKUP_PROMPTS, benchmark, lookup_benchmark
from explorer.costs.speculation import expected_tokens_per_round
from explorer.costs.tricks import speculative_speedup
from explorer.engine.drafts import PromptLookup
from explorer.engine.sampling import Sampling
from explorer.engine.speculative import SpeculativeSession
from explorer.model.loader import load
from explorer.sweeps.pays import (
    MEASURED,
    MODELLED,
    Axis,
    Trick,
    TrickContext,
    figures,
    register_trick,
)
from explorer.sweeps.pays._context import decode_memory, one_pass

CONTEXT, K, NEW_TOKENS = 64, 4, 32
PROMPTS = (  # a fixed prompt set for alpha (prose and code, as the bundled models were trained on)
    "The quick brown fox jumps over the lazy dog while the sun sets behind the hills, and",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Lists are mutable sequences, typically used to store collections of",
)


@dataclass(frozen=True)
class PassTimes:
    """The target's passes the speedup formula reads (s, medians at one batch size)."""

    one_token_s: float  # t_1: the target's one-token decode pass
    verify_s: float  # t_v: its (k + 1)-token verify pass
    draft_s: float  # t_d: the draft's one-token pass (0 for prompt lookup)


class _Spec:
    """The measured parts of one trick (model draft or prompt lookup) on ctx.lm."""

    def __init__(self, ctx: TrickContext, lookup: bool):
        self.ctx, self.lookup = ctx, lookup
        lm = ctx.lm
        if lookup:
            self.draft = PromptLookup(3)
            self.prompts = (
                list(LOOKUP_PROMPTS.values()) if lm.tokenizer else [list(range(1, 9)) * 2]
            )
        else:
            self.draft = ctx.options.get("draft") or load(
                "bundled:draft", device=lm.device, dtype=lm.info.dtype
            )
            self.prompts = list(PROMPTS) if lm.tokenizer else [list(range(1, 9))]
            ctx.attrs["draft"] = self.draft.info.name
        self.n_tokens = ctx.options.get("new_tokens", NEW_TOKENS)
        self._alpha: dict[int, float] = {}
        ctx.attrs.update(context_len=CONTEXT, alpha={}, new_tokens=self.n_tokens)

    def alpha(self, k: int) -> float:
        """Accepted / tested drafts over the prompt set at batch 1, greedy (measured counts)."""
        if k not in self._alpha:
            tested = accepted = 0
            for prompt in self.prompts:
                s = SpeculativeSession(
                    self.ctx.lm, self.draft, prompt, Sampling(greedy=True), k=k,
                    max_new_tokens=self.n_tokens, stop_at_eos=False, record_steps=False,
                    peaks=self.ctx.peaks(),  # its pass records use the sweep's peaks
                )  # fmt: skip
                s.run(self.n_tokens)
                st = s.stats()
                tested, accepted = tested + st["tested"], accepted + st["accepted"]
            self._alpha[k] = accepted / tested if tested else 0.0
            self.ctx.attrs["alpha"][k] = self._alpha[k]
        return self._alpha[k]

    def parts(self, batch: int, k: int) -> PassTimes:
        """t_1, t_v and t_d at this batch, measured alternately (medians)."""
        ctx, lm = self.ctx, self.ctx.lm
        one = one_pass(lm, batch, 1, CONTEXT, seed=ctx.seed)
        verify = one_pass(lm, batch, k + 1, CONTEXT + k, seed=ctx.seed)
        t1, tv = ctx.time_pair(one, verify)
        td = 0.0
        if not self.lookup:
            td = ctx.time(one_pass(self.draft, batch, 1, CONTEXT, seed=ctx.seed), self.draft)
        return PassTimes(one_token_s=t1, verify_s=tv, draft_s=td)

    def predicted(self, batch: int, k: int, alpha: float) -> float:
        ctx = self.ctx
        t1 = ctx.predict(batch=batch, tokens_fed=1, context_len=CONTEXT)
        tv = ctx.predict(batch=batch, tokens_fed=k + 1, context_len=CONTEXT + k)
        td = 0.0
        if not self.lookup:
            td = ctx.predict(batch=batch, tokens_fed=1, context_len=CONTEXT, lm=self.draft)
        return speculative_speedup(alpha, k, tv, td, t1)

    def session_speedup(self, k: int) -> tuple[float, float]:
        """(target-only s/token, speculative s/token) of the real sessions at batch 1 (medians)."""
        ctx, greedy = self.ctx, Sampling(greedy=True)
        if self.lookup:
            prompts = dict(enumerate(self.prompts))
            rows = lookup_benchmark(
                ctx.lm, prompts, k=k, new_tokens=self.n_tokens, repeats=ctx.repeats
            )
            base = statistics.fmean(r["plain_s"] for r in rows) / self.n_tokens
            return base, statistics.fmean(r["lookup_s"] for r in rows) / self.n_tokens
        speedups, bases = [], []
        for prompt in self.prompts:
            (row,) = benchmark(
                ctx.lm, self.draft, prompt, greedy, [k], n_tokens=self.n_tokens, repeats=ctx.repeats
            )
            speedups.append(row["measured"])
            bases.append(row["target_decode_s"])
        base = statistics.fmean(bases)
        return base, base / statistics.fmean(speedups)

    def point(self, batch: int, k: int) -> dict:
        alpha = self.alpha(k)
        p = self.parts(batch, k)
        modelled = speculative_speedup(alpha, k, p.verify_s, p.draft_s, p.one_token_s)
        for key, value in (("parts_speedup", modelled), ("draft_cost", p.draft_s / p.one_token_s)):
            self.ctx.attrs.setdefault(key, {})[batch] = value  # like for like at every batch
        self.ctx.attrs.setdefault("verify_cost", {})[batch] = p.verify_s / p.one_token_s
        split = self.ctx.split(p.one_token_s, batch=batch, tokens_fed=1, context_len=CONTEXT)
        if batch == 1:
            base_s, trick_s = self.session_speedup(k)
            how = MEASURED
        else:
            base_s, trick_s, how = p.one_token_s, p.one_token_s / modelled, MODELLED
        for _ in range(self.ctx.repeats if batch == 1 else 0):
            self.ctx.tick()  # the session runs, beside the parts' repeats
        return figures(
            base_s,
            trick_s,
            self.predicted(batch, k, alpha),
            split["regime"],
            _why(batch, k, alpha, p, split["regime"], modelled, self.lookup),
            how,
        )


def _why(batch, k, alpha, p: PassTimes, regime, modelled, lookup) -> str:
    v = p.verify_s / p.one_token_s
    paid = (
        "so rejected drafts are paid in full"
        if v > 0.6 * (k + 1)
        else "so drafts ride along on weights read once"
    )
    draft = (
        "prompt lookup costs no pass"
        if lookup
        else f"a draft pass costs {p.draft_s / p.one_token_s:.2f}"
    )
    return (
        f"batch {batch} decode is {regime}-bound here: a {k + 1}-token verify pass costs about "
        f"{v:.1f} times a 1-token pass ({ms(p.one_token_s)}), {paid}; alpha {alpha:.2f} gives "
        f"{expected_tokens_per_round(alpha, k):.2f} tokens per round and {draft} "
        f"(parts-model speedup {modelled:.2f})"
    )


def _setup(lookup: bool):
    def setup(ctx: TrickContext):
        spec = _Spec(ctx, lookup)
        if ctx.axis == "batch":
            k = ctx.options.get("k", K)
            ctx.attrs["k"] = k
            return lambda batch: spec.point(batch, k)
        batch = ctx.options.get("batch", 1)
        ctx.attrs["batch"] = batch
        return lambda k: spec.point(batch, k)

    return setup


AXES = (
    Axis(
        "batch",
        "ints",
        (1, 4, 16, 64),
        f"rows decoding together (k = {K})",
        memory=decode_memory(CONTEXT + K, K + 1),
    ),  # fmt: skip
    Axis("k", "ints", (1, 2, 4, 8), "draft tokens proposed per round (batch 1)", high=32),
)
UNIT = "one generated token per row (s)"
for _name, _title, _lookup in (
    ("speculative", "Speculative decoding (bundled draft model)", False),
    ("lookup", "Prompt-lookup decoding", True),
):
    register_trick(
        Trick(
            name=_name,
            title=_title,
            baseline="the target alone, one token per pass",
            axes=AXES,
            setup=_setup(lookup=_lookup),
            unit=UNIT,
            order=21 if _lookup else 20,
        )
    )
