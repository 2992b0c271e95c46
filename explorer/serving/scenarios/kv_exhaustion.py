"""kv-exhaustion: the paged KV cache runs out; requests are evicted and recomputed.

The same burst of requests through the continuous engine twice: with a KV cache that holds
SHORT_FRACTION of what the requests need together (num_blocks small: the engine evicts running
requests to make room, and recomputes them later) and with ROOMY_FRACTION of it (every request
keeps its blocks). Evidence from the engine's own iterations: `preempted` (requests evicted
before each pass) and `kv_blocks_used`, and the prefill tokens beyond each prompt once (the
recomputed work).
"""

from __future__ import annotations

import math

from explorer._format import ms_value, times
from explorer.serving.scenarios import Scenario, ScenarioRun, register
from explorer.serving.scenarios._figures import headline, ratio, recomputed_tokens
from explorer.serving.workload import Workload

SHORT_FRACTION = 0.3  # the broken cache holds 30% of the KV the requests need together
ROOMY_FRACTION = 2.0  # the fixed one twice it (above transformers' 15% free-block margin)
LOCAL = {"num_prompts": 8, "input_len": 16, "output_len": 24, "page_size": 16}
SMALL = {"num_prompts": 6, "input_len": 16, "output_len": 16, "page_size": 16}
MODELLED = {"num_prompts": 64, "input_len": 1024, "output_len": 512, "page_size": 16}


def blocks_for(sizes: dict, fraction: float) -> int:
    """KV blocks holding `fraction` of what all the requests need at their full length."""
    need = sizes["num_prompts"] * (sizes["input_len"] + sizes["output_len"])
    return max(1, math.ceil(fraction * need / sizes["page_size"]))


@register
class KVExhaustion(Scenario):
    name, order = "kv-exhaustion", 20
    title = "KV exhaustion: the paged cache runs out, requests are evicted and recomputed"
    needs = ("num_blocks",)
    fix = "more KV blocks (or fewer requests at once)"
    why = (
        "Every running request holds KV-cache blocks that grow with its context, and when the "
        "paged cache has no free block left the engine evicts running requests to make room. "
        "An evicted request loses its cache and is recomputed later (its prompt and the tokens "
        "it already had are prefilled again), so the engine repeats work, throughput falls and "
        "the requests decoding beside a recompute see their inter-token latency spike. "
        "The fix is a cache that holds the requests in flight: more blocks (memory, or a "
        "smaller KV dtype) or fewer requests at once (max concurrency)."
    )

    def presets(self) -> dict[str, dict]:
        return {"small": SMALL, "default": LOCAL, "modelled": MODELLED}

    def plan(self, ctx, label: str, fraction: float) -> ScenarioRun:
        s = self.sizes(ctx)
        wl = Workload(
            num_prompts=s["num_prompts"],
            input_len=s["input_len"],
            output_len=s["output_len"],
            seed=0,
        )
        knobs = {"num_blocks": blocks_for(s, fraction), "page_size": s["page_size"]}
        return ScenarioRun(label, wl, ctx.engine, knobs)

    def broken(self, ctx) -> ScenarioRun:
        return self.plan(ctx, "KV cache too small", SHORT_FRACTION)

    def fixed(self, ctx) -> ScenarioRun:
        return self.plan(ctx, "KV cache that holds them", ROOMY_FRACTION)

    def evidence(self, broken, fixed, notes) -> dict:
        def kv(res) -> dict:
            its = res.iterations
            used = [i.kv_blocks_used for i in its if i.kv_blocks_used is not None]
            return {
                "num_blocks": res.engine.get("num_blocks"),
                "peak_blocks_used": max(used) if used else None,
                "iterations": len(its),
                "iterations_after_eviction": sum(1 for i in its if i.preempted),
                "recomputed_tokens": recomputed_tokens(res),
                "prefill_tokens": sum(i.prefill_tokens for i in its),
            }

        b, f = headline(broken), headline(fixed)
        ev = {"broken": {**b, **kv(broken)}, "fixed": {**f, **kv(fixed)}}
        bb = ev["broken"]
        ev["recomputed_share"] = ratio(bb["recomputed_tokens"], bb["prefill_tokens"]) or 0.0
        ev["p99_itl_ratio"] = ratio(b["p99_itl_ms"], f["p99_itl_ms"])
        ev["throughput_ratio"] = ratio(b["output_throughput"], f["output_throughput"])
        return ev

    def verdict(self, ev: dict) -> str:
        b, f = ev["broken"], ev["fixed"]
        return (
            f"{b['preemptions']} preemptions with {b['num_blocks']} KV blocks, "
            f"{f['preemptions']} with {f['num_blocks']}; {ev['recomputed_share']:.0%} of the "
            f"prefill work recomputed evicted requests ({b['recomputed_tokens']} tokens); p99 "
            f"ITL {times(ev['p99_itl_ratio'])} the healthy run's ({ms_value(b['p99_itl_ms'])} vs "
            f"{ms_value(f['p99_itl_ms'])}; longest gap {ms_value(b['max_itl_ms'])} vs "
            f"{ms_value(f['max_itl_ms'])}), throughput {times(ev['throughput_ratio'])}"
        )
