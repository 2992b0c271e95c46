"""Per-request records and the run's metrics, with `vllm bench serve`'s definitions and keys.

Times are seconds after the run started (one clock: time.perf_counter of this process).
  sent_s     when the request was handed to the engine (its arrival, or later when a
             --max-concurrency slot was busy)
  start_s    when the engine first put it in a forward pass (local engines; None over http)
  token_s    when each output token (over http: each streamed chunk) became available
  end_s      when the request finished
Definitions (vLLM's benchmarks/serve.py):
  TTFT = token_s[0] - sent_s;  E2E latency = end_s - sent_s
  TPOT = (E2E - TTFT) / (output tokens - 1), only for requests with more than one output token
  ITL  = every gap between consecutive token times (a chunk of several tokens counts once)
  queue time = start_s - sent_s (ours; vLLM's server reports it in its own metrics only)
  duration = last end_s - first sent_s; throughputs are totals / duration
  goodput = requests meeting every given SLO (ms; ttft, tpot, e2el) / duration
Percentiles are explorer._stats.percentile (linear interpolation), as vLLM computes them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explorer._stats import percentile
from explorer.serving.steady import judge

METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 99)
SLO_NAMES = ("ttft", "tpot", "e2el")


@dataclass
class RequestRecord:
    """What happened to one request (plain data; the same for every engine and the simulator)."""

    id: str
    input_len: int
    max_tokens: int
    arrival_s: float
    sent_s: float | None = None
    start_s: float | None = None
    token_s: list[float] = field(default_factory=list)
    end_s: float | None = None
    output_len: int = 0
    output_ids: list[int] | None = None
    text: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_s is not None and bool(self.token_s)

    @property
    def ttft(self) -> float | None:
        return self.token_s[0] - self.sent_s if self.ok else None

    @property
    def e2el(self) -> float | None:
        return self.end_s - self.sent_s if self.ok else None

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_len < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_len - 1)

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.token_s, self.token_s[1:])] if self.ok else []

    @property
    def queue_s(self) -> float | None:
        return (
            self.start_s - self.sent_s
            if self.start_s is not None and self.sent_s is not None
            else None
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_goodput(items: list[str] | str | None) -> dict[str, float]:
    """SLOs from ["ttft:500", "tpot:50"] (ms), as vLLM's --goodput takes them."""
    if not items:
        return {}
    items = items.split() if isinstance(items, str) else items
    slos = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in SLO_NAMES:
            raise ValueError(
                f"--goodput: unknown SLO {name!r}; use {', '.join(SLO_NAMES)} (e.g. ttft:500)"
            )
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"--goodput: {item!r} needs a number of ms, e.g. {name}:500") from None
        if not (slos[name] > 0 and math.isfinite(slos[name])):  # nan and inf too
            raise ValueError(f"--goodput: {item!r} must be a finite number of ms > 0")
    return slos


def summarise(records: list[RequestRecord], goodput: dict[str, float] | None = None) -> dict:
    """The run's result with vllm bench serve's keys (times in ms, lists as vLLM saves them)."""
    done = [r for r in records if r.ok]
    sent = [r.sent_s for r in records if r.sent_s is not None]
    ends = [r.end_s for r in records if r.end_s is not None]
    duration = (max(ends) - min(sent)) if sent and ends else 0.0
    per = {
        "ttft": [r.ttft for r in done],
        "tpot": [r.tpot for r in done if r.tpot is not None],
        "itl": [x for r in done for x in r.itl],
        "e2el": [r.e2el for r in done],
    }
    out_tokens = sum(r.output_len for r in done)
    in_tokens = sum(r.input_len for r in done)
    rate = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    result = {
        "duration": duration,
        "completed": len(done),
        "failed": len(records) - len(done),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": rate(len(done)),
        "request_goodput": rate(_good(done, goodput)) if goodput else None,
        "output_throughput": rate(out_tokens),
        "total_token_throughput": rate(in_tokens + out_tokens),
        "max_concurrent_requests": _max_concurrent(done),
    }
    for name, values in per.items():
        result.update(_stats(name, values))
    queue = [r.queue_s for r in done if r.queue_s is not None]
    result.update(_stats("queue", queue) if queue else {})
    result.update(
        {
            "input_lens": [r.input_len for r in done],
            "output_lens": [r.output_len for r in done],
            "ttfts": per["ttft"],
            "itls": [r.itl for r in done],
            "generated_texts": [r.text or "" for r in done],
            "errors": [r.error or "" for r in records if not r.ok],
        }
    )
    if goodput:
        result["goodput_slos_ms"] = dict(goodput)
    result.update(judge(records))  # steady or not (explorer.serving.steady); no modelled capacity
    return result


def _stats(name: str, values: list[float]) -> dict:
    ms = np.asarray(values, dtype=float) * 1e3
    if ms.size == 0:
        keys = ["mean", "median", "std"] + [f"p{p}" for p in PERCENTILES]
        return {f"{k}_{name}_ms": None for k in keys}
    out = {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = percentile(ms, p)
    return out


def _good(done: list[RequestRecord], slos: dict[str, float]) -> int:
    def meets(r: RequestRecord) -> bool:
        values = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}
        return all(values[k] * 1e3 <= v for k, v in slos.items())

    return sum(meets(r) for r in done)


def _max_concurrent(done: list[RequestRecord]) -> int:
    events = sorted([(r.sent_s, 1) for r in done] + [(r.end_s, -1) for r in done])
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def load_result(path) -> dict:
    """A result JSON saved by `vllm bench serve --save-result` or by us (the same keys)."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    missing = [k for k in ("completed", "ttfts", "itls", "output_lens") if k not in data]
    if missing:
        raise ValueError(f"{path}: not a serving result (no {', '.join(missing)})")
    return data


def records_from_result(result: dict) -> list[RequestRecord]:
    """Our own records when the file has them; else approximate ones rebuilt from vLLM's lists
    (TTFT and ITLs per request, no arrival times: each request drawn from its own t=0)."""
    if result.get("requests"):
        return [RequestRecord(**r) for r in result["requests"]]
    out = []
    for i, (ttft, itl, n_in, n_out) in enumerate(
        zip(result["ttfts"], result["itls"], result["input_lens"], result["output_lens"])
    ):
        times = list(np.cumsum([ttft, *itl]))
        out.append(RequestRecord(f"req-{i}", n_in, n_out, 0.0, 0.0, None, times, times[-1], n_out))
    return out
