"""simulate(): a workload through a simulated engine -> the serving lab's ServingResult, modelled."""

from __future__ import annotations

from explorer.costs.parts import shape_of
from explorer.serving.engines.continuous import DEFAULTS as CONTINUOUS_DEFAULTS
from explorer.serving.engines.continuous import check_kv_budget
from explorer.serving.metrics import summarise
from explorer.serving.run import ServingResult, _meta
from explorer.serving.simulate.events import Simulator, to_records
from explorer.serving.simulate.policy import SimRequest
from explorer.serving.simulate.steptime import StepModel
from explorer.serving.workload import Request, Workload

ENGINE_DEFAULTS = {
    "sequential": {},
    "static": {"max_batch": 8, "max_wait_s": 0.05},
    "continuous": {**CONTINUOUS_DEFAULTS, "max_requests_per_batch": None, "scheduler": "fifo"},
}


def engine_knobs(engine: str, knobs: dict) -> dict:
    if engine not in ENGINE_DEFAULTS:
        raise ValueError(
            f"the simulator models {', '.join(ENGINE_DEFAULTS)}; {engine!r} is not one of them"
        )
    unknown = set(knobs) - set(ENGINE_DEFAULTS[engine]) - {"ignore_eos", "warmup", "record"}
    if unknown:
        raise ValueError(f"the simulated {engine} engine has no knob {', '.join(sorted(unknown))}")
    out = {
        **ENGINE_DEFAULTS[engine],
        **{k: v for k, v in knobs.items() if k in ENGINE_DEFAULTS[engine]},
    }
    if engine == "continuous" and out.get("scheduler") != "fifo":
        raise ValueError("the simulator models transformers' fifo scheduler only")
    return out


def simulate(
    info,
    workload: Workload | list[Request],
    engine: str,
    step_model: StepModel,
    *,
    goodput: dict | None = None,
    label: str | None = None,
    requests: list[Request] | None = None,
    **knobs,
) -> ServingResult:
    """Simulate `workload` on `engine` with iteration times from `step_model` (info: the model's
    ModelInfo, for the cost model's shape; requests: the workload's requests as the measured run
    tokenized them, so both see the same prompt lengths). The result has the serving lab's records, iterations
    and vLLM result keys; meta["modelled"] is True and meta["assumptions"] lists what it assumed."""
    knobs = engine_knobs(engine, knobs)
    if isinstance(workload, Workload):
        wl = workload
        requests = requests or workload.requests(vocab_size=info.vocab_size)
    else:
        wl, requests = None, list(workload)
    if not requests:
        raise ValueError("the workload has no requests")
    if engine == "continuous":
        check_kv_budget(requests, knobs["num_blocks"], knobs["page_size"])
    sim_reqs = [SimRequest(r.id, len(r.prompt_ids), r.max_tokens, r.arrival_s) for r in requests]
    sim = Simulator(engine, knobs, shape_of(info), step_model, wl.max_concurrency if wl else None)
    iterations = sim.run(sim_reqs)
    records = to_records(sim_reqs)
    latency = getattr(step_model, "request_latency_s", 0.0)  # outside the engine (HTTP, tokenising)
    for rec in records:
        rec.sent_s = None if rec.sent_s is None else rec.sent_s - latency
    meta = _meta(None, "complete", label or f"{engine} (simulated)")
    meta.update(
        model=info.name,
        device=step_model.key.get("device", "?"),
        dtype=step_model.key.get("dtype", info.dtype),
        modelled=True,
        step_model=step_model.to_dict(),
        assumptions=simulation_assumptions(engine, step_model),
    )
    return ServingResult(
        engine={"engine": engine, **knobs, "simulated": True},
        workload=wl.to_dict() if wl else {"num_prompts": len(requests)},
        records=records,
        iterations=iterations,
        result=summarise(records, goodput),
        meta=meta,
    )


def simulation_assumptions(engine: str, step_model: StepModel) -> list[str]:
    out = [
        "every request produces exactly max_tokens tokens (ignore_eos)",
        "tokens land when their iteration ends",
    ]
    if step_model.method == "fitted":
        out[:0] = [f"iteration time: {step_model.rule}", f"step model: {step_model.summary()}"]
        if engine == "continuous":
            out.append(
                "scheduler: transformers' FIFO (decodes, then prefills, then waiting; chunked "
                "under max_batch_tokens; 15% free-block safety margin; preemption resets and "
                "recomputes)"
            )
    else:
        out.insert(0, f"iteration time: {step_model.rule}")
    return out + list(step_model.assumptions)
