"""Run one recorded step's forward pass again, for the views on demand (profiler, logit lens,
attention). The session is left exactly as it was: the replay works on a copy of its cache.

A Replay holds what step i fed: the context ids [B, L] (L = step.context_len), the attention mask,
the cached prefix length `past` and a private copy of the cache cropped to it. `run()` repeats the
step's own forward; `last_token()` gives a cache holding all but the newest token plus that token,
so a view that needs the newest token alone (attention weights) never builds an L x L matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from explorer.model.passes import copy_cache, forward, position_ids


@dataclass
class Replay:
    index: int  # the step replayed (len(steps) when it is the pending next step)
    ids: torch.Tensor  # [B, L] context of the step (prompt + chosen tokens fed so far)
    mask: torch.Tensor | None  # [B, L] or None (no padding)
    past: int  # positions already cached before the step
    cache: DynamicCache | None  # a copy holding `past` positions; None without a cache
    chosen: int | None  # row 0's token chosen at this step (None for the pending step)

    @property
    def feed(self) -> torch.Tensor:
        return self.ids[:, self.past :]  # [B, T]

    def fresh_cache(self) -> DynamicCache | None:
        """A new private copy of the step's starting cache (None without a cache)."""
        return copy_cache(self.cache) if self.cache is not None else None

    def run(self, model, **kwargs):
        """The step's forward again (on a fresh cache copy): returns transformers' output."""
        return self.run_on(model, self.fresh_cache(), **kwargs)

    def run_on(self, model, cache: DynamicCache | None, **kwargs):
        """The step's forward on a cache from fresh_cache() (a caller may wrap it first)."""
        with torch.inference_mode():
            return model(
                input_ids=self.feed, attention_mask=self.mask, cache=cache, use_cache=cache is not None,
                position_ids=position_ids(self.feed, self.past, self.mask), **kwargs,
            )  # fmt: skip

    def last_token(self, model) -> tuple[DynamicCache, torch.Tensor, torch.Tensor | None, int]:
        """(cache of the first L-1 positions, newest ids [B, 1], mask [B, L], L-1)."""
        L = self.ids.shape[1]
        if self.cache is not None and self.past == L - 1:
            return copy_cache(self.cache), self.ids[:, -1:], self.mask, L - 1
        cache = DynamicCache()
        if L > 1:
            prefix_mask = None if self.mask is None else self.mask[:, : L - 1]
            _, cache = forward(model, self.ids[:, : L - 1], cache, prefix_mask, last_only=True)
        return cache, self.ids[:, -1:], self.mask, L - 1


def replay_of(session, step: int | None = None) -> Replay:
    """The Replay of step `step` of a Session (default: the latest; the pending prefill before any)."""
    steps = session.trace.steps
    if step is None:
        step = len(steps) - 1 if steps else len(steps)
    if not isinstance(step, int) or not 0 <= step <= len(steps) - (1 if steps else 0):
        raise ValueError(
            f"step must be one of the recorded steps 0..{len(steps) - 1}, got {step!r}"
            if steps
            else f"no step has run yet: only the pending prefill (step 0) can be replayed, got {step!r}"
        )
    if not steps:  # the pending prefill
        (ids, mask), past, chosen = session.inputs(), 0, None
    else:
        rec = steps[step]
        ids, mask = session.inputs(rec.context_len)
        past = rec.context_len - rec.tokens_fed
        chosen = rec.token_id
    cache = session.cache_copy(past)  # None: the session keeps no cache
    if cache is not None and not past:
        cache = DynamicCache()  # a prefill from the first position
    return Replay(step, ids, mask, past, cache, chosen)
