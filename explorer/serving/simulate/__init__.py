"""Predict before you buy: a serving simulator calibrated on measured iterations.

    from explorer.serving.simulate import profile, simulate
    model = profile(lm, "continuous")                  # fitted on the real engine (cached to a file)
    res = simulate(lm.info, Workload(...), "continuous", model)    # a ServingResult, modelled

Rooms: work (one iteration's bytes and FLOPs at a precision and TP: the one function every
machine and the capacity verdict read), steptime (the fitted machine: seconds and what limits
each step), chip (the chip machine on paper), policy (each engine's scheduler, one function per
decision), engine_knobs and engine_policies (the schedulers of vLLM V1 and V0, SGLang and
TensorRT-LLM, from their own knobs), engine_map (a published run's engine and version -> its
policy), rates (each policy's analytic capacity), events (the discrete-event loop on a heap), replicas (copies behind a load balancer),
profile (the profiling runs through the real engine, the cache file), validate (measured vs
simulated per metric), whatif (a known chip and tensor parallelism on paper: memory,
whatif_settings), capacity (the largest rate meeting SLOs), saturation (the steadiness verdict's
calibration), run (simulate(): a workload through a policy to a modelled ServingResult),
published (the what-if against published GPU serving runs) and published_report (its errors per
source, engine, chip and scheduler, with coverage), operators and operators_report (the
chip rule per operator against Vidur's measured GPU operator times, and its report), fit (the
what-if's settings fitted on a stated split by source), fit_stack (a chip's realisation under
one generation of a serving stack, e.g. MI300X under vLLM < 0.8, fitted on one source) and
fit_replay (what both fits share: a published run replayed at trial settings, and the search).
"""

from __future__ import annotations

from explorer.serving.simulate import engine_policies  # noqa: F401  (registers vllm, sglang, ...)
from explorer.serving.simulate.profile import ProfileError, profile
from explorer.serving.simulate.run import simulate
from explorer.serving.simulate.steptime import STEP_RULE, StepModel, iteration_work

__all__ = ["STEP_RULE", "ProfileError", "StepModel", "iteration_work", "profile", "simulate"]
