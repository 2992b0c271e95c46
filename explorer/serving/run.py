"""One serving run: a workload through an engine -> a ServingResult (records, iterations, metrics).

from explorer.serving import Workload, serve
res = serve(lm, Workload(num_prompts=32, output_len=32), engine="continuous")
res.result["output_throughput"], res.result["p99_ttft_ms"]
res.save("run.json")           # vllm bench serve's keys + "requests" + "iterations"
ServingResult.load("vllm-result.json")    # a file saved by vllm bench serve loads too
"""

from __future__ import annotations

import datetime
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from explorer.serving import engines
from explorer.serving.engines import Iteration
from explorer.serving.engines._feed import Feeder
from explorer.serving.metrics import RequestRecord, load_result, records_from_result, summarise
from explorer.serving.workload import Request, Workload


@dataclass
class ServingResult:
    """What a serving run measured (or a simulator modelled): the same fields either way."""

    engine: dict
    workload: dict
    records: list[RequestRecord]
    iterations: list[Iteration] = field(default_factory=list)
    result: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # model, device, dtype, date, status, notes

    @property
    def label(self) -> str:
        return self.meta.get("label") or self.engine.get("engine", "run")

    def to_dict(self) -> dict:
        """vllm bench serve's result keys, plus ours: requests, iterations, engine, workload."""
        return {
            **self.meta,
            "backend": self.engine.get("engine"),
            "model_id": self.meta.get("model"),
            "num_prompts": len(self.records),
            "request_rate": _rate(self.workload),
            "burstiness": self.workload.get("burstiness"),
            "max_concurrency": self.workload.get("max_concurrency"),
            **self.result,
            "engine": self.engine,
            "workload": self.workload,
            "requests": [r.to_dict() for r in self.records],
            "iterations": [i.to_dict() for i in self.iterations],
        }

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, default=str))

    @classmethod
    def from_dict(cls, data: dict) -> ServingResult:
        records = records_from_result(data)
        its = [Iteration(**i) for i in data.get("iterations") or []]
        engine = data.get("engine") or {"engine": data.get("backend", "vllm")}
        meta = {
            k: data[k]
            for k in ("model", "device", "dtype", "date", "status", "label", "notes")
            if k in data
        }
        meta.setdefault("model", data.get("model_id"))
        meta.setdefault("label", f"{engine.get('engine')} ({data.get('model_id') or '?'})")
        result = {
            k: v
            for k, v in data.items()
            if k not in ("requests", "iterations", "engine", "workload")
        }
        return cls(engine, data.get("workload") or {}, records, its, result, meta)

    @classmethod
    def load(cls, path) -> ServingResult:
        return cls.from_dict(load_result(path))


def serve(
    lm,
    workload: Workload | list[Request],
    engine: str = "continuous",
    *,
    goodput: dict[str, float] | None = None,
    stop: threading.Event | None = None,
    label: str | None = None,
    **knobs,
) -> ServingResult:
    """Run the workload's requests through the engine; stop.set() keeps what finished (status
    "partial" / "stopped"). Ctrl-C stops the run and raises RunInterrupted, a KeyboardInterrupt
    whose .result holds what was measured, marked partial: a loop over runs stops too, and
    nothing reports the part as a whole."""
    if isinstance(workload, Workload):
        wl, requests = workload, workload.requests(lm)
    else:
        wl, requests = None, list(workload)
    if not requests:
        raise ValueError("the workload has no requests")
    if "ignore_eos" not in knobs and wl is not None:
        knobs["ignore_eos"] = wl.ignore_eos
    eng = engines.make(engine, lm, **knobs)
    eng.check(requests)  # every "cannot serve this" error comes before the run starts
    records = {
        r.id: RequestRecord(r.id, len(r.prompt_ids), r.max_tokens, r.arrival_s) for r in requests
    }
    stop = _linked(stop)  # ours to set when the run ends; a caller's stop.set() still reaches it
    feeder = Feeder(requests, records, wl.max_concurrency if wl else None, stop)
    status, iterations = "complete", []
    try:
        iterations = eng.serve(requests, records, feeder, stop)
    except KeyboardInterrupt:
        stop.set()
        status = "interrupted (Ctrl-C)"
    finally:
        stop.set()  # ends the feeder
        feeder.join()
    for rec in records.values():  # what a stop (or a dead engine) left unfinished, marked
        if rec.error is None and (rec.end_s is None or not rec.token_s):
            rec.error = (
                "stopped before it was sent"
                if rec.sent_s is None
                else ("stopped before it finished" if rec.token_s else "stopped before it started")
            )
    if status == "complete" and any(not r.ok for r in records.values()):
        status = "partial" if any(r.ok for r in records.values()) else "failed"
    recs = list(records.values())
    res = ServingResult(
        engine=eng.describe(),
        workload=wl.to_dict() if wl else {"num_prompts": len(requests)},
        records=recs,
        iterations=iterations,
        result=summarise(recs, goodput),
        meta=run_meta(lm, status, label or eng.describe()["engine"]),
    )
    res.meta["partial"] = status != "complete"
    if status.startswith("interrupted"):
        raise RunInterrupted(res)
    return res


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during serve(): .result is what the run measured, status "interrupted (Ctrl-C)",
    partial; save it if you want it, never as a finished run."""

    def __init__(self, result: ServingResult):
        super().__init__("interrupted (Ctrl-C)")
        self.result = result


def _linked(outer: threading.Event | None) -> threading.Event:
    """A fresh Event that is set when `outer` is (so ending one run never stops a whole sweep)."""
    inner = threading.Event()
    if outer is not None:

        def follow():
            while not inner.is_set():
                if outer.wait(0.05):
                    inner.set()

        threading.Thread(target=follow, daemon=True).start()
    return inner


def run_meta(lm, status: str, label: str) -> dict:
    """The meta of a result: date, status and label, and the model, device and dtype of lm."""
    out = {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "status": status,
        "label": label,
    }
    if lm is not None:
        out.update(model=lm.info.name, device=str(lm.device), dtype=lm.info.dtype)
    return out


def _rate(workload: dict) -> float | str:
    if workload.get("arrival", "burst") == "burst":
        return "inf"
    return workload.get("request_rate")
