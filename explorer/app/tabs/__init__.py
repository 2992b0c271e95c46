"""The dashboard's tabs, one module each, behind one small protocol.

A tab is a class registered with @register(order): the dashboard builds every registered tab with
`Tab(dash)`, shows `tab.about` (one line: what the tab shows and how to read it) above `tab.widget`
under `tab.title`, merges `tab.parts` into dash.parts (names -> widgets, CSS class ie-<name>), asks
`export_figures()` for what Export offers, and calls the hooks below. A new tab is one new module
here: a `build(...) -> (widget, parts)` function lays out its controls, the Tab class wires them,
and every run it starts goes through one explorer.app.runner.Runner. Tabs use the dashboard's
public methods only (session, guard, load_model, model_names, ...).
"""

from __future__ import annotations

import threading

from explorer._registry import Registry

TABS: Registry[type] = Registry("tab")


class Tab:
    """Base class with do-nothing hooks; a tab overrides what it needs."""

    name = ""  # the key in dash.tab(name)
    title = ""  # the tab's label
    about = ""  # one line (HTML) shown first on the tab: what it shows and how to read it

    def __init__(self, dash):
        self.dash = dash
        self.parts: dict = {}
        self.widget = None
        self.runners: list = []  # explorer.app.runner.Runner: the tab's background runs

    def figures(self) -> list:
        """Every figure the tab holds (synced before display, refitted when shown)."""
        return []

    def export_figures(self) -> dict:
        """The charts the Export tab offers, by name (default: none)."""
        return {}

    def shown_figures(self) -> list:
        """The figures visible when the tab is selected (default: all of them)."""
        return self.figures()

    def set_live(self, live: bool) -> None:
        """Called with True when the tab is selected, False when another is: a hidden tab may skip work."""

    def steps_added(self, steps) -> None:
        """The session just took `steps` (append only, no O(n) work)."""

    def steps_reset(self, steps) -> None:
        """Redraw from all of the session's steps (rewind, branch, a new session)."""

    def step_selected(self, index: int | None) -> None:
        """The person picked step `index` to look at (None: follow the latest step)."""

    def peaks_known(self, hardware: dict, chips: dict) -> None:
        """The machine's measured peaks (and known chips' modelled ones) are now known."""

    def session_changed(self) -> None:
        """A new Session (or model) was swapped in."""

    def flush(self) -> None:
        """Bring figures up to date before they are exported or displayed."""

    def threads(self) -> list[threading.Thread | None]:
        """Background threads the tab runs (dash.wait() joins them): its runners'."""
        return [r.thread for r in self.runners]

    def set_busy(self, busy: bool) -> None:
        """A run (any) started or ended: each runner disables what conflicts with it."""
        for r in self.runners:
            r.set_busy(busy)


def register(order: int):
    """Class decorator: add a Tab subclass to the dashboard at position `order`."""

    def add(cls: type) -> type:
        if not cls.name or not cls.title or not cls.about:
            raise ValueError(f"{cls.__name__} needs a name, a title and an about line")
        cls.order = order
        return TABS.add(cls.name, cls)

    return add


def registered() -> list[type]:
    """Every tab class, in order (the tab modules imported first)."""
    TABS.discover(__name__)
    return TABS.values()
