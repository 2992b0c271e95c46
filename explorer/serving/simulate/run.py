"""simulate(): a workload through a simulated engine -> the serving lab's ServingResult, modelled."""

from __future__ import annotations

from explorer.costs.parts import shape_of
from explorer.serving import engines
from explorer.serving.metrics import summarise
from explorer.serving.run import ServingResult, run_meta
from explorer.serving.simulate.events import Simulator, to_records
from explorer.serving.simulate.policy import Policy, SimRequest, policy_for
from explorer.serving.simulate.steptime import StepModel
from explorer.serving.workload import Request, Workload


def engine_policy(engine: str, given: dict) -> Policy:
    """The simulator's policy for `engine`, built from the engine's own Knobs (its defaults, the
    knobs in `given`; the engine's other keywords, such as ignore_eos, are not modelled)."""
    knobs, _ = engines.knobs_of(engine, given)
    return policy_for(engine, knobs)


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
    **knobs,
) -> ServingResult:
    """Simulate `workload` on `engine` with iteration times from `step_model` (info: the model's
    ModelInfo, for the cost model's shape; requests: the workload's requests as the measured run
    tokenized them, so both see the same prompt lengths). The result has the serving lab's records, iterations
    and vLLM result keys; meta["modelled"] is True and meta["assumptions"] lists what it assumed."""
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
    sim = Simulator(policy, shape_of(info), step_model, wl.max_concurrency if wl else None)
    iterations = sim.run(sim_reqs)
    records = to_records(sim_reqs)
    meta = run_meta(None, "complete", label or f"{engine} (simulated)")
    meta.update(
        model=info.name,
        device=step_model.key.get("device", "?"),
        dtype=step_model.key.get("dtype", info.dtype),
        modelled=True,
        step_model=step_model.to_dict(),
        assumptions=simulation_assumptions(policy, step_model),
    )
    return ServingResult(
        engine={"engine": engine, **policy.knobs.to_dict(), "simulated": True},
        workload=wl.to_dict() if wl else {"num_prompts": len(requests)},
        records=records,
        iterations=iterations,
        result=summarise(records, goodput),
        meta=meta,
    )


def simulation_assumptions(policy: Policy, step_model: StepModel) -> list[str]:
    out = [
        "every request produces exactly max_tokens tokens (ignore_eos)",
        "tokens land when their iteration ends",
    ]
    if step_model.method == "fitted":
        out[:0] = [f"iteration time: {step_model.rule}", f"step model: {step_model.summary()}"]
        if policy.assumption:
            out.append(policy.assumption)
    else:
        out.insert(0, f"iteration time: {step_model.rule}")
    return out + list(step_model.assumptions)
