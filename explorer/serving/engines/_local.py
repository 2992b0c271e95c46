"""What the two Session-based engines (sequential, static) share: the inbox the Feeder fills,
and running one batch of requests through a greedy Session while timing every token."""

from __future__ import annotations

import queue
import time

from explorer.serving.engines import Iteration


class Inbox:
    """Requests the Feeder has sent and no engine has taken yet."""

    def __init__(self, feeder):
        self.feeder = feeder
        self.q: queue.Queue = queue.Queue()

    def put(self, req, rec) -> None:
        self.q.put((req, rec))

    def waiting(self) -> int:
        return self.q.qsize()

    def take(self, max_n: int, wait_s: float = 0.0) -> list:
        """Up to max_n requests: blocks for the first; then waits up to wait_s for the batch to
        fill (never once nothing more can arrive). [] when the run is over or stopped."""
        first = self._get(None)
        if first is None:
            return []
        batch, deadline = [first], time.perf_counter() + wait_s
        while len(batch) < max_n:
            try:
                batch.append(self.q.get_nowait())
                continue
            except queue.Empty:
                pass
            if self.feeder.finished.is_set() or time.perf_counter() >= deadline:
                break
            item = self._get(deadline)
            if item is not None:
                batch.append(item)
        return batch

    def _get(self, deadline: float | None):
        while not self.feeder.stop.is_set():
            if self.feeder.finished.is_set() and self.q.empty():
                return None
            if deadline is not None and time.perf_counter() >= deadline:
                return None
            try:
                return self.q.get(timeout=0.02)
            except queue.Empty:
                continue
        return None


def run_batch(lm, batch, feeder, iterations: list, ignore_eos: bool, waiting, prefix_cache=None):
    """Serve these (request, record) pairs as one greedy Session batch until the longest ends.

    Each row stops taking tokens at its own max_tokens (or its EOS unless ignore_eos); its end is
    its last token's time. The batch holds every row until the longest is done."""
    from explorer.engine.sampling import Sampling
    from explorer.engine.session import Session

    reqs = [r for r, _ in batch]
    recs = [rec for _, rec in batch]
    prompt = [r.prompt_ids for r in reqs] if len(reqs) > 1 else reqs[0].prompt_ids
    s = Session(
        lm,
        prompt,
        Sampling(temperature=0.0),
        top_n=1,
        max_new_tokens=max(r.max_tokens for r in reqs),
        roofline=False,
        stop_at_eos=not ignore_eos,
        prefix_cache=prefix_cache,
    )
    cached = s.trace.settings.get("prefix_cache", {}).get("tokens", 0)  # prompt KV copied in
    eos = s.eos_ids
    start = feeder.now()
    for rec in recs:
        rec.start_s = start
        rec.output_ids = []
    live = [True] * len(reqs)
    while not s.done and any(live) and not feeder.stop.is_set():
        t0 = feeder.now()
        step = s.step()
        t1 = feeder.now()
        tokens = step.row_tokens or [step.token_id]
        for i, (req, rec) in enumerate(zip(reqs, recs)):
            if live[i]:
                rec.token_s.append(t1)
                rec.output_ids.append(tokens[i])
                if len(rec.output_ids) >= req.max_tokens or (not ignore_eos and tokens[i] in eos):
                    live[i] = False
                    _finish(lm, rec, t1, feeder)
        prefill = step.phase == "prefill"
        iterations.append(
            Iteration(
                index=len(iterations),
                start_s=t0,
                end_s=t1,
                decode_requests=0 if prefill else sum(live) + tokens_done(live, recs, t1),
                prefill_requests=len(reqs) if prefill else 0,
                prefill_tokens=sum(len(r.prompt_ids) - cached for r in reqs) if prefill else 0,
                batch_tokens=step.tokens_fed * len(reqs),
                waiting=waiting(),
                passes=[[step.tokens_fed, step.context_len - step.tokens_fed]] * len(reqs),
            )
        )
    for i, rec in enumerate(recs):  # the session stopped first (max positions, Stop)
        if live[i]:
            rec.error = "stopped before it finished" if feeder.stop.is_set() else s.stop_reason
            _finish(lm, rec, feeder.now(), feeder)
    return s


def tokens_done(live, recs, t) -> int:
    """Rows that finished with a token in this very pass (they decoded in it too)."""
    return sum(1 for ok, rec in zip(live, recs) if not ok and rec.end_s == t)


def _finish(lm, rec, t: float, feeder) -> None:
    rec.end_s = t
    rec.output_len = len(rec.output_ids)
    if lm.tokenizer is not None:
        rec.text = lm.tokenizer.decode(rec.output_ids)
    feeder.done(rec)
