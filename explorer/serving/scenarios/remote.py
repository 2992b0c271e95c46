"""The scenarios whose knobs live in the server, against any OpenAI-protocol server (the http engine).

Over HTTP nobody sees the server's KV blocks or its preemptions: what a client sees is when each
token came and which requests failed. So a remote scenario sends the scenario's own workload to a
server started with the broken setting (and, given `fixed_url`, to one started with the fixed
setting), and reports the evidence visible from outside: TTFT and ITL over time, stalls (gaps far
above the median ITL), failed requests, whether the queue kept growing (steady). The server flags
of the broken and the fixed setting (vLLM, SGLang, `transformers serve`) come from the scenario's
own engine knobs (SERVER_FLAGS); the client cannot set them.

    res = run_remote("kv-exhaustion", "http://gpu-node:8000", fixed_url="http://gpu-node:8001")
    res.verdict, res.evidence, res.knobs["broken"]["vLLM"]
    explorer scenario kv-exhaustion --url http://gpu-node:8000 [--fixed-url ...] [--json]
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from explorer.serving.run import ServingResult, serve
from explorer.serving.workload import Workload

STALL = 5.0  # a gap above STALL x the run's median ITL is a stall a user notices
# the continuous engine's knobs that a server sets at start-up: server -> flag (None: it has none)
SERVER_FLAGS: dict[str, dict[str, str | None]] = {
    "num_blocks": {
        "vLLM": "--num-gpu-blocks-override {} --max-model-len {tokens}",  # it must fit in them
        "SGLang": "--max-total-tokens {tokens}",
        "transformers serve": "--cb-num-blocks {}",
    },
    "page_size": {
        "vLLM": "--block-size {}",
        "SGLang": "--page-size {}",
        "transformers serve": "--cb-block-size {}",
    },
    "max_batch_tokens": {
        "vLLM": "--max-num-batched-tokens {}",
        "SGLang": "--chunked-prefill-size {}",
        "transformers serve": "--cb-max-batch-tokens {}",
    },
    "max_requests_per_batch": {
        "vLLM": "--max-num-seqs {}",
        "SGLang": "--max-running-requests {}",
        "transformers serve": None,
    },
}
WARMUP = Workload(num_prompts=4, input_len=16, output_len=8, seed=99)  # not measured
SERVERS = ("vLLM", "SGLang", "transformers serve")
BASE = {  # how each server is started with its scheduler recorded here
    "vLLM": "vllm serve MODEL",
    "SGLang": "python -m sglang.launch_server --model-path MODEL",
    "transformers serve": "transformers serve MODEL --continuous-batching",
}
NOTE = (
    "transformers serve answers 422 to vLLM's ignore_eos: the http engine finds that out with a "
    'probe and sends "generation_config": "{\\"min_new_tokens\\": N, ...}" instead; the '
    "numbers in the flags are the scenario's own (sized for the bundled model here): scale the "
    "blocks and the chunk with your workload"
)


def server_knobs(name: str) -> list[str]:
    """The knobs the scenario `name` turns that live in a server ([]: it cannot run remotely).
    A scenario that runs its own way (memory-wall probes batches in child processes: a server
    would fail at start-up instead) has no broken and fixed workload to send."""
    from explorer.serving import scenarios
    from explorer.serving.scenarios import Scenario

    sc = scenarios.get(name)
    if type(sc).execute is not Scenario.execute or not set(sc.needs) <= set(SERVER_FLAGS):
        return []
    return list(sc.needs)


def remote_names() -> tuple[str, ...]:
    """The scenarios that run against a server (every knob they turn is a server flag)."""
    from explorer.serving import scenarios

    return tuple(n for n in scenarios.names() if server_knobs(n))


def server_flags(knobs: dict, engine_knobs: dict | None = None) -> dict[str, str]:
    """Each server's start-up flags for these continuous-engine knobs (a knob it lacks: said).
    engine_knobs: the run's whole knob set; `transformers serve` also gets its KV size from it
    (left to itself on a CPU it sizes the cache from memory and may not start)."""
    out = {}
    for server in SERVERS:
        mine = dict(knobs)
        if server == "transformers serve" and engine_knobs:
            for k in ("num_blocks", "page_size"):
                mine.setdefault(k, engine_knobs.get(k))
        flags = []
        for knob, value in mine.items():
            if knob not in SERVER_FLAGS or value is None:
                continue
            flag = SERVER_FLAGS[knob][server]
            tokens = value * mine.get("page_size", 16) if knob == "num_blocks" else None
            flags.append(
                flag.format(value, tokens=tokens) if flag else f"(no flag for {knob}={value})"
            )
        out[server] = " ".join([BASE[server], *flags])
    return out


@dataclass
class RemoteResult:
    """A scenario against a server: the broken server's run, the fixed server's (if given), the
    evidence a client sees, and the server flags each run needs."""

    scenario: str
    broken: ServingResult
    fixed: ServingResult | None
    verdict: str
    why: str
    evidence: dict
    knobs: dict
    modelled: bool = False
    partial: bool = False
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "scenario": self.scenario,
            "where": "a server over HTTP (measured from the client)",
            "broken": self.broken.to_dict(),
            "fixed": self.fixed.to_dict() if self.fixed else None,
            "verdict": self.verdict,
            "why": self.why,
            "evidence": self.evidence,
            "server_knobs": self.knobs,
            "modelled": False,
            "partial": self.partial,
            "notes": self.notes,
        }


def check_remote(name: str) -> None:
    """A clear ValueError for a scenario whose knobs do not live in a server."""
    from explorer.serving import scenarios

    sc = scenarios.get(name)  # an unknown name: one line listing them
    if not server_knobs(name):
        turns = ", ".join(sc.needs) or "no engine knob (its workload is what changes)"
        raise ValueError(
            f"the {name} scenario turns {turns}, not a server's flag: --url takes "
            f"{', '.join(remote_names())}; run {name} on the local engine"
        )


def plans(name: str, lm) -> tuple:
    """The scenario's broken and fixed Plans at this machine's scale (what the servers are
    started to match: the workload is sent as is, the knobs become server flags)."""
    from explorer.serving import scenarios
    from explorer.serving.scenarios._context import ScenarioContext

    sc = scenarios.get(name)
    ctx = ScenarioContext(lm, lm.info if lm is not None else None, "continuous")
    return sc.broken(ctx), sc.fixed(ctx)


def outside_evidence(res: ServingResult) -> dict:
    """What a client sees of a run: failures, TTFT's trend, ITL stalls, the long prompt's effect."""
    ok = sorted((r for r in res.records if r.ok), key=lambda r: r.sent_s)
    gaps = [g for r in ok for g in r.itl]
    med = statistics.median(gaps) if gaps else None
    failed = [r for r in res.records if not r.ok]
    out = {
        "requests": len(res.records),
        "failed": len(failed),
        "first_error": failed[0].error if failed else None,
        "p99_ttft_ms": res.result.get("p99_ttft_ms"),
        "median_itl_ms": med * 1e3 if med else None,
        "p99_itl_ms": res.result.get("p99_itl_ms"),
        "stalls": sum(1 for g in gaps if med and g > STALL * med),
        "steady": res.result.get("steady"),
    }
    third = len(ok) // 3
    if third:
        early = statistics.median(r.ttft for r in ok[:third])
        late = statistics.median(r.ttft for r in ok[-third:])
        out["ttft_late_over_early"] = late / early if early else None
    out.update(_long_prompt(ok))
    return out


def _long_prompt(ok: list) -> dict:
    """The others' median ITL while the longest prompt was prefilled vs otherwise (when one prompt
    is at least 4x the median prompt: the head-of-line scenario's shape)."""
    if len(ok) < 3:
        return {}
    long = max(ok, key=lambda r: r.input_len)
    if long.input_len < 4 * statistics.median(r.input_len for r in ok):
        return {}
    during, other = [], []
    for r in ok:
        if r is not long:
            for a, b in zip(r.token_s, r.token_s[1:]):
                (during if b > long.sent_s and a < long.token_s[0] else other).append(b - a)
    return {
        "long_prompt_tokens": long.input_len,
        "long_ttft_ms": long.ttft * 1e3,
        "others_itl_during_long_prefill_ms": statistics.median(during) * 1e3 if during else None,
        "others_itl_otherwise_ms": statistics.median(other) * 1e3 if other else None,
    }


def verdict_from_outside(name: str, broken: dict, fixed: dict | None) -> str:
    """One sentence from the client-side evidence (the server's own records are not visible)."""
    line = f"{name} over HTTP: the broken server: {_seen(broken)}"
    if fixed is not None:
        line += f"; the fixed server: {_seen(fixed)}"
    return line


def _seen(ev: dict) -> str:
    """What a client saw of one run, in a few figures."""
    bits = [f"{ev['failed']} of {ev['requests']} requests failed"]
    if ev.get("median_itl_ms") and ev.get("p99_itl_ms"):
        bits.append(
            f"p99 ITL {ev['p99_itl_ms']:.0f} ms, {ev['p99_itl_ms'] / ev['median_itl_ms']:.1f}x the "
            f"median ({ev['stalls']} gaps above {STALL:g}x)"
        )
    during, other = ev.get("others_itl_during_long_prefill_ms"), ev.get("others_itl_otherwise_ms")
    if during and other:
        bits.append(
            f"the others' median ITL {during / other:.1f}x while the long prompt was prefilled, "
            f"its TTFT {ev['long_ttft_ms']:.0f} ms"
        )
    return ", ".join(bits)


def run_remote(
    name: str,
    base_url: str,
    *,
    fixed_url: str | None = None,
    served_model: str | None = None,
    lm=None,
    stop: threading.Event | None = None,
    progress: Callable[[str], None] | None = None,
    warmup: bool = True,
) -> RemoteResult:
    """Send the scenario's workload to the server started with its broken flags (and to one started
    with its fixed flags, if given); read the evidence a client sees. lm cuts the text prompts with
    its tokenizer (each server tokenizes them itself); the flags are in RemoteResult.knobs.
    warmup: a few requests to each server first, not measured."""
    check_remote(name)
    for url in (base_url, fixed_url):
        if url is not None:
            check_reachable(url)  # before any request: one line naming the URL, in seconds
    broken_plan, fixed_plan = plans(name, lm)
    runs = {}
    for role, url, plan in (("broken", base_url, broken_plan), ("fixed", fixed_url, fixed_plan)):
        if url is None or (stop is not None and stop.is_set()):
            continue
        if warmup:  # a server that just started is cold (the cold-start scenario): not measured
            serve(lm, WARMUP, "http", stop=stop, base_url=url, served_model=served_model)
        if progress:
            progress(f"{role} run against {url} ({plan.label})")
        runs[role] = serve(
            lm, plan.workload, "http", stop=stop, label=f"{role} server: {plan.label}",
            base_url=url, served_model=served_model,
        )  # fmt: skip
    broken, fixed = runs["broken"], runs.get("fixed")
    ev = {"broken": outside_evidence(broken), "fixed": outside_evidence(fixed) if fixed else None}
    turned = server_knobs(name)
    knobs = {"knobs": turned, **{role: flags_for(plan, turned) for role, plan in
                                  (("broken", broken_plan), ("fixed", fixed_plan))}}  # fmt: skip
    why = (
        f"What this scenario turns is set when the server starts ({', '.join(turned)}), so a "
        "client cannot turn it: start one server with the broken flags and one with the fixed. "
        "From outside the failure shows only in when tokens come and which requests fail: a "
        "preempted request's tokens stop while its prompt is recomputed, and a long prompt "
        "prefilled in one pass delays every decoding request's next token. The server's own "
        "metrics (vLLM's /metrics: num_preemptions, kv cache usage) confirm what the client saw."
    )
    cut = fixed_url is not None and fixed is None
    partial = cut or any(r.meta.get("partial") for r in runs.values())
    return RemoteResult(
        name, broken, fixed, verdict_from_outside(name, ev["broken"], ev["fixed"]), why, ev,
        knobs, partial=partial, notes=[NOTE],
    )  # fmt: skip


CONNECT_TIMEOUT_S = 3.0  # a server that does not accept a connection in this long is not there


def check_reachable(url: str) -> None:
    """ServerError (one line naming the URL) unless an OpenAI-compatible server answers
    GET {url}/v1/models; a connection is given CONNECT_TIMEOUT_S."""
    import httpx

    from explorer.serving.engines.http import ServerError

    if not str(url).startswith(("http://", "https://")):
        raise ServerError(f"{url!r} is not a server's base URL: give http://host:port")
    probe = f"{url.rstrip('/').removesuffix('/v1')}/v1/models"
    try:
        httpx.get(probe, timeout=httpx.Timeout(10.0, connect=CONNECT_TIMEOUT_S)).raise_for_status()
    except httpx.HTTPError as err:
        raise ServerError(f"no OpenAI-compatible server answers at {probe}: {err}") from None


def flags_for(plan, turned: list[str]) -> dict[str, str]:
    """The server flags that reproduce this plan's setting of the knobs the scenario turns."""
    from explorer.serving import engines

    full = {**engines.get("continuous").Knobs().to_dict(), **plan.knobs}
    return server_flags({k: full.get(k) for k in _with_page(turned)}, full)


def _with_page(knobs: list[str]) -> list[str]:
    """num_blocks means nothing without the block size: both go to the server."""
    return [*knobs, "page_size"] if "num_blocks" in knobs and "page_size" not in knobs else knobs
