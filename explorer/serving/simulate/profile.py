"""The profiling run: a grid of small workloads through the real engine, its iterations fitted.

Each grid point is a burst of requests (batch = how many run together, context = prompt length,
prefill chunk = what max_batch_tokens lets in per iteration) served by the real engine after one
discarded warm-up run; every recorded Iteration (its passes and seconds) is a data point. The
last grid point is held out: the fit never sees it and its median error is printed. The fit is
cached to a JSON file keyed by model, dtype, device, threads, engine knobs and the versions of
torch and transformers; a cache written by other versions is refitted, and the StepModel says so.
"""

from __future__ import annotations

import json
import os
import statistics
import warnings
from pathlib import Path

from explorer.costs import guards
from explorer.costs.parts import shape_of
from explorer.serving.simulate.run import engine_knobs
from explorer.serving.simulate.steptime import (
    StepModel,
    busy_gap,
    fit,
    one_at_a_time_rate,
    startup_delay,
)

# (num_prompts, input_len, output_len, arrivals/s or None for a burst): batch x context x prefill
# chunk, prompts joining running batches (fixed arrival gaps), small enough for a laptop. The
# validation workloads use other arrival processes, rates and length mixes.
GRID = [
    (1, 16, 24, None),
    (2, 96, 16, None),
    (4, 32, 24, None),
    (4, 160, 12, None),
    (8, 64, 16, None),
    (16, 48, 12, None),
    (32, 24, 16, None),
    (24, 56, 16, "fast"),
    (24, 112, 12, "medium"),
    (32, 40, 16, "busy"),
    (12, 72, 16, "medium"),  # held out
]
RATES = {
    "busy": 8.0,
    "fast": 4.0,
    "medium": 2.0,
}  # x the one-request-at-a-time rate of the first fit


CHECK_BURST = (4, 32, 12)  # the machine check's workload: 4 requests at once, 32 in, 12 out


class ProfileError(ValueError):
    """A profiling run that cannot be used (the message says why)."""


def cache_dir() -> Path:
    root = os.environ.get("EXPLORER_CACHE") or Path.home() / ".cache" / "explorer"
    return Path(root) / "simulate"


def profile_key(lm, engine: str, knobs: dict) -> dict:
    import torch
    import transformers

    return {
        "model": lm.info.name,
        "dtype": lm.info.dtype,
        "weights": getattr(lm.info, "weights", None),
        "device": str(lm.device),
        "threads": torch.get_num_threads(),
        "engine": engine,
        "knobs": {k: knobs[k] for k in sorted(knobs)},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _path(key: dict) -> Path:
    stem = "-".join(
        str(key[k]).replace("/", "_").replace(":", "_")
        for k in ("model", "dtype", "device", "engine")
    )
    return cache_dir() / f"{stem}.json"


def _versions_differ(old: dict, key: dict) -> list[str]:
    return [
        f"{k} {old.get(k)} -> {key[k]}" for k in ("torch", "transformers") if old.get(k) != key[k]
    ]


def load_cached(key: dict) -> tuple[StepModel | None, str | None]:
    """(the cached fit, None) when its key matches; (None, why) when it must be refitted."""
    path = _path(key)
    if not path.exists():
        return None, None
    try:
        data = json.loads(path.read_text())
        old = data["key"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None, f"{path}: unreadable profile cache, refitted"
    if old == key:
        return StepModel.from_dict(data), None
    changed = _versions_differ(old, key)
    if changed:
        return None, f"profile cache from other library versions ({', '.join(changed)}): refitted"
    return None, "profile cache for other settings (threads or knobs): refitted"


def measure_grid(lm, engine: str, knobs: dict, grid=GRID, progress: bool = True) -> list:
    """Each grid workload's ServingResult through the real engine (after a discarded warm-up).
    Arrival rates are set from the bursts' own first fit, so they suit any model's speed."""
    from tqdm.auto import tqdm

    from explorer.serving.run import serve
    from explorer.serving.workload import Workload

    def run(n, i, o, rate):
        arrival = "burst" if rate is None else "fixed"
        wl = Workload(n, arrival, rate, input_len=i, output_len=o, seed=7)
        res = serve(lm, wl, engine, **knobs)
        if res.meta["status"] != "complete":
            raise ProfileError(f"profiling run {n}x{i}+{o} did not complete: {res.meta['status']}")
        return res

    run(*grid[0])  # warm-up, discarded
    bursts = [g for g in grid if g[3] is None]
    runs = [run(*g) for g in tqdm(bursts, desc=f"profile {engine} (bursts)", disable=not progress)]
    first = fit(shape_of(lm.info), [p for res in runs for p in _points(res.iterations)])
    base = one_at_a_time_rate(lm.info, first, 48, 24)
    for g in tqdm(
        [g for g in grid if g[3] is not None],
        desc=f"profile {engine} (arrivals)",
        disable=not progress,
    ):
        runs.append(run(*g[:3], RATES[g[3]] * base))
    return runs


def _points(iterations) -> list[dict]:
    return [{"passes": it.passes, "seconds": it.seconds} for it in iterations if it.passes]


def profile(
    lm, engine: str = "continuous", *, refit: bool = False, progress: bool = True, **knobs
) -> StepModel:
    """The engine's step-time model on this machine: cached, or fitted from a profiling run."""
    knobs = engine_knobs(engine, knobs)
    key = profile_key(lm, engine, knobs)
    model, why = (None, None) if refit else load_cached(key)
    if model is not None:
        return model
    if why:
        warnings.warn(why, RuntimeWarning, stacklevel=2)
    runs = measure_grid(lm, engine, knobs, progress=progress)
    train = [p for res in runs[:-1] for p in _points(res.iterations)]
    held = _points(runs[-1].iterations)
    model = fit(shape_of(lm.info), train, held, key=key)
    model.gap_s = busy_gap([it for res in runs for it in res.iterations])
    model.startup_s = startup_delay(runs)
    model.assumptions = [
        f"fitted on {len(train)} iterations of {len(runs) - 1} profiling workloads "
        f"(num_prompts x input_len + output_len, arrivals: {_grid_text(GRID[:-1])}), "
        f"held out {_grid_text(GRID[-1:])}",
        *([why] if why else []),
    ]
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model.to_dict(), indent=1))
    return model


def _grid_text(grid) -> str:
    return ", ".join(f"{n}x{i}+{o} {r or 'burst'}" for n, i, o, r in grid)


def machine_check(
    lm,
    model: StepModel,
    engine: str = "continuous",
    *,
    tolerance: float = guards.TOLERANCE,
    **knobs,
) -> guards.MachineCheck:
    """Is the step model still this machine's? One small burst (CHECK_BURST) through the real
    engine now, after a one-request warm-up: the median of its decode steps' measured seconds
    against the median the model predicts for the same passes (guards.machine_check: ok within
    `tolerance`). A profile cached on another machine, or under other load, reads far off."""
    from explorer.serving.run import serve
    from explorer.serving.workload import Workload

    knobs = engine_knobs(engine, knobs)
    n, i, o = CHECK_BURST
    serve(lm, Workload(1, "burst", None, input_len=i, output_len=2, seed=5), engine, **knobs)
    res = serve(lm, Workload(n, "burst", None, input_len=i, output_len=o, seed=5), engine, **knobs)
    timed = [it for it in res.iterations if it.passes and it.seconds > 0]
    steps = [it for it in timed if all(q == 1 for q, _ in it.passes)] or timed
    if not steps:
        raise ProfileError("the machine check's burst recorded no timed iteration")
    shape = shape_of(lm.info)
    measured = statistics.median(it.seconds for it in steps)
    predicted = statistics.median(model.seconds(shape, it.passes) for it in steps)
    what = f"the median of {len(steps)} decode steps ({n} requests, {i} tokens in)"
    return guards.machine_check(measured, predicted, tolerance, what)


def checked_profile(
    lm, engine: str = "continuous", *, refit_stale: bool = True, progress: bool = True, **knobs
) -> tuple[StepModel, guards.MachineCheck, bool]:
    """profile() and its machine check: (the step model, the check, whether it was refitted).
    A model the check finds more than the tolerance off is refitted when `refit_stale` (and
    checked again), else kept with a RuntimeWarning that says its predictions are stale."""
    model = profile(lm, engine, progress=progress, **knobs)
    check = machine_check(lm, model, engine, **knobs)
    if check.ok:
        return model, check, False
    if not refit_stale:
        warnings.warn(check.line, RuntimeWarning, stacklevel=2)
        return model, check, False
    model = profile(lm, engine, refit=True, progress=progress, **knobs)
    return model, machine_check(lm, model, engine, **knobs), True
