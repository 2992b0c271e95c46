"""sequential: one request at a time through Session, first come first served (the baseline).

prefix_caching=True keeps the prompt KV of the last `prefix_slots` requests (explorer.PrefixCache,
copied from each finished Session) and starts a request from the longest prefix it shares with one
of them, when that is at least `min_prefix` tokens: its prefill then runs over the rest only, as in
vLLM's automatic prefix caching (which does it per KV block). Iterations count only the tokens fed."""

from __future__ import annotations

from dataclasses import dataclass

from explorer.engine.settings import setting
from explorer.serving.engines import Engine, Knobs, register
from explorer.serving.engines._local import Inbox, run_batch


@dataclass
class SequentialKnobs(Knobs):
    prefix_caching: bool = setting(
        False, "prefix caching", "start a request from the KV of a recent prompt it shares"
    )
    min_prefix: int = setting(
        16, "min prefix", "prefix caching: shortest shared prefix reused (tokens)", low=1
    )
    prefix_slots: int = setting(
        8, "prefix slots", "prefix caching: recent prompts whose KV is kept", low=1, high=1024
    )


@register("sequential", SequentialKnobs, order=10)
class Sequential(Engine):
    knobs: SequentialKnobs

    def __init__(self, lm, knobs: SequentialKnobs, *, ignore_eos: bool = True):
        super().__init__(lm, knobs, ignore_eos=ignore_eos)
        self._prefixes: list = []  # PrefixCache of recent prompts, newest last
        self.reused_tokens = 0

    def describe(self) -> dict:
        out = super().describe()
        if self.knobs.prefix_caching:
            out["prefix_reused_tokens"] = self.reused_tokens  # prompt tokens served from the cache
        return out

    def _best_prefix(self, ids: list[int]):
        """The longest cached prefix shared with ids (>= min_prefix tokens, and not the whole prompt), or None."""
        best, n = None, 0
        for pc in self._prefixes:
            m = min(pc.shared_with(ids), len(ids) - 1)
            if m > n:
                best, n = pc, m
        if best is None or n < self.knobs.min_prefix:
            return None
        return best.head(n)

    def _remember(self, ids: list[int], session) -> None:
        from explorer.engine.prefix import PrefixCache

        self._prefixes.append(PrefixCache.from_session(session, ids))
        del self._prefixes[: -self.knobs.prefix_slots]

    def serve(self, requests, records, feeder, stop) -> list:
        inbox, iterations = Inbox(feeder), []
        feeder.start(inbox.put)
        while batch := inbox.take(1):
            ids = batch[0][0].prompt_ids
            pc = self._best_prefix(ids) if self.knobs.prefix_caching else None
            s = run_batch(
                self.lm, batch, feeder, iterations, self.ignore_eos, inbox.waiting, prefix_cache=pc
            )
            if self.knobs.prefix_caching:
                self.reused_tokens += len(pc) if pc is not None else 0
                if s.steps:  # prefilled: its cache holds the prompt's KV
                    self._remember(ids, s)
        return iterations
