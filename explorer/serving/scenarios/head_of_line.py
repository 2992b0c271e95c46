"""head-of-line: one long prompt's prefill stalls everyone's decode; chunked prefill fixes it.

Short requests arrive at once and decode; then one long prompt arrives: measured, a calibration
run of the short requests first (TTFT and ITL of this machine, now) puts its arrival at their
median TTFT + DECODING ITLs, so it lands while they decode however fast the machine is;
modelled, at long_at seconds. With a
token budget per iteration above the long prompt (max_batch_tokens large: no chunking) its whole
prefill lands in one pass, and every short request waits for that pass between two tokens. With
max_batch_tokens = CHUNK the prompt is split into chunks that ride along with the decodes: the
others' inter-token latency falls, and the long prompt's own TTFT rises (measured both ways).
"""

from __future__ import annotations

from dataclasses import replace

from explorer._format import ms_value, times
from explorer.serving.scenarios import Scenario, ScenarioRun, register
from explorer.serving.scenarios._figures import percentile_ms, ratio
from explorer.serving.workload import Workload

LONG_ID = "long"
LONG_OUTPUT = 4  # tokens the long prompt generates: its cost is its prefill
DECODING = 4  # the long prompt arrives this many of the short requests' ITLs after their TTFT
LOCAL = {
    "shorts": 6,
    "input_len": 16,
    "output_len": 48,
    "long_len": 448,
    "long_at": 0.1,
    "chunk": 32,
}
SMALL = {
    "shorts": 4,
    "input_len": 16,
    "output_len": 32,
    "long_len": 320,
    "long_at": 0.1,
    "chunk": 32,
}
MODELLED = {
    "shorts": 32,
    "input_len": 256,
    "output_len": 256,
    "long_len": 32000,
    "long_at": 0.5,
    "chunk": 512,
}


def workloads(sizes: dict, seed: int = 0) -> tuple[Workload, Workload]:
    """The experiment: the short requests (arriving at once) and the one long prompt (its arrival
    set by with_long); sizes as a preset's (shorts, input_len, output_len, long_len)."""
    shorts = Workload(
        num_prompts=sizes["shorts"],
        input_len=sizes["input_len"],
        output_len=sizes["output_len"],
        seed=seed,
    )
    long = Workload(
        num_prompts=1, input_len=sizes["long_len"], output_len=LONG_OUTPUT, seed=seed + 1
    )
    return shorts, long


def with_long(shorts: list, long: list, at: float) -> list:
    """The short requests and the long prompt (id LONG_ID) arriving at `at` seconds."""
    (request,) = long
    return [*shorts, replace(request, id=LONG_ID, arrival_s=at)]


def long_arrival(result: dict) -> float | None:
    """When the long prompt arrives, from a run of the short requests alone (its vLLM result):
    their median TTFT + DECODING inter-token latencies, so it lands while they decode however fast
    the machine is (None when the run measured neither)."""
    at = ((result["median_ttft_ms"] or 0) + DECODING * (result["median_itl_ms"] or 0)) / 1e3
    return at or None


def figures(res) -> dict:
    """One run's figures (ms): the other requests' ITL percentiles (explorer._stats.percentile,
    interpolated, as vLLM), the long prompt's TTFT, and its largest prefill iteration."""
    others = [r for r in res.records if r.id != LONG_ID]
    long = next((r for r in res.records if r.id == LONG_ID), None)
    itls = [x for r in others for x in r.itl]
    big = max(res.iterations, key=lambda i: i.prefill_tokens, default=None)
    slowest = max((i.seconds for i in res.iterations), default=0.0)
    return {
        "max_batch_tokens": res.engine.get("max_batch_tokens"),
        "others_p99_itl_ms": percentile_ms(itls, 99),
        "others_max_itl_ms": percentile_ms(itls, 100),
        "others_median_itl_ms": percentile_ms(itls, 50),
        "long_ttft_ms": None if long is None or long.ttft is None else long.ttft * 1e3,
        "largest_prefill_tokens": 0 if big is None else big.prefill_tokens,
        "decodes_in_largest_prefill": 0 if big is None else big.decode_requests,
        "slowest_iteration_ms": slowest * 1e3,
    }


@register
class HeadOfLine(Scenario):
    name, order = "head-of-line", 30
    title = "head-of-line blocking: one long prefill stalls everyone's decode"
    needs = ("max_batch_tokens",)
    fix = "chunked prefill (max_batch_tokens)"
    why = (
        "An iteration runs every request in the batch together, so a pass that carries a long "
        "prompt's whole prefill takes as long as that prefill, and every request decoding beside "
        "it waits that long for its next token. "
        "The requests behind the long prompt did nothing wrong: their inter-token latency spikes "
        "because one pass was made too big. "
        "Chunked prefill caps the tokens per pass (max_batch_tokens), so the long prompt is "
        "prefilled a chunk at a time between the others' tokens: their p99 ITL falls, and the "
        "long prompt pays for it with a later first token."
    )

    def presets(self) -> dict[str, dict]:
        return {"small": SMALL, "default": LOCAL, "modelled": MODELLED}

    def prepare(self, ctx) -> None:
        s = self.sizes(ctx)
        if ctx.modelled:
            ctx.notes["long_at"] = s["long_at"]
            return
        shorts = Workload(num_prompts=s["shorts"], input_len=s["input_len"], output_len=8, seed=0)
        res = ctx.serve(
            ScenarioRun("calibration (the short requests alone)", shorts, ctx.engine), keep=False
        )
        ctx.notes["long_at"] = long_arrival(res.result) or s["long_at"]

    def requests(self, ctx) -> list:
        shorts, long = workloads(self.sizes(ctx))
        return with_long(ctx.requests(shorts), ctx.requests(long), ctx.notes["long_at"])

    def plan(self, ctx, label: str, chunked: bool) -> ScenarioRun:
        s, reqs = self.sizes(ctx), self.requests(ctx)
        unchunked = max(len(r.prompt_ids) for r in reqs) + len(reqs)  # the whole prompt fits
        knobs = {"max_batch_tokens": s["chunk"] if chunked else unchunked}
        return ScenarioRun(label, reqs, ctx.engine, knobs)

    def broken(self, ctx) -> ScenarioRun:
        return self.plan(ctx, "one pass per prompt", chunked=False)

    def fixed(self, ctx) -> ScenarioRun:
        return self.plan(ctx, "chunked prefill", chunked=True)

    def evidence(self, broken, fixed, notes) -> dict:
        ev = {"broken": figures(broken), "fixed": figures(fixed)}
        b, f = ev["broken"], ev["fixed"]
        ev["long_len"] = next((r.input_len for r in broken.records if r.id == LONG_ID), None)
        ev["long_at_s"] = notes.get("long_at")
        ev["others_p99_itl_ratio"] = ratio(b["others_p99_itl_ms"], f["others_p99_itl_ms"])
        ev["long_ttft_ratio"] = ratio(f["long_ttft_ms"], b["long_ttft_ms"])
        return ev

    def verdict(self, ev: dict) -> str:
        b, f = ev["broken"], ev["fixed"]
        if not b["decodes_in_largest_prefill"]:
            return (
                f"the {ev['long_len']}-token prompt arrived before the others decoded (at "
                f"{ev['long_at_s']:.2f} s), so its one-pass prefill delayed their first token "
                "rather than their ITL (the machine was slower than its calibration run): rerun"
            )
        return (
            f"the {ev['long_len']}-token prompt prefilled in one pass ({b['largest_prefill_tokens']} "
            f"prefill tokens, {ms_value(b['slowest_iteration_ms'])}) stalls the others: their longest "
            f"gap between tokens {ms_value(b['others_max_itl_ms'])} vs {ms_value(f['others_max_itl_ms'])} "
            f"in chunks of {f['max_batch_tokens']}, p99 ITL {ms_value(b['others_p99_itl_ms'])} vs "
            f"{ms_value(f['others_p99_itl_ms'])} ({times(ev['others_p99_itl_ratio'])}); the long "
            f"prompt's TTFT {ms_value(b['long_ttft_ms'])} -> {ms_value(f['long_ttft_ms'])} "
            f"({times(ev['long_ttft_ratio'])})"
        )
