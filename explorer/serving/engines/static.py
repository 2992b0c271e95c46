"""static: batches of up to B requests through the batched Session (left padding).

A batch starts when B requests are waiting, or max_wait_s after its first one arrived (or at
once when nothing more will arrive), and runs until its longest request ends: requests that
arrive meanwhile wait (head-of-line blocking), which their queue time and TTFT show.
"""

from __future__ import annotations

from explorer.serving.engines import check_lengths, register
from explorer.serving.engines._local import Inbox, run_batch


@register("static")
class Static:
    def __init__(self, lm, max_batch: int = 8, max_wait_s: float = 0.05, ignore_eos: bool = True):
        if lm is None:
            raise ValueError("the static engine needs a loaded model")
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(
                f"static engine: max batch must be a whole number >= 1, got {max_batch!r}"
            )
        if max_wait_s < 0:
            raise ValueError(f"static engine: max wait must be >= 0 s, got {max_wait_s}")
        self.lm, self.max_batch, self.max_wait_s = lm, max_batch, max_wait_s
        self.ignore_eos = ignore_eos

    def describe(self) -> dict:
        return {"engine": "static", "max_batch": self.max_batch, "max_wait_s": self.max_wait_s}

    def check(self, requests) -> None:
        check_lengths(self.lm, requests)

    def serve(self, requests, records, feeder, stop) -> list:
        inbox, iterations = Inbox(feeder), []
        feeder.start(inbox.put)
        while batch := inbox.take(self.max_batch, self.max_wait_s):
            run_batch(self.lm, batch, feeder, iterations, self.ignore_eos, inbox.waiting)
        return iterations
