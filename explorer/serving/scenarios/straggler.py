"""straggler: a static batch waits for its longest request while its finished rows sit idle.

The same burst, output lengths lognormal (a few long answers among short ones), through the
static engine (batches of SLOTS, each run until its longest request ends) and through the
continuous engine with the same SLOTS rows per iteration (a finished request's row is taken by
the next waiting one at once). Slot utilisation is busy rows / SLOTS over the iterations that
decode, from each engine's own iterations.
"""

from __future__ import annotations

from explorer._format import ms_value, share, times
from explorer.serving.scenarios import Scenario, ScenarioRun, register
from explorer.serving.scenarios._figures import headline, ratio
from explorer.serving.workload import Workload

SLOTS = 8
LOCAL = {"num_prompts": 24, "input_len": 16, "output_len": 6, "spread": 0.9}
SMALL = {"num_prompts": 16, "input_len": 16, "output_len": 6, "spread": 0.9}
MODELLED = {"num_prompts": 256, "input_len": 512, "output_len": 128, "spread": 1.0}


@register
class Straggler(Scenario):
    name, order = "straggler", 40
    title = "stragglers: a static batch waits for its longest request"
    engine = "static"
    needs = ("max_batch",)
    fix = "continuous batching (a finished request's slot is refilled at once)"
    why = (
        "A static batch starts together and ends together: it runs until its longest request "
        "has its last token, so the rows of requests that finished early sit idle and the "
        "requests queued behind the batch wait for the straggler. "
        "Output lengths in real traffic are long-tailed (lognormal here), so nearly every batch "
        "has a straggler and most of its slots idle for most of its iterations. "
        "Continuous batching frees a finished request's slot at the next iteration and fills it "
        "from the queue, so the same number of slots stays busy and the queue drains sooner."
    )

    def presets(self) -> dict[str, dict]:
        return {"small": SMALL, "default": LOCAL, "modelled": MODELLED}

    def workload(self, ctx) -> Workload:
        s = self.sizes(ctx)
        return Workload(
            num_prompts=s["num_prompts"],
            input_len=s["input_len"],
            output_len=s["output_len"],
            output_dist="lognormal",
            output_spread=s["spread"],
            seed=0,
        )

    def broken(self, ctx) -> ScenarioRun:
        return ScenarioRun(
            f"static batches of {SLOTS}", self.workload(ctx), ctx.engine, {"max_batch": SLOTS}
        )

    def fixed(self, ctx) -> ScenarioRun:
        knobs = {"max_requests_per_batch": SLOTS}
        return ScenarioRun(f"continuous, {SLOTS} slots", self.workload(ctx), "continuous", knobs)

    def evidence(self, broken, fixed, notes) -> dict:
        lens = sorted(r.output_len for r in broken.records if r.ok)
        b, f = headline(broken), headline(fixed)
        for side, res in ((b, broken), (f, fixed)):
            s = res.result
            side.update(
                p99_e2el_ms=s.get("p99_e2el_ms"),
                duration_s=s.get("duration"),
                p99_queue_ms=s.get("p99_queue_ms"),
            )
        return {
            "slots": SLOTS,
            "output_len_median": lens[len(lens) // 2] if lens else None,
            "output_len_max": lens[-1] if lens else None,
            "broken": b,
            "fixed": f,
            "utilisation_gain": ratio(f["slot_utilisation"], b["slot_utilisation"]),
            "throughput_ratio": ratio(f["output_throughput"], b["output_throughput"]),
        }

    def verdict(self, ev: dict) -> str:
        b, f = ev["broken"], ev["fixed"]

        return (
            f"static batches of {ev['slots']} kept {share(b['slot_utilisation'])} of their slots "
            f"busy (outputs median {ev['output_len_median']}, longest {ev['output_len_max']} "
            f"tokens); continuous batching {share(f['slot_utilisation'])}; p99 E2E "
            f"{ms_value(b['p99_e2el_ms'])} -> {ms_value(f['p99_e2el_ms'])}, throughput "
            f"{times(ev['throughput_ratio'])}"
        )
