"""static: batches of up to B requests through the batched Session (left padding).

A batch starts when B requests are waiting, or max_wait_s after its first one arrived (or at
once when nothing more will arrive), and runs until its longest request ends: requests that
arrive meanwhile wait (head-of-line blocking), which their queue time and TTFT show.
"""

from __future__ import annotations

from dataclasses import dataclass

from explorer.engine.settings import setting
from explorer.serving.engines import Engine, Knobs, register
from explorer.serving.engines._local import Inbox, run_batch


@dataclass
class StaticKnobs(Knobs):
    batch_knob = "max_batch"

    max_batch: int = setting(8, "max batch", "requests per batch", low=1, high=1024)
    max_wait_s: float = setting(
        0.05, "max wait (s)", "how long a batch waits to fill", low=0, high=60, step=0.01
    )


@register("static", StaticKnobs, order=20)
class Static(Engine):
    knobs: StaticKnobs

    def serve(self, requests, records, feeder, stop) -> list:
        inbox, iterations = Inbox(feeder), []
        feeder.start(inbox.put)
        while batch := inbox.take(self.knobs.max_batch, self.knobs.max_wait_s):
            run_batch(self.lm, batch, feeder, iterations, self.ignore_eos, inbox.waiting)
        return iterations
