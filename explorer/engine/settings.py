"""One spelling per setting: a dataclass field declared once with its range, default, label and help.

    @dataclass
    class Sampling:
        top_p: float = setting(1.0, "top-p", "1 = off", low=0, high=1, low_open=True, step=0.05)

validate(obj) checks every declared field (the message states the range); the dashboard's controls
(explorer.app.controls), the CLI flags (explorer.cli.common) and the docs read the same Spec.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 0 .. 2**64 - 1
TYPED_MAX = 10**7  # the largest number a person may type where its Spec names no `high`
_BAD = object()  # text that is not a value of the Spec's kind


@dataclass(frozen=True)
class Spec:
    """What a setting is: its type, range, the value that switches it off, label and help text."""

    kind: type  # float, int, bool or str
    label: str
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is not allowed
    high_open: bool = False
    optional: bool = False  # None is allowed (e.g. seed: random; max tokens: no limit)
    step: float | None = None  # widget increment
    cli: str | None = None  # CLI flag when not --field-name
    choices: tuple | None = None  # the allowed values (a str setting with a fixed set)

    def range_text(self) -> str:
        if self.kind is bool:
            return "True or False"
        if self.choices:
            return f"one of {', '.join(map(str, self.choices))}"
        if self.kind is str:
            return f"text{' (or None)' if self.optional else ''}"
        lo = "" if self.low is None else f"{'>' if self.low_open else '>='} {_num(self.low)}"
        hi = "" if self.high is None else f"{'<' if self.high_open else '<='} {_num(self.high)}"
        what = "a whole number" if self.kind is int else "a number"
        bounds = " and ".join(b for b in (lo, hi) if b)
        return f"{what}{' ' + bounds if bounds else ''}{' (or None)' if self.optional else ''}"

    def problem(self, value: Any) -> str | None:
        """None when value is allowed, else why not."""
        if value is None:
            return None if self.optional else f"must be {self.range_text()}, got None"
        if self.kind is bool:
            return None if isinstance(value, bool) else f"must be True or False, got {value!r}"
        if self.choices or self.kind is str:
            ok = value in self.choices if self.choices else isinstance(value, str)
            return None if ok else f"must be {self.range_text()}, got {value!r}"
        ok_type = (
            isinstance(value, int) and not isinstance(value, bool)
            if self.kind is int
            else isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
        )
        if not ok_type:
            return f"must be {self.range_text()}, got {value!r}"
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return f"must be {self.range_text()}, got {value!r}"
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return f"must be {self.range_text()}, got {value!r}"
        return None

    def parse(self, text: Any) -> Any:
        """The value a person typed (text, or a number from a widget) as this Spec's kind, in range:
        ValueError "<label> must be <range>, got <text>". Where `high` is None, numbers past
        TYPED_MAX are refused too; NaN and infinities always are."""
        raw = text.strip() if isinstance(text, str) else text
        if self.optional and (raw is None or str(raw).lower() in ("", "none")):
            return None
        spec = self
        if self.kind in (int, float) and self.high is None:
            spec = dataclasses.replace(self, high=TYPED_MAX)
        value = _convert(self.kind, raw)
        why = spec.problem(value) if value is not _BAD else f"must be {spec.range_text()}"
        if why:
            why = why.split(", got ")[0]  # the text as typed, not as converted
            raise ValueError(f"{self.label} {why}, got {text!r}".strip())
        return value

    def parse_list(self, text: Any) -> list:
        """Values separated by commas (or semicolons; a list or tuple as it is), each parse()d."""
        items = text if isinstance(text, (list, tuple)) else str(text).replace(";", ",").split(",")
        items = [v.strip() if isinstance(v, str) else v for v in items]
        items = [v for v in items if v != ""]
        if not items:
            raise ValueError(f"{self.label}: give at least one value".strip(": "))
        return [self.parse(v) for v in items]


def _convert(kind: type, raw: Any) -> Any:
    """raw as `kind` (a whole float such as 8.0 or "1e3" is an int), or _BAD."""
    if kind is bool:
        words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
        return raw if isinstance(raw, bool) else words.get(str(raw).lower(), _BAD)
    if kind is str:
        return str(raw)
    if isinstance(raw, bool):
        return _BAD
    try:
        number = float(raw)
    except (TypeError, ValueError, OverflowError):
        return _BAD
    if kind is float:
        return number
    if isinstance(raw, int):
        return raw
    try:
        return int(raw)
    except (TypeError, ValueError):
        return int(number) if math.isfinite(number) and number.is_integer() else _BAD


def _num(x: float) -> str:
    if x == SEED_MAX:
        return "2**64 - 1"
    if x == TYPED_MAX:
        return f"{TYPED_MAX:,}"
    return f"{x:g}" if isinstance(x, float) else str(x)


def setting(default: Any, label: str, help: str, *, kind: type | None = None, **spec) -> Any:
    """A dataclass field carrying its Spec (kind defaults to the type of `default`)."""
    kind = kind or type(default)
    return dataclasses.field(
        default=default, metadata={"spec": Spec(kind=kind, label=label, help=help, **spec)}
    )


def specs(cls_or_obj) -> dict[str, Spec]:
    """{field name: Spec} of every declared setting, in declaration order."""
    return {
        f.name: f.metadata["spec"] for f in dataclasses.fields(cls_or_obj) if "spec" in f.metadata
    }


def validate(obj) -> None:
    """ValueError naming the first field whose value is outside its declared range."""
    for name, spec in specs(obj).items():
        why = spec.problem(getattr(obj, name))
        if why:
            named = name if spec.label == name.replace("_", "-") else f"{name} ({spec.label})"
            raise ValueError(f"{named} {why}{'; ' + spec.help if spec.help else ''}")


@dataclass
class SessionOptions:
    """The engine options of a Session besides sampling (explorer.engine.Session takes them as keywords)."""

    use_cache: bool = setting(
        True, "KV cache", "keep past keys/values; off feeds the whole sequence each step"
    )
    batch_size: int = setting(
        1, "batch size", "rows decoded together (the prompt repeated)", low=1, high=256
    )
    top_n: int = setting(
        20, "top-n shown", "most likely tokens recorded per step", low=0, high=1000
    )
    max_new_tokens: int | None = setting(
        None,
        "max tokens",
        "stop after this many tokens (None: at EOS or the model's last position)",
        kind=int,
        low=1,
        optional=True,
    )
    stop_at_eos: bool = setting(True, "stop at end-of-text", "stop when every row has produced EOS")

    def __post_init__(self) -> None:
        validate(self)


def check_int(name: str, value, low: int) -> None:
    """ValueError naming `name` unless value is a whole number >= low (bools are not numbers here)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
