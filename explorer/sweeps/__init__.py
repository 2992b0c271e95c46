"""Sweeps: one registry of timed measurements, each a tidy pandas DataFrame.

    from explorer import sweeps
    sweeps.names()                          # ["cache", "prefill", "batch", "dtype", ...]
    df = sweeps.run("batch", lm, batches=[1, 8, 64])
    plots.sweep("batch", df)                # its figure (explorer.plots.sweeps, registered by name)

A sweep is one module in this folder that calls register(Sweep(...)): its name, title, run
function, columns, and the parameters a user types (Param: a keyword of run() with its kind,
label, default and help). The CLI (`explorer sweep NAME`), the dashboard's Sweeps tab and the
notebooks all read this registry; none of them names a sweep's arguments itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from explorer._registry import Registry
from explorer.engine.settings import Spec
from explorer.sweeps._common import COLUMNS, StopSweep, interrupted, measure_points  # noqa: F401


@dataclass(frozen=True)
class Param:
    """One argument of a sweep's run() that a person types (in a box or as a CLI flag)."""

    name: str  # the keyword of run()
    kind: str  # "int" | "ints" | "floats" | "names" (comma-separated) | "word" (one of `choices`)
    label: str  # shown beside the box
    default: str | None = (
        None  # text in the box; None: run()'s own default (CLI) and not shown in the tab
    )
    help: str = ""
    low: int = 1  # for int / ints
    high: int | None = None  # for int / ints (None: Spec's TYPED_MAX)
    flag: str | None = None  # the CLI flag, if not --name-with-dashes
    choices: tuple[str, ...] | Callable[[], list[str]] = ()  # for "word": allowed (or a callable)

    def allowed(self) -> list[str]:
        return list(self.choices() if callable(self.choices) else self.choices)

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def spec(self) -> Spec:
        """The Spec of one value: what parse() converts and range-checks with."""
        if self.kind in ("int", "ints"):
            return Spec(int, self.label, self.help, low=self.low, high=self.high)
        if self.kind == "floats":
            return Spec(float, self.label, self.help, low=0, low_open=True)
        choices = tuple(self.allowed()) if self.kind == "word" else None
        return Spec(str, self.label, self.help, choices=choices)

    def parse(self, text: str | int) -> Any:
        """The value from typed text (ValueError naming the label and the range; Spec.parse)."""
        if self.kind in ("int", "word"):
            return self.spec.parse(text)
        return self.spec.parse_list(text)


REPEATS = Param(
    "repeats", "int", "repeats", "3", "timed repeats per point (the median is reported)"
)
CONTEXT = Param(
    "context_len",
    "int",
    "context length",
    None,
    "cached prefix + fed token",
    low=2,
    flag="--context",
)


@dataclass(frozen=True)
class Sweep:
    """A registered sweep: run(lm, **params, progress=, bar=, stop=) -> DataFrame with `columns`."""

    name: str
    title: str
    run: Callable[..., Any]
    columns: list[str]
    help: str
    params: tuple[Param, ...] = field(default=())  # the first is the sizes box of the Sweeps tab
    order: int = 100  # place in the CLI's list and the Sweeps tab
    check: Callable[[dict[str, Any]], None] | None = None  # checks the parsed keywords together

    def arguments(
        self, texts: dict[str, str], name_of: Callable[[Param], str] | None = None
    ) -> dict[str, Any]:
        """run() keywords from typed texts {param name: text}; empty texts are left to run()'s defaults.
        A bad value raises ValueError, prefixed with name_of(param) when given (the CLI's flag)."""
        known = {p.name: p for p in self.params}
        unknown = set(texts) - set(known)
        if unknown:
            raise ValueError(
                f"sweep {self.name} does not take {', '.join(sorted(unknown))}; it takes "
                f"{', '.join(known)}"
            )
        out = {}
        for k, v in texts.items():
            if str(v).strip():
                try:
                    out[k] = known[k].parse(v)
                except ValueError as err:
                    raise ValueError(
                        f"{name_of(known[k])}: {err}" if name_of else str(err)
                    ) from None
        if self.check is not None:
            self.check(out)  # ValueError: one line naming the flags (e.g. an axis a trick lacks)
        return out


SWEEPS: Registry[Sweep] = Registry("sweep", same=lambda s: s.run)


def register(sweep: Sweep) -> Sweep:
    unknown = [c for c in sweep.columns if c not in COLUMNS]
    if unknown:
        raise ValueError(f"sweep {sweep.name}: columns without a description in COLUMNS: {unknown}")
    return SWEEPS.add(sweep.name, sweep)


def names() -> list[str]:
    return SWEEPS.names()


def get(name: str) -> Sweep:
    return SWEEPS.get(name)


def run(name: str, lm, **kwargs):
    """Run a registered sweep on a loaded model (keywords as its module's run() takes them)."""
    return get(name).run(lm, **kwargs)


SWEEPS.discover(__name__)
