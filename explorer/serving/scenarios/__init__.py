"""Seeing it break: production failure scenarios, each run broken and fixed on a real engine.

    from explorer import load
    from explorer.serving import scenarios

    scenarios.names()                    # ('overload', 'kv-exhaustion', 'head-of-line', ...)
    sc = scenarios.get("kv-exhaustion")  # .title, .engine, .needs (its knobs), .why, .fix
    scenarios.catalog()                  # the same for every scenario, as plain dicts
    res = scenarios.run("kv-exhaustion", load("bundled:target"))     # measured on this machine
    res.verdict        # "6 preemptions with 4 KV blocks, 0 with 64; ..."
    res.evidence       # the figures the verdict rests on, computed from the two runs' records
    res.broken, res.fixed                 # ServingResult of each run (fixed: None if stopped)
    res.to_dict()      # {"scenario", "broken", "fixed", "verdict", "why", "evidence", "modelled",
                       #  "partial", ...}: broken/fixed are ServingResult.to_dict() + "steady",
                       #  "preemptions"
    scenarios.run("overload", None, hardware="h100")   # the same preset at GPU scale, modelled
                                                        # (model: arch:llama-3.1-8b by default)

run(name, lm, *, hardware=None, model=None, engine=None, stop=None, progress=None,
    memory_budget_gb=None, scale="default", sizes=None) -> ScenarioResult
    hardware     a known chip (explorer.costs.hardware): the simulator's what-if on paper,
                 ScenarioResult.modelled True; the scenario must have a model (model_ok)
    engine       another engine for the scenario's broken run; it must take the knobs the
                 scenario turns: check_engine(name, engine) raises the one-line ValueError
    stop         a threading.Event: set it and the run in progress stops; what it measured is
                 kept, marked partial (ScenarioResult.partial, the run's meta["partial"])
    progress     called with one line of text as each run starts
    scale        "default", or "small": the least that still shows the failure and its fix (a
                 notebook or a test on a laptop CPU; fewer requests, a smaller memory budget)
    sizes        overrides of the scale's sizes, e.g. {"num_prompts": 400}: get(name).presets()
                 lists them (a GPU user raises them)
    Ctrl-C       raises ScenarioInterrupted (a KeyboardInterrupt): .scenario is the partial
                 ScenarioResult, .result the ServingResult of the cut run
Bad input is a ValueError with one line: an unknown scenario (it lists them), an engine without
the scenario's knob (it says which engine has it), a memory budget above what the machine has,
an unknown scale or size (it lists them).

A scenario is one module here that registers itself (@register): its presets (the sizes of a
seeded workload and engine knobs for the broken run and the fixed one: small, this machine's
default, GPU scale),
evidence() (figures computed from the two runs' records and iterations) and verdict() (a short
sentence from the evidence). Scenario.needs names the engine knobs it turns; the Serving tab
reads it to offer a scenario only for an engine that has them.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from explorer._registry import Registry
from explorer.serving import engines
from explorer.serving.run import RunInterrupted, ServingResult
from explorer.serving.scenarios._context import (
    ScenarioContext,
    ScenarioRun,
    check_memory_budget,
    run_dict,
)

SCENARIOS: Registry[Scenario] = Registry(
    "scenario", same=lambda sc: (type(sc).__module__, type(sc).__qualname__)
)
SCALES = ("small", "default")  # the measured presets (modelled: the scenario's GPU-scale one)


@dataclass
class ScenarioResult:
    """A scenario's two runs, the verdict and the figures it rests on."""

    scenario: str
    broken: ServingResult | None
    fixed: ServingResult | None
    verdict: str
    why: str
    evidence: dict = field(default_factory=dict)
    modelled: bool = False
    partial: bool = False
    title: str = ""
    needs: dict = field(default_factory=dict)  # {"engine": ..., "knobs": [...]}

    def to_dict(self) -> dict:
        return {
            "scenario": self.scenario,
            "title": self.title,
            "broken": None if self.broken is None else run_dict(self.broken),
            "fixed": None if self.fixed is None else run_dict(self.fixed),
            "verdict": self.verdict,
            "why": self.why,
            "evidence": self.evidence,
            "modelled": self.modelled,
            "partial": self.partial,
            "needs": self.needs,
        }


class Scenario:
    """One failure and its fix: presets, evidence from records, a verdict from the evidence."""

    name: ClassVar[str]
    title: ClassVar[str]  # a few words: "overload: the queue grows without bound"
    engine: ClassVar[str] = "continuous"  # the engine of the broken run
    needs: ClassVar[tuple[str, ...]] = ()  # knobs (or engine keywords) of that engine it turns
    why: ClassVar[str]  # three sentences: what breaks, why, what fixes it
    fix: ClassVar[str]  # the fix in a few words
    model_ok: ClassVar[bool] = True  # has a modelled (--hardware) version in the simulator
    takes_budget: ClassVar[bool] = False  # runs under memory_budget_gb
    min_budget_gb: ClassVar[float] = 0.0  # the least memory_budget_gb it takes
    order: ClassVar[int] = 0

    # --- what a scenario defines ------------------------------------------------------------------

    def presets(self) -> dict[str, dict]:
        """Its sizes per scale: "small" (the least that still shows the failure and its fix: a
        notebook or a test on a laptop CPU), "default" (measured on this machine), "modelled"
        (--hardware: GPU scale in the simulator)."""
        raise NotImplementedError

    def sizes(self, ctx: ScenarioContext) -> dict:
        """The preset of ctx's scale ("modelled" with --hardware), with ctx.sizes over it."""
        return {**self.presets()["modelled" if ctx.modelled else ctx.scale], **ctx.sizes}

    def prepare(self, ctx: ScenarioContext) -> None:
        """Before the two runs (a calibration run, say); notes go into ctx.notes."""

    def broken(self, ctx: ScenarioContext) -> ScenarioRun:
        raise NotImplementedError

    def fixed(self, ctx: ScenarioContext) -> ScenarioRun:
        raise NotImplementedError

    def evidence(self, broken: ServingResult, fixed: ServingResult, notes: dict) -> dict:
        """The figures the verdict rests on, computed from the two runs (and ctx.notes)."""
        raise NotImplementedError

    def verdict(self, ev: dict) -> str:
        """A short sentence from the evidence alone."""
        raise NotImplementedError

    # --- the run ----------------------------------------------------------------------------------

    def execute(self, ctx: ScenarioContext) -> tuple[ServingResult | None, ServingResult | None]:
        """(broken, fixed): fixed is None when the broken run was stopped (both before it)."""
        self.prepare(ctx)
        if ctx.stopped():
            return None, None
        broken = ctx.serve(self.broken(ctx))
        if ctx.stopped():
            return broken, None
        return broken, ctx.serve(self.fixed(ctx))

    def needs_dict(self, engine: str | None = None) -> dict:
        return {"engine": engine or self.engine, "knobs": list(self.needs)}


class ScenarioInterrupted(KeyboardInterrupt):
    """Ctrl-C during a scenario: .scenario is what it had (partial), .result the cut run."""

    def __init__(self, scenario: ScenarioResult, result: ServingResult | None):
        super().__init__("interrupted (Ctrl-C)")
        self.scenario, self.result = scenario, result


def register(cls: type[Scenario]) -> type[Scenario]:
    """Class decorator: the scenario cls.name."""
    SCENARIOS.add(cls.name, cls())
    return cls


def names() -> tuple[str, ...]:
    """The registered scenarios, in their order."""
    return tuple(SCENARIOS.names())


def get(name: str) -> Scenario:
    return SCENARIOS.get(name)


def catalog() -> list[dict]:
    """Every scenario as plain data (for a picker or an http listing): name, title, engine,
    needs (its knobs), fix, why, model_ok (has a --hardware model), takes_budget."""
    out = []
    for name in names():
        sc = get(name)
        out.append({
            "name": name, "title": sc.title, "engine": sc.engine, "needs": list(sc.needs),
            "fix": sc.fix, "why": sc.why, "model_ok": sc.model_ok, "takes_budget": sc.takes_budget,
        })  # fmt: skip
    return out


def engine_takes(engine: str, knob: str) -> bool:
    """Whether `engine` has `knob` among its Knobs or its constructor's keywords."""
    cls = engines.get(engine)
    return knob in cls.Knobs.specs() or knob in inspect.signature(cls.__init__).parameters


def check_engine(name: str, engine: str) -> None:
    """ValueError (one line) when `engine` lacks a knob the scenario `name` turns."""
    sc = get(name)
    for knob in sc.needs:
        if not engine_takes(engine, knob):
            takers = [e for e in engines.names() if engine_takes(e, knob)]
            raise ValueError(
                f"the {name} scenario needs the {' or '.join(takers)} engine's {knob}; "
                f"the {engine} engine has no {knob}"
            )


def check_modelled(name: str) -> None:
    """ValueError (one line) when the scenario has no model in the simulator (--hardware)."""
    if not get(name).model_ok:
        raise ValueError(
            f"the {name} scenario has no model in the simulator: run it without --hardware"
        )


def check_budget(name: str, gb: float, device="cpu") -> None:
    """ValueError (one line) for a memory budget the scenario does not take, or one that is not
    below what the device has available (refused before anything runs)."""
    if not get(name).takes_budget:
        raise ValueError(
            f"--memory-budget: the {name} scenario has no memory budget (memory-wall has)"
        )
    check_memory_budget(gb, device)
    least = get(name).min_budget_gb
    if gb < least:
        raise ValueError(
            f"--memory-budget {gb:g} GB is below the {name} scenario's least, {least:g} GB: under "
            "it the run's own interpreter and engine set-up, not the KV cache, hit the cap first"
        )


def check_sizes(name: str, scale: str = "default", sizes: dict | None = None) -> None:
    """ValueError (one line) for a scale that is not one of SCALES, or a size the scenario has
    not got."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    known = get(name).presets()[scale]
    for key in sizes or {}:
        if key not in known:
            raise ValueError(
                f"sizes: the {name} scenario has no size {key!r}; it has {', '.join(known)}"
            )


def run(
    name: str,
    lm,
    *,
    hardware: str | None = None,
    model: str | None = None,
    engine: str | None = None,
    stop: threading.Event | None = None,
    progress: Callable[[str], None] | None = None,
    memory_budget_gb: float | None = None,
    scale: str = "default",
    sizes: dict | None = None,
) -> ScenarioResult:
    """Run the scenario broken and fixed (see the module docstring)."""
    sc = get(name)
    check_sizes(name, scale, sizes)
    if engine is not None:
        engines.get(engine)  # an unknown engine: its own one line
        check_engine(name, engine)
    if hardware is not None:
        check_modelled(name)
    if memory_budget_gb is not None:
        check_budget(name, memory_budget_gb, "cpu" if lm is None else lm.device)
    ctx = ScenarioContext.build(
        lm,
        hardware=hardware,
        model=model,
        engine=engine or sc.engine,
        stop=stop,
        progress=progress,
        memory_budget_gb=memory_budget_gb,
        scenario=name,
        scale=scale,
        sizes=sizes,
    )
    try:
        broken, fixed = sc.execute(ctx)
    except RunInterrupted as err:
        part = _partial(sc, ctx, *_cut(ctx, err.result))
        raise ScenarioInterrupted(part, err.result) from None
    except KeyboardInterrupt:  # between runs or outside serve() (a load, a forked probe)
        raise ScenarioInterrupted(_partial(sc, ctx, *_so_far(ctx)), None) from None
    cut = _partial_run(broken) or _partial_run(fixed)
    if ctx.stopped() or cut or (broken is None and fixed is None):
        return _partial(sc, ctx, broken, fixed)
    ev = sc.evidence(broken, fixed, ctx.notes)
    return ScenarioResult(
        name,
        broken,
        fixed,
        sc.verdict(ev),
        sc.why,
        ev,
        ctx.modelled,
        False,
        sc.title,
        sc.needs_dict(ctx.engine),
    )


def _so_far(ctx: ScenarioContext) -> tuple:
    """(broken, fixed) kept when Ctrl-C lands outside a serve(): the runs so far, or what a
    scenario that runs outside ctx.serve() left in ctx.notes["so_far"] (memory-wall's probes)."""
    if ctx.notes.get("so_far") is not None:
        return ctx.notes["so_far"]
    done = ctx.results
    return (done[0] if done else None, done[1] if len(done) > 1 else None)


def _partial_run(res: ServingResult | None) -> bool:
    return res is not None and bool(res.meta.get("partial"))


def _cut(ctx: ScenarioContext, res: ServingResult) -> tuple:
    """(broken, fixed) when a run was interrupted: the cut run is the last one started."""
    done = ctx.results
    return (res, None) if not done else (done[0], res)


def _partial(sc: Scenario, ctx: ScenarioContext, broken, fixed) -> ScenarioResult:
    """What a stopped scenario keeps: its runs so far, marked partial, and no verdict."""
    cut = fixed if fixed is not None else broken
    which = "fixed" if fixed is not None else "broken"
    if cut is None:
        verdict = "stopped before the broken run: no verdict"
    else:
        ok = sum(r.ok for r in cut.records)
        verdict = (
            f"stopped during the {which} run ({ok} of {len(cut.records)} requests finished): "
            "no verdict from part of a scenario"
        )
    return ScenarioResult(
        sc.name,
        broken,
        fixed,
        verdict,
        sc.why,
        {"stopped_during": which},
        ctx.modelled,
        True,
        sc.title,
        sc.needs_dict(ctx.engine),
    )


__all__ = [
    "ScenarioContext",
    "ScenarioRun",
    "Scenario",
    "ScenarioInterrupted",
    "ScenarioResult",
    "check_budget",
    "check_engine",
    "check_memory_budget",
    "check_modelled",
    "check_sizes",
    "catalog",
    "engine_takes",
    "get",
    "names",
    "register",
    "run",
    "SCALES",
]

SCENARIOS.discover(__name__)
