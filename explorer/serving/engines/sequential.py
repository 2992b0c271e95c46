"""sequential: one request at a time through Session, first come first served (the baseline)."""

from __future__ import annotations

from explorer.serving.engines import check_lengths, register
from explorer.serving.engines._local import Inbox, run_batch


@register("sequential")
class Sequential:
    knobs: dict = {}

    def __init__(self, lm, ignore_eos: bool = True):
        if lm is None:
            raise ValueError("the sequential engine needs a loaded model")
        self.lm, self.ignore_eos = lm, ignore_eos

    def describe(self) -> dict:
        return {"engine": "sequential"}

    def check(self, requests) -> None:
        check_lengths(self.lm, requests)

    def serve(self, requests, records, feeder, stop) -> list:
        inbox, iterations = Inbox(feeder), []
        feeder.start(inbox.put)
        while batch := inbox.take(1):
            run_batch(self.lm, batch, feeder, iterations, self.ignore_eos, inbox.waiting)
        return iterations
