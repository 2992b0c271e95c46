"""sequential: one request at a time through Session, first come first served (the baseline).

prefix_caching=True keeps the prompt KV of the last `prefix_slots` requests (explorer.PrefixCache,
copied from each finished Session) and starts a request from the longest prefix it shares with one
of them, when that is at least `min_prefix` tokens: its prefill then runs over the rest only, as in
vLLM's automatic prefix caching (which does it per KV block). Iterations count only the tokens fed."""

from __future__ import annotations

from explorer.serving.engines import check_lengths, register
from explorer.serving.engines._local import Inbox, run_batch


@register("sequential")
class Sequential:
    knobs: dict = {}

    def __init__(
        self,
        lm,
        ignore_eos: bool = True,
        prefix_caching: bool = False,
        min_prefix: int = 16,
        prefix_slots: int = 8,
    ):
        if lm is None:
            raise ValueError("the sequential engine needs a loaded model")
        for name, v in (("min_prefix", min_prefix), ("prefix_slots", prefix_slots)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
        self.lm, self.ignore_eos = lm, ignore_eos
        self.knobs = (
            {"prefix_caching": True, "min_prefix": min_prefix, "prefix_slots": prefix_slots}
            if prefix_caching
            else {}
        )
        self._prefixes: list = []  # PrefixCache of recent prompts, newest last
        self.reused_tokens = 0

    def describe(self) -> dict:
        out = {"engine": "sequential", **self.knobs}
        if self.knobs:
            out["prefix_reused_tokens"] = self.reused_tokens  # prompt tokens served from the cache
        return out

    def _best_prefix(self, ids: list[int]):
        """The longest cached prefix shared with ids (>= min_prefix tokens, and not the whole prompt), or None."""
        best, n = None, 0
        for pc in self._prefixes:
            m = min(pc.shared_with(ids), len(ids) - 1)
            if m > n:
                best, n = pc, m
        if best is None or n < self.knobs["min_prefix"]:
            return None
        return best.head(n)

    def _remember(self, ids: list[int], session) -> None:
        from explorer.engine.prefix import PrefixCache

        self._prefixes.append(PrefixCache.from_session(session, ids))
        del self._prefixes[: -self.knobs["prefix_slots"]]

    def check(self, requests) -> None:
        check_lengths(self.lm, requests)

    def serve(self, requests, records, feeder, stop) -> list:
        inbox, iterations = Inbox(feeder), []
        feeder.start(inbox.put)
        while batch := inbox.take(1):
            ids = batch[0][0].prompt_ids
            pc = self._best_prefix(ids) if self.knobs else None
            s = run_batch(
                self.lm, batch, feeder, iterations, self.ignore_eos, inbox.waiting, prefix_cache=pc
            )
            if self.knobs:
                self.reused_tokens += len(pc) if pc is not None else 0
                if s.steps:  # prefilled: its cache holds the prompt's KV
                    self._remember(ids, s)
        return iterations
