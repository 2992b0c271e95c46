"""What a scenario's runs share: a ScenarioRun (workload + engine knobs), and the
ScenarioContext that runs it, measured on the loaded model (explorer.serving.serve) or modelled on a known chip (the
simulator's what-if, explorer.serving.simulate.whatif)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from explorer.serving.run import ServingResult, serve
from explorer.serving.workload import Request, Workload

DEFAULT_ARCH = "arch:llama-3.1-8b"  # the model a --hardware scenario runs when none is given


@dataclass
class ScenarioRun:
    """One run of a scenario: who asks what and when, through which engine with which knobs."""

    label: str
    workload: Workload | list[Request]
    engine: str = "continuous"
    knobs: dict = field(default_factory=dict)  # engine knobs and keywords (warmup, ...)


def check_memory_budget(gb: float, device="cpu") -> None:
    """ValueError (one line) for a memory budget that is not a positive number of GB, or more
    than the device has available: refused before anything runs."""
    from explorer.model.device import available_bytes
    from explorer.model.memory import gib

    if not gb > 0:  # NaN too
        raise ValueError(f"--memory-budget must be a number of GB > 0, got {gb}")
    free = available_bytes(device)
    if free is not None and gb * 1e9 > free:
        raise ValueError(
            f"--memory-budget {gb:g} GB is more than this machine has available ({gib(free)}); "
            "a budget must be below it, so the run fails inside it, not in the machine's swap"
        )


def preemptions(res: ServingResult) -> int:
    """Requests the engine evicted from its KV cache over the whole run."""
    return sum(i.preempted for i in res.iterations)


def run_dict(res: ServingResult) -> dict:
    """ServingResult.to_dict() with the two figures every scenario reads: steady, preemptions."""
    return {**res.to_dict(), "steady": res.result.get("steady"), "preemptions": preemptions(res)}


@dataclass
class ScenarioContext:
    """Where a scenario runs: the loaded model (measured) or a chip on paper (modelled)."""

    lm: object | None
    info: object  # the model's ModelInfo
    engine: str
    hardware: str | None = None
    step_model: object | None = None
    chip_knobs: dict = field(default_factory=dict)  # the what-if's engine knobs (KV from memory)
    stop: threading.Event | None = None
    progress: Callable[[str], None] | None = None
    memory_budget_gb: float | None = None
    notes: dict = field(default_factory=dict)  # what prepare() found (calibration)
    results: list = field(default_factory=list)  # the runs so far, in order
    scale: str = "default"  # the measured preset: "small" (the least that shows it) or "default"
    sizes: dict = field(default_factory=dict)  # overrides of the preset's sizes

    @property
    def modelled(self) -> bool:
        return self.hardware is not None

    @classmethod
    def build(
        cls,
        lm,
        *,
        hardware,
        model,
        engine,
        stop,
        progress,
        memory_budget_gb,
        scenario,
        scale="default",
        sizes=None,
    ) -> ScenarioContext:
        if hardware is None:
            if lm is None:
                raise ValueError(f"the {scenario} scenario runs a loaded model: give one")
            return cls(
                lm,
                lm.info,
                engine,
                stop=stop,
                progress=progress,
                memory_budget_gb=memory_budget_gb,
                scale=scale,
                sizes=dict(sizes or {}),
            )
        from explorer.model.loader import arch_info
        from explorer.serving.simulate.policy import modelled
        from explorer.serving.simulate.whatif import chip_model

        if engine not in modelled():
            raise ValueError(
                f"--hardware: the simulator has no model of the {engine} engine "
                f"(it models {', '.join(modelled())})"
            )

        info = lm.info if lm is not None else arch_info(model or DEFAULT_ARCH, "bfloat16")
        step, paper = chip_model(info, hardware)
        return cls(
            None,
            info,
            engine,
            hardware,
            step,
            dict(paper["knobs"]),
            stop,
            progress,
            sizes=dict(sizes or {}),
        )

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def requests(self, workload: Workload, lm=None) -> list[Request]:
        """The workload's requests: tokenized by the model (measured), token ids (modelled)."""
        if self.modelled:
            return workload.requests(vocab_size=self.info.vocab_size)
        return workload.requests(lm or self.lm)

    def serve(self, plan: ScenarioRun, lm=None, keep: bool = True) -> ServingResult:
        """Run the plan (measured on lm, default the context's; or modelled); the result joins
        self.results unless keep=False (a warm-up or calibration run: not one of the two)."""
        where = f"modelled on {self.hardware}" if self.modelled else "measured"
        self.say(f"{plan.label} run ({plan.engine}, {where})")
        res = self._simulate(plan) if self.modelled else self._measure(plan, lm or self.lm)
        if keep:
            self.results.append(res)
        return res

    def _measure(self, plan: ScenarioRun, lm) -> ServingResult:
        return serve(lm, plan.workload, plan.engine, stop=self.stop, label=plan.label, **plan.knobs)

    def _simulate(self, plan: ScenarioRun) -> ServingResult:
        from explorer.serving.simulate import simulate
        from explorer.serving.simulate.whatif import check_context

        wl = plan.workload
        requests = wl.requests(vocab_size=self.info.vocab_size) if isinstance(wl, Workload) else wl
        check_context(self.info, requests)
        base = self.chip_knobs if plan.engine == "continuous" else {}
        knobs = {k: v for k, v in {**base, **plan.knobs}.items() if k != "warmup"}
        return simulate(
            self.info,
            wl,
            plan.engine,
            self.step_model,
            label=plan.label,
            requests=requests,
            **knobs,
        )

    def capacity_rps(self, input_len: int, output_len: int, knobs: dict | None = None) -> float:
        """--hardware: the modelled service capacity (req/s) of the continuous engine."""
        from explorer.serving.simulate.run import engine_knobs, saturation_rate

        full = engine_knobs("continuous", {**self.chip_knobs, **(knobs or {})})
        return saturation_rate(
            self.info, self.step_model, "continuous", full, input_len, output_len
        )
