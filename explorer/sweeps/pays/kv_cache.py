"""kv-cache: the KV cache itself, on vs off, over sequence length.

At length L the baseline is the pass a cache-less generate() makes for token L + 1: all L tokens
fed again (their K/V recomputed: L x the matmul FLOPs of a decode step, and L x L attention
scores). The trick is the cached decode step at the same position: 1 token fed, L - 1 cached
tokens' K/V read. Per token the cached work grows linearly with L and the uncached quadratically
(so over a whole generation: quadratic vs cubic... in FLOPs; explorer sweep cache times that).
"""

from __future__ import annotations

from explorer._format import ms
from explorer.costs.tricks import ratio
from explorer.sweeps.pays import Axis, Trick, TrickContext, figures, register_trick
from explorer.sweeps.pays._context import one_pass
from explorer.sweeps.pays._why import regime_phrase


def setup(ctx: TrickContext):
    def point(length: int) -> dict:
        base = one_pass(ctx.lm, 1, length, length, use_cache=False, seed=ctx.seed)
        fast = one_pass(ctx.lm, 1, 1, length, seed=ctx.seed)
        base_s, fast_s = ctx.time_pair(base, fast)
        parts = ctx.split(base_s, batch=1, tokens_fed=length, context_len=length, use_cache=False)
        predicted = ratio(
            ctx.predict(batch=1, tokens_fed=length, context_len=length, use_cache=False),
            ctx.predict(batch=1, tokens_fed=1, context_len=length),
        )
        why = (
            f"length {length}: without the cache the pass recomputes all {length} tokens "
            f"({length}x a cached step's matmul FLOPs), {regime_phrase(parts)}; the cached step "
            f"feeds 1 token and reads {length - 1} tokens of K/V ({ms(fast_s)})"
        )
        return figures(base_s, fast_s, predicted, parts["regime"], why)

    return point


register_trick(
    Trick(
        name="kv-cache",
        title="KV cache (on vs off)",
        baseline="the same position without a cache (all tokens fed again)",
        axes=(
            Axis(
                "length",
                "ints",
                (2, 8, 32, 128, 512),
                "sequence length L: the pass that makes token L + 1",
                low=2,
                high=lambda info: info.max_positions or None,
            ),
        ),
        setup=setup,
        unit="the forward pass that makes the next token, batch 1",
        order=10,
    )
)
