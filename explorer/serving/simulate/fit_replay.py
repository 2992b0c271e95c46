"""Replaying published runs at trial settings, for the fits (fit.py: the pooled, chip-family and
engine terms; fit_stack.py: a serving stack's): the settings a run is simulated with, its rows
at those settings, how much slower the simulation reads than the run, and the secant search for
the value where that is zero. Below both fits, so neither imports the other.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from explorer.serving.simulate import published
from explorer.serving.simulate.whatif_settings import CHIP_FAMILIES

RATE_METRICS = ("output_throughput", "request_throughput")
SIMULATED = published.SIMULATED_SETTINGS  # the what-if settings a replay passes on


@dataclass
class Term:
    """One fitted value, where it applies and the data that determined it."""

    name: str
    value: float
    family: str  # "all" (pooled) or a chip family
    data: str


def settings_for(point: dict, pooled: dict, families: dict, stacks: dict | None = None) -> dict:
    """The what-if settings a run is simulated with: pooled, then its chip family's, then its
    stack family's (`stacks`: family -> values; whatif_settings.STACK_DEFAULTS when None)."""
    from explorer.costs.hardware import chip_named
    from explorer.serving.simulate.engine_map import policy_of
    from explorer.serving.simulate.whatif_settings import STACK_DEFAULTS, stack_family

    chip = chip_named(point["chip"]).name
    family = CHIP_FAMILIES.get(chip, "")
    stack = stack_family(chip, policy_of(point["engine"])) or ""
    stacks = STACK_DEFAULTS if stacks is None else stacks
    return {**pooled, **families.get(family, {}), **stacks.get(stack, {})}


def replay(
    points: list[dict],
    pooled: dict,
    families: dict,
    stacks: dict | None = None,
    engines: dict | None = None,
) -> list[dict]:
    """published.errors rows of every point at these settings (latency: the point's own where
    its harness has none, else its engine's in `engines` (ENGINE_DEFAULTS when None), else
    pooled's)."""
    from explorer.serving.simulate.engine_map import policy_of
    from explorer.serving.simulate.whatif_settings import ENGINE_DEFAULTS

    engines = ENGINE_DEFAULTS if engines is None else engines
    rows = []
    for p in points:
        mine = settings_for(p, pooled, families, stacks)
        mine = {k: v for k, v in mine.items() if k in SIMULATED}
        engine = engines.get(policy_of(p["engine"]), {})
        latency = engine.get("request_latency_s", pooled["request_latency_s"])
        latency = p.get("what_if", {}).get("request_latency_s", latency)
        try:
            sim = published.simulate_point(p, mine)
        except ValueError as err:  # a run its scheduler cannot serve: unsupported, as the table has
            sim = {"unsupported": str(err)}
        rows.extend(published.errors(p, sim, latency))
    return rows


def slowness(rows: list[dict], metrics) -> float:
    """Median signed log error, as 'how much slower the simulation is' (a rate's sign flipped):
    it grows with every overhead, so a bisection finds its zero."""
    logs = []
    for r in rows:
        if r["metric"] in metrics and r["simulated"]:
            e = math.log(r["simulated"] / r["measured"])
            logs.append(-e if r["metric"] in RATE_METRICS else e)
    return statistics.median(logs) if logs else 0.0


def secant(too_slow, x0: float, x1: float, high: float, evals: int = 3) -> float:
    """The value in [0, high] where too_slow(value) (increasing) crosses 0: secant steps from
    x0 and x1, `evals` evaluations in all (the last step's value is returned unevaluated)."""
    f0 = too_slow(x0)
    if x0 == 0 and f0 >= 0:
        return 0.0
    for _ in range(evals - 1):
        f1 = too_slow(x1)
        if f1 == f0:
            break
        x0, f0, x1 = x1, f1, min(high, max(0.0, x1 - f1 * (x1 - x0) / (f1 - f0)))
    return x1
