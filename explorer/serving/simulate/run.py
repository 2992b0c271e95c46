"""simulate(): a workload through a simulated engine -> the serving lab's ServingResult, modelled."""

from __future__ import annotations

from explorer.costs.parts import shape_of
from explorer.serving.metrics import summarise
from explorer.serving.run import ServingResult, run_meta
from explorer.serving.simulate.events import Simulator, to_records
from explorer.serving.simulate.policy import Policy, SimRequest, knobs_for, policy_for
from explorer.serving.simulate.replicas import check_replicas, deal, merge_iterations
from explorer.serving.simulate.steptime import StepModel
from explorer.serving.steady import judge
from explorer.serving.workload import Request, Workload


def engine_policy(engine: str, given: dict) -> Policy:
    """The simulator's policy for `engine`, built from the engine's own Knobs (its defaults, the
    knobs in `given`; the engine's other keywords, such as ignore_eos, are not modelled)."""
    return policy_for(engine, knobs_for(engine, given))


def engine_knobs(engine: str, given: dict) -> dict:
    """Every knob of a simulated engine, defaults filled in and validated."""
    return engine_policy(engine, given).knobs.to_dict()


def simulate(
    info,
    workload: Workload | list[Request],
    engine: str,
    step_model: StepModel,
    *,
    goodput: dict | None = None,
    label: str | None = None,
    requests: list[Request] | None = None,
    replicas: int = 1,
    **knobs,
) -> ServingResult:
    """Simulate `workload` on `engine` with iteration times from `step_model` (info: the model's
    ModelInfo, for the cost model's shape; requests: the workload's requests as the measured run
    tokenized them, so both see the same prompt lengths). replicas: that many independent copies
    of the engine behind a load balancer that deals the requests round-robin in arrival order
    (explorer.serving.simulate.replicas). The result has the serving lab's records, iterations
    and vLLM result keys; meta["modelled"] is True and meta["assumptions"] lists what it
    assumed."""
    check_replicas(replicas)
    policy = engine_policy(engine, knobs)
    if isinstance(workload, Workload):
        wl = workload
        requests = requests or workload.requests(vocab_size=info.vocab_size)
    else:
        wl, requests = None, list(workload)
    if not requests:
        raise ValueError("the workload has no requests")
    policy.check(requests)
    sim_reqs = [SimRequest(r.id, len(r.prompt_ids), r.max_tokens, r.arrival_s) for r in requests]
    iterations = _run_replicas(info, engine, knobs, step_model, sim_reqs, replicas, wl)
    records = to_records(sim_reqs)
    latency = getattr(step_model, "request_latency_s", 0.0)  # outside the engine (HTTP, tokenising)
    for rec in records:
        rec.sent_s = None if rec.sent_s is None else rec.sent_s - latency
    result = summarise(records, goodput)
    capacity = replicas * policy.saturation_rate(info, step_model, *mean_lengths(sim_reqs))
    offered = wl.request_rate if wl and wl.arrival != "burst" and not wl.max_concurrency else None
    result.update(judge(records, capacity, offered))
    meta = run_meta(None, "complete", label or f"{engine} (simulated)")
    meta.update(
        model=info.name,
        device=step_model.key.get("device", "?"),
        dtype=step_model.key.get("dtype", info.dtype),
        modelled=True,
        step_model=step_model.to_dict(),
        assumptions=simulation_assumptions(policy, step_model, replicas),
    )
    if replicas > 1:
        meta["replicas"] = replicas
    return ServingResult(
        engine={"engine": engine, **policy.knobs.to_dict(), "simulated": True},
        workload=wl.to_dict() if wl else {"num_prompts": len(requests)},
        records=records,
        iterations=iterations,
        result=result,
        meta=meta,
    )


def _run_replicas(info, engine, knobs, step_model, sim_reqs, replicas, wl) -> list:
    """Each replica's share of the requests through its own engine; their iterations merged."""
    runs = []
    for part, concurrency in deal(sim_reqs, replicas, wl.max_concurrency if wl else None):
        sim = Simulator(engine_policy(engine, knobs), shape_of(info), step_model, concurrency)
        runs.append(sim.run(part))
    return merge_iterations(runs)


def simulation_assumptions(policy: Policy, step_model: StepModel, replicas: int = 1) -> list[str]:
    out = [
        "every request produces exactly max_tokens tokens (ignore_eos)",
        "tokens land when their iteration ends",
    ]
    if step_model.method == "fitted":
        out[:0] = [f"iteration time: {step_model.rule}", f"step model: {step_model.summary()}"]
    else:
        out.insert(0, f"iteration time: {step_model.rule}")
    own = policy.Knobs is not None  # a served engine's scheduler replaces the chip's line
    if policy.assumption and (own or step_model.method == "fitted"):
        out.append(policy.assumption)
    if replicas > 1:
        out.append(
            f"{replicas} independent replicas behind a load balancer that deals the requests "
            "round-robin in arrival order (each its own engine, KV cache and GPUs)"
        )
    return out + [a for a in step_model.assumptions if not (own and a.startswith("scheduler:"))]


def mean_lengths(reqs) -> tuple[int, int]:
    """The mean prompt and output lengths of a list of requests (rounded)."""
    n = len(reqs)
    return round(sum(r.input_len for r in reqs) / n), round(sum(r.max_tokens for r in reqs) / n)


def saturation_rate(info, model: StepModel, engine: str, knobs: dict, input_len, output_len):
    """The modelled service capacity (req/s) of `engine` with these knobs for requests of these
    lengths: the largest rate its step model drains, analytically (no run). Each policy class
    owns its formula (Policy.saturation_rate; explorer.serving.simulate.rates)."""
    return engine_policy(engine, knobs).saturation_rate(info, model, input_len, output_len)
