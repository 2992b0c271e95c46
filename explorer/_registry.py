"""One registry for every kind of registered thing (Vidur's BaseRegistry).

Sweeps, pay tricks, scenarios, engines, simulator policies, dashboard tabs and CLI commands are
each one module that adds itself to one `Registry`:

    SWEEPS = Registry("sweep")
    SWEEPS.add("batch", Sweep(...))       # a second, different "batch" is refused
    SWEEPS.names()                        # sorted by each item's `order`, then by name
    SWEEPS.get("nope")                    # ValueError: unknown sweep 'nope'; the sweeps are ...
    SWEEPS.discover("explorer.sweeps")    # imports the package's modules (each registers itself)

Behaviour that belongs to a registered kind lives on the registered class, not in
`if name == ...` branches elsewhere.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _order(item: Any) -> Any:
    return getattr(item, "order", getattr(item, "ORDER", 100))


def _identity(item: Any) -> Any:
    """What makes two registrations the same thing: a class (or module) by its qualified name, so
    that re-importing a module re-registers it; anything else by itself."""
    if isinstance(item, (type, ModuleType)):
        return (getattr(item, "__module__", None), getattr(item, "__qualname__", item.__name__))
    return item


class Registry(Generic[T]):
    """Named items of one kind: add(), names() in order, get() with one error wording, discover()."""

    def __init__(
        self,
        kind: str,
        plural: str | None = None,
        *,
        order: Callable[[T], Any] = _order,
        same: Callable[[T], Any] = _identity,
    ):
        self.kind, self.plural = kind, plural or kind + "s"
        self.order, self.same = order, same
        self.entries: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        """Register `item` as `name` (ValueError when another, different item has that name)."""
        old = self.entries.get(name)
        if old is not None and self.same(old) != self.same(item):
            raise ValueError(f"two {self.plural} are named {name!r}")
        self.entries[name] = item
        return item

    def remove(self, name: str) -> T | None:
        return self.entries.pop(name, None)

    def names(self) -> list[str]:
        """The names, sorted by each item's order, then by name."""
        return sorted(self.entries, key=lambda n: (self.order(self.entries[n]), n))

    def get(self, name: str) -> T:
        """The item called `name` (ValueError: one line listing the known names)."""
        if name not in self.entries:
            raise ValueError(
                f"unknown {self.kind} {name!r}; the {self.plural} are {', '.join(self.names())}"
            )
        return self.entries[name]

    def values(self) -> list[T]:
        """The items in names() order."""
        return [self.entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"

    @staticmethod
    def discover(package: str, skip: tuple[str, ...] = ()) -> list[ModuleType]:
        """Import every module of `package` whose name does not start with "_" (nor is in `skip`):
        each registers what it defines. Callable from the package's own __init__."""
        pkg = sys.modules.get(package) or importlib.import_module(package)
        return [
            importlib.import_module(f"{package}.{m.name}")
            for m in pkgutil.iter_modules(pkg.__path__)
            if not m.name.startswith("_") and m.name not in skip
        ]
