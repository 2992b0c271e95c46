"""static-cache and prefix-cache: two ways to keep K/V, against the DynamicCache and a full prefill.

static-cache, over context length L: one decode step (batch 1) onto L - 1 cached tokens, with
transformers' StaticCache preallocated to the longest context swept (as a server allocates for its
longest request) against the DynamicCache. Eager, the static cache saves the DynamicCache's
torch.cat (a copy of the whole cache each step) but its attention runs over every preallocated
slot, masked: it pays at long contexts and costs at short ones. Its real payoff is fixed shapes
for torch.compile / CUDA graphs (trick `compile`); this trick measures the cache alone.

prefix-cache, over the shared-prefix length P (every request hits) and over the hit fraction h
(at P = PREFIX): the prefill of P + SUFFIX tokens against a copy of the prefix's cached K/V
(explorer.engine.prefix.PrefixCache.start) plus the prefill of the SUFFIX new tokens. Rows over h
are modelled from the measured hit and miss: h t_hit + (1 - h) t_full.

predicted_speedup: the calibrated cost model over the passes each side runs, plus the bytes the
cost model's forward pass does not count (explorer.costs.tricks: the DynamicCache's copy, the
prefix copy).
"""

from __future__ import annotations

from transformers import StaticCache

from explorer._format import ms
from explorer.costs.tricks import (
    kv_copy_bytes,
    prefix_expected_s,
    prefix_speedup,
    ratio,
)
from explorer.engine.prefix import PrefixCache
from explorer.model.passes import forward
from explorer.sweeps._common import token_ids
from explorer.sweeps.pays import (
    MEASURED,
    MODELLED,
    Axis,
    Trick,
    TrickContext,
    figures,
    register_trick,
)
from explorer.sweeps.pays._context import context_memory, one_pass
from explorer.sweeps.pays._why import regime_phrase

SUFFIX, PREFIX = 16, 256


def _calibrated(ctx: TrickContext, fed: int, context: int, extra_bytes: float = 0.0) -> float:
    """The calibrated latency of a batch-1 pass plus extra_bytes moved."""
    return ctx.predict(batch=1, tokens_fed=fed, context_len=context, extra_bytes=extra_bytes)


# --- static cache --------------------------------------------------------------------------------


def static_setup(ctx: TrickContext):
    lm = ctx.lm
    cache_len = ctx.options.get("cache_len", max(ctx.values))
    ctx.attrs["static_cache_len"] = cache_len

    def point(length: int) -> dict:
        static = StaticCache(config=lm.model.config, max_cache_len=cache_len)
        base = one_pass(lm, 1, 1, length, seed=ctx.seed)
        fast = one_pass(lm, 1, 1, length, seed=ctx.seed, cache=static)
        base_s, fast_s = ctx.time_pair(base, fast)
        split = ctx.split(base_s, batch=1, tokens_fed=1, context_len=length)
        copy = kv_copy_bytes(lm.info.kv_bytes_per_token, length - 1)
        predicted = ratio(
            _calibrated(ctx, 1, length, copy), _calibrated(ctx, 1, cache_len)
        )  # static: attention over every preallocated slot
        why = (
            f"context {length} of a {cache_len}-slot static cache: decode is {regime_phrase(split)}; "
            f"the DynamicCache copies its {length - 1} cached tokens' K/V ({copy / 1e6:.3g} MB) "
            f"each step, the static cache attends over all {cache_len} slots, masked"
        )
        return figures(base_s, fast_s, predicted, split["regime"], why)

    return point


# --- prefix cache --------------------------------------------------------------------------------


class _Prefix:
    def __init__(self, ctx: TrickContext, prefix: int):
        lm, self.ctx, self.prefix = ctx.lm, ctx, prefix
        run = one_pass(lm, 1, prefix + SUFFIX, prefix + SUFFIX, seed=ctx.seed)
        self.full = run  # the prefill of prefix + suffix onto an empty cache
        ids = token_ids(lm.info, 1, prefix + SUFFIX, lm.device, ctx.seed)  # [1, P + S]
        self.pc = PrefixCache(lm, ids[0, :prefix].tolist())
        rows = [ids[0].tolist()]

        def hit():
            return forward(lm.model, ids[:, prefix:], self.pc.start(lm, rows), last_only=True)

        self.hit = hit

    def times(self) -> tuple[float, float]:
        if not hasattr(self, "_times"):
            self._times = self.ctx.time_pair(self.full, self.hit)
        return self._times

    def predicted(self, h: float) -> float:
        p, total = self.prefix, self.prefix + SUFFIX
        copy = kv_copy_bytes(self.ctx.lm.info.kv_bytes_per_token, p)
        full = _calibrated(self.ctx, total, total)
        return prefix_speedup(full, _calibrated(self.ctx, SUFFIX, total, copy), h)

    def row(self, h: float) -> dict:
        full_s, hit_s = self.times()
        p, total = self.prefix, self.prefix + SUFFIX
        split = self.ctx.split(full_s, batch=1, tokens_fed=total, context_len=total)
        why = (
            f"a {total}-token prefill is {regime_phrase(split)}: a hit skips {p} of its {total} "
            f"tokens ({ms(full_s)} -> {ms(hit_s)}, the {self.pc.bytes / 1e6:.3g} MB prefix copy "
            f"included)" + (f"; {h:.0%} of requests hit" if h < 1 else "")
        )
        return figures(
            full_s,
            prefix_expected_s(full_s, hit_s, h),
            self.predicted(h),
            split["regime"],
            why,
            MEASURED if h in (0, 1) else MODELLED,
        )


def prefix_setup(ctx: TrickContext):
    ctx.attrs["suffix_tokens"] = SUFFIX
    if ctx.axis == "prefix":
        return lambda p: _Prefix(ctx, p).row(1.0)
    prefix = ctx.options.get("prefix", PREFIX)
    if ctx.lm.info.max_positions:
        prefix = min(prefix, ctx.lm.info.max_positions - SUFFIX)
    ctx.attrs["prefix_tokens"] = prefix
    one = _Prefix(ctx, prefix)
    return one.row


def _positions_left(reserve: int):
    return lambda info: info.max_positions - reserve if info.max_positions else None


register_trick(
    Trick(
        name="static-cache",
        title="Static KV cache (eager)",
        baseline="the DynamicCache",
        axes=(
            Axis(
                "context",
                "ints",
                (16, 64, 256, 512),
                "context length of the decode step (the static cache holds the longest)",
                low=2,
                high=_positions_left(0),
                memory=context_memory,
            ),
        ),
        setup=static_setup,
        unit="one decode step, batch 1",
        order=50,
    )
)
register_trick(
    Trick(
        name="prefix-cache",
        title="Prefix caching",
        baseline=f"the full prefill (prefix + {SUFFIX} new tokens)",
        axes=(
            Axis(
                "prefix",
                "ints",
                (16, 64, 256),
                f"shared-prefix length (every request hits; {SUFFIX} new tokens after it)",
                high=_positions_left(SUFFIX),
            ),
            Axis(
                "hit",
                "floats",
                (0.0, 0.25, 0.5, 0.75, 1.0),
                f"fraction of requests whose prefix is cached (prefix {PREFIX})",
                low=0,
                high=1,
            ),
        ),
        setup=prefix_setup,
        unit="the prefill before the first token, batch 1",
        order=60,
    )
)
