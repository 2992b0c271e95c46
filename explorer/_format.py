"""How a figure is written for a person, in one place: a missing figure is "n/a" everywhere.

ms(0.0123)          -> "12 ms"       (from seconds)
ms_value(3.21)      -> "3.2 ms"      (a figure already in ms, e.g. a result's p99_itl_ms)
number(None)        -> "n/a"
number(0.5, ".3f")  -> "0.500"
pct(-3.25, "+.1f")  -> "-3.2%"       (a figure already in percent)
share(0.5)          -> "50%"         (a fraction)
times(2.0)          -> "2.0x"
gb(2.5e9)           -> "2.50 GB"     (from bytes)
rate(3.21)          -> "3.21 req/s"
text(4, "{:.1f}")   -> "4.0"         (any str.format pattern)
"""

from __future__ import annotations

from typing import Any

NA = "n/a"  # the one spelling of a figure that is missing or could not be computed


def text(value: Any, pattern: str = "{}") -> str:
    """value through a str.format pattern, or NA for None."""
    return NA if value is None else pattern.format(value)


def number(value: float | None, spec: str = ".2f") -> str:
    return NA if value is None else format(value, spec)


def ms_value(milliseconds: float | None) -> str:
    """A figure already in milliseconds: whole ms from 10 ms up, one decimal below."""
    if milliseconds is None:
        return NA
    return f"{milliseconds:,.0f} ms" if abs(milliseconds) >= 10 else f"{milliseconds:.1f} ms"


def ms(seconds: float | None) -> str:
    """Seconds written as milliseconds (the rule of ms_value)."""
    return ms_value(None if seconds is None else seconds * 1e3)


def pct(percent: float | None, spec: str = ".1f") -> str:
    """A figure already in percent (e.g. an error of -3.2)."""
    return NA if percent is None else f"{percent:{spec}}%"


def share(fraction: float | None) -> str:
    """A fraction as a whole percent: 0.5 -> "50%"."""
    return NA if fraction is None else f"{fraction:.0%}"


def times(ratio: float | None) -> str:
    return NA if ratio is None else f"{ratio:.1f}x"


def gb(n_bytes: float | None) -> str:
    return NA if n_bytes is None else f"{n_bytes / 1e9:.2f} GB"


def rate(per_second: float | None, unit: str = "req/s") -> str:
    return NA if per_second is None else f"{per_second:.3g} {unit}"
